"""Benchmark: ``fedlmc report`` of one sweep folder, this tree against a git revision.

Each run is a fresh Python process with one tree first on the path (``git archive`` of
``--baseline-ref`` for ``old``, this checkout for ``new``); it builds the report of
``SWEEP_DIR`` into a folder of its own and reports the wall and CPU seconds of the
``report`` command (imports included, as a user's command pays them). Each tree first
builds one report untimed, which also writes its bytecode caches (the processes write them
whatever the shell's ``PYTHONDONTWRITEBYTECODE``), so that neither side pays for compiling.
The timed runs alternate ``old, new, new, old, ...`` ``--repeats`` times each, so that the
machine's load falls on both alike; the medians and every run go to the JSON, with the
commit of this checkout. Every report must be the same: ``report.md``, ``report_full.md``
and every figure compared byte for byte with the first one (the script exits non-zero
otherwise).

    fedlmc sweep configs/quick.toml --out /tmp/quick
    python benchmarks/report_cost.py /tmp/quick --baseline-ref main --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from git_trees import exported_tree

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "report_cost.json"
CHILD = """
import contextlib, io, json, sys, time
wall, cpu = time.perf_counter(), time.process_time()
from fedlmc.simulations.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    code = main(["report", sys.argv[1], "--to", sys.argv[2]])
print(json.dumps({"code": code, "seconds": time.perf_counter() - wall,
                  "cpu_seconds": time.process_time() - cpu}))
"""


def timed_report(tree: Path, sweep: Path, out: Path) -> dict:
    """One ``fedlmc report`` of ``sweep`` into ``out`` in a fresh process importing ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree), "MPLBACKEND": "Agg"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # both trees run from their bytecode caches
    command = [sys.executable, "-c", CHILD, str(sweep), str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tree)
    if done.returncode != 0:
        raise RuntimeError(f"report with {tree} failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["code"] != 0:
        raise RuntimeError(f"report with {tree} exited {result['code']}:\n{done.stderr[-4000:]}")
    return result


def checkout_commit() -> str:
    """This checkout's commit, with ``+changes`` when its tracked files differ from it."""
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    dirty = subprocess.run([*git, "diff", "--quiet", "HEAD"]).returncode != 0
    return commit.strip() + ("+changes" if dirty else "")


def written(folder: Path) -> dict[str, bytes]:
    """Every file a report wrote under ``folder``, by relative path."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", type=Path, help="a sweep's out dir (its results.csv)")
    parser.add_argument("--baseline-ref", required=True, help="git ref of the old tree")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each tree (default 3)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args(argv)
    if args.repeats < 1 or not (args.sweep / "results.csv").is_file():
        parser.error(
            f"sweep {str(args.sweep)!r}, --repeats {args.repeats}; "
            "allowed: a folder holding results.csv, --repeats >= 1"
        )
    if not args.json.parent.is_dir():
        parser.error(f"--json {str(args.json)!r}: its folder does not exist")
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    outputs: dict[str, list[dict[str, bytes]]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as scratch:
        try:
            old_tree = exported_tree(args.baseline_ref, Path(scratch) / "old")
        except subprocess.CalledProcessError as error:
            parser.error(f"--baseline-ref {args.baseline_ref!r}: {error.stderr.decode().strip()}")
        trees = {"old": old_tree, "new": ROOT}
        for side, tree in trees.items():  # untimed: imports cached, bytecode written
            timed_report(tree, args.sweep.resolve(), Path(scratch) / f"{side}-warm-up")
        order = [("old", "new") if i % 2 == 0 else ("new", "old") for i in range(args.repeats)]
        for i, pair in enumerate(order):
            for side in pair:
                out = Path(scratch) / f"{side}-{i}"
                runs[side].append(timed_report(trees[side], args.sweep.resolve(), out))
                outputs[side].append(written(out))
                print(f"{side}: {runs[side][-1]['seconds']:.2f} s", flush=True)
    first = outputs["old"][0]
    same = all(output == first for side in outputs for output in outputs[side])
    table = {}
    for measure in ("seconds", "cpu_seconds"):
        old, new = (statistics.median(r[measure] for r in runs[side]) for side in runs)
        table[measure] = {"old_median": old, "new_median": new, "ratio": new / old}
        print(f"{measure:<12} old {old:7.2f}  new {new:7.2f}  new / old {new / old:5.2f}")
    print(f"{len(first)} files written; the same bytes in every report: {same}")
    record = {
        "sweep": str(args.sweep),
        "baseline_ref": args.baseline_ref,
        "new_commit": checkout_commit(),
        "repeats": args.repeats,
        "files": sorted(first),
        "same_files": same,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
        "medians": table,
        "runs": runs,
    }
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    if not same:
        sys.exit("the two trees wrote different reports")


if __name__ == "__main__":
    main()
