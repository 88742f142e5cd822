"""Benchmark: weight matching of today's tree against a baseline revision, each run in a fresh
process, alternating, with the forward start, the ``rebasin`` package and the ``lapx`` solvers
beside it.

Two 3-hidden-layer MLPs trained on disjoint halves of the embedded digits (as
``benchmarks/weight_matching.py`` trains them, cached on disk) are matched at each ``--widths``
(hidden ``128 * width``). Every timed run is a new Python process that imports ``fedlmc`` from
one source tree (``after``: this tree; ``before``: ``git archive`` of ``--before-rev`` in a
temporary directory), loads the two models, loads the numba kernels (not timed) and times one
``weight_matching`` call with every core (wall and process CPU seconds); ``forward`` is this
tree's ``weight_matching(..., start="forward")`` (the forward start); the runs alternate
``before, after, forward[, rebasin]`` ``--repeats`` times, so that the machine's load falls on
all alike.
The load average is recorded before each run. ``rebasin`` (``PermutationCoordinateDescent``,
its model tracing included) runs at ``--rebasin-hidden`` (``pip install fedlmc[bench]``).

Reported per width: medians, every run, the permutations' equality between before and after
(group by group), the exact objective of each, the test accuracy of each matching's merge (the
midpoint of model a and the aligned model b, on the 1,000 test digits), and the ratios.
``--solver-hidden`` adds the assignment solvers on the very cost matrices today's descent
solves (its runs of independent groups, every ``--solver-stride``-th run): the warm-started
solver in use (the groups of a run one after the other, as the descent solves them in
threads) against lapx's batch solvers on the same stack of matrices (``lapjvs_batch`` with
its float64 and float32 kernels, ``lapjvx_batch``, both threads), each checked against the
warm-started value.

    python benchmarks/weight_matching_speed.py --widths 32 --repeats 3 --before-rev main
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from git_trees import exported_tree
from machine import machine_speed, write_result

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "weight_matching_speed.json"


# ----------------------------------------------------------------------------- child process


def child(args: argparse.Namespace) -> None:
    """One timed matching in this process, ``fedlmc`` imported from ``args.tree``; prints JSON."""
    sys.path.insert(0, str(args.tree))
    import numpy as np
    import torch

    from fedlmc.models.classifiers import build_model
    from fedlmc.permutation import apply_permutation, permutation_spec
    from fedlmc.permutation.matching import matching_objective, weight_matching

    torch.set_num_threads(os.cpu_count() or 1)
    models = []
    for path in (args.model_a, args.model_b):
        model = build_model("mlp", width=args.width, in_shape=(1, 28, 28), norm="none")
        model.load_state_dict(torch.load(path, map_location="cpu"))
        models.append(model.eval())
    spec = permutation_spec(models[0])
    sd_a, sd_b = models[0].state_dict(), models[1].state_dict()
    small = build_model("mlp", width=1 / 64, in_shape=(1, 28, 28), norm="none").state_dict()
    weight_matching(spec, small, small)  # loads the numba kernels (not timed)
    load = os.getloadavg()[0]
    wall, cpu = time.perf_counter(), time.process_time()
    if args.matcher == "rebasin":
        import copy

        from rebasin import PermutationCoordinateDescent

        model_b = copy.deepcopy(models[1])
        descent = PermutationCoordinateDescent(models[0], model_b, torch.zeros(1, 1, 28, 28))
        descent.rebasin(max_iterations=100)
        aligned, perms, sweeps = model_b.state_dict(), None, None
    else:
        start = {"start": "forward"} if args.matcher == "fedlmc-forward" else {}
        matching = weight_matching(spec, sd_a, sd_b, seed=0, **start)
        perms, sweeps = dict(matching), len(matching.objectives)
    seconds, cpu_seconds = time.perf_counter() - wall, time.process_time() - cpu
    if perms is not None:
        aligned = apply_permutation(spec, perms, sd_b)
        np.savez(args.perms_out, **{g: p.numpy() for g, p in perms.items()})
    digest = hashlib.sha256()
    for group in sorted(perms or {}):
        digest.update(perms[group].numpy().tobytes())
    result = {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "load_before": load,
        "sweeps": sweeps,
        "objective": matching_objective(spec, sd_a, aligned),
        "perms_sha256": digest.hexdigest() if perms is not None else None,
        "threads": torch.get_num_threads(),
    }
    print("RESULT " + json.dumps(result))


def run_child(tree: Path, matcher: str, width: float, models: tuple[Path, Path], perms_out: Path):
    """Run :func:`child` in a fresh interpreter; its JSON result."""
    command = [sys.executable, str(Path(__file__).resolve()), "child", "--tree", str(tree)]
    command += ["--matcher", matcher, "--width", str(width), "--perms-out", str(perms_out)]
    command += ["--model-a", str(models[0]), "--model-b", str(models[1])]
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # every core, as a user's process would
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir()
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{matcher} run in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


# ----------------------------------------------------------------------------- parent


def trained_models(width: float, cache: Path) -> tuple[Path, Path]:
    """Paths of the two cached trained MLPs (trained now when missing, as
    ``benchmarks/weight_matching.py`` trains them: 5 epochs, disjoint halves)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import weight_matching as wm

    from fedlmc.data.loading import load_dataset

    splits = load_dataset("mnist5k")
    x, y = splits.train
    half = len(y) // 2
    wm.trained_mlp(width, 0, 5, (x[:half], y[:half]), cache)
    wm.trained_mlp(width, 1, 5, (x[half:], y[half:]), cache)
    return tuple(cache / f"seeded_mlp_w{width}_s{s}_e5_n{half}.pt" for s in (0, 1))


NAMES = ("before", "after", "forward", "rebasin")
"""The matchers of a width, in the order each repeat runs them."""


def merged_accuracy(width: float, models: tuple[Path, Path], perms: Path) -> float:
    """Test accuracy of the midpoint of model a and model b aligned by ``perms`` (npz)."""
    import numpy as np
    import torch

    from fedlmc.averaging import interpolate, load_state
    from fedlmc.data.loading import load_dataset
    from fedlmc.evaluation import evaluate
    from fedlmc.models.classifiers import build_model
    from fedlmc.permutation import apply_permutation, permutation_spec

    loaded = []
    for path in models:
        model = build_model("mlp", width=width, in_shape=(1, 28, 28), norm="none")
        model.load_state_dict(torch.load(path, map_location="cpu"))
        loaded.append(model.eval())
    spec = permutation_spec(loaded[0])
    stored = np.load(perms)
    aligned = apply_permutation(
        spec, {g: torch.from_numpy(stored[g]) for g in stored.files}, loaded[1].state_dict()
    )
    merged = load_state(loaded[0], interpolate(loaded[0].state_dict(), aligned, 0.5))
    return float(evaluate(merged, load_dataset("mnist5k").test)["accuracy"])


def baseline_tree(rev: str) -> Path:
    """``git archive`` of ``rev`` unpacked in a temporary directory."""
    return exported_tree(rev, Path(tempfile.mkdtemp(prefix="wm-before-")))


def same_perms(first: Path, second: Path) -> bool:
    import numpy as np

    a, b = np.load(first), np.load(second)
    return sorted(a.files) == sorted(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)


def summary(runs: list[dict]) -> dict:
    return {
        "seconds": statistics.median(r["seconds"] for r in runs),
        "cpu_seconds": statistics.median(r["cpu_seconds"] for r in runs),
        "seconds_all": [r["seconds"] for r in runs],
        "cpu_seconds_all": [r["cpu_seconds"] for r in runs],
        "load_before_all": [r["load_before"] for r in runs],
        "sweeps": runs[-1]["sweeps"],
        "objective": runs[-1]["objective"],
        "objective_all": [r["objective"] for r in runs],
        "perms_sha256": runs[-1]["perms_sha256"],
    }


def benchmark_width(width: float, args, before: Path | None, scratch: Path) -> dict:
    models = trained_models(width, args.cache)
    hidden = int(128 * width)
    matchers = {"after": ROOT, "forward": ROOT}
    if before is not None:
        matchers["before"] = before
    if hidden in args.rebasin_hidden:
        matchers["rebasin"] = ROOT
    order = [m for m in NAMES if m in matchers]
    kinds = {"rebasin": "rebasin", "forward": "fedlmc-forward"}
    runs: dict[str, list[dict]] = {m: [] for m in order}
    for repeat in range(args.repeats):
        for name in order:
            out = scratch / f"{name}_{width}_{repeat}.npz"
            matcher = kinds.get(name, "fedlmc")
            runs[name].append(run_child(matchers[name], matcher, width, models, out))
            r = runs[name][-1]
            print(
                f"  hidden {hidden} {name:>7}: {r['seconds']:.2f} s wall, {r['cpu_seconds']:.2f} s "
                f"CPU, load {r['load_before']:.1f}, J {r['objective']:.4f}",
                flush=True,
            )
    row = {"width": width, "hidden": hidden}
    for name in order:
        row[name] = summary(runs[name])
        if name != "rebasin":  # the package permutes its own copy; its permutations are not kept
            last = scratch / f"{name}_{width}_{args.repeats - 1}.npz"  # as objective, sha
            row[name]["merged_acc"] = merged_accuracy(width, models, last)
    for name in ("before", "after"):
        if name in row:
            ratio = row["forward"]["seconds"] / row[name]["seconds"]
            row[f"time_ratio_forward_vs_{name}"] = ratio
            cpu = row["forward"]["cpu_seconds"] / row[name]["cpu_seconds"]
            row[f"cpu_ratio_forward_vs_{name}"] = cpu
    if "before" in runs:
        row["same_permutations"] = all(
            same_perms(scratch / f"before_{width}_{k}.npz", scratch / f"after_{width}_{k}.npz")
            for k in range(args.repeats)
        )
        row["time_ratio_after_vs_before"] = row["after"]["seconds"] / row["before"]["seconds"]
        cpu = row["after"]["cpu_seconds"] / row["before"]["cpu_seconds"]
        row["cpu_ratio_after_vs_before"] = cpu
    if "rebasin" in runs:
        for name in ("after", "forward"):
            suffix = "" if name == "after" else "_forward"
            wall = row["rebasin"]["seconds"] / row[name]["seconds"]
            row[f"speedup{suffix}_vs_rebasin"] = wall
            cpu = row["rebasin"]["cpu_seconds"] / row[name]["cpu_seconds"]
            row[f"speedup_cpu{suffix}_vs_rebasin"] = cpu
    if hidden in args.solver_hidden:
        row["solvers"] = solver_comparison(width, models, args.solver_stride)
    return row


def solver_comparison(width: float, models: tuple[Path, Path], stride: int) -> dict:
    """Seconds of the assignment solves of one descent of today's tree, every ``stride``-th run
    of independent groups: the warm-started solver against lapx's batch solvers on the same
    stacks of matrices (values checked against the warm-started solver's)."""
    import numpy as np
    import torch

    from fedlmc.models.classifiers import build_model
    from fedlmc.permutation import coordinate_descent as align
    from fedlmc.permutation import permutation_spec

    try:
        import lap
    except ImportError:
        return {"note": "lapx not installed (pip install fedlmc[bench])"}
    loaded = []
    for path in models:
        model = build_model("mlp", width=width, in_shape=(1, 28, 28), norm="none")
        model.load_state_dict(torch.load(path, map_location="cpu"))
        loaded.append(model.state_dict())
    spec = permutation_spec(build_model("mlp", width=width, in_shape=(1, 28, 28), norm="none"))

    def columns(pairs) -> list[np.ndarray]:
        """Column of each row from lapx's ``(rows, cols)`` lists."""
        return [cols[np.argsort(rows)] for rows, cols in zip(*pairs, strict=True)]

    solvers = {
        "lapjvs_batch_float64": lambda stack: columns(
            lap.lapjvs_batch(stack, return_cost=False, n_threads=2, prefer_float32=False)
        ),
        "lapjvs_batch_float32": lambda stack: columns(
            lap.lapjvs_batch(stack, return_cost=False, n_threads=2, prefer_float32=True)
        ),
        "lapjvx_batch": lambda stack: columns(
            lap.lapjvx_batch(stack, return_cost=False, n_threads=2)
        ),
    }
    totals = {"runs": 0, "solves": 0, "warm_started_seconds": 0.0}
    totals.update({f"{name}_seconds": 0.0 for name in solvers})
    totals.update({f"{name}_max_value_gap": 0.0 for name in solvers})
    solve_warm, solve_plain = align._solve_warm, align._solve_plain
    seen = [0]

    def timed_plain(groups, matrix, warm, pool):
        costs = [matrix(group) for group in groups]
        start = time.perf_counter()
        solved = []
        for group, cost in zip(groups, costs, strict=True):
            columns, warm[group] = solve_warm(cost, warm[group])
            solved.append((cost, columns))
        elapsed = time.perf_counter() - start
        seen[0] += 1
        if (seen[0] - 1) % stride:
            return solved
        totals["runs"] += 1
        totals["solves"] += len(groups)
        totals["warm_started_seconds"] += elapsed
        stack = np.stack([cost.double().numpy() for cost in costs])
        rows = np.arange(stack.shape[1])
        best = [
            float(c[rows, cols.numpy()].sum()) for c, (_, cols) in zip(stack, solved, strict=True)
        ]
        minimise = stack.max(axis=(1, 2), keepdims=True) - stack  # lapx minimises
        for name, solve in solvers.items():
            start = time.perf_counter()
            found = solve(minimise)
            totals[f"{name}_seconds"] += time.perf_counter() - start
            for c, cols, value in zip(stack, found, best, strict=True):
                gap = abs(value - float(c[np.arange(len(c)), np.asarray(cols)].sum()))
                totals[f"{name}_max_value_gap"] = max(totals[f"{name}_max_value_gap"], gap)
        return solved

    align._solve_plain = timed_plain
    try:
        align.weight_matching(spec, loaded[0], loaded[1], seed=0)
    finally:
        align._solve_plain = solve_plain
    return totals


def print_table(rows: list[dict]) -> None:
    for r in rows:
        print(f"\nhidden {r['hidden']}:")
        for name in NAMES:
            if name in r:
                s = r[name]
                each = ", ".join(f"{x:.2f}" for x in s["seconds_all"])
                loads = ", ".join(f"{x:.1f}" for x in s["load_before_all"])
                acc = f", merged acc {s['merged_acc']:.4f}" if "merged_acc" in s else ""
                print(
                    f"  {name:>7}: median {s['seconds']:.2f} s wall ({each}), "
                    f"{s['cpu_seconds']:.2f} s CPU, J {s['objective']:.4f}{acc}, loads {loads}"
                )
        for name in ("before", "after"):
            if f"time_ratio_forward_vs_{name}" in r:
                wall, cpu = r[f"time_ratio_forward_vs_{name}"], r[f"cpu_ratio_forward_vs_{name}"]
                print(f"  forward/{name}: wall {wall:.3f}, CPU {cpu:.3f}")
        if "same_permutations" in r:
            print(
                f"  after/before: wall {r['time_ratio_after_vs_before']:.3f}, CPU "
                f"{r['cpu_ratio_after_vs_before']:.3f}; same permutations: {r['same_permutations']}"
            )
        for suffix, name in (("", "after"), ("_forward", "forward")):
            if f"speedup{suffix}_vs_rebasin" in r:
                wall, cpu = r[f"speedup{suffix}_vs_rebasin"], r[f"speedup_cpu{suffix}_vs_rebasin"]
                print(f"  rebasin/{name}: wall {wall:.2f}x, CPU {cpu:.2f}x")
        if "solvers" in r:
            print(f"  solvers: {json.dumps(r['solvers'])}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    kid = sub.add_parser("child", help="(internal) one timed run in this process")
    kid.add_argument("--tree", type=Path, required=True)
    kid.add_argument("--matcher", choices=["fedlmc", "fedlmc-forward", "rebasin"], required=True)
    kid.add_argument("--width", type=float, required=True)
    kid.add_argument("--model-a", type=Path, required=True)
    kid.add_argument("--model-b", type=Path, required=True)
    kid.add_argument("--perms-out", type=Path, required=True)
    parser.add_argument("--widths", type=float, nargs="+", default=[16.0, 32.0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before-rev", default=None, help="baseline git revision (e.g. main)")
    parser.add_argument("--rebasin-hidden", type=int, nargs="*", default=[2048])
    parser.add_argument("--solver-hidden", type=int, nargs="*", default=[])
    parser.add_argument("--solver-stride", type=int, default=1, help="every k-th run of solves")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "fedlmc-bench-weight-matching",
        help="directory caching the trained models",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.command is None:
        if args.repeats < 1 or args.solver_stride < 1 or any(w <= 0 for w in args.widths):
            parser.error(
                f"--repeats and --solver-stride must be >= 1 and --widths > 0, got "
                f"{args.repeats}, {args.solver_stride}, {args.widths}"
            )
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.command == "child":
        child(args)
        return
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    args.cache.mkdir(parents=True, exist_ok=True)
    before = baseline_tree(args.before_rev) if args.before_rev else None
    scratch = Path(tempfile.mkdtemp(prefix="wm-speed-"))
    machine_before = machine_speed()
    try:
        rows = [benchmark_width(width, args, before, scratch) for width in args.widths]
    finally:  # the permutations and the exported baseline tree are this run's scratch
        shutil.rmtree(scratch, ignore_errors=True)
        if before is not None:
            shutil.rmtree(before, ignore_errors=True)
    print_table(rows)
    result = {
        "benchmark": "weight_matching_speed",
        "model": "mlp, 3 hidden layers, norm none, mnist5k disjoint halves, 5 epochs",
        "before_rev": args.before_rev,
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
        "note": "each run a fresh process; runs alternate; medians; shared machine: see loads; "
        "forward: this tree's weight_matching(start='forward')",
        "machine_before": machine_before,
        "machine_after": machine_speed(),
        "rows": rows,
    }
    write_result(args.out, result)


if __name__ == "__main__":
    main()
