"""The rows a cell leaves in ``results.csv``: the run-config columns, one row per method, one
failed row with the reason, and the atomic append of a cell's rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fedlmc.io import atomic_write_csv
from fedlmc.simulations.config import (
    row_methods,
)
from fedlmc.simulations.records.results_file import (
    plain_text,
    read_results,
)

RESULTS = "results.csv"
CONFIG = "config.json"
LEAD_COLUMNS = ("cell_id", "status", "error")
CONFIG_EXCLUDED = ("out-dir",)
MAX_ERROR = 400  # characters of a failed cell's reason kept in results.csv


# ----------------------------------------------------------------------------- cells


def config_columns(config: Mapping[str, Any]) -> dict[str, Any]:
    """The run-config values stored on every row (all keys but ``out-dir``)."""
    return {k: v for k, v in config.items() if k not in CONFIG_EXCLUDED}


def cell_rows(cid: str, config: Mapping[str, Any], metrics: pd.DataFrame) -> pd.DataFrame:
    """The tidy rows of a finished cell: id, ``status = "ok"``, config, then the metrics.

    Columns of ``metrics`` named like a lead or config column (runners may echo their config)
    are dropped: the sweep's resolved config is the one recorded.
    """
    lead = {"cell_id": cid, "status": "ok", "error": "", **config_columns(config)}
    metrics = metrics.reset_index(drop=True)
    metrics = metrics.drop(columns=[c for c in metrics.columns if c in lead or c in config])
    lead_frame = pd.DataFrame([lead] * len(metrics))
    return pd.concat([lead_frame, metrics], axis=1)


def rows_of_cell(cid: str, config: Mapping[str, Any], metrics: pd.DataFrame) -> pd.DataFrame:
    """:func:`cell_rows`, or a failed row when ``metrics`` does not hold exactly the methods
    of ``config`` (:func:`fedlmc.simulations.config.row_methods`): such a cell could never
    count as done."""
    expected = row_methods(config)
    got = [str(m) for m in metrics["method"]] if "method" in metrics else []
    if sorted(got) != sorted(expected):
        return failed_row(
            cid, config, f"the cell reported methods {got}; expected {expected} (its config's)"
        )
    return cell_rows(cid, config, metrics)


def failed_row(cid: str, config: Mapping[str, Any], error: BaseException | str) -> pd.DataFrame:
    """One row recording why a cell failed: the reason on one line, any traceback cut off."""
    if isinstance(error, BaseException):
        error = f"{type(error).__name__}: {error}"
    reason = " ".join(str(error).split()).split("Traceback (most recent call last)")[0].strip()
    if len(reason) > MAX_ERROR:
        reason = reason[: MAX_ERROR - 3] + "..."
    return pd.DataFrame(
        [{"cell_id": cid, "status": "failed", "error": reason, **config_columns(config)}]
    )


# ----------------------------------------------------------------------------- results file


def merge_columns(old: Sequence[str], new: Sequence[str]) -> list[str]:
    """``old`` columns in order, then the columns of ``new`` not yet seen."""
    return list(dict.fromkeys([*old, *new]))


def append_rows(out_dir: Path, rows: pd.DataFrame) -> pd.DataFrame:
    """Replace the cell's previous rows (a failed attempt, a cell that lost a row) by ``rows``
    (their text fields made plain: one line per row); returns the whole table."""
    old = read_results(out_dir, set_aside_bad=True, check_cells=False)  # bad lines set aside
    text = [c for c in rows.columns if not pd.api.types.is_numeric_dtype(rows[c])]
    rows = rows.assign(**{c: rows[c].map(plain_text) for c in text})
    keep = old[old["cell_id"] != rows["cell_id"].iloc[0]]
    table = pd.concat([keep, rows], ignore_index=True) if len(keep) else rows.copy()
    table = table.reindex(columns=merge_columns(old.columns, rows.columns))
    atomic_write_csv(out_dir / RESULTS, table)
    return table


# ----------------------------------------------------------------------------- the sweep


def outcome_rows(cid: str, config: Mapping[str, Any], result: Any) -> pd.DataFrame:
    """The rows of an engine :class:`~fedlmc.simulations.engine.cells.CellResult`: its table, or its
    failed row (the ServerApp raised, or produced no rows)."""
    if result.error is not None:
        return failed_row(cid, config, result.error)
    table = result.outcome.table()
    if table.empty:
        return failed_row(cid, config, "the federation produced no rows")
    return rows_of_cell(cid, config, table)
