"""The ``fedlmc`` command line.

- ``fedlmc sweep CONFIG.toml [key=value ...] [--out DIR] [--force]``: run (or resume) a sweep,
  then build its report; the default out dir is ``results/<name>``.
- ``fedlmc report DIR``: (re)build the figures and ``report.md`` of a sweep's out dir.
- ``fedlmc run [key=value ...]``: one federation with the given run-config keys; prints its rows.
- ``fedlmc validate CONFIG.toml [key=value ...]``: check a sweep and print its expanded cells.

Configuration errors (and ``ValueError`` from bad data or partition settings) end with one line
``fedlmc: error: ...`` on stderr and exit status 2, without a traceback. ``sweep`` exits 1 when
every cell failed; ``run`` exits 1 (one line on stderr) when the federation fails.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from fedlmc.config import (
    ConfigError,
    cell_id,
    expand_grid,
    grid_points,
    load_sweep_config,
    parse_override,
    validate_run_config,
)

SHOWN_COLUMNS = (
    "method",
    "accuracy",
    "nll",
    "temperature",
    "ece",
    "endpoint_acc_mean",
    "ensemble_acc",
    "loss_barrier",
    "loss_barrier_calibrated",
    "lewc_cos_mean",
)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser with the four sub-commands."""
    parser = argparse.ArgumentParser(
        prog="fedlmc",
        description="Federated one-shot merging and linear mode connectivity studies on Flower.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    sweep = sub.add_parser("sweep", help="run or resume a sweep, then build its report")
    sweep.add_argument("config", help="sweep TOML file")
    sweep.add_argument("overrides", nargs="*", metavar="key=value", help="overrides")
    sweep.add_argument("--out", help="output folder (default: results/<name>)")
    sweep.add_argument(
        "--force",
        action="store_true",
        help="replace a different sweep already in the output folder",
    )
    sweep.add_argument(
        "--no-retry-failed",
        action="store_true",
        help="keep failed cells as they are instead of retrying them",
    )
    sweep.add_argument("--no-report", action="store_true", help="do not build the report")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar or cell lines")

    report = sub.add_parser("report", help="build figures and report.md from a sweep folder")
    report.add_argument("dir", help="a sweep output folder (holding results.csv)")

    run = sub.add_parser("run", help="run one federation and print its rows")
    run.add_argument("overrides", nargs="*", metavar="key=value", help="run-config values")
    run.add_argument("--csv", help="also write the rows to this CSV file")

    validate = sub.add_parser("validate", help="validate a sweep and list its cells")
    validate.add_argument("config", help="sweep TOML file")
    validate.add_argument("overrides", nargs="*", metavar="key=value", help="overrides")
    validate.add_argument(
        "--no-device-check",
        action="store_true",
        help="do not check that requested GPUs are visible (for CUDA configs)",
    )
    return parser


def command_sweep(args: argparse.Namespace) -> int:
    from simulations.sweep import run_sweep

    sweep = load_sweep_config(args.config, args.overrides)
    out_dir = Path(args.out) if args.out else Path("results") / sweep.name
    results = run_sweep(
        sweep,
        out_dir,
        force=args.force,
        retry_failed=not args.no_retry_failed,
        progress=not args.quiet,
    )
    print(f"results: {out_dir / 'results.csv'} ({len(results)} rows)")
    if not args.no_report:
        print_report(out_dir)
    return 0 if (results["status"] == "ok").any() else 1


def print_report(out_dir: Path) -> None:
    from simulations.report import build_report

    paths = build_report(out_dir)
    figures = [p for p in paths if p.suffix == ".png"]
    print(f"report: {out_dir / 'report.md'}; {len(figures)} figure(s) in {out_dir / 'figures'}")
    for path in figures:
        print(f"  {path}")


def command_report(args: argparse.Namespace) -> int:
    out_dir = Path(args.dir)
    if not (out_dir / "results.csv").exists():
        raise ConfigError(f"dir = {args.dir!r}: no results.csv there; allowed: a sweep out dir")
    print_report(out_dir)
    return 0


def command_run(args: argparse.Namespace) -> int:
    import pandas as pd

    from simulations.federation import run_federation

    values = dict(parse_override(text) for text in args.overrides)
    config = validate_run_config(values)
    if config["data-root"]:
        config["data-root"] = str(Path(config["data-root"]).expanduser().resolve())
    try:
        rows = run_federation(config)
    except ValueError:
        raise
    except Exception as err:  # noqa: BLE001 - a failed federation is reported on one line
        print(
            f"fedlmc: error: the federation failed: {type(err).__name__}: "
            f"{' '.join(str(err).split())}",
            file=sys.stderr,
        )
        return 1
    shown = [c for c in SHOWN_COLUMNS if c in rows.columns]
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(rows[shown].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    if args.csv:
        rows.to_csv(args.csv, index=False)
        print(f"rows written to {args.csv}")
    return 0


def command_validate(args: argparse.Namespace) -> int:
    sweep = load_sweep_config(args.config, args.overrides, check_devices=not args.no_device_check)
    cells = expand_grid(sweep)
    axes = list(sweep.grid)
    print(f"{sweep.name}: {len(cells)} cell(s); grid axes: {', '.join(axes) or 'none'}")
    for point, cell in zip(grid_points(sweep), cells, strict=True):
        values = " ".join(f"{k}={v}" for k, v in point.items()) or "(base values)"
        print(f"  {cell_id(cell)}  {values}")
    return 0


COMMANDS = {
    "sweep": command_sweep,
    "report": command_report,
    "run": command_run,
    "validate": command_validate,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedlmc`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ValueError as err:  # ConfigError is a ValueError
        message = " ".join(str(err).split())
        print(f"fedlmc: error: {message}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `fedlmc validate ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:  # e.g. an out dir that cannot be created
        print(f"fedlmc: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fedlmc: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
