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
    report, full = to / "report.md", to / FULL_REPORT
    record = {"name": out_dir.name, **record}  # the title, wherever it is written
    atomic_write_text(full, report_markdown(results, record, figures, to, settings, training))
    atomic_write_text(report, summary_markdown(results, record, figures, to, settings, training))
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
        return Path(to)
    if not all(creatable_in(f) for f in (out_dir, out_dir / FIGURES)):
        raise ConfigError(
            f"dir = {str(out_dir)!r} is not writable (the report, report.md, report_full.md "
            "and figures/, is written there); allowed: a writable sweep out dir, or --to "
            "FOLDER to write the report elsewhere"
        )
    return out_dir


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
    "build_report",
    "read_record",
    "report_folder",
    "report_settings",
]
