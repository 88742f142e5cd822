"""The quick sweep whatever the shell's thread variables say: ``OMP_NUM_THREADS`` unset, ``=2``
and ``=8`` (``MKL_NUM_THREADS`` set alike), each as a fresh ``fedlmc sweep`` process.

Every client slot computes with ``max(1, floor(num-cpus))`` threads and the server with
``server-cpus`` (default: what the slots leave), whatever the variables say
(:mod:`fedlmc.simulations.config.threads`), so each setting should take about the time of the unset
one (target: within 1.1x). Each setting runs ``--repeats`` times, the settings in rotating order;
the median of each is reported, all runs and the load average before each run kept in the JSON.
Single-machine wall-clock measurements: on a shared machine other jobs add noise.

    python benchmarks/thread_control.py              # 3 x 3 quick sweeps (~7 min on 2 cores)
    python benchmarks/thread_control.py --smoke      # 1 tiny cell per setting
"""

from __future__ import annotations

import argparse
import json
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

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "thread_control.json"
QUICK = ROOT / "configs" / "quick.toml"
SETTINGS = {"unset": None, "OMP_NUM_THREADS=2": "2", "OMP_NUM_THREADS=8": "8"}
VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
TARGET = 1.1


def environment(value: str | None) -> dict[str, str]:
    """This process's environment with the thread variables set to ``value`` (unset: None)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    for name in VARIABLES:
        env.pop(name, None)
        if value is not None:
            env[name] = value
    return env


def sweep_seconds(overrides: Sequence[str], out: Path, env: dict[str, str]) -> float:
    """Wall seconds of ``fedlmc sweep configs/quick.toml OVERRIDES`` as a fresh process."""
    command = [sys.executable, "-m", "fedlmc.simulations.cli", "sweep", str(QUICK), *overrides]
    command += ["--out", str(out), "--quiet", "--no-report"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    return seconds


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one tiny cell per setting")
    args = parser.parse_args(argv)
    overrides = ["width=[0.125]", "epochs=1", "lambdas=3", "seed=[0]"] if args.smoke else []
    labels = list(SETTINGS)
    runs: dict[str, list[float]] = {label: [] for label in labels}
    loads: dict[str, list[float]] = {label: [] for label in labels}
    with tempfile.TemporaryDirectory(prefix="thread-control-") as tmp:
        for r in range(args.repeats):
            order = labels[r % len(labels) :] + labels[: r % len(labels)]
            for label in order:
                loads[label].append(os.getloadavg()[0])
                out = Path(tmp) / f"{label.replace('=', '-')}-{r}"
                seconds = sweep_seconds(overrides, out, environment(SETTINGS[label]))
                runs[label].append(seconds)
                print(f"repeat {r + 1}: {label:<18} {seconds:6.1f} s", flush=True)
    base = statistics.median(runs["unset"])
    results: dict[str, Any] = {
        "what": "fedlmc sweep configs/quick.toml --quiet --no-report, fresh process per run",
        "overrides": overrides,
        "target_ratio": TARGET,
        "note": "single-machine wall-clock measurements (shared machine: other jobs add noise); "
        "medians over repeats",
        "settings": {},
    }
    for label in labels:
        median = statistics.median(runs[label])
        results["settings"][label] = {
            "median_seconds": median,
            "seconds_all": runs[label],
            "ratio_to_unset": median / base,
            "within_target": median / base <= TARGET,
            "load_average_before": loads[label],
        }
        print(
            f"{label:<18} median {median:6.1f} s  ratio to unset {median / base:.2f}x  "
            f"[all: {', '.join(f'{x:.1f}' for x in runs[label])}]",
            flush=True,
        )
    import torch

    results["machine"] = {
        "cpus": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average_end": os.getloadavg()[0],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
