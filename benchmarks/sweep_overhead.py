"""What a sweep costs beyond its work: ``fedlmc sweep`` against the same cells computed directly.

Two pipelines, timed in the same run as fresh processes (interpreter start and imports included
in both), on the same cells, with the metric values compared row by row; each measurement is
repeated (``--repeats``, rotating which pipeline goes first) and the **median** of each is
reported, all runs and the load average being kept in the JSON. Single-machine wall-clock
measurements: on a shared machine other jobs add noise.

- ``sweep``: ``fedlmc sweep CONFIG ... --quiet --no-report`` (the sweep engine: one Flower
  simulation, warm Ray actors, several cells in flight, each client slot with ``num-cpus``
  threads, the server with what the slots leave);
- ``direct``: the fair baseline, what a user's own script would do: one process, no Flower,
  the whole machine: for each cell, train each client in turn (same seeds, same data), then
  evaluate every method with :func:`fedlmc.study.compare_methods` (what the ServerApp's
  ``compare`` strategy calls), with ``T`` threads for everything; ``T`` = 1, 2, 4, ... up to
  every usable core is measured and the fastest median is the baseline. Metric values equal the
  sweep's bit for bit at ``T = num-cpus``; at other ``T`` float32 rounding may differ slightly
  (the largest difference is reported).

Measurements (each printed, all written to ``--json``):

1. the quick sweep (``configs/quick.toml``, 8 cells): ratio sweep / fair direct;
2. start-up apart from per-cell cost: one tiny cell (:data:`STARTUP_PROBE`), sweep minus fair
   direct = the sweep's one-off cost (imports, Ray start and stop, actors and their imports);
   the quick sweep's per-cell time without it, against the direct loop's;
3. with ``--full``: a 16-cell sweep of narrow models (``configs/quick.toml`` at widths 0.125
   and 0.25, seeds 0..7) and its prefixes of 2 and 8 cells: least-squares slopes of wall time
   over the cell count for both pipelines; and the 16-cell sweep with ``num-cpus`` = 2, 1 and
   0.5 (1, 2 and 4 client slots on 2 cores), cells per minute.

Optionally (``--per-cell``), the quick sweep run the way it was before the engine: one Flower
simulation per cell (``run_sweep(..., runner=run_federation)``).

    python benchmarks/sweep_overhead.py                 # ~10 min on 2 cores (3 repeats)
    python benchmarks/sweep_overhead.py --full          # + cell-count fits and slots (~40 min)
    python benchmarks/sweep_overhead.py --smoke         # a 2-cell check of the script itself
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
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "sweep_overhead.json"
QUICK = ROOT / "configs" / "quick.toml"
NARROW = ("width=[0.125,0.25]",)
VOLATILE = ("seconds", "bytes")


# ----------------------------------------------------------------------------- the direct loop


def direct_rows(
    config_path: str, overrides: Sequence[str], threads: int
) -> tuple[list[dict], dict]:
    """Every cell of the sweep computed in this process with ``threads`` threads (training and
    evaluation, torch and the BLAS pools): rows and timings."""
    from fedlmc.simulations.config.threads import use_threads

    use_threads(threads)
    from fedlmc.simulations.config import (
        FEDAVG,
        cell_id,
        expand_grid,
        load_sweep_config,
        method_list,
    )
    from fedlmc.simulations.task import (
        build_from_config,
        client_data,
        client_seed,
        device_of,
        load_splits,
        train_options,
    )
    from fedlmc.study.compare import compare_methods
    from fedlmc.train import train_model

    timings = {"load": 0.0, "train": 0.0, "evaluate": 0.0}
    rows: list[dict] = []
    for config in expand_grid(load_sweep_config(config_path, overrides)):
        start = time.perf_counter()
        splits = load_splits(config)
        n = config["num-clients"]
        parts = [client_data(config, pid, n) for pid in range(n)]
        device = device_of(config)
        loaded = time.perf_counter()
        states, weights = [], []
        for pid, data in enumerate(parts):  # one client after the other
            model = build_from_config(config, splits, seed=client_seed(config["seed"], pid))
            model, _ = train_model(
                model,
                data,
                **train_options(config),
                seed=client_seed(config["seed"], pid, 1),
                device=device,
                augment=splits.augment,
            )
            states.append({k: v.detach().cpu().clone() for k, v in model.state_dict().items()})
            weights.append(float(len(data[1])))
        trained = time.perf_counter()
        template = build_from_config(config, splits)
        methods = [m for m in method_list(config) if m != FEDAVG]
        comparison = compare_methods(
            template,
            states,
            weights,
            splits,
            methods,
            lambdas=config["lambdas"],
            seed=config["seed"],
            diagnostics=config["diagnostics"],
            device=device,
        )
        rows.extend({"cell_id": cell_id(config), **row} for row in comparison.rows)
        done = time.perf_counter()
        timings["load"] += loaded - start
        timings["train"] += trained - loaded
        timings["evaluate"] += done - trained
    return rows, timings


def direct_main(args: argparse.Namespace) -> None:
    """``direct`` sub-command (run in a fresh process by the benchmark)."""
    start = time.perf_counter()
    import pandas as pd

    imported = time.perf_counter()
    rows, timings = direct_rows(args.config, args.overrides, args.threads)
    pd.DataFrame(rows).to_csv(args.rows, index=False)
    timings["imports"] = imported - start
    timings["threads"] = args.threads
    Path(args.timings).write_text(json.dumps(timings))


def per_cell_main(args: argparse.Namespace) -> None:
    """``per-cell`` sub-command: the sweep with one Flower simulation per cell (as before)."""
    from fedlmc.simulations.config import load_sweep_config
    from fedlmc.simulations.runs.federation import run_federation
    from fedlmc.simulations.runs.sweep import run_sweep

    run_sweep(
        load_sweep_config(args.config, args.overrides),
        args.out,
        runner=run_federation,
        progress=False,
    )


# ----------------------------------------------------------------------------- measuring


class TooSlow(RuntimeError):
    """A run stopped after exceeding its time cap (it cannot be the fastest)."""


def timed(
    command: Sequence[str], env: dict[str, str] | None = None, cap: float | None = None
) -> float:
    """Wall seconds of ``command`` as a fresh process (it must succeed); :class:`TooSlow`
    when it runs past ``cap`` seconds."""
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=cap
        )
    except subprocess.TimeoutExpired:
        raise TooSlow(f"stopped after {cap:.0f} s") from None
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    return seconds


def environment() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    return env


def run_sweep_cli(config: Path, overrides: Sequence[str], out: Path) -> tuple[float, Any]:
    from fedlmc.simulations.records.results_file import read_results

    command = [sys.executable, "-m", "fedlmc.simulations.cli", "sweep", str(config), *overrides]
    seconds = timed([*command, "--out", str(out), "--quiet", "--no-report"], environment())
    return seconds, read_results(out)


def run_per_cell(config: Path, overrides: Sequence[str], out: Path) -> tuple[float, Any]:
    from fedlmc.simulations.records.results_file import read_results

    command = [sys.executable, __file__, "per-cell", str(config), *overrides, "--out", str(out)]
    return timed(command, environment()), read_results(out)


def run_direct(
    config: Path, overrides: Sequence[str], work: Path, threads: int, cap: float | None = None
) -> tuple[float, Any, dict]:
    import pandas as pd

    rows, timings = work / f"direct-{threads}.csv", work / f"direct-{threads}.json"
    command = [sys.executable, __file__, "direct", str(config), *overrides]
    command += ["--threads", str(threads)]
    seconds = timed([*command, "--rows", str(rows), "--timings", str(timings)], environment(), cap)
    frame = pd.read_csv(rows, keep_default_na=False, na_values=["", "nan", "NaN"])
    return seconds, frame, json.loads(timings.read_text())


def compare_rows(sweep: Any, direct: Any) -> dict[str, Any]:
    """Metric values of the sweep's rows against the direct loop's, cell by cell and method by
    method: every column both have (timings and byte counts aside) must be equal."""
    import numpy as np
    import pandas as pd

    key = ["cell_id", "method"]
    ok = sweep[sweep["status"] == "ok"]
    columns = [
        c
        for c in direct.columns
        if c in ok.columns and c not in key and not any(v in c for v in VOLATILE)
    ]
    merged = ok[key + columns].merge(direct[key + columns], on=key, suffixes=("_s", "_d"))
    differing, largest = [], 0.0
    for column in columns:
        a, b = merged[f"{column}_s"], merged[f"{column}_d"]
        if pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b):
            x, y = a.to_numpy(dtype=float), b.to_numpy(dtype=float)
            same = (x == y) | (np.isnan(x) & np.isnan(y))
            if not same.all():
                largest = max(largest, float(np.nanmax(np.abs(x - y))))
        else:
            same = ((a.isna() & b.isna()) | (a.astype(object) == b.astype(object))).to_numpy()
        if not same.all():
            differing.append(column)
    return {
        "rows_compared": int(len(merged)),
        "rows_expected": int(len(direct)),
        "columns_compared": len(columns),
        "identical": not differing and len(merged) == len(direct) == len(ok),
        "differing_columns": differing,
        "max_abs_difference": largest,
    }


def fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``(slope, intercept)``."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return slope, my - slope * mx


def seeds(count: int) -> str:
    return f"seed=[{','.join(str(s) for s in range(count))}]"


SLOW_FACTOR = 2.0
"""A direct run longer than this many times the fastest one so far (+ 30 s) is stopped: that
thread count cannot be the fair baseline (on a loaded machine, oversubscribed OpenMP threads
can run several times slower)."""


def thread_counts() -> list[int]:
    """Thread counts the direct loop tries: 1, 2, 4, ... up to every usable core."""
    from fedlmc.simulations.config.threads import usable_cores

    cores, counts = usable_cores(), [1]
    while counts[-1] * 2 < cores:
        counts.append(counts[-1] * 2)
    return sorted({*counts, cores})


def pair(
    label: str,
    config: Path,
    overrides: Sequence[str],
    work: Path,
    results: dict[str, Any],
    repeats: int = 1,
) -> dict[str, Any]:
    """The sweep and the direct loop (at each of :func:`thread_counts`) on the same cells,
    ``repeats`` times in rotating order; the headline figures are medians, and the fair direct
    loop is the thread count with the smallest median (what a user's own script would pick)."""
    counts = thread_counts()
    pipelines = ["sweep", *(f"direct-{t}" for t in counts)]
    runs: dict[str, list[float]] = {name: [] for name in pipelines}
    checks: dict[str, dict] = {}
    breakdowns: dict[str, dict] = {}
    abandoned: dict[str, str] = {}
    loads = []
    sweep = None
    for r in range(repeats):
        folder = work / f"{label}-{r}"
        folder.mkdir(parents=True)
        loads.append(os.getloadavg()[0])
        frames = {}
        for name in pipelines[r % len(pipelines) :] + pipelines[: r % len(pipelines)]:
            if name == "sweep":
                seconds, sweep = run_sweep_cli(config, overrides, folder / "sweep")
            elif name in abandoned:
                continue
            else:
                threads = int(name.split("-")[1])
                done = [min(v) for n, v in runs.items() if n.startswith("direct") and v]
                cap = SLOW_FACTOR * min(done) + 30 if done else None
                try:
                    seconds, frames[name], breakdowns[name] = run_direct(
                        config, overrides, folder, threads, cap
                    )
                except TooSlow as err:  # cannot be the fastest: not measured again
                    abandoned[name] = str(err)
                    print(f"{label}: direct loop with {threads} threads {err}", flush=True)
                    continue
            runs[name].append(seconds)
        for name, frame in frames.items():
            checks[name] = compare_rows(sweep, frame)
    medians = {name: statistics.median(values) for name, values in runs.items() if values}
    pipelines = [name for name in pipelines if name in medians]
    best = min((n for n in pipelines if n != "sweep"), key=medians.get)
    entry = {
        "cells": int(sweep["cell_id"].nunique()),
        "overrides": list(overrides),
        "sweep_seconds": medians["sweep"],
        "direct_seconds": medians[best],
        "direct_threads": int(best.split("-")[1]),
        "ratio": medians["sweep"] / medians[best],
        "sweep_seconds_all": runs["sweep"],
        "direct_seconds_all": runs[best],
        "direct_by_threads": {
            name.split("-")[1]: {
                "median_seconds": medians[name],
                "seconds_all": runs[name],
                "breakdown": breakdowns[name],
                "metrics_vs_sweep": checks[name],
            }
            for name in pipelines
            if name != "sweep"
        },
        "direct_abandoned": {
            name.split("-")[1]: f"{reason} (over {SLOW_FACTOR}x the fastest direct run + 30 s)"
            for name, reason in abandoned.items()
        },
        "failed_cells": int((sweep["status"] != "ok").sum()),
        "metrics": checks[best],
        "load_average_before": loads,
    }
    results[label] = entry
    others = "; ".join(
        f"{n.split('-')[1]} thread(s) {medians[n]:.1f} s" for n in pipelines if n != "sweep"
    )
    print(
        f"{label:<10} {entry['cells']:>3} cells  sweep {entry['sweep_seconds']:6.1f} s  fair "
        f"direct {entry['direct_seconds']:6.1f} s ({entry['direct_threads']} threads)  ratio "
        f"{entry['ratio']:.2f}x  [medians of {repeats}; direct: {others}; sweep all: "
        f"{', '.join(f'{x:.1f}' for x in runs['sweep'])}; identical metrics at the best count: "
        f"{checks[best]['identical']} (max abs diff {checks[best]['max_abs_difference']:.2g}); "
        f"load {', '.join(f'{x:.1f}' for x in loads)}]",
        flush=True,
    )
    return entry


STARTUP_PROBE = ("width=[0.125]", "epochs=1", "lambdas=3", "seed=[0]", "diagnostics=false")
"""One tiny cell: its sweep's wall time minus the direct loop's is the sweep's start-up and
shut-down (Python and Flower imports, Ray start and stop, actors and their imports)."""


def startup(work: Path, results: dict[str, Any], repeats: int) -> dict[str, Any]:
    """The sweep's start-up cost, apart from its per-cell cost (see :data:`STARTUP_PROBE`)."""
    probe = pair("startup-probe", QUICK, list(STARTUP_PROBE), work, results, repeats)
    quick = results["quick"]
    once = probe["sweep_seconds"] - probe["direct_seconds"]
    per_cell_sweep = (quick["sweep_seconds"] - once) / quick["cells"]
    per_cell_direct = quick["direct_seconds"] / quick["cells"]
    entry = {
        "startup_seconds": once,
        "what": "sweep minus fair direct loop on one tiny cell: imports, Ray start and stop, "
        "actors and their imports (data loading counts in both)",
        "quick_sweep_per_cell_seconds_without_startup": per_cell_sweep,
        "quick_direct_per_cell_seconds": per_cell_direct,
        "per_cell_ratio": per_cell_sweep / per_cell_direct,
    }
    results["startup"] = entry
    print(
        f"start-up (one-off): {once:.1f} s; per quick cell without it: sweep "
        f"{per_cell_sweep:.2f} s, direct {per_cell_direct:.2f} s ({entry['per_cell_ratio']:.2f}x)",
        flush=True,
    )
    return entry


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    direct = sub.add_parser("direct", help="(internal) the direct loop in this process")
    direct.add_argument("config")
    direct.add_argument("overrides", nargs="*")
    direct.add_argument("--rows", required=True)
    direct.add_argument("--timings", required=True)
    per_cell = sub.add_parser("per-cell", help="(internal) one simulation per cell")
    per_cell.add_argument("config")
    per_cell.add_argument("overrides", nargs="*")
    per_cell.add_argument("--out", required=True)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--per-cell", action="store_true", help="also time one simulation/cell")
    parser.add_argument("--smoke", action="store_true", help="2 tiny cells, no slot study")
    direct.add_argument("--threads", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each measurement")
    parser.add_argument(
        "--full", action="store_true", help="also the 2/8/16-cell fits and the client-slot study"
    )
    args = parser.parse_args(argv)
    if args.command == "direct":
        return direct_main(args)
    if args.command == "per-cell":
        return per_cell_main(args)

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sweep-overhead-") as tmp:
        work = Path(tmp)
        if args.smoke:
            smoke = ["width=[0.125]", "epochs=1", "lambdas=3"]
            pair("smoke", QUICK, smoke, work, results, args.repeats)
            prefixes: tuple[int, ...] = ()
        else:
            pair("quick", QUICK, [], work, results, args.repeats)
            startup(work, results, args.repeats)
            prefixes = (1, 4, 8) if args.full else ()  # seeds: 2, 8 and 16 cells
        for count in prefixes:
            pair(f"narrow-{2 * count}", QUICK, [*NARROW, seeds(count)], work, results, args.repeats)
        if prefixes:
            labels = [f"narrow-{2 * c}" for c in prefixes]
            cells = [results[label]["cells"] for label in labels]
            sweep_fit = fit(cells, [results[label]["sweep_seconds"] for label in labels])
            direct_fit = fit(cells, [results[label]["direct_seconds"] for label in labels])
            results["per_cell"] = {
                "sweep_slope_seconds": sweep_fit[0],
                "direct_slope_seconds": direct_fit[0],
                "fixed_cost_per_extra_cell_seconds": sweep_fit[0] - direct_fit[0],
                "sweep_intercept_seconds": sweep_fit[1],
                "direct_intercept_seconds": direct_fit[1],
                "startup_cost_seconds": sweep_fit[1] - direct_fit[1],
            }
            print(
                f"per extra cell: sweep {sweep_fit[0]:.2f} s, direct {direct_fit[0]:.2f} s -> "
                f"fixed cost {sweep_fit[0] - direct_fit[0]:+.2f} s per cell; start-up "
                f"{sweep_fit[1] - direct_fit[1]:+.1f} s once",
                flush=True,
            )
            slots = {}
            direct_16 = results["narrow-16"]["direct_seconds"]
            for cpus, count in ((2.0, 1), (1.0, 2), (0.5, 4)):
                overrides = [*NARROW, seeds(8), f"num-cpus={cpus:g}"]
                if cpus == 1.0:
                    runs = results["narrow-16"]["sweep_seconds_all"]
                else:
                    runs = [
                        run_sweep_cli(QUICK, overrides, work / f"slots-{count}-{r}")[0]
                        for r in range(args.repeats)
                    ]
                seconds = min(runs)
                slots[str(count)] = {
                    "num_cpus": cpus,
                    "sweep_seconds": seconds,
                    "sweep_seconds_all": runs,
                    "cells_per_minute": 16 * 60 / seconds,
                    "ratio_to_direct": seconds / direct_16,
                }
                print(
                    f"{count} client slot(s) (num-cpus={cpus:g}): {seconds:6.1f} s, "
                    f"{16 * 60 / seconds:.1f} cells/min, {seconds / direct_16:.2f}x direct",
                    flush=True,
                )
            results["slots"] = slots
        if args.per_cell:
            seconds, frame = run_per_cell(QUICK, [], work / "per-cell")
            results["quick_per_cell_simulation"] = {
                "seconds": seconds,
                "ratio_to_direct": seconds / results["quick"]["direct_seconds"],
                "ratio_to_engine": seconds / results["quick"]["sweep_seconds"],
                "failed_cells": int((frame["status"] != "ok").sum()),
            }
            print(
                f"quick, one simulation per cell (before the engine): {seconds:.1f} s, "
                f"{seconds / results['quick']['direct_seconds']:.2f}x direct",
                flush=True,
            )
    import torch

    results["machine"] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "load_average_end": os.getloadavg()[0],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {args.json}")
    bad = [
        k
        for k, v in results.items()
        if isinstance(v, dict) and v.get("metrics", {}).get("identical") is False
    ]
    if bad:
        print(f"WARNING: metric values differ in {', '.join(bad)}")


if __name__ == "__main__":
    main()
