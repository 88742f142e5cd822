"""Benchmark: weight matching's forward start against the published descent, on trained MLPs.

For each ``--widths`` (hidden ``128 * width``, 3 hidden layers, no norm) and each seed pair of
``--pairs``, two MLPs are trained on disjoint halves of the embedded digits (as
``benchmarks/weight_matching.py`` trains them from seeded initialisations, 5 epochs, cached on
disk) and model b is matched onto model a twice in this process, once each, the order
alternating from pair to pair: ``weight_matching(spec, a, b, seed=0)`` (the published descent:
the identity start, every sweep in seeded random order) and
``weight_matching(..., start="forward")`` (the forward start:
:mod:`fedlmc.permutation.coordinate_descent`). Reported per pair: the exact objective
:math:`J` each reaches, the test accuracy of the midpoint of a and the aligned b (1,000 test
digits), sweeps, wall and CPU seconds (every core; the solver's kernels loaded first, not
timed); per width, how often the forward start's :math:`J` is higher and the mean accuracy
difference. The machine's float32 matrix-product speed and load average are recorded before
and after (a slow day's times are not a normal day's).

    python benchmarks/forward_start.py --widths 0.25 1 4 8 16 --pairs 0,1 2,3 4,5

``--sweep DIR`` instead summarises a sweep folder that ran both ``weight_matching`` and
``weight_matching_forward`` on the same clients (e.g. ``fedlmc sweep configs/quick.toml
methods=weight_matching,weight_matching_forward --out DIR``): per grid point the two methods'
test accuracy (mean and sample std over the seeds) and every cell's difference, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from machine import machine_speed, write_result

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "forward_start.json"
STARTS = ("identity", "forward")


def match(spec, sd_a, sd_b, start: str) -> dict:
    """One timed ``weight_matching`` from ``start``: permutations, sweeps, seconds."""
    from fedlmc.permutation.matching import weight_matching

    wall, cpu = time.perf_counter(), time.process_time()
    found = weight_matching(spec, sd_a, sd_b, seed=0, start=start)
    seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "perms": dict(found),
        "sweeps": len(found.objectives),
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
    }


def pair_row(width: float, seeds: tuple[int, int], args, splits, order=STARTS) -> dict:
    """Both starts on the pair ``seeds`` at ``width``: objective, merged accuracy, time."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import weight_matching as wm

    from fedlmc.averaging import interpolate, load_state
    from fedlmc.evaluation import evaluate
    from fedlmc.permutation import apply_permutation, permutation_spec
    from fedlmc.permutation.objective import matching_objective

    x, y = splits.train
    half = len(y) // 2
    model_a = wm.trained_mlp(width, seeds[0], args.epochs, (x[:half], y[:half]), args.cache)
    model_b = wm.trained_mlp(width, seeds[1], args.epochs, (x[half:], y[half:]), args.cache)
    spec = permutation_spec(model_a)
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    row = {"width": width, "hidden": sd_a["hidden.0.linear.weight"].shape[0], "seeds": seeds}
    for start in order:
        found = match(spec, sd_a, sd_b, start)
        aligned = apply_permutation(spec, found.pop("perms"), sd_b)
        merged = load_state(model_a, interpolate(sd_a, aligned, 0.5))
        found["objective"] = matching_objective(spec, sd_a, aligned)
        found["merged_acc"] = float(evaluate(merged, splits.test)["accuracy"])
        row[start] = found
    row["objective_ratio"] = row["forward"]["objective"] / row["identity"]["objective"]
    row["acc_difference"] = row["forward"]["merged_acc"] - row["identity"]["merged_acc"]
    row["time_ratio"] = row["forward"]["seconds"] / row["identity"]["seconds"]
    return row


def warm_up() -> None:
    """Load the solver's numba kernels (not timed): one matching of a tiny MLP each way."""
    from fedlmc.models.classifiers import build_model
    from fedlmc.permutation import permutation_spec

    small = build_model("mlp", width=1 / 64, in_shape=(1, 28, 28), norm="none").state_dict()
    spec = permutation_spec(build_model("mlp", width=1 / 64, in_shape=(1, 28, 28), norm="none"))
    for start in STARTS:
        match(spec, small, small, start)


def width_summary(rows: list[dict]) -> dict:
    return {
        "hidden": rows[0]["hidden"],
        "pairs": len(rows),
        "forward_objective_higher": sum(r["objective_ratio"] > 1 for r in rows),
        "mean_objective_ratio": statistics.mean(r["objective_ratio"] for r in rows),
        "mean_acc_identity": statistics.mean(r["identity"]["merged_acc"] for r in rows),
        "mean_acc_forward": statistics.mean(r["forward"]["merged_acc"] for r in rows),
        "mean_acc_difference": statistics.mean(r["acc_difference"] for r in rows),
        "median_time_ratio": statistics.median(r["time_ratio"] for r in rows),
    }


def print_rows(rows: list[dict], summaries: list[dict]) -> None:
    print(
        f"{'hidden':>6} {'pair':>5} {'J identity':>10} {'J forward':>10} {'acc id':>7} "
        f"{'acc fw':>7} {'s id':>7} {'s fw':>7} {'sweeps':>7}"
    )
    for r in rows:
        i, f = r["identity"], r["forward"]
        print(
            f"{r['hidden']:>6} {r['seeds'][0]},{r['seeds'][1]:<3} {i['objective']:>10.4f} "
            f"{f['objective']:>10.4f} {i['merged_acc']:>7.4f} {f['merged_acc']:>7.4f} "
            f"{i['seconds']:>7.2f} {f['seconds']:>7.2f} {i['sweeps']:>3}/{f['sweeps']:<3}"
        )
    for s in summaries:
        print(
            f"hidden {s['hidden']}: forward J higher in {s['forward_objective_higher']} of "
            f"{s['pairs']} pairs (mean ratio {s['mean_objective_ratio']:.4f}); merged acc "
            f"{s['mean_acc_identity']:.4f} -> {s['mean_acc_forward']:.4f} "
            f"({s['mean_acc_difference']:+.4f}); time ratio {s['median_time_ratio']:.2f}"
        )


def sweep_summary(folder: Path) -> dict:
    """The accuracies of ``weight_matching`` and ``weight_matching_forward`` in a sweep folder:
    per (bias, width) their mean and sample std over the seeds, and per cell the difference."""
    from fedlmc.simulations.records.results_file import read_results

    frame = read_results(folder)
    frame = frame[frame["status"] == "ok"]
    methods = ["weight_matching", "weight_matching_forward"]
    pivot = frame[frame["method"].isin(methods)].pivot_table(
        index=["bias", "width", "seed"], columns="method", values="accuracy"
    )
    if pivot.empty or set(methods) - set(pivot.columns):
        raise SystemExit(f"{folder}: needs rows of both {methods[0]} and {methods[1]}")
    points = []
    for (bias, width), cells in pivot.groupby(level=["bias", "width"]):
        point = {"bias": bool(bias), "width": float(width), "cells": len(cells)}
        for method in methods:
            point[f"{method}_mean"] = float(cells[method].mean())
            point[f"{method}_std"] = float(cells[method].std(ddof=1))
        difference = cells[methods[1]] - cells[methods[0]]
        point["differences"] = {int(k[2]): float(v) for k, v in difference.items()}
        points.append(point)
    return {"benchmark": "forward_start --sweep", "folder": str(folder), "points": points}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=float, nargs="+", default=[0.25, 1.0, 4.0, 8.0, 16.0])
    parser.add_argument(
        "--pairs",
        nargs="+",
        default=["0,1", "2,3", "4,5"],
        help="seed pairs a,b of the two trained models",
    )
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "fedlmc-bench-weight-matching",
        help="directory caching the trained models",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--sweep", type=Path, default=None, help="summarise this sweep folder")
    args = parser.parse_args(argv)
    try:
        args.pairs = [tuple(int(s) for s in p.split(",")) for p in args.pairs]
    except ValueError:
        parser.error(f"--pairs: each must be two integer seeds a,b, got {args.pairs}")
    if any(len(p) != 2 or p[0] == p[1] for p in args.pairs):
        parser.error(f"--pairs: each must be two different seeds a,b, got {args.pairs}")
    if any(w <= 0 for w in args.widths) or args.epochs < 1:
        parser.error(f"--widths must be > 0 and --epochs >= 1, got {args.widths}, {args.epochs}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.sweep is not None:
        summary = sweep_summary(args.sweep)
        print(json.dumps(summary, indent=2))
        write_result(args.out, summary)
        return
    import torch

    from fedlmc.data.loading import load_dataset

    torch.set_num_threads(os.cpu_count() or 1)
    args.cache.mkdir(parents=True, exist_ok=True)
    splits = load_dataset("mnist5k")
    warm_up()
    before = machine_speed()
    rows, summaries = [], []
    for width in args.widths:
        block = [
            pair_row(width, pair, args, splits, STARTS[:: 1 if k % 2 == 0 else -1])
            for k, pair in enumerate(args.pairs)
        ]
        for r in block:
            print(
                f"  hidden {r['hidden']} pair {r['seeds']}: J {r['identity']['objective']:.4f} "
                f"-> {r['forward']['objective']:.4f}",
                flush=True,
            )
        rows += block
        summaries.append(width_summary(block))
    print_rows(rows, summaries)
    result = {
        "benchmark": "forward_start",
        "model": f"mlp, 3 hidden layers, norm none, mnist5k disjoint halves, {args.epochs} epochs",
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "machine_before": before,
        "machine_after": machine_speed(),
        "rows": rows,
        "widths": summaries,
    }
    write_result(args.out, result)


if __name__ == "__main__":
    main()
