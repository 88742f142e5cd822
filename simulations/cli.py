"""The ``fedlmc`` command line.

- ``fedlmc sweep CONFIG.toml [key=value ...] [--out DIR] [--force] [--ray-address ADDR]``: run
  (or resume) a sweep in one Flower simulation (:mod:`fedlmc.simulations.engine.cells`), then build
  its report; the default out dir is ``results/<name>``. A grid of more than ``--max-cells``
  (default 1000) points is refused before any cell is validated; the first line says how many
  cells and client-epochs of training are left.
- ``fedlmc report DIR [--to FOLDER]``: (re)build the figures and ``report.md`` of a sweep's
  out dir (a run's out dir is refused with the reason), into DIR or, with ``--to``, into
  FOLDER (DIR then only read: a read-only DIR without ``--to`` is refused before any work).
- ``fedlmc run [key=value ...] [--csv FILE] [--ray-address ADDR]``: one federation with the
  given run-config keys; prints its rows. Its ``out-dir`` and ``--csv`` are checked before any
  work (writable; an out dir holding a sweep is refused; ``--csv`` must be a new file or a
  ``fedlmc run --csv`` table of the same columns, which the rows are appended to: a link, a
  device, a FIFO, another file or another command's rows are refused) and held locked while
  it runs (:mod:`fedlmc.simulations.runs.run_outputs`).
- ``fedlmc validate CONFIG.toml [key=value ...] [--out DIR]``: check a sweep (every cell, the
  memory its models need, and that the out dir is a writable folder holding no ``fedlmc run``
  results) and print its expanded cells.
- ``fedlmc methods`` / ``fedlmc models``: the registered merge methods / models (markdown tables,
  as in the docs pages; ``methods`` then says what the ``_t`` rows are); ``fedlmc keys
  [NAME|PATTERN]``: every run-config key, one, or those a pattern such as ``'dp-*'`` matches, on
  wrapped lines (``--markdown``: the docs' table; ``--pyproject``: the
  ``[tool.flwr.app.config]`` block of ``pyproject.toml``; ``--write-pyproject PATH``: rewrite that
  block in the file); ``fedlmc columns``: every results column with its definition.
- ``fedlmc track DIR --to NAME [--track-dir DIR] [--tracking-uri URI]``: export a sweep's or a
  run's out dir to a tracker (:mod:`fedlmc.simulations.tracking`: ``tensorboard``, ``mlflow``,
  each an optional extra); ``sweep`` and ``run`` take ``--track NAME`` to export when they
  finish (a run needs an ``out-dir``). The tracker's name and its extra being installed are
  checked before any work; exporting again skips the runs already there. ``track`` holds the
  out dir's lock while it exports (refused while a sweep writes there).
- ``fedlmc superlink start [--timeout S]`` / ``fedlmc superlink stop``: Flower's local
  SuperLink for ``flwr run .``, started with a longer wait than Flower's 15 s and stopped by
  its process id (:mod:`fedlmc.simulations.runs.local_superlink`); a SuperLink that does not
  start exits 1 with one line.
- ``fedlmc data fetch NAME --root DIR [--mirror URL]``: download a torchvision data set once
  (md5-checked, :func:`fedlmc.data.download.fetch_dataset`); a failed download exits 1 with one
  line. ``fedlmc data list``: the registered data sets (a markdown table, as in the docs).

A config file is a regular file of at most 1 MiB (:mod:`fedlmc.simulations.config.config_file`);
no path written is a link, a device, a FIFO (:mod:`fedlmc.simulations.records.written_paths`).

Every sub-command's ``--help`` ends with examples (:mod:`fedlmc.simulations.cli_help`); a
run-config key given as ``--epochs 2`` is answered with ``epochs=2``.

Configuration errors (and ``ValueError`` from bad data or partition settings) end with one line
``fedlmc: error: ...`` on stderr (one per mistake: a sweep file's independent mistakes, key by
key, are all named) and exit status 2, without a traceback; so does a
``--ray-address`` where no Ray cluster answers. ``sweep`` exits 1 when every cell failed, or
(one line) when the simulation stopped with cells unfinished (a rerun resumes); ``run`` exits 1
(one line on stderr) when the federation fails.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TypeAlias

from fedlmc.data.catalog import datasets_markdown
from fedlmc.io import atomic_write_text
from fedlmc.simulations.cli_help import (
    add_data_command,
    add_listing_commands,
    help_options,
    key_value_hint,
    keys_listing,
    methods_listing,
    one_line,
)
from fedlmc.simulations.config import (
    MAX_CELLS,
    ConfigError,
    absolute_paths,
    canonical_cell_id,
    cell_methods,
    check_local_cpus,
    client_epochs,
    expand_grid,
    grid_points,
    load_sweep_config,
    memory_check_note,
    parse_override,
    run_schema,
    validate_run_config,
)
from fedlmc.simulations.config.config_file import read_config_text
from fedlmc.simulations.config.tables import (
    columns_table,
    keys_table,
    models_table,
    pyproject_config,
    with_pyproject_config,
)

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""The type of ``add_subparsers()``'s result, which each ``add_..._command`` adds to."""


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser with its sub-commands."""
    parser = argparse.ArgumentParser(
        prog="fedlmc",
        description="Federated one-shot merging and linear mode connectivity studies on Flower.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_sweep_command(sub)
    add_report_command(sub)
    add_run_command(sub)
    add_track_command(sub)
    add_validate_command(sub)
    add_listing_commands(sub)
    add_superlink_command(sub)
    add_data_command(sub)
    return parser


def add_sweep_command(sub: Commands) -> None:
    """``fedlmc sweep CONFIG.toml [key=value ...]`` and its options."""
    sweep = sub.add_parser(
        "sweep", help="run or resume a sweep, then build its report", **help_options("sweep")
    )
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
    add_ray_address(sweep)
    sweep.add_argument(
        "--cells-in-flight",
        type=positive_int,
        metavar="N",
        help="cells run at once (default: ceil(client slots / num-clients) + 1)",
    )
    sweep.add_argument("--quiet", action="store_true", help="no progress bar or cell lines")
    add_max_cells(sweep)
    add_track_options(sweep, "--track")


def add_report_command(sub: Commands) -> None:
    """``fedlmc report DIR``."""
    report = sub.add_parser(
        "report", help="build figures and report.md from a sweep folder", **help_options("report")
    )
    report.add_argument("dir", help="a sweep output folder (holding results.csv)")
    report.add_argument(
        "--to",
        metavar="FOLDER",
        help="write report.md, report_full.md and figures/ into FOLDER instead of DIR (for a "
        "read-only DIR: DIR is then only read)",
    )


def add_run_command(sub: Commands) -> None:
    """``fedlmc run [key=value ...]`` and its options."""
    run = sub.add_parser(
        "run",
        help="run one federation and print its rows",
        **help_options("run", f"methods: {', '.join(cell_methods())} (fedlmc keys: every key)"),
    )
    run.add_argument("overrides", nargs="*", metavar="key=value", help="run-config values")
    run.add_argument("--csv", help="also write the rows to this CSV file")
    add_ray_address(run)
    add_track_options(run, "--track")


def add_track_command(sub: Commands) -> None:
    """``fedlmc track DIR --to NAME``."""
    track = sub.add_parser(
        "track", help="export a sweep's or a run's out dir to a tracker", **help_options("track")
    )
    track.add_argument("dir", help="a sweep's or a fedlmc run's out dir (holding results.csv)")
    add_track_options(track, "--to", required=True)


def add_validate_command(sub: Commands) -> None:
    """``fedlmc validate CONFIG.toml [key=value ...]`` and its options."""
    validate = sub.add_parser(
        "validate", help="validate a sweep and list its cells", **help_options("validate")
    )
    validate.add_argument("config", help="sweep TOML file")
    validate.add_argument("overrides", nargs="*", metavar="key=value", help="overrides")
    validate.add_argument("--out", help="the output folder to check (default: results/<name>)")
    validate.add_argument(
        "--no-device-check",
        action="store_true",
        help="do not check that requested GPUs are visible, that the models fit this "
        "machine's memory and that a model factory imports here (for configs meant for "
        "another machine)",
    )
    add_max_cells(validate)


def add_superlink_command(sub: Commands) -> None:
    """``fedlmc superlink start|stop``."""
    link = sub.add_parser(
        "superlink",
        help="start or stop Flower's local SuperLink for `flwr run .` (waits longer than "
        "Flower's 15 s)",
        **help_options("superlink"),
    )
    link_sub = link.add_subparsers(dest="superlink_command", required=True)
    start = link_sub.add_parser(
        "start", help="start it and wait until it answers", **help_options("superlink start")
    )
    start.add_argument(
        "--timeout", type=float, default=300.0, metavar="S", help="seconds to wait (300)"
    )
    link_sub.add_parser(
        "stop",
        help="stop it (whoever started it), by its process id",
        **help_options("superlink stop"),
    )


def add_ray_address(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="join an existing Ray cluster (auto, HOST:PORT or ray://HOST:PORT) instead of "
        "starting a local Ray",
    )


def add_max_cells(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-cells",
        type=positive_int,
        default=MAX_CELLS,
        metavar="N",
        help=f"allow a grid of up to N cells (default {MAX_CELLS}: a larger grid is refused "
        "before any cell is validated)",
    )


def add_track_options(parser: argparse.ArgumentParser, flag: str, required: bool = False) -> None:
    """``flag`` naming a tracker, and each tracker's destination option (its registry entry)."""
    from fedlmc.simulations.tracking import TRACKERS

    names = ", ".join(TRACKERS.names())
    parser.add_argument(
        flag,
        dest="track",
        metavar="NAME",
        required=required,
        help=f"export the results to a tracker: {names} (each an optional extra)",
    )
    for tracker in TRACKERS:
        parser.add_argument(tracker.option, metavar="DEST", help=tracker.option_help)


def track_request(args: argparse.Namespace, out_dir: Path | str, flag: str = "--track"):
    """Before any work: ``(tracker name, destination or None)`` asked for by ``args``, or
    ``None``; :class:`ConfigError` for an unknown tracker, one whose extra is missing, or a
    destination option of another tracker."""
    from fedlmc.simulations.records.results_file import check_writable_folder
    from fedlmc.simulations.tracking import TRACKERS, check_tracker

    given = {t.option: getattr(args, dest_name(t.option)) for t in TRACKERS}
    if args.track is None:
        stray = [option for option, value in given.items() if value]
        if stray:
            raise ConfigError(f"{stray[0]} is a tracker's option; allowed with {flag} NAME only")
        return None
    tracker = check_tracker(args.track, flag)
    for option, value in given.items():
        if value and option != tracker.option:
            raise ConfigError(
                f"{option} is not an option of {flag} {tracker.name}; allowed: {tracker.option}"
            )
    destination = given[tracker.option]
    if tracker.option == "--track-dir":
        check_writable_folder(destination or Path(out_dir) / "tensorboard", "--track-dir")
    return tracker.name, destination


def dest_name(option: str) -> str:
    """argparse's attribute name of ``option``."""
    return option.lstrip("-").replace("-", "_")


def print_error(message: object, status: int = 1) -> int:
    """``fedlmc: error: <message on one line>`` on stderr (:func:`one_line`), one line per
    mistake of a :class:`~fedlmc.simulations.config.schema.ConfigErrors`; returns ``status``
    (the exit code)."""
    for part in getattr(message, "messages", [message]):
        print(f"fedlmc: error: {one_line(part)}", file=sys.stderr)
    return status


def failure(what: str, err: BaseException) -> int:
    """:func:`print_error` of ``what failed: <error type>: <error>``; returns 1."""
    return print_error(f"{what} failed: {type(err).__name__}: {err}")


def export_to_tracker(out_dir: Path | str, request) -> int:
    """Export ``out_dir`` to the tracker of ``request`` (:func:`track_request`); 0, or 1 with
    one line on stderr when the tracker fails."""
    from fedlmc.simulations.tracking import export_folder

    name, destination = request
    try:
        summary = export_folder(out_dir, name, destination)
    except ValueError:
        raise
    except Exception as err:  # noqa: BLE001 - a failed export is reported on one line
        return failure(f"export to {name}", err)
    print(summary.line())
    return 0


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: allowed: an integer >= 1")
    return value


def command_sweep(args: argparse.Namespace) -> int:
    # every cell, before torch or Flower
    sweep = load_sweep_config(args.config, args.overrides, max_cells=args.max_cells)
    check_local_cpus(expand_grid(sweep), local=not args.ray_address)
    out_dir = Path(args.out) if args.out else Path("results") / sweep.name
    from fedlmc.simulations.records.results_file import check_writable_folder
    from fedlmc.simulations.records.written_paths import check_own_files

    check_writable_folder(out_dir, "--out")
    check_own_files(out_dir, "--out")
    tracking = track_request(args, out_dir)
    from fedlmc.simulations.engine.cells import EngineError
    from fedlmc.simulations.records.out_dir_lock import out_dir_lock
    from fedlmc.simulations.runs.sweep import run_sweep

    with out_dir_lock(out_dir, "fedlmc sweep"):  # the cells, the report and the export
        try:
            results = run_sweep(
                sweep,
                out_dir,
                force=args.force,
                retry_failed=not args.no_retry_failed,
                progress=not args.quiet,
                ray_address=args.ray_address,
                cells_in_flight=args.cells_in_flight,
            )
        except EngineError as err:
            return print_error(f"{err}; rerun the same command to resume")
        print(f"results: {out_dir / 'results.csv'} ({len(results)} rows)")
        if not args.no_report:
            print_report(out_dir)
        code = 0 if (results["status"] == "ok").any() else 1
        if tracking is not None:
            code = max(code, export_to_tracker(out_dir, tracking))
    return code


def print_report(out_dir: Path, to: Path | None = None) -> None:
    """Build the report of the sweep in ``out_dir`` into ``to`` (default: ``out_dir``) and
    print where it went."""
    from fedlmc.simulations.report.build import build_report

    paths = build_report(out_dir, to)
    to = out_dir if to is None else to
    figures = [p for p in paths if p.suffix == ".png"]
    print(
        f"report: {to / 'report.md'} (every table: report_full.md); {len(figures)} "
        f"figure(s) in {to / 'figures'}"
    )
    for path in figures:
        print(f"  {path}")


def command_report(args: argparse.Namespace) -> int:
    from fedlmc.simulations.records.out_dir_lock import out_dir_lock
    from fedlmc.simulations.report.build import report_folder

    out_dir = Path(args.dir)
    if not (out_dir / "results.csv").exists():
        raise ConfigError(f"dir = {args.dir!r}: no results.csv there; allowed: a sweep out dir")
    refuse_run_folder(args.dir)
    to = report_folder(out_dir, args.to)  # a read-only DIR without --to: refused here
    with out_dir_lock(to, "fedlmc report"):
        refuse_run_folder(args.dir)  # again under the lock: a run may have written meanwhile
        print_report(out_dir, None if to == out_dir else to)
    return 0


def refuse_run_folder(folder: str) -> None:
    """:class:`ConfigError` when ``folder`` holds one ``fedlmc run``'s rows, not a sweep's."""
    from fedlmc.simulations.records.results_file import out_dir_kind

    if out_dir_kind(folder) == "run":
        raise ConfigError(
            f"dir = {folder!r} holds the rows of one fedlmc run (no cell_id column): a report "
            f"compares the cells of a sweep; the run's rows are in "
            f"{str(Path(folder) / 'results.csv')!r}"
        )


def command_run(args: argparse.Namespace) -> int:
    values = dict(parse_override(text) for text in args.overrides)
    config = validate_run_config(values)  # before torch, Ray or Flower are imported
    config = absolute_paths(check_local_cpus([config], local=not args.ray_address)[0])
    from fedlmc.simulations.runs.run_outputs import check_run_outputs, holding_outputs

    check_run_outputs(config, args.csv)
    note = memory_check_note(config)
    if note is not None:
        print(note, file=sys.stderr)
    if args.track is not None and not config["out-dir"]:
        raise ConfigError(
            f"--track {args.track}: the run's out dir is what is exported; allowed: with "
            "out-dir=DIR"
        )
    tracking = track_request(args, config["out-dir"])
    from fedlmc.simulations.records.progress import stderr_say
    from fedlmc.simulations.runs.federation import run_federation
    from fedlmc.strategies import ClientsFailedError

    with holding_outputs(config, args.csv):
        try:
            rows = run_federation(config, ray_address=args.ray_address, say=stderr_say)
        except ClientsFailedError as err:  # the clients, not the configuration, failed: exit 1
            return print_error(
                f"the federation failed because of its clients: {type(err).__name__}: {err}"
            )
        except ValueError:
            raise
        except Exception as err:  # noqa: BLE001 - a failed federation is reported on one line
            return failure("the federation", err)
        from fedlmc.simulations.records.run_table import show_rows

        show_rows(rows, config, args.csv)
        return 0 if tracking is None else export_to_tracker(config["out-dir"], tracking)


def command_track(args: argparse.Namespace) -> int:
    from fedlmc.simulations.records.out_dir_lock import out_dir_lock
    from fedlmc.simulations.records.written_paths import check_own_files

    out_dir = Path(args.dir)
    check_own_files(out_dir, "dir")
    if not (out_dir / "results.csv").is_file():
        raise ConfigError(
            f"dir = {args.dir!r}: no results.csv there; allowed: a sweep's or a fedlmc run's "
            "out dir"
        )
    request = track_request(args, out_dir, "--to")
    with out_dir_lock(out_dir, "fedlmc track"):  # never beside a sweep writing there
        return export_to_tracker(out_dir, request)


def command_validate(args: argparse.Namespace) -> int:
    from fedlmc.simulations.runs.same_sweep import check_out_dir_for

    sweep = load_sweep_config(
        args.config,
        args.overrides,
        check_devices=not args.no_device_check,
        max_cells=args.max_cells,
    )
    out_dir = Path(args.out) if args.out else Path("results") / sweep.name
    check_out_dir_for(sweep, out_dir)  # writable, fedlmc's files, not another sweep's
    cells = check_local_cpus(expand_grid(sweep), local=not args.no_device_check)
    axes = list(sweep.grid)
    print(
        f"{sweep.name}: {len(cells)} cell(s), {client_epochs(cells):,} client-epochs of "
        f"training; grid axes: {', '.join(axes) or 'none'}"
    )
    for point, cell in zip(grid_points(sweep), cells, strict=True):
        values = " ".join(f"{k}={v}" for k, v in point.items()) or "(base values)"
        print(f"  {canonical_cell_id(cell)}  {values}")
    if not args.no_device_check:
        for note in dict.fromkeys(memory_check_note(cell) for cell in cells):
            if note is not None:
                print(note)
    return 0


def command_methods(args: argparse.Namespace) -> int:
    print(methods_listing())
    return 0


def command_models(args: argparse.Namespace) -> int:
    print(models_table())
    return 0


def command_keys(args: argparse.Namespace) -> int:
    if args.write_pyproject:
        path = Path(args.write_pyproject)
        text = read_config_text(path, "--write-pyproject")  # a regular file, at most 1 MiB
        try:
            updated = with_pyproject_config(text)
        except ValueError as err:
            raise ConfigError(f"--write-pyproject {str(path)!r}: {err}") from None
        atomic_write_text(path, updated)
        print(f"{path}: [tool.flwr.app.config] {'unchanged' if updated == text else 'updated'}")
    elif args.pyproject:
        print(pyproject_config(), end="")
    else:
        print(keys_table() if args.markdown else keys_listing(args.name))
    return 0


def command_columns(args: argparse.Namespace) -> int:
    print(columns_table())
    return 0


def command_data(args: argparse.Namespace) -> int:
    if args.data_command == "list":
        print(datasets_markdown())
        return 0
    from fedlmc.data.download import DownloadError, fetch_dataset

    try:
        result = fetch_dataset(args.name, args.root, mirror=args.mirror)
    except DownloadError as err:  # the network, not the command, failed
        return print_error(err)
    print(result.summary())
    return 0


def command_superlink(args: argparse.Namespace) -> int:
    from fedlmc.simulations.runs import local_superlink as link

    try:
        if args.superlink_command == "start":
            link.start_local_superlink(timeout=args.timeout)
        else:
            link.stop_local_superlink()
    except link.SuperLinkError as err:
        return print_error(err)
    return 0


COMMANDS = {
    "sweep": command_sweep,
    "report": command_report,
    "run": command_run,
    "track": command_track,
    "validate": command_validate,
    "methods": command_methods,
    "models": command_models,
    "keys": command_keys,
    "columns": command_columns,
    "data": command_data,
    "superlink": command_superlink,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fedlmc`` console script; returns the exit status."""
    from fedlmc.simulations.engine.stop_signals import exit_status, handle_signals

    handle_signals()  # SIGTERM stops a command like Ctrl-C does (exit status 143)
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # `--epochs 2`: point to epochs=2
        hint = key_value_hint(extras, sys.argv[1:] if argv is None else argv, list(run_schema()))
        parser.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
    try:
        return COMMANDS[args.command](args)
    except ValueError as err:  # ConfigError is a ValueError
        return print_error(err, status=2)
    except BrokenPipeError:  # e.g. `fedlmc validate ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as err:  # e.g. an out dir that cannot be created
        return print_error(err)
    except KeyboardInterrupt as interrupt:  # Ctrl-C, or SIGTERM (stop_signals.Terminated)
        code = exit_status(interrupt)
        what = "terminated (SIGTERM)" if code != 130 else "interrupted"
        print(f"fedlmc: {what}; rerun the same command to resume", file=sys.stderr)
        return code


def console() -> None:
    """The ``fedlmc`` console script: :func:`main`, then exit without the modules' teardown."""
    from fedlmc.simulations.engine.exit_workaround import exit_without_teardown

    exit_without_teardown(main())


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    console()
