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

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fedlmc.io import atomic_write
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
    """The rows of one ServerApp outcome (:class:`~fedlmc.simulations.server_app.ServerOutcome`):
    ``config_columns`` first (the run-config columns of its ``results.csv``), then
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


def _write(frame: pd.DataFrame, path: Path) -> None:
    atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def write_training(frame: pd.DataFrame, out_dir: str | os.PathLike) -> Path | None:
    """A run's ``training.csv`` (atomic); nothing when ``frame`` is empty."""
    if frame.empty:
        return None
    path = Path(out_dir) / TRAINING_FILE
    _write(sorted_rows(frame), path)
    return path


def replace_cell_rows(out_dir: str | os.PathLike, cid: str, rows: pd.DataFrame) -> pd.DataFrame:
    """``training.csv`` with cell ``cid``'s rows replaced by ``rows`` (possibly none), written
    atomically and sorted (module docstring); returns the whole table."""
    path = Path(out_dir) / TRAINING_FILE
    old = read_training(out_dir)
    old = pd.DataFrame(columns=["cell_id"]) if old is None else old
    keep = old[old["cell_id"] != cid]
    if rows.empty and keep.empty:
        if path.exists():
            path.unlink()
        return keep
    new = rows.assign(cell_id=cid) if not rows.empty else rows
    if not new.empty:
        new = new[["cell_id", *[c for c in new.columns if c != "cell_id"]]]
    parts = [p for p in (keep, new) if not p.empty]
    table = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0].copy()
    columns = list(dict.fromkeys([*keep.columns, *new.columns]))
    tail = [c.name for c in TRAINING_COLUMNS]
    table = table.reindex(columns=[*[c for c in columns if c not in tail], *tail])
    table = sorted_rows(typed(table))
    _write(table, path)
    return table


def keep_cells(out_dir: str | os.PathLike, keep_ids: Sequence[str] | set[str]) -> None:
    """Move ``training.csv`` to ``training.previous.csv`` and carry over the rows of the cells
    in ``keep_ids`` (a sweep superseded with ``--force``)."""
    folder = Path(out_dir)
    old = read_training(folder)
    if old is None:
        return
    os.replace(folder / TRAINING_FILE, folder / "training.previous.csv")
    kept = old[old["cell_id"].isin(set(keep_ids))] if "cell_id" in old else old.iloc[0:0]
    if len(kept):
        _write(kept, folder / TRAINING_FILE)


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
    return typed(frame[~bad]).reset_index(drop=True)


__all__ = [
    "client_epoch_rows",
    "fedavg_round_rows",
    "keep_cells",
    "read_training",
    "replace_cell_rows",
    "training_rows",
    "write_training",
]
