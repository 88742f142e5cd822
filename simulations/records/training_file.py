"""``training.csv``: the clients' per-epoch training curves and FedAvg's per-round curve.

Columns: :mod:`fedlmc.training_columns` (``cell_id`` in a sweep's file, the run-config columns
as ``results.csv`` names them, then ``phase``, ``client``, ``step`` and the metrics).

- :func:`training_rows` turns one ServerApp outcome into rows: per surviving client of the run's
  one-shot training round whose history passed the screen
  (:func:`fedlmc.strategies.screening.screen_history`), one ``client_epoch`` row per epoch; per
  FedAvg round, one ``fedavg_round`` row (:meth:`fedlmc.strategies.FedAvgResult.round_curve`).
  A client whose history was dropped, or that sent none, has no rows.
- :func:`write_training` writes a run's file; :func:`replace_cell_rows` puts one sweep cell's
  rows in place of that cell's previous ones (a re-run cell is replaced, never duplicated).
  Both write atomically (:func:`fedlmc.io.atomic_write`), and a sweep's file is kept sorted by
  ``cell_id``, then phase, client and step, so a resumed sweep's file equals an uninterrupted
  one's whatever order the cells finished in. A sweep writes a cell's training rows *before*
  its results rows: ``results.csv`` says which cells are done, so a crash between the two
  leaves a cell that reruns and replaces its training rows.
- :func:`read_training` reads a file back (``None`` when there is none: a results folder from
  before training curves existed) **line by line**, as ``results.csv`` is read
  (:mod:`fedlmc.simulations.records.csv_lines`): a line that does not parse on its own, has
  another number of fields than the header, is cut off, holds a control character, an unknown
  phase, a step or client that is no integer or text in a numeric column is left out with a
  warning naming the file and the line, and so are another sweep's rows (cells the folder's
  ``config.json`` does not hold); a junk line above the header, or a byte order mark, is read
  past. Before a sweep rewrites the file (:func:`replace_cell_rows`) those lines are moved,
  byte for byte, to ``training.rejected.csv``: one bad line never costs another cell's history.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fedlmc.io import atomic_write_csv
from fedlmc.simulations.records.csv_lines import is_number, shown_field, split_lines
from fedlmc.simulations.records.results_file import CELL_ID, numeric_columns, put_aside
from fedlmc.training_columns import (
    CLIENT_EPOCH,
    FEDAVG_ROUND,
    KEY_COLUMNS,
    METRIC_COLUMNS,
    PHASES,
    TRAINING_COLUMNS,
    TRAINING_FILE,
)

NAN = float("nan")
ORDER = ["phase", "client", "step"]
REQUIRED = KEY_COLUMNS  # the columns a line must hold to be the header


def client_epoch_rows(report: Any) -> list[dict[str, Any]]:
    """One row per epoch of every survivor of ``report`` (a
    :class:`~fedlmc.strategies.strategy_utils.RoundReport`) with a screened history."""
    rows = []
    for update in report.survivors:
        history = update.history
        if not history:
            continue
        calibration = history.get("calibration_loss", [NAN] * len(history["train_loss"]))
        for epoch, (loss, acc, cal) in enumerate(
            zip(history["train_loss"], history["train_accuracy"], calibration, strict=True),
            start=1,
        ):
            rows.append(
                {
                    "phase": CLIENT_EPOCH,
                    "client": int(update.partition_id),
                    "step": epoch,
                    "train_loss": loss,
                    "train_accuracy": acc,
                    "calibration_loss": cal,
                }
            )
    return rows


def fedavg_round_rows(result: Any) -> list[dict[str, Any]]:
    """One row per round of a :class:`~fedlmc.strategies.FedAvgResult`."""
    return [
        {"phase": FEDAVG_ROUND, "client": None, "step": int(point.pop("round")), **point}
        for point in result.round_curve()
    ]


def training_rows(outcome: Any, config_columns: Mapping[str, Any]) -> pd.DataFrame:
    """The rows of one ServerApp outcome
    (:class:`~fedlmc.simulations.records.server_outcome.ServerOutcome`): ``config_columns`` first
    (the run-config columns of its ``results.csv``), then
    :data:`~fedlmc.training_columns.TRAINING_COLUMNS`; an empty frame when nothing was kept."""
    rows: list[dict[str, Any]] = []
    for name, report in outcome.reports.items():
        if name != "fedavg":  # the one-shot training round (compare or the strategy's merge)
            rows += client_epoch_rows(report)
    if "fedavg" in outcome.results:
        rows += fedavg_round_rows(outcome.results["fedavg"])
    if not rows:
        return pd.DataFrame()
    body = pd.DataFrame(rows).reindex(columns=[c.name for c in TRAINING_COLUMNS])
    config = pd.DataFrame([dict(config_columns)] * len(body))
    return typed(pd.concat([config, body], axis=1))


def typed(frame: pd.DataFrame) -> pd.DataFrame:
    """``client`` and ``step`` as nullable integers (written without ``.0``), metrics as floats."""
    frame = frame.copy()
    for name in ("client", "step"):
        frame[name] = pd.to_numeric(frame[name], errors="coerce").astype("Int64")
    for name in METRIC_COLUMNS:  # a metric an older file lacks is NaN
        values = frame[name] if name in frame else pd.Series(NAN, index=frame.index)
        frame[name] = pd.to_numeric(values, errors="coerce").astype(float)
    return frame


def sorted_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` sorted by ``cell_id`` (when present), phase, client, step."""
    keys = (["cell_id"] if "cell_id" in frame else []) + ORDER
    phase = frame["phase"].map({p: i for i, p in enumerate(PHASES)})
    ordered = frame.assign(phase=phase).sort_values(keys, kind="stable", na_position="first")
    return frame.loc[ordered.index].reset_index(drop=True)


def write_training(frame: pd.DataFrame, out_dir: str | os.PathLike) -> Path | None:
    """A run's ``training.csv`` (atomic); nothing when ``frame`` is empty."""
    if frame.empty:
        return None
    path = Path(out_dir) / TRAINING_FILE
    atomic_write_csv(path, sorted_rows(frame))
    return path


def _as_text(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame``'s cells as the text ``to_csv`` writes for them (NaN as an empty string)."""
    buffer = io.StringIO()
    typed(frame).to_csv(buffer, index=False)
    buffer.seek(0)
    return pd.read_csv(buffer, dtype=str, keep_default_na=False)


def _raw_rows(out_dir: Path) -> pd.DataFrame:
    """The good rows of a sweep's ``training.csv`` as text, exactly as written; its bad lines
    and another sweep's rows moved to ``training.rejected.csv`` first (:func:`training_text`;
    an empty frame when the file is absent or holds no ``cell_id``)."""
    read = training_text(out_dir, set_aside_bad=True)
    if read is None or "cell_id" not in read.columns:
        return pd.DataFrame(columns=["cell_id"])
    return read


def _text_sorted(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows held as text, sorted like :func:`sorted_rows` (client and step as numbers)."""
    keys = pd.DataFrame(
        {
            "cell_id": frame["cell_id"],
            "phase": frame["phase"].map({p: i for i, p in enumerate(PHASES)}),
            "client": pd.to_numeric(frame["client"], errors="coerce"),
            "step": pd.to_numeric(frame["step"], errors="coerce"),
        }
    )
    order = keys.sort_values(["cell_id", *ORDER], kind="stable", na_position="first").index
    return frame.loc[order].reset_index(drop=True)


def replace_cell_rows(out_dir: str | os.PathLike, cid: str, rows: pd.DataFrame) -> pd.DataFrame:
    """``training.csv`` with cell ``cid``'s rows replaced by ``rows`` (possibly none), written
    atomically and sorted (module docstring); returns the whole table as text. The other cells'
    rows are kept as they were written, so a file's bytes depend only on its cells' values."""
    path = Path(out_dir) / TRAINING_FILE
    old = _raw_rows(Path(out_dir))
    keep = old[old["cell_id"] != cid]
    if rows.empty and keep.empty:
        if path.exists():
            path.unlink()
        return keep
    parts = [keep] if not keep.empty else []
    if not rows.empty:
        new = _as_text(rows.assign(cell_id=cid))
        parts.append(new[["cell_id", *[c for c in new.columns if c != "cell_id"]]])
    table = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0].copy()
    columns = list(dict.fromkeys(c for part in parts for c in part.columns))
    tail = [c.name for c in TRAINING_COLUMNS]
    table = table.reindex(columns=[*[c for c in columns if c not in tail], *tail]).fillna("")
    table = _text_sorted(table)
    atomic_write_csv(path, table)
    return table


def keep_cells(out_dir: str | os.PathLike, keep_ids: Sequence[str] | set[str]) -> None:
    """Move ``training.csv`` to ``training.previous.csv`` and carry over the rows of the cells
    in ``keep_ids`` as they were written (a sweep superseded with ``--force``)."""
    folder = Path(out_dir)
    path = folder / TRAINING_FILE
    if not path.exists():
        return
    old = _raw_rows(folder)
    os.replace(path, folder / "training.previous.csv")
    kept = old[old["cell_id"].isin(set(keep_ids))]
    if len(kept):
        atomic_write_csv(path, kept)


def row_problem(values: Mapping[str, str], numeric: Sequence[str]) -> str | None:
    """Why a row of ``training.csv`` (``column -> field``) is bad beyond what every line is
    checked for (:func:`fedlmc.simulations.records.csv_lines.split_lines`): an unknown phase, a
    step or client that is no integer, text in a metric or numeric config column (``numeric``),
    a ``cell_id`` that is not 12 hex digits; ``None`` for a good row."""
    if values["phase"] not in PHASES:
        return f"phase {shown_field(values['phase'])}; allowed: {', '.join(PHASES)}"
    if not values["step"].isdigit():
        return f"step {shown_field(values['step'])} is not an integer >= 0"
    if values["client"] and not values["client"].isdigit():
        return f"client {shown_field(values['client'])} is not an integer >= 0"
    for column in (*METRIC_COLUMNS, *numeric):
        if column in values and not is_number(values[column]):
            return f"{column} = {shown_field(values[column])} is not a number"
    if "cell_id" in values and not CELL_ID.fullmatch(values["cell_id"]):
        return f"cell_id {shown_field(values['cell_id'])} is not 12 hex digits"
    return None


def training_text(out_dir: str | os.PathLike, *, set_aside_bad: bool) -> pd.DataFrame | None:
    """The good rows of ``out_dir/training.csv`` as text, exactly as written (every field a
    string), the bad lines and another sweep's rows named in a warning and, with
    ``set_aside_bad``, moved to ``training.rejected.csv``; ``None`` when there is no file or
    it has no header (a warning says so)."""
    path = Path(out_dir) / TRAINING_FILE
    if not path.exists():
        return None
    numeric = numeric_columns()
    lines = split_lines(path, REQUIRED, lambda values: row_problem(values, numeric))
    put_aside(path, lines, set_aside_bad=set_aside_bad)  # the caller rewrites the file
    if lines.header is None:
        return None
    return pd.DataFrame(lines.good, columns=lines.header, dtype=str)


def read_training(out_dir: str | os.PathLike) -> pd.DataFrame | None:
    """``out_dir/training.csv`` read line by line (module docstring), ``client`` and ``step``
    as integers and the metrics as floats; ``None`` when there is none."""
    text = training_text(out_dir, set_aside_bad=False)
    if text is None:
        return None
    buffer = io.StringIO()
    text.to_csv(buffer, index=False)
    buffer.seek(0)
    frame = pd.read_csv(
        buffer,
        keep_default_na=False,
        na_values=["", "nan", "NaN"],
        dtype={"cell_id": str, "phase": str},
    )
    return typed(frame)


__all__ = [
    "client_epoch_rows",
    "fedavg_round_rows",
    "keep_cells",
    "read_training",
    "replace_cell_rows",
    "training_rows",
    "training_text",
    "write_training",
]
