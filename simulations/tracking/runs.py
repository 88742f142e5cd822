"""A results folder read as tracker runs: what each run holds, independent of the tracker.

A sweep's out dir (``results.csv`` with a ``cell_id`` column) gives one :class:`TrackedRun` per
cell with ``ok`` rows (failed cells are left out: a rerun that retries them exports them then),
plus one run named ``report`` holding the sweep's figures and ``report.md`` when the folder has
them. A ``fedlmc run`` out dir (no ``cell_id``) is one run, keyed ``run-<12 hex>`` of the SHA-256
of its ``results.csv`` (a new run written into the folder is a new tracker run), its figures (if
any) with it.

A run holds:

- ``params``: the cell's key columns, i.e. the run-config keys (:func:`fedlmc.simulations.config.
  run_schema`, ``out-dir`` aside) that ``results.csv`` records, with their values as read;
- ``step_metrics``: ``(tag, step, value)`` from ``training.csv`` (absent in older folders): a
  ``client_epoch`` row gives ``client_epoch/client-<client>/<metric>`` at step = epoch, a
  ``fedavg_round`` row gives ``fedavg_round/<metric>`` at step = round; every column after
  ``step`` is a metric;
- ``row_metrics``: ``(tag, value)`` for every numeric column of every ``results.csv`` row of the
  cell, tagged ``<method>/<column>`` (logged at step 0);
- ``figures`` (PNG files) and ``texts`` (``report.md``) for the ``report`` run.

Empty (NaN) values are **not logged**: a tag missing at a step means the value is undefined there
(a column that does not apply to the method, a metric a client did not measure).

``digest`` (16 hex of SHA-256 over everything the run holds) tells an export whether a run
already in the tracker is this one: same key and digest -> skipped; same key, other digest
(e.g. the report after a resumed sweep added cells) -> replaced.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedlmc.simulations.config import LINK, run_schema
from fedlmc.simulations.config.schema import ConfigError
from fedlmc.simulations.records.results_file import CONFIG, RESULTS, out_dir_kind, read_results
from fedlmc.simulations.records.training_file import training_text

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TrackedRun", "tracked_runs"]

FIGURES = "figures"
REPORT = "report.md"
REPORT_KEY = "report"
LEAD_COLUMNS = ("cell_id", "status", "error", "method")
TRAINING_LEAD = ("cell_id", "phase", "client", "step")
PHASES = ("client_epoch", "fedavg_round")
ParamValue = str | int | float | bool


@dataclass(frozen=True)
class TrackedRun:
    """One tracker run (module docstring)."""

    key: str
    name: str
    label: str = ""
    params: dict[str, ParamValue] = field(default_factory=dict)
    step_metrics: tuple[tuple[str, int, float], ...] = ()
    row_metrics: tuple[tuple[str, float], ...] = ()
    figures: tuple[Path, ...] = ()
    texts: tuple[Path, ...] = ()
    kind: str = "cell"

    @property
    def digest(self) -> str:
        """16 hex of SHA-256 over the params, metrics, and the figures' and texts' bytes."""
        sha = hashlib.sha256()
        data = [self.key, self.name, self.params, self.step_metrics, self.row_metrics]
        sha.update(json.dumps(data, sort_keys=True, default=str).encode("utf-8"))
        for path in (*self.figures, *self.texts):
            sha.update(path.name.encode("utf-8"))
            sha.update(path.read_bytes())
        return sha.hexdigest()[:16]


def tracked_runs(out_dir: str | Path) -> list[TrackedRun]:
    """The runs of a sweep's or a ``fedlmc run``'s out dir (module docstring);
    :class:`~fedlmc.simulations.config.schema.ConfigError` for a folder holding no results."""
    folder = Path(out_dir)
    kind = out_dir_kind(folder)
    if kind == "empty" or not (folder / RESULTS).is_file():
        raise ConfigError(
            f"{str(folder)!r} holds no results.csv; allowed: a sweep's or a fedlmc run's out dir"
        )
    if kind == "run":
        return [run_folder_run(folder)]
    return sweep_runs(folder)


# ----------------------------------------------------------------------------- sweeps


def sweep_runs(folder: Path) -> list[TrackedRun]:
    """One run per cell with ``ok`` rows, in ``results.csv`` order, then the ``report`` run."""
    results = read_results(folder)
    ok = results[results["status"] == "ok"]
    training = read_training(folder)
    axes = grid_axes(folder)
    runs = []
    for cid in dict.fromkeys(ok["cell_id"]):
        rows = ok[ok["cell_id"] == cid]
        curves = training[training["cell_id"] == cid] if "cell_id" in training else training[:0]
        params = key_params(rows)
        label = varying_label(params, axes)
        runs.append(
            TrackedRun(
                key=cid,
                name=f"{cid} {label}".strip(),
                label=label,
                params=params,
                step_metrics=step_metrics(curves),
                row_metrics=row_metrics(rows),
            )
        )
    report = report_run(folder)
    return runs + ([report] if report is not None else [])


def grid_axes(folder: Path) -> list[str]:
    """The sweep's grid keys (``config.json``; a linked axis ``a+b`` gives ``a`` and ``b``), for
    the runs' display names; [] without one."""
    try:
        grid = json.loads((folder / CONFIG).read_text(encoding="utf-8")).get("grid", {})
    except (OSError, ValueError, AttributeError):
        return []
    return [key.strip() for axis in grid for key in str(axis).split(LINK)]


def varying_label(params: Mapping[str, ParamValue], axes: Sequence[str]) -> str:
    """``"k=v k=v"``: the cell's value of every grid key, in the grid's order (what tells the
    sweep's cells apart: width, seed, ...)."""
    return " ".join(f"{k}={params[k]}" for k in axes if k in params)


def report_run(folder: Path) -> TrackedRun | None:
    """The ``report`` run: the PNG files of ``figures/`` and ``report.md``; ``None`` without
    either."""
    figures = figure_files(folder)
    texts = tuple(p for p in [folder / REPORT] if p.is_file())
    if not figures and not texts:
        return None
    return TrackedRun(key=REPORT_KEY, name=REPORT_KEY, figures=figures, texts=texts, kind="report")


def figure_files(folder: Path) -> tuple[Path, ...]:
    """The PNG files of ``folder/figures``, sorted by name."""
    return tuple(sorted((folder / FIGURES).glob("*.png")))


# ----------------------------------------------------------------------------- a fedlmc run


def run_folder_run(folder: Path) -> TrackedRun:
    """The one run of a ``fedlmc run`` out dir (module docstring)."""
    import pandas as pd

    path = folder / RESULTS
    key = "run-" + hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    try:
        rows = pd.read_csv(path, keep_default_na=False, na_values=["", "nan", "NaN"])
    except (ValueError, pd.errors.ParserError) as err:
        raise ConfigError(f"results file {str(path)!r}: cannot read it ({err})") from None
    return TrackedRun(
        key=key,
        name=f"{key} {folder.name}",
        params=key_params(rows),
        step_metrics=step_metrics(read_training(folder)),
        row_metrics=row_metrics(rows),
        figures=figure_files(folder),
        kind="run",
    )


# ----------------------------------------------------------------------------- columns


def key_columns(columns: Sequence[str]) -> list[str]:
    """The run-config keys among ``columns`` (``out-dir`` is never recorded)."""
    keys = set(run_schema()) - {"out-dir"}
    return [c for c in columns if c in keys]


def param_value(value: Any) -> ParamValue:
    """A parameter as trackers take it: numbers and bools as they are, anything else (a missing
    value included, as ``""``) as text."""
    if isinstance(value, bool):
        return value
    if hasattr(value, "item"):  # numpy scalars
        value = value.item()
    if isinstance(value, int | float | bool):
        return "" if isinstance(value, float) and math.isnan(value) else value
    return "" if value is None else str(value)


def key_params(rows: pd.DataFrame) -> dict[str, ParamValue]:
    """The key columns of the cell's first row (every row of a cell has the same config)."""
    first = rows.iloc[0]
    return {c: param_value(first[c]) for c in key_columns(list(rows.columns))}


def metric_columns(frame: pd.DataFrame, skip: Sequence[str]) -> list[str]:
    """The numeric (not boolean) columns of ``frame`` outside ``skip``."""
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    return [
        c
        for c in frame.columns
        if c not in skip and is_numeric_dtype(frame[c]) and not is_bool_dtype(frame[c])
    ]


def row_metrics(rows: pd.DataFrame) -> tuple[tuple[str, float], ...]:
    """``(<method>/<column>, value)`` for every numeric metric of every row, NaN left out."""
    skip = (*LEAD_COLUMNS, *key_columns(list(rows.columns)))
    columns = metric_columns(rows, skip)
    found = []
    for _, row in rows.iterrows():
        method = str(row.get("method", "") or "run")
        for column in columns:
            value = float(row[column])
            if not math.isnan(value):
                found.append((f"{method}/{column}", value))
    return tuple(found)


# ----------------------------------------------------------------------------- training.csv


def read_training(folder: Path) -> pd.DataFrame:
    """``folder/training.csv`` as text, read line by line
    (:func:`fedlmc.simulations.records.training_file.training_text`: a bad line is left out
    with a warning); an empty frame when absent."""
    import pandas as pd

    frame = training_text(folder, set_aside_bad=False)
    return pd.DataFrame(columns=list(TRAINING_LEAD)) if frame is None else frame


def step_metrics(curves: pd.DataFrame) -> tuple[tuple[str, int, float], ...]:
    """``(tag, step, value)`` of every non-NaN metric of ``curves`` (module docstring)."""
    if curves.empty:
        return ()
    columns = list(curves.columns)
    metrics = columns[columns.index("step") + 1 :]
    found = []
    for _, row in curves.iterrows():
        prefix = phase_prefix(row["phase"], row["client"])
        step = int(row["step"])
        for metric in metrics:
            value = to_float(row[metric])
            if not math.isnan(value):
                found.append((f"{prefix}/{metric}", step, value))
    return tuple(found)


def phase_prefix(phase: Any, client: Any) -> str:
    """``client_epoch/client-<client>`` or ``fedavg_round``; ConfigError for another phase."""
    if phase == "client_epoch":
        return f"client_epoch/client-{client}"
    if phase == "fedavg_round":
        return "fedavg_round"
    raise ConfigError(f"training.csv phase {phase!r}; allowed: {', '.join(PHASES)}")


def to_float(value: Any) -> float:
    """``value`` as a float; NaN for an empty or non-numeric value."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def params_text(params: Mapping[str, ParamValue]) -> dict[str, str]:
    """The params as text (MLflow stores text; TensorBoard's hparams take the values)."""
    return {k: str(v) for k, v in params.items()}
