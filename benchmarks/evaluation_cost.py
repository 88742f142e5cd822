"""What evaluating one sweep cell costs against training it: ``compare_methods`` before and after
the shared forward passes, on the same two trained clients, in the same run.

The cell is the quick sweep's widest (``configs/quick.toml`` at width 8 = 1,024 hidden units,
bias-free, seed 0: two clients of 1,800 digits, 12 epochs; every method of the sweep, 11 path
points, diagnostics on). The script

1. trains the cell's two clients once, timed (wall and CPU seconds), and keeps their weights;
2. evaluates them with :func:`fedlmc.study.compare_methods` the old way and the new way, each in
   a fresh process with the same harness (this file's ``worker`` sub-command): **old** is the
   package at ``--baseline-ref`` (default: main before the change, extracted with ``git
   archive``), **new** is this tree; each worker makes a first call, the same as the timed
   ones (imports, compiled kernels, the allocator's first growth: recorded apart as
   ``first_call_seconds``), and then ``--repeats`` timed calls, what a sweep's server pays per
   cell after its first; the two alternate, old first then new first;
3. prints the medians, the ratios new / old and evaluation / training, and the largest absolute
   difference of every column of the rows (numbers, and the numbers inside the JSON columns)
   between old and new, and writes everything to ``--json``.

Every process computes with ``--threads`` threads (torch's pools and every BLAS pool,
:func:`fedlmc.simulations.config.threads.use_threads`), set here, not read from the shell.
Single-machine measurements: on a shared machine other jobs stretch the wall times, so the
figures to read are the ratios within this run (and the CPU seconds).

    python benchmarks/evaluation_cost.py                   # ~1 min quiet on 2 cores
    python benchmarks/evaluation_cost.py --repeats 1 --unshared
    python benchmarks/evaluation_cost.py results results/quick-before results/quick-after

The ``results`` sub-command compares two sweeps' ``results.csv`` value by value (the quick
sweep run before and after a change), every column but timings and byte counts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from git_trees import exported_tree

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "evaluation_cost.json"
QUICK = ROOT / "configs" / "quick.toml"
CELL = ("width=[8]", "bias=[false]", "seed=[0]")
BASELINE_REF = "490b538"  # main before the shared forward passes
VOLATILE = ("merge_seconds",)


# ----------------------------------------------------------------------------- in every process


def cell(threads: int, extra: Sequence[str] = ()) -> tuple[dict, Any]:
    """The cell's run config (``extra`` overrides after the cell's) and data splits, after
    fixing the thread count."""
    from fedlmc.simulations.config.threads import use_threads

    use_threads(threads)
    from fedlmc.simulations.config import expand_grid, load_sweep_config
    from fedlmc.simulations.task import load_splits

    overrides = (*CELL, *extra)
    configs = expand_grid(load_sweep_config(QUICK, overrides))
    if len(configs) != 1:
        raise RuntimeError(f"the overrides {overrides} give {len(configs)} cells, not 1")
    return configs[0], load_splits(configs[0])


def train(config: dict, splits: Any) -> tuple[list[dict], list[float]]:
    """The cell's clients, as the sweep trains them (same seeds, same data)."""
    from fedlmc.simulations.task import (
        build_from_config,
        client_data,
        client_seed,
        device_of,
        train_options,
    )
    from fedlmc.train import train_model

    count = config["num-clients"]
    states, weights = [], []
    for pid in range(count):
        data = client_data(config, pid, count)
        model = build_from_config(config, splits, seed=client_seed(config["seed"], pid))
        model, _ = train_model(
            model,
            data,
            **train_options(config),
            seed=client_seed(config["seed"], pid, 1),
            device=device_of(config),
            augment=splits.augment,
        )
        states.append({k: v.detach().cpu().clone() for k, v in model.state_dict().items()})
        weights.append(float(len(data[1])))
    return states, weights


def evaluate(config: dict, splits: Any, states, weights, **options: Any) -> list[dict]:
    """The cell's rows: what the ServerApp's ``compare`` strategy computes."""
    from fedlmc.simulations.config import FEDAVG, method_list
    from fedlmc.simulations.task import build_from_config, device_of
    from fedlmc.study.compare import compare_methods

    methods = [m for m in method_list(config) if m != FEDAVG]
    return compare_methods(
        build_from_config(config, splits),
        states,
        weights,
        splits,
        methods,
        lambdas=config["lambdas"],
        seed=config["seed"],
        device=device_of(config),
        **{"diagnostics": config["diagnostics"], **options},
    ).rows


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def since(start: tuple[float, float]) -> dict[str, float]:
    wall, cpu = clocks()
    return {"wall": wall - start[0], "cpu": cpu - start[1]}


def worker(args: argparse.Namespace) -> None:
    """``worker`` sub-command: one first call (timed apart), then ``--repeats`` timed calls of
    ``compare_methods`` on the clients in ``--clients``; rows and times to ``--out``."""
    import torch

    import fedlmc

    config, splits = cell(args.threads, args.set)
    states, weights = torch.load(args.clients)
    options = {"share_forwards": False} if args.unshared else {}
    start = clocks()
    evaluate(config, splits, states, weights, **options)  # the process's first: warms it up
    first = since(start)
    times, rows = [], []
    for _ in range(args.repeats):
        start = clocks()
        rows = evaluate(config, splits, states, weights, **options)
        times.append(since(start))
    # JSON, not pickle: the parent reads only data (floats round-trip exactly, NaN included)
    record = {"package": fedlmc.__file__, "first": first, "times": times, "rows": rows}
    Path(args.out).write_text(json.dumps(record))


# ----------------------------------------------------------------------------- the comparison


def run_worker(tree: Path, clients: Path, out: Path, args: argparse.Namespace, *extra: str):
    """This file's ``worker`` sub-command with ``tree`` first on the import path."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(Path(__file__).resolve()), "worker", "--clients", str(clients)]
    command += ["--out", str(out), "--repeats", "1", "--threads", str(args.threads), *extra]
    command += [f"--set={item}" for item in args.set]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tree)
    if done.returncode != 0:
        raise RuntimeError(f"worker in {tree} failed:\n{done.stderr[-4000:]}")
    return json.loads(out.read_text())


def numbers(value: Any) -> list[float] | None:
    """The numbers of a row value: a number, or a JSON list or dict of them (flattened)."""
    if isinstance(value, bool):
        return [float(value)]
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, str) and value[:1] in "[{":
        try:
            parsed = json.loads(value)
        except ValueError:
            return None
        flat: list[float] = []
        stack = [parsed]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
            elif isinstance(item, int | float):
                flat.append(float(item))
            else:
                return None
        return flat
    return None


def differences(old: Sequence[dict], new: Sequence[dict]) -> dict[str, Any]:
    """Per column (timings aside) the largest absolute difference between old and new rows of
    the same method; text that is not numbers must be equal."""
    by_method = {row["method"]: row for row in new}
    per_column: dict[str, float] = {}
    unequal_text: list[str] = []
    for row in old:
        other = by_method.get(row["method"])
        if other is None:
            unequal_text.append(f"method {row['method']} missing")
            continue
        for column, value in row.items():
            if column in VOLATILE or column not in other:
                continue
            a, b = numbers(value), numbers(other[column])
            if a is None or b is None or len(a) != len(b):
                if value != other[column]:
                    unequal_text.append(f"{row['method']}.{column}")
                continue
            worst = 0.0
            for x, y in zip(a, b, strict=True):
                if math.isnan(x) and math.isnan(y):
                    continue
                worst = max(worst, abs(x - y) if not (math.isnan(x) or math.isnan(y)) else math.inf)
            per_column[column] = max(per_column.get(column, 0.0), worst)
    return {
        "methods": [row["method"] for row in old],
        "columns_compared": len(per_column),
        "max_abs_difference": max(per_column.values(), default=0.0),
        "columns_differing": {c: v for c, v in sorted(per_column.items()) if v > 0},
        "text_differing": unequal_text,
    }


def results_main(args: argparse.Namespace) -> None:
    """``results`` sub-command: two sweep folders' ``results.csv`` row by row (cell and
    method), every column but timings and byte counts; the largest absolute differences."""
    from fedlmc.simulations.records.results_file import read_results

    frames = [read_results(folder) for folder in (args.before, args.after)]
    rows = [
        {(r["cell_id"], r["method"]): r for r in frame.to_dict("records") if r["status"] == "ok"}
        for frame in frames
    ]
    keys = sorted(set(rows[0]) & set(rows[1]))
    found = differences(
        [_without_timings({**rows[0][k], "method": k}) for k in keys],
        [_without_timings({**rows[1][k], "method": k}) for k in keys],
    )
    found.pop("methods")
    found |= {"rows_before": len(rows[0]), "rows_after": len(rows[1]), "rows_compared": len(keys)}
    print(json.dumps(found, indent=2))
    if args.json is not None:
        args.json.write_text(json.dumps(found, indent=2) + "\n")


def _without_timings(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if "seconds" not in k and "bytes" not in k}


def median(times: Sequence[dict[str, float]], clock: str) -> float:
    return statistics.median(t[clock] for t in times)


def medians(timed: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per variant, the median wall and CPU seconds of its timed calls."""
    return {
        name: {clock: median(times, clock) for clock in ("wall", "cpu")}
        for name, times in timed.items()
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    work = sub.add_parser("worker", help="(internal) time compare_methods in this process")
    work.add_argument("--clients", required=True)
    work.add_argument("--out", required=True)
    work.add_argument("--repeats", type=int, default=1)
    work.add_argument("--threads", type=int, default=1)
    work.add_argument("--unshared", action="store_true")
    work.add_argument("--set", action="append", default=[])
    compare = sub.add_parser("results", help="two sweep folders' results.csv, value by value")
    compare.add_argument("before", type=Path)
    compare.add_argument("after", type=Path)
    compare.add_argument("--json", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=3, help="timed calls of each (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="threads of every process")
    parser.add_argument("--baseline-ref", default=BASELINE_REF, help="git ref of the old way")
    parser.add_argument(
        "--unshared", action="store_true", help="also time this tree with share_forwards=False"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override after the cell's (e.g. --set epochs=1 for a check of the script)",
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    if args.command == "worker":
        worker(args)
        return
    if args.command == "results":
        results_main(args)
        return
    if args.repeats < 1 or args.threads < 1:
        parser.error(f"--repeats {args.repeats}, --threads {args.threads}; allowed: >= 1")

    import torch

    load_before = os.getloadavg()
    config, splits = cell(args.threads, args.set)
    start = clocks()
    states, weights = train(config, splits)
    training = since(start)
    print(f"training: {training['wall']:.1f} s wall, {training['cpu']:.1f} s CPU")
    variants = {"old": [], "new": []} | ({"new_unshared": []} if args.unshared else {})
    firsts: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    rows: dict[str, list[dict]] = {}
    packages: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        clients = Path(tmp) / "clients.pt"
        torch.save((states, weights), clients)
        trees = {"old": exported_tree(args.baseline_ref, Path(tempfile.mkdtemp(dir=tmp)))}
        trees |= {"new": ROOT, "new_unshared": ROOT}
        for repeat in range(args.repeats):
            order = list(variants) if repeat % 2 == 0 else list(reversed(variants))
            for name in order:
                extra = ("--unshared",) if name == "new_unshared" else ()
                found = run_worker(trees[name], clients, Path(tmp) / f"{name}.json", args, *extra)
                variants[name].extend(found["times"])
                firsts[name].append(found["first"])
                rows[name] = found["rows"]
                packages[name] = found["package"]
                last = found["times"][-1]
                print(f"  {name}: {last['wall']:.2f} s wall, {last['cpu']:.2f} s CPU")
    result = summary(args, config, training, variants, firsts, rows, load_before)
    result["packages"] = packages
    print_summary(result)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")


def summary(args, config, training, variants, firsts, rows, load_before) -> dict[str, Any]:
    import torch

    typical = medians(variants)
    ratios = {
        clock: {
            "new_over_old": typical["new"][clock] / typical["old"][clock],
            "old_over_training": typical["old"][clock] / training[clock],
            "new_over_training": typical["new"][clock] / training[clock],
        }
        for clock in ("wall", "cpu")
    }
    compared = {"old_vs_new": differences(rows["old"], rows["new"])}
    if "new_unshared" in rows:
        compared["new_unshared_vs_new"] = differences(rows["new_unshared"], rows["new"])
    return {
        "cell": {"config": str(QUICK.relative_to(ROOT)), "overrides": [*CELL, *args.set]},
        "hidden_units": int(config["base-hidden"] * config["width"]),
        "methods": compared["old_vs_new"]["methods"],
        "lambdas": config["lambdas"],
        "threads": args.threads,
        "baseline_ref": args.baseline_ref,
        "repeats": args.repeats,
        "training_seconds": training,
        "evaluation_seconds": variants,
        "evaluation_median_seconds": typical,
        "first_call_seconds": firsts,
        "first_call_median_seconds": medians(firsts),
        "ratios": ratios,
        "rows": compared,
        "load_average_before": list(load_before),
        "load_average_after": list(os.getloadavg()),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
    }


def print_summary(result: dict[str, Any]) -> None:
    train = result["training_seconds"]
    print(f"\ntraining the 2 clients: {train['wall']:.2f} s wall, {train['cpu']:.2f} s CPU")
    for name, found in result["evaluation_median_seconds"].items():
        print(f"compare_methods {name:>12}: {found['wall']:.2f} s wall, {found['cpu']:.2f} s CPU")
    for name, found in result["first_call_median_seconds"].items():
        share = found["wall"] / train["wall"]
        print(f"  first call {name:>12}: {found['wall']:.2f} s wall ({share:.3f} of training)")
    for clock, ratio in result["ratios"].items():
        print(
            f"{clock:>4}: new/old {ratio['new_over_old']:.3f}, old/training "
            f"{ratio['old_over_training']:.3f}, new/training {ratio['new_over_training']:.3f}"
        )
    for name, found in result["rows"].items():
        text = found["text_differing"] or "none"
        print(
            f"rows {name}: {found['columns_compared']} columns, max |difference| "
            f"{found['max_abs_difference']:.3g}; text differing: {text}"
        )
        for column, value in found["columns_differing"].items():
            print(f"    {column}: {value:.3g}")


if __name__ == "__main__":
    main()
