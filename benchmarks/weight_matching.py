"""Benchmark: fedlmc.align.weight_matching against a straightforward Git Re-Basin implementation.

Two 3-hidden-layer MLPs (hidden ``128 * width``) are trained on disjoint halves of the embedded
MNIST digits (``mnist5k``, seeds 0 and 1). Both matchers align model b to model a in the same
process with the same seed, alternating run by run; for each we report the median wall-clock and
CPU (process) time over ``--repeats`` runs, the number of sweeps, the final objective
``sum_w <W_a, pi(W_b)>`` and the test accuracy of the midpoint ``(theta_a + pi(theta_b)) / 2``.
The reference follows the published code: each sweep visits all groups in random order, rebuilds
every permuted ``W_b`` from scratch for each group, solves one assignment per group and adopts
it (progress if the gain exceeds 1e-12); it stops after a sweep without progress or 100 sweeps.
fedlmc's version runs the same descent but updates each cost matrix by a low-rank product when a
few neighbour units moved, skips groups whose cost matrix cannot have changed, solves
independent groups' assignments in threads, and warm-starts each assignment from the prices of
the group's previous solve (:mod:`fedlmc.assignment`, compiled by numba). The one-time cost of
loading (or, on a fresh install, compiling) that solver is measured before the timed runs and
reported separately as ``jit_seconds``. A last, untimed fedlmc run per width times its
assignment solves alone, warm-started against scipy on the very same matrices (``solver_*``).

    python benchmarks/weight_matching.py                       # widths 4 8 16 (hidden 512..2048)
    python benchmarks/weight_matching.py --widths 1 2 --epochs 1 --repeats 1   # quick run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from fedlmc import align
from fedlmc.align import matching_objective, weight_matching
from fedlmc.assignment import solve_assignment
from fedlmc.data import load_dataset
from fedlmc.evaluation import evaluate
from fedlmc.merge import interpolate, load_state
from fedlmc.models import build_model
from fedlmc.permutation import PermutationSpec, apply_permutation, permutation_spec
from fedlmc.train import train_model

DEFAULT_OUT = Path(__file__).parent / "results" / "weight_matching.json"


# ----------------------------------------------------------------------------- reference


def _permuted_param(
    spec: PermutationSpec, perms, key: str, params, except_axis: int
) -> torch.Tensor:
    """``params[key]`` with every group's permutation applied except on ``except_axis``."""
    w = params[key]
    for axis, group in enumerate(spec.axes_to_perm[key]):
        if axis != except_axis and group is not None:
            w = w.index_select(axis, perms[group])
    return w


def reference_weight_matching(
    spec: PermutationSpec, sd_a, sd_b, max_iter: int = 100, seed: int = 0
):
    """Git Re-Basin weight matching as published (samuela/git-re-basin), ported to torch."""
    sizes = {g: sd_a[axes[0][0]].shape[axes[0][1]] for g, axes in spec.perm_to_axes.items()}
    perms = {g: torch.arange(n) for g, n in sizes.items()}
    names = list(perms)
    rng = np.random.default_rng(seed)
    sweeps = 0
    for _ in range(max_iter):
        sweeps += 1
        progress = False
        for index in rng.permutation(len(names)):
            group = names[index]
            n = sizes[group]
            cost = torch.zeros(n, n)
            for key, axis in spec.perm_to_axes[group]:
                w_a = sd_a[key].movedim(axis, 0).reshape(n, -1)
                w_b = _permuted_param(spec, perms, key, sd_b, axis).movedim(axis, 0).reshape(n, -1)
                cost += w_a @ w_b.T
            rows, cols = linear_sum_assignment(cost.numpy(), maximize=True)
            assert np.array_equal(rows, np.arange(n))
            old = cost[torch.arange(n), perms[group]].sum().item()
            new = cost[torch.arange(n), torch.from_numpy(cols)].sum().item()
            progress = progress or new > old + 1e-12
            perms[group] = torch.from_numpy(cols).long()
        if not progress:
            break
    return perms, sweeps


def solver_comparison(spec: PermutationSpec, sd_a, sd_b, seed: int = 0) -> dict:
    """Seconds of all assignment solves of one fedlmc run: warm-started vs scipy, same matrices.

    Runs :func:`weight_matching` with its solves made sequential and, for every cost matrix it
    solves, also times ``scipy.optimize.linear_sum_assignment(cost, maximize=True)`` and checks
    that both reach the same value.
    """
    solve_warm, solve_many = align._solve_warm, align._solve_many
    totals = {"solves": 0, "warm_seconds": 0.0, "scipy_seconds": 0.0, "max_value_gap": 0.0}

    def timed_solve(cost, warm):
        start = time.perf_counter()
        columns, warm = solve_warm(cost, warm)
        middle = time.perf_counter()
        matrix = cost.double().cpu().numpy()
        rows, best = linear_sum_assignment(matrix, maximize=True)
        end = time.perf_counter()
        gap = matrix[rows, best].sum() - matrix[rows, columns.numpy()].sum()
        totals["solves"] += 1
        totals["warm_seconds"] += middle - start
        totals["scipy_seconds"] += end - middle
        totals["max_value_gap"] = max(totals["max_value_gap"], float(gap))
        return columns, warm

    align._solve_warm = timed_solve
    align._solve_many = lambda costs, warm, pool: solve_many(costs, warm, None)
    try:
        weight_matching(spec, sd_a, sd_b, seed=seed)
    finally:
        align._solve_warm, align._solve_many = solve_warm, solve_many
    return totals


def fedlmc_weight_matching(spec: PermutationSpec, sd_a, sd_b, seed: int = 0):
    """``(perms, sweeps)`` from :func:`fedlmc.align.weight_matching`."""
    matching = weight_matching(spec, sd_a, sd_b, seed=seed)
    return dict(matching), len(matching.objectives)


# ----------------------------------------------------------------------------- models


def trained_mlp(width: float, seed: int, epochs: int, data, cache: Path) -> torch.nn.Module:
    """An MLP trained on ``data`` (cached on disk by width/seed/epochs/size)."""
    model = build_model("mlp", width=width, in_shape=(1, 28, 28), norm="none")
    path = cache / f"mlp_w{width}_s{seed}_e{epochs}_n{len(data[1])}.pt"
    if path.exists():
        model.load_state_dict(torch.load(path, map_location="cpu"))
        return model.eval()
    train_model(
        model,
        data,
        epochs=epochs,
        lr=0.05,
        weight_decay=3e-3,
        batch_size=128,
        seed=seed,
        device="cpu",
    )
    torch.save(model.state_dict(), path)
    return model.eval()


def timed_interleaved(runs: dict, repeats: int) -> dict:
    """Run each matcher ``repeats`` times, alternating between them so that load from other
    processes hits both alike; per matcher: last result, wall and CPU seconds of every run."""
    out = {name: {"wall": [], "cpu": []} for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            wall, cpu = time.perf_counter(), time.process_time()
            out[name]["result"] = fn()
            out[name]["wall"].append(time.perf_counter() - wall)
            out[name]["cpu"].append(time.process_time() - cpu)
    return out


def benchmark_width(width: float, args, splits, cache: Path) -> dict:
    x, y = splits.train
    half = len(y) // 2
    model_a = trained_mlp(width, 0, args.epochs, (x[:half], y[:half]), cache)
    model_b = trained_mlp(width, 1, args.epochs, (x[half:], y[half:]), cache)
    spec = permutation_spec(model_a)
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    hidden = sd_a["hidden.0.linear.weight"].shape[0]
    row = {
        "width": width,
        "hidden": hidden,
        "acc_a": evaluate(model_a, splits.test)["accuracy"],
        "acc_b": evaluate(model_b, splits.test)["accuracy"],
        "objective_identity": matching_objective(spec, sd_a, sd_b),
        "acc_plain_average": evaluate(
            load_state(model_a, interpolate(sd_a, sd_b, 0.5)), splits.test
        )["accuracy"],
    }
    runs = {
        "reference": lambda: reference_weight_matching(spec, sd_a, sd_b, seed=args.seed),
        "fedlmc": lambda: fedlmc_weight_matching(spec, sd_a, sd_b, seed=args.seed),
    }
    for name, timing in timed_interleaved(runs, args.repeats).items():
        perms, sweeps = timing["result"]
        aligned = apply_permutation(spec, perms, sd_b)
        merged = load_state(model_a, interpolate(sd_a, aligned, 0.5))
        row[f"{name}_seconds"] = statistics.median(timing["wall"])
        row[f"{name}_seconds_all"] = timing["wall"]
        row[f"{name}_cpu_seconds"] = statistics.median(timing["cpu"])
        row[f"{name}_cpu_seconds_all"] = timing["cpu"]
        row[f"{name}_sweeps"] = sweeps
        row[f"{name}_objective"] = matching_objective(spec, sd_a, sd_b, perms)
        row[f"{name}_merged_acc"] = evaluate(merged, splits.test)["accuracy"]
    solves = solver_comparison(spec, sd_a, sd_b, seed=args.seed)
    row.update({f"solver_{key}": value for key, value in solves.items()})
    row["speedup"] = row["reference_seconds"] / row["fedlmc_seconds"]
    row["speedup_cpu"] = row["reference_cpu_seconds"] / row["fedlmc_cpu_seconds"]
    return row


def print_table(rows: list[dict]) -> None:
    print(
        f"{'hidden':>6} {'ref s':>7} {'ours s':>7} {'speedup':>7} {'cpu x':>6} {'sweeps':>9} "
        f"{'ref objective':>13} {'our objective':>13} {'ref acc':>7} {'our acc':>7} {'plain':>6}"
    )
    for r in rows:
        print(
            f"{r['hidden']:>6} {r['reference_seconds']:>7.2f} {r['fedlmc_seconds']:>7.2f} "
            f"{r['speedup']:>6.1f}x {r['speedup_cpu']:>5.1f}x "
            f"{r['reference_sweeps']:>4}/{r['fedlmc_sweeps']:<4} "
            f"{r['reference_objective']:>13.4f} {r['fedlmc_objective']:>13.4f} "
            f"{r['reference_merged_acc']:>7.3f} {r['fedlmc_merged_acc']:>7.3f} "
            f"{r['acc_plain_average']:>6.3f}"
        )
    print("\nassignment solves of one fedlmc run (sequential), same matrices:")
    print(f"{'hidden':>6} {'solves':>6} {'scipy s':>8} {'warm s':>7} {'ratio':>6} {'value gap':>9}")
    for r in rows:
        ratio = r["solver_scipy_seconds"] / r["solver_warm_seconds"]
        print(
            f"{r['hidden']:>6} {r['solver_solves']:>6} {r['solver_scipy_seconds']:>8.2f} "
            f"{r['solver_warm_seconds']:>7.2f} {ratio:>5.1f}x {r['solver_max_value_gap']:>9.1e}"
        )


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--widths",
        type=float,
        nargs="+",
        default=[4.0, 8.0, 16.0],
        help="MLP width multipliers of 128 hidden units (default: 4 8 16)",
    )
    parser.add_argument("--epochs", type=int, default=5, help="training epochs per model")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per matcher (median)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the group visiting order")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "fedlmc-bench-weight-matching",
        help="directory caching the trained models",
    )
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.repeats < 1 or any(w <= 0 for w in args.widths):
        parser.error("--epochs and --repeats must be >= 1 and --widths > 0")
    return args


def jit_seconds() -> float:
    """Seconds to load (first time: compile) the numba assignment solver, by one tiny solve."""
    start = time.perf_counter()
    solve_assignment(np.eye(2))
    return time.perf_counter() - start


def main(argv=None) -> None:
    args = parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    jit = jit_seconds()
    print(f"numba solver loaded in {jit:.2f} s (not in the timings below)")
    splits = load_dataset("mnist5k")
    rows = []
    for width in args.widths:
        rows.append(benchmark_width(width, args, splits, args.cache))
        print(f"width {width}: done", flush=True)
    print_table(rows)
    result = {
        "benchmark": "weight_matching",
        "dataset": "mnist5k (disjoint halves of the training split per model)",
        "model": "mlp, 3 hidden layers, norm none",
        "epochs": args.epochs,
        "repeats": args.repeats,
        "seed": args.seed,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "jit_seconds": jit,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
