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
  before training curves existed); rows with an unknown phase or a non-numeric step or metric
  are left out with a warning naming the file.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fedlmc.io import atomic_write_csv
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
    for name in METRIC_COLUMNS:
        frame[name] = pd.to_numeric(frame[name], errors="coerce").astype(float)
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


def _raw_rows(path: Path) -> pd.DataFrame:
    """The rows of a sweep's ``path`` as text, exactly as written, less those
    :func:`read_training` would leave out (an empty frame when absent or unreadable)."""
    empty = pd.DataFrame(columns=["cell_id"])
    checked = read_training(path.parent) if path.exists() else None
    if checked is None or "cell_id" not in checked:
        return empty
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    return raw[raw.index.isin(checked.attrs["kept"])].reset_index(drop=True)


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
    old = _raw_rows(path)
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
    old = _raw_rows(path)
    os.replace(path, folder / "training.previous.csv")
    kept = old[old["cell_id"].isin(set(keep_ids))]
    if len(kept):
        atomic_write_csv(path, kept)


def read_training(out_dir: str | os.PathLike) -> pd.DataFrame | None:
    """``out_dir/training.csv`` (module docstring); ``None`` when there is none."""
    path = Path(out_dir) / TRAINING_FILE
    if not path.exists():
        return None
    text = {"cell_id": str, "phase": str}
    try:
        frame = pd.read_csv(path, keep_default_na=False, na_values=["", "nan", "NaN"], dtype=text)
    except (OSError, ValueError, pd.errors.ParserError) as err:
        print(f"fedlmc: warning: {str(path)!r} cannot be read ({err}); left out", file=sys.stderr)
        return None
    missing = [c for c in (*KEY_COLUMNS, *METRIC_COLUMNS) if c not in frame]
    if missing:
        print(f"fedlmc: warning: {str(path)!r} lacks columns {missing}; left out", file=sys.stderr)
        return None
    numbers = frame[["step", *METRIC_COLUMNS]].apply(pd.to_numeric, errors="coerce")
    bad = ~frame["phase"].isin(PHASES) | numbers["step"].isna()
    bad |= (numbers[list(METRIC_COLUMNS)].isna() & frame[list(METRIC_COLUMNS)].notna()).any(axis=1)
    if bad.any():
        rows = ", ".join(str(i + 2) for i in frame.index[bad][:5])
        print(
            f"fedlmc: warning: {int(bad.sum())} bad row(s) in {str(path)!r} left out (rows {rows})",
            file=sys.stderr,
        )
    kept = typed(frame[~bad]).reset_index(drop=True)
    kept.attrs["kept"] = list(frame.index[~bad])  # the file's row numbers (0 = first row)
    return kept


__all__ = [
    "client_epoch_rows",
    "fedavg_round_rows",
    "keep_cells",
    "read_training",
    "replace_cell_rows",
    "training_rows",
    "write_training",
]
