r"""Benchmark: Preserve-First Merging (Qu and Horvath 2025) against the merge and the logit
ensemble, on the embedded MNIST digits.

PFM keeps every client's first layers, so its merge is a model, not a state dict of the
template (:mod:`fedlmc.merging.baselines.preserve_first`); a sweep runs it with ``k = 1`` as the
registered methods ``preserve_first`` and ``weight_matching_preserve_first``. This script sweeps
``k``: it measures PFM on clients trained here like ``configs/baselines_quick.toml``'s (the
3,600-digit pool split IID, 12 epochs, lr 0.05, weight decay 3e-3, batch 128, each client its
own seeded initialisation, a 3-hidden-layer MLP), not on the sweep's own clients. For each
cell (width x clients x bias x seed) it evaluates on the 1,000 test digits, each at the
temperature fitted on the server split (accuracy does not depend on it):

- ``average`` and ``weight_matching`` (onto client 0): the merges (PFM with k = 0);
- ``pfm_k`` and ``wm_pfm_k`` for k = 1, 2: PFM with k preserved layers on the plain clients and
  on the weight-matched ones, with ``params_ratio``, its parameters over one model's;
- ``logit_ensemble``: PFM with k = 3 (every layer but the output one).

    python benchmarks/preserve_first.py --bias false        # 12 cells: 43 min on 2 shared cores
    python benchmarks/preserve_first.py --seeds 0 --widths 0.5 --clients 2   # quick
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from statistics import mean, stdev

import torch

from fedlmc.averaging import average, load_state
from fedlmc.data.loading import load_dataset, partition
from fedlmc.evaluation import metrics_from_logits, predict_logits
from fedlmc.merging.baselines.preserve_first import preserve_first
from fedlmc.merging.calibrate import fit_temperature
from fedlmc.merging.methods import merge_states
from fedlmc.models.classifiers import build_model
from fedlmc.train import train_model

DEFAULT_OUT = Path(__file__).parent / "results" / "preserve_first.json"
DEPTH = 3


def train_clients(count: int, width: float, bias: bool, seed: int, splits) -> list[dict]:
    """``count`` IID clients of the pool, each its own seeded initialisation."""
    states = []
    for i, data in enumerate(partition(splits.train, count, "iid", seed=seed)):
        torch.manual_seed(1000 * seed + i)
        model = build_model("mlp", width=width, bias=bias)
        train_model(model, data, epochs=12, lr=0.05, weight_decay=3e-3, batch_size=128, seed=i)
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return states


def scores(model: torch.nn.Module, splits) -> dict[str, float]:
    """Test accuracy and NLL at the temperature fitted on the server split."""
    model.eval()
    temperature = fit_temperature(predict_logits(model, splits.server[0]), splits.server[1])
    found = metrics_from_logits(predict_logits(model, splits.test[0]), splits.test[1], temperature)
    return {"accuracy": float(found["accuracy"]), "nll_t": float(found["nll"])}


def cell(width: float, count: int, bias: bool, seed: int, splits) -> dict[str, dict]:
    """Every row of one cell."""
    states = train_clients(count, width, bias, seed, splits)
    template = build_model("mlp", width=width, bias=bias)
    single = sum(p.numel() for p in template.parameters())
    matched = merge_states("weight_matching", template, states, seed=seed)[1]
    rows = {
        "endpoint_mean": {
            "accuracy": mean(scores(load_state(template, s), splits)["accuracy"] for s in states)
        },
        "average": scores(load_state(template, average(states)), splits),
        "weight_matching": scores(load_state(template, average(matched)), splits),
    }
    for prefix, clients in (("pfm", states), ("wm_pfm", matched)):
        for k in range(1, DEPTH):
            model = preserve_first(template, clients, None, k)
            rows[f"{prefix}_{k}"] = scores(model, splits) | {
                "params_ratio": model.parameter_count / single
            }
    rows["logit_ensemble"] = scores(preserve_first(template, states, None, DEPTH), splits)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=float, nargs="+", default=[0.5, 4.0])
    parser.add_argument("--clients", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--bias", choices=["false", "true"], nargs="+", default=["false", "true"])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    splits = load_dataset("mnist5k")
    cells = []
    for bias in (b == "true" for b in args.bias):
        for width in args.widths:
            for count in args.clients:
                for seed in args.seeds:
                    rows = cell(width, count, bias, seed, splits)
                    cells.append(
                        {"bias": bias, "width": width, "clients": count, "seed": seed, "rows": rows}
                    )
                    short = {m: round(r["accuracy"], 3) for m, r in rows.items()}
                    print(f"bias={bias} width={width} clients={count} seed={seed}: {short}")
    summary = summarise(cells)
    for line in summary:
        print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": platform.processor(), "cells": cells, "summary": summary}, indent=1)
    )


def summarise(cells: list[dict]) -> list[str]:
    """One line per (bias, width, clients): mean +- std of the accuracy over the seeds."""
    lines = []
    keys = sorted({(c["bias"], c["width"], c["clients"]) for c in cells})
    for bias, width, count in keys:
        group = [
            c["rows"]
            for c in cells
            if (c["bias"], c["width"], c["clients"]) == (bias, width, count)
        ]
        parts = []
        for method in group[0]:
            values = [rows[method]["accuracy"] for rows in group]
            spread = stdev(values) if len(values) > 1 else float("nan")
            parts.append(f"{method} {mean(values):.3f}+-{spread:.3f}")
        lines.append(f"bias={bias} width={width} clients={count}: " + ", ".join(parts))
    return lines


if __name__ == "__main__":
    main()
