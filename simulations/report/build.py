"""Figures and a markdown report from a sweep's ``results.csv``.

:func:`build_report` reads ``out_dir/results.csv`` (and ``config.json`` for the title and the
``[report]`` settings), keeps the ``ok`` rows and writes, under ``out_dir/figures/``, only the
figures whose data exists. Which figures there are, in report order, what each shows and when
it is drawn: :data:`~fedlmc.simulations.report.figure_table.FIGURE_TABLE` (one ``@figure``
registration per figure; its table on the Sweeps page is generated from it,
:func:`~fedlmc.simulations.report.figure_table.figures_markdown`).

When a config key other than the x axis and ``seed`` varies too, figures get one panel per
value combination of those keys. Every figure is titled with what was run; panels of one
quantity share the y axis; coinciding methods are drawn once
(:mod:`fedlmc.simulations.report.plotting`). ``report.md`` holds the short report (one row per
distinct quantity, :mod:`fedlmc.simulations.report.summary`) and links to the figures and to
``report_full.md``, every table (:mod:`fedlmc.simulations.report.markdown`).

The parts: the rows and tables in :mod:`fedlmc.simulations.report.data`, the drawing functions in
:mod:`fedlmc.simulations.report.plotting`, which figure is drawn from which rows into which file in
:mod:`fedlmc.simulations.report.figure_table`
(:data:`~fedlmc.simulations.report.figure_table.FIGURE_TABLE`, one registration per figure), the
text of ``report.md`` in :mod:`fedlmc.simulations.report.markdown`; this module writes them
(:func:`build_report`) and re-exports their public names. :func:`report_folder` says, before
any work, where ``fedlmc report DIR [--to FOLDER]`` may write the report.

What fedlmc wrote is recognisable: ``report.md`` and ``report_full.md`` start with the line
:data:`REPORT_MARKER`, and ``figures/`` holds the empty file :data:`FIGURES_MARKER`. In a
``--to FOLDER`` (:func:`check_report_files`) an existing ``report.md`` / ``report_full.md``
must be empty or start with that line, and an existing non-empty ``figures/`` must hold that
file; anything else is a user's and is refused before any work (a sweep's own out dir holds
fedlmc's ``results.csv`` and its report, older ones without the markers, is fedlmc's).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fedlmc.io import atomic_write_text
from fedlmc.simulations.config.report_keys import REPORT_SCHEMA
from fedlmc.simulations.config.schema import ConfigError
from fedlmc.simulations.records.results_file import check_writable_folder, read_results
from fedlmc.simulations.records.training_file import read_training
from fedlmc.simulations.records.written_paths import check_own_files
from fedlmc.simulations.report.data import ok_rows
from fedlmc.simulations.report.figure_table import draw_figures
from fedlmc.simulations.report.markdown import report_markdown
from fedlmc.simulations.report.summary import FULL_REPORT, summary_markdown

FIGURES = "figures"
REPORT_MARKER = "<!-- written by fedlmc report -->"
"""The first line of ``report.md`` and ``report_full.md``."""
FIGURES_MARKER = ".fedlmc-figures"
"""The empty file in a ``figures/`` folder fedlmc writes."""


def report_settings(record: dict[str, Any]) -> dict[str, Any]:
    """The ``[report]`` settings of ``config.json`` over the defaults."""
    settings = {k: spec.default for k, spec in REPORT_SCHEMA.items()}
    settings.update(record.get("report", {}))
    return settings


def build_report(out_dir: str | os.PathLike, to: str | os.PathLike | None = None) -> list[Path]:
    """Write the figures, ``report.md`` (the short report,
    :mod:`fedlmc.simulations.report.summary`) and ``report_full.md`` (every table) of the
    sweep in ``out_dir`` into ``to`` (default: ``out_dir``; another folder leaves ``out_dir``
    only read); returns their paths."""
    out_dir = Path(out_dir)
    to = out_dir if to is None else Path(to)
    if not (out_dir / "results.csv").exists():
        raise ValueError(f"out_dir={str(out_dir)!r} has no results.csv; run the sweep first")
    results = read_results(out_dir)
    record = read_record(out_dir)
    settings = report_settings(record)
    rows = ok_rows(results)
    training = read_training(out_dir)
    figures = draw_figures(rows, to / FIGURES, settings, training)
    if (to / FIGURES).is_dir():
        atomic_write_text(to / FIGURES / FIGURES_MARKER, "")
    report, full = to / "report.md", to / FULL_REPORT
    record = {"name": out_dir.name, **record}  # the title, wherever it is written
    text = report_markdown(results, record, figures, to, settings, training)
    atomic_write_text(full, f"{REPORT_MARKER}\n{text}")
    text = summary_markdown(results, record, figures, to, settings, training)
    atomic_write_text(report, f"{REPORT_MARKER}\n{text}")
    return [*figures, report, full]


def report_folder(out_dir: Path, to: str | None) -> Path:
    """Before any work: the folder ``fedlmc report DIR [--to FOLDER]`` writes ``report.md``,
    ``report_full.md`` and ``figures/`` into: ``to`` (a writable folder; ``out_dir`` is then
    only read, so it may be read-only) or ``out_dir``, which must then be writable.
    :class:`ConfigError` otherwise, naming ``--to``; either folder's names fedlmc writes must
    be free of links, devices and FIFOs (:func:`check_own_files`)."""
    check_own_files(out_dir, "dir")
    if to:
        check_writable_folder(to, "--to")
        check_own_files(to, "--to")
        if Path(to).resolve() != out_dir.resolve():
            check_report_files(Path(to))
        return Path(to)
    if not all(creatable_in(f) for f in (out_dir, out_dir / FIGURES)):
        raise ConfigError(
            f"dir = {str(out_dir)!r} is not writable (the report, report.md, report_full.md "
            "and figures/, is written there); allowed: a writable sweep out dir, or --to "
            "FOLDER to write the report elsewhere"
        )
    return out_dir


def check_report_files(to: Path) -> None:
    """Before any work: :class:`ConfigError` when ``--to`` ``to`` holds a ``report.md``,
    ``report_full.md`` or non-empty ``figures/`` fedlmc did not write (module docstring)."""
    for name in ("report.md", FULL_REPORT):
        if (to / name).is_file() and not starts_with_marker(to / name):
            raise refuse_report(to, f"{name} there was not written by fedlmc report")
    figures = to / FIGURES
    if figures.is_dir() and any(figures.iterdir()) and not (figures / FIGURES_MARKER).is_file():
        raise refuse_report(to, f"{FIGURES}/ there was not written by fedlmc report")


def starts_with_marker(path: Path) -> bool:
    """Whether ``path`` is empty or its first line is :data:`REPORT_MARKER` (an unreadable
    file is not)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(len(REPORT_MARKER) + 2)
    except OSError:
        return False
    return not head or head.decode("utf-8", errors="replace").startswith(REPORT_MARKER)


def refuse_report(to: Path, why: str) -> ConfigError:
    return ConfigError(
        f"--to {str(to)!r}: {why} and fedlmc would replace it; allowed: a folder without "
        f"report.md, report_full.md and figures/, or one where fedlmc report wrote them"
    )


def creatable_in(folder: Path) -> bool:
    """Whether files can be created in ``folder`` (``True`` when it does not exist yet)."""
    return not folder.is_dir() or os.access(folder, os.W_OK | os.X_OK)


def read_record(out_dir: Path) -> dict[str, Any]:
    """``config.json`` of the sweep, or an empty dict."""
    try:
        return json.loads((out_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


__all__ = [
    "FIGURES",
    "FIGURES_MARKER",
    "REPORT_MARKER",
    "build_report",
    "read_record",
    "report_folder",
    "report_settings",
]
