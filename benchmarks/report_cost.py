"""Benchmark: ``fedlmc report`` of one sweep folder, this tree against a git revision.

Each run is a fresh Python process with one tree first on the path (``git archive`` of
``--baseline-ref`` for ``old``, this checkout for ``new``); it builds the report of
``SWEEP_DIR`` into a folder of its own and reports the wall and CPU seconds of the
``report`` command (imports included, as a user's command pays them). The runs alternate
``old, new, new, old, ...`` ``--repeats`` times each, so that the machine's load falls on
both alike; the medians and every run go to the JSON. Both trees must write the same report:
``report.md``, ``report_full.md`` and every figure compared byte for byte (the script exits
non-zero otherwise).

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
    command = [sys.executable, "-c", CHILD, str(sweep), str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=tree)
    if done.returncode != 0:
        raise RuntimeError(f"report with {tree} failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["code"] != 0:
        raise RuntimeError(f"report with {tree} exited {result['code']}:\n{done.stderr[-4000:]}")
    return result


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
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    outputs: dict[str, dict[str, bytes]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        trees = {"old": exported_tree(args.baseline_ref, Path(scratch) / "old"), "new": ROOT}
        order = [("old", "new") if i % 2 == 0 else ("new", "old") for i in range(args.repeats)]
        for i, pair in enumerate(order):
            for side in pair:
                out = Path(scratch) / f"{side}-{i}"
                runs[side].append(timed_report(trees[side], args.sweep.resolve(), out))
                outputs.setdefault(side, written(out))
                print(f"{side}: {runs[side][-1]['seconds']:.2f} s", flush=True)
    same = outputs["old"] == outputs["new"]
    table = {}
    for measure in ("seconds", "cpu_seconds"):
        old, new = (statistics.median(r[measure] for r in runs[side]) for side in runs)
        table[measure] = {"old_median": old, "new_median": new, "ratio": new / old}
        print(f"{measure:<12} old {old:7.2f}  new {new:7.2f}  new / old {new / old:5.2f}")
    print(f"{len(outputs['new'])} files written; the same bytes from both trees: {same}")
    record = {
        "sweep": str(args.sweep),
        "baseline_ref": args.baseline_ref,
        "repeats": args.repeats,
        "files": sorted(outputs["new"]),
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
