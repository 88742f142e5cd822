"""Benchmark: fedlmc.permutation.matching.weight_matching against Git Re-Basin implementations a
user could run.

Two 3-hidden-layer MLPs (hidden ``128 * width``) are trained on disjoint halves of the embedded
MNIST digits (``mnist5k``, seeds 0 and 1). The matchers align model b to model a in the same
process, alternating run by run, every core in use (whatever the shell's thread variables
say); for each we report the median wall-clock and CPU (process) time over ``--repeats`` runs,
the number of sweeps, the final objective ``J = sum_w <W_a, pi(W_b)>`` and the test accuracy of
the midpoint ``(theta_a + pi(theta_b)) / 2``. Single-machine measurements (a shared machine:
other jobs add noise). The matchers:

- ``fedlmc``: :func:`fedlmc.permutation.matching.weight_matching` (float32 cost matrices with
  low-rank updates, skipped groups, independent groups solved together in threads, warm-started
  assignments from :mod:`fedlmc.permutation.assignment`, compiled by numba; the one-time load or
  compile of its numba kernels is measured apart as ``jit_seconds``);
- ``reference``: the published algorithm ported to torch, the library's
  :func:`fedlmc.permutation.reference_matching.reference_weight_matching` with float32 cost
  matrices (each sweep visits all groups in random order, rebuilds every permuted ``W_b`` for
  each group, solves with scipy and keeps an assignment that raises the objective; stops after
  a sweep without progress or 100 sweeps), up to ``--reference-max-hidden`` units;
- ``rebasin``: the ``rebasin`` package from PyPI (``PermutationCoordinateDescent``, its model
  tracing included), at the widths ``--rebasin-hidden`` (``pip install fedlmc[bench]``).
  Its coordinate descent may end at another local optimum: both objectives are reported.

A last, untimed fedlmc run per width times its assignment solves alone, on the very matrices
the warm-started solver sees, against scipy and lapx's ``lapjvs`` (float64 kernel), split into
cold solves (a group's first) and warm ones (``solver_*``). With a CUDA GPU, fedlmc also runs
with the models on the GPU (``cuda_*``: cost matrices built there, assignments on the CPU);
without one the row says so. ``random_order`` is fedlmc's descent without the residual stream
moved to the front of its first sweep (the descent before issue 53; on an MLP, which has no
stream, the same path, checked: ``same_permutations_as_random_order``), timed in the same run
(``time_ratio_vs_random_order``). ``one_descent`` is ``restarts=1`` (on an MLP the default's own
path: no residual stream, one descent) and ``--before-rev REV`` adds ``before``, the
``weight_matching`` of git revision ``REV`` loaded beside this one (``time_ratio_vs_before``:
today's code against that revision's, same run).

``--vit-depths`` adds the ViT rows: a ViT of ``--vit-width`` trained as issue 53 says, a planted
random permutation of it (``--vit-permutations`` seeds) matched back from ``--vit-seeds``
matching seeds by both descents: how many restore the model bit for bit, and the median seconds.

    python benchmarks/weight_matching.py                       # widths 4 8 16 (hidden 512..2048)
    python benchmarks/weight_matching.py --widths 32 --repeats 3   # hidden 4096
    python benchmarks/weight_matching.py --widths 1 2 --epochs 1 --repeats 1   # quick run
    python benchmarks/weight_matching.py --widths --vit-depths 2 4 6   # ViT recovery only
    python benchmarks/weight_matching.py --widths 16 --before-rev main    # 2,048: vs main
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from machine import write_result
from scipy.optimize import linear_sum_assignment

from fedlmc.averaging import interpolate, load_state
from fedlmc.data.loading import load_dataset
from fedlmc.evaluation import evaluate
from fedlmc.models.classifiers import build_model
from fedlmc.permutation import (
    PermutationSpec,
    apply_permutation,
    permutation_spec,
    random_permutations,
)
from fedlmc.permutation import coordinate_descent as align
from fedlmc.permutation.accumulate import accumulate, dot64
from fedlmc.permutation.assignment import solve_assignment
from fedlmc.permutation.matching import matching_objective, weight_matching
from fedlmc.permutation.reference_matching import (
    reference_weight_matching as textbook_weight_matching,
)
from fedlmc.train import train_model

DEFAULT_OUT = Path(__file__).parent / "results" / "weight_matching.json"


# ----------------------------------------------------------------------------- reference


def reference_weight_matching(spec: PermutationSpec, sd_a, sd_b, seed: int = 0):
    """``(perms, sweeps)`` from the library's textbook descent
    (:func:`fedlmc.permutation.reference_matching.reference_weight_matching`), with float32 cost
    matrices as a user porting the published code to torch would write them."""
    matching = textbook_weight_matching(spec, sd_a, sd_b, seed=seed, dtype=torch.float32)
    return dict(matching), len(matching.objectives)


def lapjvs_solve(matrix: np.ndarray) -> np.ndarray | None:
    """Column of each row maximising ``matrix`` by lapx's ``lapjvs`` (float64 kernel), or
    ``None`` when lapx is not installed (``pip install fedlmc[bench]``)."""
    try:
        import lap
    except ImportError:
        return None
    reduced = matrix.max() - matrix  # lapjvs minimises; same assignment
    x, _y = lap.lapjvs(reduced, return_cost=False, jvx_like=False, prefer_float32=False)
    return np.asarray(x)


def solver_comparison(spec: PermutationSpec, sd_a, sd_b, seed: int = 0) -> dict:
    """Seconds of all assignment solves of one fedlmc run: warm-started vs scipy vs lapx's
    ``lapjvs``, on the very matrices the warm-started solver sees (cold: a group's first solve).

    Runs :func:`weight_matching` with its solves made sequential and, for every cost matrix it
    solves, also times ``scipy.optimize.linear_sum_assignment(cost, maximize=True)`` and
    ``lapjvs`` and checks that all reach the same value.
    """
    solve_warm, solve_run = align._solve_warm, align._solve_run
    totals = {"solves": 0, "max_value_gap": 0.0}
    for kind in ("cold", "warm"):
        totals.update({f"{kind}_solves": 0, f"{kind}_warm_seconds": 0.0})
        totals.update({f"{kind}_scipy_seconds": 0.0, f"{kind}_lapjvs_seconds": 0.0})

    def timed_solve(cost, warm):
        kind = "warm" if warm.prices.any() else "cold"
        start = time.perf_counter()
        columns, warm = solve_warm(cost, warm)
        warm_seconds = time.perf_counter() - start
        matrix = cost.double().cpu().numpy()  # scipy and lapjvs take float64 (copy not timed)
        start = time.perf_counter()
        rows, best = linear_sum_assignment(matrix, maximize=True)
        end = time.perf_counter()
        lapjvs_columns = lapjvs_solve(matrix)
        last = time.perf_counter()
        value = matrix[rows, best].sum()
        gaps = [value - matrix[rows, columns.numpy()].sum()]
        if lapjvs_columns is not None:
            gaps.append(value - matrix[rows, lapjvs_columns].sum())
            totals[f"{kind}_lapjvs_seconds"] += last - end
        else:
            totals[f"{kind}_lapjvs_seconds"] = float("nan")
        totals["solves"] += 1
        totals[f"{kind}_solves"] += 1
        totals[f"{kind}_warm_seconds"] += warm_seconds
        totals[f"{kind}_scipy_seconds"] += end - start
        totals["max_value_gap"] = max(totals["max_value_gap"], *(abs(float(g)) for g in gaps))
        return columns, warm

    align._solve_warm = timed_solve
    align._solve_run = lambda run, matrix, warm, blocks, pool: solve_run(
        run, matrix, warm, blocks, None
    )
    try:
        weight_matching(spec, sd_a, sd_b, seed=seed)
    finally:
        align._solve_warm, align._solve_run = solve_warm, solve_run
    for name in ("warm", "scipy", "lapjvs"):
        totals[f"{name}_seconds"] = totals[f"cold_{name}_seconds"] + totals[f"warm_{name}_seconds"]
    return totals


def rebasin_weight_matching(model_a, model_b, max_iter: int = 100):
    """``(permuted state of b, None)`` from the ``rebasin`` package (PyPI, a PyTorch port of
    Git Re-Basin): ``PermutationCoordinateDescent(a, b, x).rebasin()``, tracing included."""
    import copy

    from rebasin import PermutationCoordinateDescent

    model_b = copy.deepcopy(model_b)
    descent = PermutationCoordinateDescent(model_a, model_b, torch.zeros(1, 1, 28, 28))
    descent.rebasin(max_iterations=max_iter)
    return model_b.state_dict()


def fedlmc_weight_matching(spec: PermutationSpec, sd_a, sd_b, seed: int = 0):
    """``(perms, sweeps)`` from :func:`fedlmc.permutation.matching.weight_matching`."""
    matching = weight_matching(spec, sd_a, sd_b, seed=seed)
    return dict(matching), len(matching.objectives)


def one_descent_weight_matching(spec: PermutationSpec, sd_a, sd_b, seed: int = 0):
    """``(perms, sweeps)`` from :func:`weight_matching` with one descent (``restarts=1``): the
    descent without the restarts a spec with a residual stream gets by default."""
    matching = weight_matching(spec, sd_a, sd_b, seed=seed, restarts=1)
    return dict(matching), len(matching.objectives)


def module_at(rev: str):
    """``fedlmc.permutation.coordinate_descent`` as it is at git revision ``rev`` (loaded from
    ``git show``; its imports resolve to this tree's sibling modules)."""
    import importlib.util
    import subprocess
    import sys

    root = Path(__file__).parents[1]
    source = subprocess.run(
        ["git", "show", f"{rev}:fedlmc/permutation/coordinate_descent.py"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / f"coordinate_descent_{rev.replace('/', '_')}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"_before_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def before_weight_matching(module, spec: PermutationSpec, sd_a, sd_b, seed: int = 0):
    """``(perms, sweeps)`` from the ``weight_matching`` of ``module`` (:func:`module_at`)."""
    matching = module.weight_matching(spec, sd_a, sd_b, seed=seed)
    return dict(matching), len(matching.objectives)


def random_order_weight_matching(spec: PermutationSpec, sd_a, sd_b, seed: int = 0):
    """``(perms, sweeps)`` from one descent of :func:`weight_matching` with the residual stream
    not moved to the front of the first sweep (the descent before issue 53: every sweep in the
    seeded random order), for the before/after rows of the same run."""
    stream = align.residual_stream
    align.residual_stream = lambda spec, state_dict: None
    try:
        matching = weight_matching(spec, sd_a, sd_b, seed=seed, restarts=1)
        return dict(matching), len(matching.objectives)
    finally:
        align.residual_stream = stream


# ----------------------------------------------------------------------------- models


def trained_mlp(width: float, seed: int, epochs: int, data, cache: Path) -> torch.nn.Module:
    """An MLP trained on ``data`` from the initialisation ``seed`` draws (cached on disk by
    width/seed/epochs/size; ``seeded_`` in the name: files written before the initialisation
    was seeded are not read)."""
    torch.manual_seed(seed)
    model = build_model("mlp", width=width, in_shape=(1, 28, 28), norm="none")
    if epochs == 0:  # untrained: the seeded initialisation (feasibility runs at large widths)
        return model.eval()
    path = cache / f"seeded_mlp_w{width}_s{seed}_e{epochs}_n{len(data[1])}.pt"
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
    runs = {"fedlmc": lambda: fedlmc_weight_matching(spec, sd_a, sd_b, seed=args.seed)}
    runs["random_order"] = lambda: random_order_weight_matching(spec, sd_a, sd_b, seed=args.seed)
    runs["one_descent"] = lambda: one_descent_weight_matching(spec, sd_a, sd_b, seed=args.seed)
    if args.before is not None:
        module = args.before
        runs["before"] = lambda: before_weight_matching(module, spec, sd_a, sd_b, seed=args.seed)
    if hidden <= args.reference_max_hidden:
        runs["reference"] = lambda: reference_weight_matching(spec, sd_a, sd_b, seed=args.seed)
    if hidden in args.rebasin_hidden:
        runs["rebasin"] = lambda: (rebasin_weight_matching(model_a, model_b), None)
    timed_runs = timed_interleaved(runs, args.repeats)
    for name, timing in timed_runs.items():
        perms, sweeps = timing["result"]
        if name == "rebasin":  # the package permutes model b itself
            aligned, perms = perms, None
        else:
            aligned = apply_permutation(spec, perms, sd_b)
        merged = load_state(model_a, interpolate(sd_a, aligned, 0.5))
        row[f"{name}_seconds"] = statistics.median(timing["wall"])
        row[f"{name}_seconds_all"] = timing["wall"]
        row[f"{name}_cpu_seconds"] = statistics.median(timing["cpu"])
        row[f"{name}_cpu_seconds_all"] = timing["cpu"]
        row[f"{name}_sweeps"] = sweeps
        row[f"{name}_objective"] = matching_objective(spec, sd_a, aligned)
        row[f"{name}_merged_acc"] = evaluate(merged, splits.test)["accuracy"]
    if hidden <= args.solver_max_hidden:
        solves = solver_comparison(spec, sd_a, sd_b, seed=args.seed)
        row.update({f"solver_{key}": value for key, value in solves.items()})
    before = timed_runs["random_order"]["result"][0]
    after = timed_runs["fedlmc"]["result"][0]
    row["same_permutations_as_random_order"] = all(torch.equal(after[g], before[g]) for g in after)
    row["time_ratio_vs_random_order"] = row["fedlmc_seconds"] / row["random_order_seconds"]
    for name in ("one_descent", "before"):
        if name in runs:
            other = timed_runs[name]["result"][0]
            row[f"same_permutations_as_{name}"] = all(
                torch.equal(after[g], other[g]) for g in after
            )
            row[f"time_ratio_vs_{name}"] = row["fedlmc_seconds"] / row[f"{name}_seconds"]
            row[f"cpu_ratio_vs_{name}"] = row["fedlmc_cpu_seconds"] / row[f"{name}_cpu_seconds"]
    for name in ("reference", "rebasin"):
        if name in runs:
            row[f"speedup_vs_{name}"] = row[f"{name}_seconds"] / row["fedlmc_seconds"]
            row[f"speedup_cpu_vs_{name}"] = row[f"{name}_cpu_seconds"] / row["fedlmc_cpu_seconds"]
    row.update(cuda_path(spec, sd_a, sd_b, args))
    row["peak_rss_gib_so_far"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return row


# ----------------------------------------------------------------------------- ViT recovery

VIT_MATCHERS = {
    "random_order": random_order_weight_matching,
    "one_descent": one_descent_weight_matching,
    "fedlmc": fedlmc_weight_matching,
}
"""The descents the ViT rows compare: before issue 53 (one descent, random order), one descent
with the stream first, and the default (stream first, then restarts)."""


def trained_vit(depth: int, args, splits, cache: Path) -> torch.nn.Module:
    """A ViT of ``--vit-width`` trained as issue 53 says (AdamW, one-cycle lr 3e-3, weight decay
    0.05, batches of 32) on the first ``--vit-digits`` digits, cached on disk."""
    width, epochs, n = float(args.vit_width), args.vit_epochs, args.vit_digits
    path = cache / f"vit_w{width}_d{depth}_e{epochs}_n{n}_s0.pt"
    torch.manual_seed(0)
    model = build_model("vit", width=width, depth=depth)
    if path.exists():
        model.load_state_dict(torch.load(path, map_location="cpu"))
        return model.eval()
    x, y = splits.train
    common = {"lr": 3e-3, "weight_decay": 0.05, "batch_size": 32, "optimizer": "adamw"}
    train_model(model, (x[:n], y[:n]), epochs=epochs, seed=0, device="cpu", **common)
    torch.save(model.state_dict(), path)
    return model.eval()


def planted_recovery(spec: PermutationSpec, sd, args) -> dict:
    """Per matcher of :data:`VIT_MATCHERS`: how many (permutation seed, matching seed) pairs
    restore ``sd`` bit for bit from a planted random permutation of it, and the median
    seconds of one matching (the matchers alternate run by run)."""
    out = {name: {"recovered": 0, "runs": 0, "seconds": []} for name in VIT_MATCHERS}
    for permutation_seed in range(args.vit_permutations):
        planted = random_permutations(spec, sd, seed=permutation_seed)
        permuted = apply_permutation(spec, planted, sd)
        for seed in range(args.vit_seeds):
            for name, matcher in VIT_MATCHERS.items():
                start = time.perf_counter()
                perms, _sweeps = matcher(spec, sd, permuted, seed=seed)
                out[name]["seconds"].append(time.perf_counter() - start)
                restored = apply_permutation(spec, perms, permuted)
                out[name]["recovered"] += all(torch.equal(restored[k], sd[k]) for k in sd)
                out[name]["runs"] += 1
    return {
        f"{name}_{key}": statistics.median(value) if key == "seconds" else value
        for name, result in out.items()
        for key, value in result.items()
    }


def vit_recovery(args, splits, cache: Path) -> list[dict]:
    """One row per ``--vit-depths``: the trained ViT's accuracy and :func:`planted_recovery`."""
    rows = []
    for depth in args.vit_depths:
        model = trained_vit(depth, args, splits, cache)
        spec, sd = permutation_spec(model), model.state_dict()
        row = {"width": args.vit_width, "depth": depth}
        row["acc"] = evaluate(model, splits.test)["accuracy"]
        row.update(planted_recovery(spec, sd, args))
        rows.append(row)
        print(
            f"ViT width {args.vit_width} depth {depth}: planted permutation recovered "
            f"{row['random_order_recovered']}/{row['random_order_runs']} by one descent in "
            f"random order ({row['random_order_seconds']:.2f} s), "
            f"{row['one_descent_recovered']}/{row['one_descent_runs']} by one descent stream "
            f"first ({row['one_descent_seconds']:.2f} s), {row['fedlmc_recovered']}/"
            f"{row['fedlmc_runs']} by the default ({row['fedlmc_seconds']:.2f} s)",
            flush=True,
        )
    return rows


def cuda_path(spec: PermutationSpec, sd_a, sd_b, args) -> dict:
    """fedlmc weight matching with the models on CUDA (cost matrices built there, assignments
    on the CPU): median wall seconds and the objective; a note when no GPU is visible."""
    if not torch.cuda.is_available():
        return {"cuda_seconds": float("nan"), "cuda_note": "not run: no CUDA GPU visible"}
    cuda_a = {k: v.cuda() for k, v in sd_a.items()}
    cuda_b = {k: v.cuda() for k, v in sd_b.items()}
    weight_matching(spec, cuda_a, cuda_b, seed=args.seed)  # warm-up (CUDA context, kernels)
    times, perms = [], None
    for _ in range(args.repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        perms = dict(weight_matching(spec, cuda_a, cuda_b, seed=args.seed))
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return {
        "cuda_seconds": statistics.median(times),
        "cuda_seconds_all": times,
        "cuda_objective": matching_objective(spec, sd_a, sd_b, perms),
        "cuda_device": torch.cuda.get_device_name(0),
    }


def print_table(rows: list[dict]) -> None:
    print(
        f"{'hidden':>6} {'fedlmc s':>8} {'sweeps':>6} {'objective':>10} {'acc':>6} "
        f"{'reference s':>11} {'x':>6} {'rebasin s':>9} {'x':>6} {'rebasin J':>10} {'cuda s':>7}"
    )
    for r in rows:
        ref = r.get("reference_seconds", float("nan"))
        reb = r.get("rebasin_seconds", float("nan"))
        print(
            f"{r['hidden']:>6} {r['fedlmc_seconds']:>8.2f} {r['fedlmc_sweeps']:>6} "
            f"{r['fedlmc_objective']:>10.4f} {r['fedlmc_merged_acc']:>6.3f} {ref:>11.2f} "
            f"{r.get('speedup_vs_reference', float('nan')):>5.1f}x {reb:>9.2f} "
            f"{r.get('speedup_vs_rebasin', float('nan')):>5.1f}x "
            f"{r.get('rebasin_objective', float('nan')):>10.4f} {r['cuda_seconds']:>7.2f}"
        )
    print("\nassignment solves of one fedlmc run (sequential), the same matrices for each solver:")
    print(
        f"{'hidden':>6} {'solves':>6} {'cold':>4} {'warm-started s':>14} {'scipy s':>8} "
        f"{'lapjvs s':>8} {'cold: ours':>10} {'scipy':>6} {'lapjvs':>6} {'value gap':>9}"
    )
    for r in (r for r in rows if "solver_solves" in r):
        print(
            f"{r['hidden']:>6} {r['solver_solves']:>6} {r['solver_cold_solves']:>4} "
            f"{r['solver_warm_seconds']:>14.2f} {r['solver_scipy_seconds']:>8.2f} "
            f"{r['solver_lapjvs_seconds']:>8.2f} {r['solver_cold_warm_seconds']:>10.2f} "
            f"{r['solver_cold_scipy_seconds']:>6.2f} {r['solver_cold_lapjvs_seconds']:>6.2f} "
            f"{r['solver_max_value_gap']:>9.1e}"
        )


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--widths",
        type=float,
        nargs="*",
        default=[4.0, 8.0, 16.0],
        help="MLP width multipliers of 128 hidden units (default: 4 8 16; none: no MLP rows)",
    )
    parser.add_argument(
        "--vit-depths",
        type=int,
        nargs="*",
        default=[],
        help="ViT depths whose planted-permutation recovery is counted (e.g. 2 4 6)",
    )
    parser.add_argument("--vit-width", type=float, default=4.0, help="ViT width (default 4)")
    parser.add_argument("--vit-epochs", type=int, default=2, help="ViT training epochs")
    parser.add_argument("--vit-digits", type=int, default=3600, help="ViT training digits")
    parser.add_argument("--vit-permutations", type=int, default=4, help="planted permutations")
    parser.add_argument("--vit-seeds", type=int, default=5, help="matching seeds per permutation")
    parser.add_argument(
        "--epochs", type=int, default=5, help="training epochs per model (0: untrained models)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per matcher (median)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the group visiting order")
    parser.add_argument(
        "--before-rev",
        default=None,
        help="also time weight_matching as it is at this git revision (e.g. main): the "
        "'before' rows, in the same run",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    parser.add_argument(
        "--reference-max-hidden",
        type=int,
        default=2048,
        help="time the straightforward reference up to this width (it is slow beyond)",
    )
    parser.add_argument(
        "--solver-max-hidden",
        type=int,
        default=4096,
        help="compare the assignment solvers up to this width (scipy is slow beyond)",
    )
    parser.add_argument(
        "--rebasin-hidden",
        type=int,
        nargs="*",
        default=[2048],
        help="widths at which the rebasin package is timed (pip install fedlmc[bench])",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "fedlmc-bench-weight-matching",
        help="directory caching the trained models",
    )
    args = parser.parse_args(argv)
    args.before = None if args.before_rev is None else module_at(args.before_rev)
    if args.epochs < 0 or args.repeats < 1 or any(w <= 0 for w in args.widths):
        parser.error("--epochs must be >= 0 (0: untrained), --repeats >= 1, --widths > 0")
    return args


def jit_seconds() -> float:
    """Seconds to load (first time: compile) fedlmc's numba kernels: the assignment solver (float64
    and float32 matrices) and the float64 sums, by one tiny call each."""
    start = time.perf_counter()
    solve_assignment(np.eye(2))
    solve_assignment(np.eye(2, dtype=np.float32))
    accumulate(torch.zeros(2, 2, dtype=torch.float64), torch.ones(2, 2))
    dot64(torch.ones(2, 2), torch.ones(2, 2))
    return time.perf_counter() - start


def main(argv=None) -> None:
    from fedlmc.simulations.config.threads import usable_cores, use_threads

    args = parse_args(argv)
    use_threads(usable_cores())  # every core, whatever the shell's OMP_NUM_THREADS says
    args.cache.mkdir(parents=True, exist_ok=True)
    jit = jit_seconds()
    print(f"numba kernels loaded in {jit:.2f} s (not in the timings below)")
    splits = load_dataset("mnist5k")
    rows = []
    for width in args.widths:
        rows.append(benchmark_width(width, args, splits, args.cache))
        print(f"width {width}: done", flush=True)
    if rows:
        print_table(rows)
    vit_rows = vit_recovery(args, splits, args.cache)
    result = {
        "benchmark": "weight_matching",
        "dataset": "mnist5k (disjoint halves of the training split per model)",
        "model": "mlp, 3 hidden layers, norm none",
        "epochs": args.epochs,
        "repeats": args.repeats,
        "seed": args.seed,
        "torch_threads": torch.get_num_threads(),
        "note": "single-machine wall-clock measurements on a shared machine; medians of repeats",
        "cpu_count": os.cpu_count(),
        "jit_seconds": jit,
        "rows": rows,
        "vit_recovery": vit_rows,
    }
    write_result(args.out, result)


if __name__ == "__main__":
    main()
