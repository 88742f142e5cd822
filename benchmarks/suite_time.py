"""What the test suite costs: test files, the fast loop or the whole suite, before and after.

Two source trees are timed in the same run: ``--base REF`` (a clean copy of that git commit,
``git archive``) and this working tree (or ``--head REF``). Each measurement runs pytest as a
fresh process on one tree (``PYTHONPATH`` = the tree, run from the tree's root, the venv's own
interpreter), alternating the trees (base, head, head, base, ...) so that a change of the
machine's load lands on both; the median of ``--repeats`` runs of each is reported with the
ratio head / base, the load average before each run and every run's time and test counts in
the JSON. Single-machine wall-clock times: on a shared machine other jobs add noise, which the
alternation and the ratio reduce but do not remove.

What is timed (every target is a pytest command line):

- ``--files F ...``: each test file alone, ``pytest -q -p no:cacheprovider F`` (no workers);
- ``--fast``: the fast loop of docs/development.md, ``pytest -q -p no:cacheprovider -m "not
  slow"``; ``--workers 2``: the same with ``-n 2`` (both when both are given);
- ``--full``: the README's test command, ``pytest -q -p no:cacheprovider -n 2 --dist loadfile``,
  whose per-file times (the sum of each file's tests, setup and teardown included, from
  pytest's JUnit XML) are kept in the JSON too.

    python benchmarks/suite_time.py --base main --files tests/project/test_readme.py
    python benchmarks/suite_time.py --base main --fast --repeats 3
    python benchmarks/suite_time.py --base main --full --repeats 1 --json /tmp/full.json

``--beside-busy`` runs every measurement beside one CPU-bound process (a Python loop that never
sleeps, started before and stopped after each run), as the issue's "beside a CPU-bound process".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from git_trees import exported_tree

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "suite_time.json"
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def commit_of(ref: str) -> str:
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", ref], check=True, capture_output=True, text=True
    ).stdout.strip()


def counts(tail: str) -> dict[str, int]:
    """pytest's summary line (``3 passed, 1 failed in 12.0s``) as ``{"passed": 3, ...}``."""
    found: dict[str, int] = {}
    for line in reversed(tail.splitlines()):
        if " in " in line and any(w in line for w in ("passed", "failed", "error")):
            for part in line.split(" in ")[0].strip("= ").split(", "):
                number, _, word = part.partition(" ")
                if number.isdigit():
                    found[word.rstrip("s") if word == "errors" else word] = int(number)
            break
    return found


def file_seconds(junit: Path) -> dict[str, float]:
    """Each test file's summed test time (setup, call and teardown) from pytest's JUnit XML."""
    per_file: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = case.get("classname", "").split("::")[0]
        path = name.replace(".", "/") + ".py"
        per_file[path] += float(case.get("time", 0.0))
    return dict(per_file)


@contextmanager
def cpu_bound_process(wanted: bool) -> Iterator[None]:
    """One process that keeps a core busy while the block runs (nothing when not ``wanted``)."""
    if not wanted:
        yield
        return
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        busy.kill()
        busy.wait()


def timed(tree: Path, args: list[str], junit: Path | None, busy: bool) -> dict[str, Any]:
    """One pytest run of ``args`` on ``tree`` (beside a CPU-bound process when ``busy``): wall
    seconds, exit status, counts, load. Each run starts with an empty ``FEDLMC_CACHE`` (the
    embedded digits' ``.npz``, the clients' partitions), as on CI's fresh machine."""
    cache = tempfile.TemporaryDirectory(prefix="suite-time-cache-")
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "MPLBACKEND": "Agg",
        "FEDLMC_CACHE": cache.name,
    }
    extra = [f"--junitxml={junit}"] if junit else []
    load = os.getloadavg()[0]
    with cache, cpu_bound_process(busy):
        start = time.perf_counter()
        done = subprocess.run(
            [*PYTEST, *args, *extra], cwd=tree, env=env, capture_output=True, text=True
        )
        seconds = time.perf_counter() - start
    run = {
        "seconds": round(seconds, 2),
        "returncode": done.returncode,
        "counts": counts(done.stdout[-3000:]),
        "load_before": round(load, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }
    if junit is not None and junit.exists():
        run["file_seconds"] = {k: round(v, 2) for k, v in sorted(file_seconds(junit).items())}
    if done.returncode not in (0, 5):
        run["tail"] = done.stdout[-1500:]
    return run


def measure(
    name: str,
    args: list[str],
    trees: dict[str, Path],
    repeats: int,
    scratch: Path,
    busy: bool = False,
) -> dict[str, Any]:
    """``repeats`` runs of each tree, alternating (base, head, head, base, ...)."""
    runs: dict[str, list[dict]] = {label: [] for label in trees}
    labels = list(trees)
    for i in range(repeats):
        order = labels if i % 2 == 0 else labels[::-1]
        for label in order:
            junit = scratch / f"{label}-{len(runs[label])}-{abs(hash(name))}.xml"
            run = timed(trees[label], args, junit if "--dist" in args else None, busy)
            runs[label].append(run)
            print(
                f"  {name} [{label}] {run['seconds']:8.1f} s  rc {run['returncode']}  "
                f"{run['counts']}  load {run['load_before']:.1f}",
                flush=True,
            )
    median = {label: statistics.median(r["seconds"] for r in runs[label]) for label in runs}
    result: dict[str, Any] = {"command": shlex.join(args), "median_seconds": median, "runs": runs}
    if len(median) == 2:
        result["ratio_head_over_base"] = round(median["head"] / median["base"], 3)
    return result


def targets(options: argparse.Namespace) -> list[tuple[str, list[str]]]:
    chosen = [(path, [path]) for path in options.files]
    fast = ["-m", "not slow"]
    if options.fast:
        chosen.append(("fast loop", fast))
    if options.workers:
        chosen.append((f"fast loop -n {options.workers}", [*fast, "-n", str(options.workers)]))
    if options.full:
        chosen.append(("full suite", ["-n", "2", "--dist", "loadfile"]))
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git ref of the 'before' tree, e.g. main")
    parser.add_argument("--head", help="git ref of the 'after' tree (default: this working tree)")
    parser.add_argument("--files", nargs="*", default=[], help="test files, each timed alone")
    parser.add_argument("--fast", action="store_true", help='the fast loop (-m "not slow")')
    parser.add_argument(
        "--workers", type=int, default=0, help="the fast loop with -n N (with --fast: as well)"
    )
    parser.add_argument("--full", action="store_true", help="the README's test command")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--beside-busy", action="store_true", help="run beside one CPU-bound process"
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    options = parser.parse_args(argv)
    chosen = targets(options)
    if not chosen:
        parser.error("nothing to time: give --files, --fast, --workers or --full")
    if options.repeats < 1:
        parser.error(f"--repeats {options.repeats}: allowed: an integer >= 1")
    if options.workers < 0:
        parser.error(f"--workers {options.workers}: allowed: an integer >= 0 (0: none)")
    with tempfile.TemporaryDirectory(prefix="suite-time-") as scratch_name:
        scratch = Path(scratch_name)
        trees = {"base": exported_tree(options.base, scratch / "base")}
        trees["head"] = exported_tree(options.head, scratch / "head") if options.head else ROOT
        report: dict[str, Any] = {
            "base": commit_of(options.base),
            "head": commit_of(options.head) if options.head else "working tree",
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "repeats": options.repeats,
            "beside_cpu_bound_process": options.beside_busy,
            "targets": {},
        }
        for name, args in chosen:
            print(f"{name}:", flush=True)
            report["targets"][name] = measure(
                name, args, trees, options.repeats, scratch, options.beside_busy
            )
    print(f"\n{'target':60s} {'base s':>8s} {'head s':>8s} {'ratio':>6s}")
    for name, result in report["targets"].items():
        median = result["median_seconds"]
        print(
            f"{name:60s} {median['base']:8.1f} {median['head']:8.1f} "
            f"{result['ratio_head_over_base']:6.2f}"
        )
    options.json.parent.mkdir(parents=True, exist_ok=True)
    options.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written {options.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
