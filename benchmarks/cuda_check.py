"""CUDA check: the MNIST MLP sweep at widths up to 32x, seconds per cell and peak GPU memory.

Runs one real Flower federation per width (2 clients, each given ``--gpus-per-client`` of the
GPU) through :func:`fedlmc.simulations.runs.sweep.run_sweep` and prints a table:

- ``cell_s``: wall seconds of the cell (Ray start, training, merging, evaluation);
- ``train_s``: the clients' summed training seconds, ``merge_s``: the server's merge seconds;
- ``driver_peak_mib``: ``torch.cuda.max_memory_allocated`` of this process (the ServerApp runs in
  a thread here: merging, alignment, evaluation); the clients train in Ray actors, other
  processes, so their memory is seen only in
- ``device_peak_mib``: the largest ``total - free`` device memory (``torch.cuda.mem_get_info``,
  all processes) sampled every 0.2 s during the cell, minus the level before the sweep.

Also reports the ratio of each cell's seconds to the smallest width's (the baseline measured in
the same run). Writes everything to ``--json`` (default ``benchmarks/results/cuda_check.json``).
Exits with status 2 and a one-line message when no CUDA GPU is visible.

    python benchmarks/cuda_check.py                     # embedded digits (mnist5k)
    python benchmarks/cuda_check.py --dataset mnist --data-root /data --epochs 20
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

WIDTHS = (0.125, 0.5, 2.0, 8.0, 32.0)


class DeviceMemorySampler:
    """Samples the device's used memory (all processes) in a background thread."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _used(self) -> int:
        import torch

        free, total = torch.cuda.mem_get_info()
        return int(total - free)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._used())
            self._stop.wait(self.interval)

    def __enter__(self) -> DeviceMemorySampler:
        self.peak = self._used()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="mnist5k")
    parser.add_argument("--data-root", default="")
    parser.add_argument("--widths", type=float, nargs="+", default=list(WIDTHS))
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--gpus-per-client", type=float, default=0.5)
    parser.add_argument("--out", default=None, help="sweep out dir (default: a fresh temp dir)")
    parser.add_argument("--json", default="benchmarks/results/cuda_check.json")
    return parser.parse_args(argv)


def make_runner(records: list[dict[str, Any]], baseline_used: int):
    """The real federation, wrapped to time each cell and track its memory peaks."""
    import torch

    from fedlmc.simulations.runs.federation import run_federation

    def runner(config):
        torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        with DeviceMemorySampler() as sampler:
            rows = run_federation(config)
        records.append(
            {
                "width": config["width"],
                "cell_s": time.perf_counter() - start,
                "train_s": float(rows["train_seconds"].iloc[0])
                if "train_seconds" in rows
                else None,
                "merge_s": float(rows["merge_seconds"].max()) if "merge_seconds" in rows else None,
                "driver_peak_mib": torch.cuda.max_memory_allocated() / 2**20,
                "device_peak_mib": max(0, sampler.peak - baseline_used) / 2**20,
                "accuracy": dict(zip(rows["method"], rows["accuracy"].astype(float), strict=True)),
            }
        )
        return rows

    return runner


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("cuda_check: no CUDA GPU is visible; run this on a machine with one", file=sys.stderr)
        return 2
    from fedlmc.simulations.config import sweep_from_mapping
    from fedlmc.simulations.runs.sweep import run_sweep

    sweep = sweep_from_mapping(
        {
            "name": "cuda_check",
            "run": {
                "dataset": args.dataset,
                "data-root": args.data_root,
                "model": "mlp",
                "num-clients": 2,
                "epochs": args.epochs,
                "weight-decay": 3e-3,
                "lambdas": 11,
                "num-gpus": args.gpus_per_client,
                "device": "cuda",
                "methods": "average,average_t,weight_matching,weight_matching_t,ensemble",
            },
            "grid": {"width": sorted(args.widths)},
        }
    )
    free, total = torch.cuda.mem_get_info()
    records: list[dict[str, Any]] = []
    out_dir = args.out or tempfile.mkdtemp(prefix="cuda_check_")
    run_sweep(
        sweep, out_dir, force=True, progress=True, runner=make_runner(records, int(total - free))
    )
    if not records:
        print("cuda_check: every cell was already done in --out; use a fresh --out")
        return 1
    base = records[0]["cell_s"]
    print(f"\n{torch.cuda.get_device_name(0)}, {args.dataset}, {args.epochs} epochs, 2 clients")
    print(
        f"{'width':>6} {'hidden':>7} {'cell_s':>8} {'ratio':>6} {'train_s':>8} {'merge_s':>8} "
        f"{'driver_MiB':>11} {'device_MiB':>11} {'avg_acc':>8} {'wm_acc':>7}"
    )
    for r in records:
        r["ratio_to_smallest"] = r["cell_s"] / base
        print(
            f"{r['width']:>6g} {round(128 * r['width']):>7} {r['cell_s']:>8.1f} "
            f"{r['ratio_to_smallest']:>6.2f} {r['train_s'] or float('nan'):>8.1f} "
            f"{r['merge_s'] or float('nan'):>8.2f} {r['driver_peak_mib']:>11.0f} "
            f"{r['device_peak_mib']:>11.0f} {r['accuracy'].get('average', float('nan')):>8.4f} "
            f"{r['accuracy'].get('weight_matching', float('nan')):>7.4f}"
        )
    out = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "dataset": args.dataset,
        "epochs": args.epochs,
        "cells": records,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
