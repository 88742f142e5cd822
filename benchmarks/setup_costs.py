"""What a sweep pays before its first cell trains, this tree against a git revision, in the
same run: expanding every shipped config into its cells (validation, canonical configs and
cell ids: what ``fedlmc sweep`` and ``fedlmc validate`` do first) and splitting 5,000 labels over
4 clients with each partition scheme (what every client does before it trains).

Each measurement is a fresh process (this file's ``worker`` sub-command) with the tree first on
the import path, one thread, the two trees alternating (old first, then new first); the
workers also return what they computed (every cell id, every part's indices as a SHA-256), and
the script checks that both trees computed the same. Both trees expand this tree's
``configs/*.toml``.

    python benchmarks/setup_costs.py --baseline-ref 2804e0e --repeats 5

Prints the medians and ratios and writes ``--json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from git_trees import exported_tree

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "setup_costs.json"
SCHEMES = ("iid", "dirichlet", "pathological", "shard")
LABELS, CLIENTS = 5_000, 4


def worker(args: argparse.Namespace) -> None:
    """Time the expansion of every config (``expand_grid``: its cells validated and canonical)
    and each scheme's split, ``--repeats`` times each after one untimed call (imports); write
    the times and what they computed (the cells' ids, the parts' hashes) to ``--out``."""
    import numpy as np

    import fedlmc
    from fedlmc.data.partitions import partition_indices
    from fedlmc.simulations.config import cell_id, expand_grid, load_sweep_config

    configs = sorted(Path(args.configs).glob("*.toml"))

    def expand() -> list[dict]:
        sweeps = [load_sweep_config(path, check_devices=False) for path in configs]
        return [cell for sweep in sweeps for cell in expand_grid(sweep)]

    labels = np.random.default_rng(0).integers(0, 10, LABELS)

    def split(scheme: str) -> list[str]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            parts = partition_indices(labels, CLIENTS, scheme, alpha=0.5, seed=1)
        return [hashlib.sha256(p.tobytes()).hexdigest() for p in parts]

    tasks = {"expand configs": expand} | {f"split {s}": (lambda s=s: split(s)) for s in SCHEMES}
    record: dict = {"package": fedlmc.__file__, "times": {}, "computed": {}}
    for name, task in tasks.items():
        first = task()  # untimed (imports); what it computed, for the comparison
        record["computed"][name] = (
            [cell_id(c) for c in first] if name == "expand configs" else first
        )
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            task()
            times.append(time.perf_counter() - start)
        record["times"][name] = times
    Path(args.out).write_text(json.dumps(record))


def run_worker(tree: Path, out: Path, repeats: int) -> dict:
    """This file's ``worker`` in a fresh one-thread process with ``tree`` first on the path."""
    threads = {v: "1" for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    env = {**os.environ, "PYTHONPATH": str(tree), **threads}
    command = [sys.executable, str(Path(__file__).resolve()), "worker", "--out", str(out)]
    command += ["--repeats", str(repeats), "--configs", str(ROOT / "configs")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tree)
    if done.returncode != 0:
        raise RuntimeError(f"worker in {tree} failed:\n{done.stderr[-4000:]}")
    return json.loads(out.read_text())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    work = sub.add_parser("worker", help="(internal) time the setup steps in this process")
    work.add_argument("--out", required=True)
    work.add_argument("--repeats", type=int, default=5)
    work.add_argument("--configs", required=True)
    parser.add_argument("--baseline-ref", required=False, help="git ref of the old tree")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls of each (default 5)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    if args.command == "worker":
        worker(args)
        return
    if not args.baseline_ref or args.repeats < 1:
        parser.error(
            f"--baseline-ref {args.baseline_ref!r}, --repeats {args.repeats}; "
            "allowed: a git ref, --repeats >= 1"
        )
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"old": exported_tree(args.baseline_ref, Path(scratch) / "old"), "new": ROOT}
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        for order in (("old", "new"), ("new", "old")):
            for side in order:
                runs[side].append(run_worker(trees[side], Path(scratch) / "out.json", args.repeats))
    packages = {side: {r["package"] for r in runs[side]} for side in runs}
    print(f"old: {', '.join(packages['old'])}; new: {', '.join(packages['new'])}")
    same = all(r["computed"] == runs["old"][0]["computed"] for side in runs for r in runs[side])
    table = {}
    print(f"{'step':<20} {'old s':>9} {'new s':>9} {'new / old':>9}")
    for name in runs["new"][0]["times"]:
        old, new = (statistics.median(t for r in runs[s] for t in r["times"][name]) for s in runs)
        table[name] = {"old_median_seconds": old, "new_median_seconds": new, "ratio": new / old}
        print(f"{name:<20} {old:9.4f} {new:9.4f} {new / old:9.2f}")
    cells = len(runs["new"][0]["computed"]["expand configs"])
    print(f"{cells} cells; both trees computed the same ids and parts: {same}")
    record = {
        "baseline_ref": args.baseline_ref,
        "repeats": args.repeats,
        "cells": cells,
        "same_results": same,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "steps": table,
    }
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    if not same:
        sys.exit("the two trees computed different cell ids or parts")


if __name__ == "__main__":
    main()
