"""Run every cell of a sweep as a Flower federation and keep tidy, resumable results.

Engine: all unfinished cells run in **one** Flower simulation (:mod:`fedlmc.simulations.engine`: one
Ray session, one pool of warm ClientApp actors, several cells in flight so that every client
slot stays busy while finished cells merge and evaluate on the server). ``ray_address`` joins
an existing Ray cluster. A custom ``runner(config) -> DataFrame`` (tests, other back ends) runs
the cells one after another instead.

Output folder ``out_dir``:

- ``config.json``: the sweep (``name``, ``run``, ``grid``, ``report``), every cell's resolved run
  config with its ``cell_id``, and the versions of fedlmc, flwr, torch, Python plus the device.
- ``results.csv``: one row per (cell, method): ``cell_id``, ``status`` (``ok`` / ``failed``),
  ``error``, the run-config columns (hyphenated keys, as in the TOML), then the metric columns of
  :func:`fedlmc.simulations.federation.run_federation`. A cell's rows are appended as soon as the
  cell finishes, atomically: the old rows plus the new ones go to a temporary file that
  ``os.replace`` puts in place, so a kill at any moment leaves either the old or the new file.
- ``training.csv``: the clients' per-epoch training curves and FedAvg's per-round curve, one
  row per cell x client x epoch (:mod:`fedlmc.simulations.training_file`), written (atomically,
  sorted by cell) just before the cell's rows are appended to ``results.csv``; a re-run cell's
  rows replace its old ones. A custom ``runner`` returns no curves: its cells get none.
- ``cells/<cell_id>/``: the ``out-dir`` handed to each cell (merged weights, if any).

Cells finish, and their rows are appended, in any order; the rows of a cell do not depend on
what ran before or beside it.

Resume: a rerun skips every cell whose rows are all in ``results.csv`` and valid (its ``ok``
rows hold exactly the methods of :func:`fedlmc.simulations.config.row_methods`); lines that fail
the schema on read (cut off, junk, an unclosed quote, text in a numeric column, a control
character: :mod:`fedlmc.simulations.results_file`) are moved to ``results.rejected.csv`` with a
warning, and their cells, like any cell that lost a row, run again, their new rows replacing
the old. A cell whose runner or federation reports other methods than its config's is recorded
as failed. A folder holding the results of a ``fedlmc run`` is refused. Failed cells (the runner
raised, e.g. too few clients survived) are recorded as one row with ``status = "failed"`` and
the reason, the sweep goes on, and a rerun retries them (``retry_failed=False`` keeps them);
the retry's rows replace the failed row. A killed sweep, rerun, thus ends with the same rows as
an uninterrupted one: no cell twice, none missing.

A sweep holds its ``out_dir``'s lock (:func:`fedlmc.simulations.out_dir_lock.out_dir_lock`) while
it writes: a second sweep, a ``fedlmc run`` or a ``fedlmc report`` on the folder is refused, and the
folder's kind is checked again under the lock. A different sweep (another set of cells)
under an existing ``out_dir`` is refused unless
``force=True``; then the old ``results.csv`` / ``config.json`` are kept as
``results.previous.csv`` / ``config.previous.json``, and the rows of cells that are still in the
new sweep are carried over (same cell id = same resolved experiment).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fedlmc.io import atomic_write_csv, atomic_write_json, remove_stale_temporaries
from fedlmc.simulations.config import (
    ConfigError,
    SweepConfig,
    absolute_paths,
    cell_id,
    experiment_values,
    row_methods,
    run_schema,
    unique_cells,
)
from fedlmc.simulations.out_dir_lock import out_dir_lock
from fedlmc.simulations.provenance import versions
from fedlmc.simulations.results_file import (
    finished_cells,
    plain_text,
    read_results,
    refuse_mixing,
)
from fedlmc.simulations.training_file import keep_cells, replace_cell_rows, training_rows

Runner = Callable[[Mapping[str, Any]], pd.DataFrame]

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


def runtime_config(config: Mapping[str, Any], cell_dir: Path) -> dict[str, Any]:
    """The config a cell runs with: its own ``out-dir``, and its local paths made absolute
    (:func:`fedlmc.simulations.config.absolute_paths`: Ray workers need not share the driver's
    working directory)."""
    return absolute_paths({**config, "out-dir": str(cell_dir)})


def run_cell(runner: Runner, cid: str, config: Mapping[str, Any]) -> pd.DataFrame:
    """The cell's rows, or its failed row when the runner raises or returns nothing."""
    try:
        metrics = runner(config)
        if metrics is None or len(metrics) == 0:
            return failed_row(cid, config, "runner returned no rows")
        return rows_of_cell(cid, config, metrics)
    except Exception as err:  # noqa: BLE001 - a failed cell is recorded, the sweep goes on
        return failed_row(cid, config, err)


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


# ----------------------------------------------------------------------------- config.json


def sweep_record(sweep: SweepConfig, cells: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What ``config.json`` holds: the sweep, every resolved cell with its id, versions."""
    return {
        **sweep.to_dict(),
        "source": sweep.source,
        "cells": [{"cell_id": cell_id(c), "config": dict(c)} for c in cells],
        "versions": versions(),
    }


def experiment_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a ``config.json`` record that must match to resume: the cells' experiments."""
    return {c["cell_id"]: experiment_values(c["config"]) for c in record.get("cells", [])}


def describe_difference(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """A short text saying how two experiments (cell id -> values) differ."""
    gone, added = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    parts = []
    if added:
        parts.append(f"{len(added)} new cell(s)")
    if gone:
        parts.append(f"{len(gone)} cell(s) no longer in the sweep")
    keys = {k for c in [*old.values(), *new.values()] for k in c}

    def values_of(cells: Mapping[str, Any], key: str) -> set[str]:
        return {json.dumps(c.get(key)) for c in cells.values()}

    changed = sorted(k for k in keys if values_of(old, k) != values_of(new, k))
    if changed:
        parts.append(f"changed keys: {', '.join(changed)}")
    return "; ".join(parts) or "different cells"


def prepare_out_dir(out_dir: Path, record: Mapping[str, Any], *, force: bool) -> None:
    """Create ``out_dir``, refuse a run's results or a different sweep there (unless
    ``force``), write config.json."""
    refuse_mixing(out_dir, "sweep")
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out_dir)
    path = out_dir / CONFIG
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            old = {}
        before, now = experiment_of(old), experiment_of(record)
        if before != now:
            if not force:
                raise ConfigError(
                    f"out dir {str(out_dir)!r} holds a different sweep "
                    f"({describe_difference(before, now)}); allowed: the same sweep (to resume), "
                    f"another --out, or --force"
                )
            supersede(out_dir, set(now))
    atomic_write_json(path, record)


def supersede(out_dir: Path, keep_ids: set[str]) -> None:
    """Keep the old files as ``*.previous.*`` and carry over rows of cells still in the sweep."""
    results, config = out_dir / RESULTS, out_dir / CONFIG
    old = read_results(out_dir)
    if results.exists():
        os.replace(results, out_dir / "results.previous.csv")
    if config.exists():
        os.replace(config, out_dir / "config.previous.json")
    kept = old[old["cell_id"].isin(keep_ids)]
    if len(kept):
        atomic_write_csv(results, kept)
    keep_cells(out_dir, keep_ids)


# ----------------------------------------------------------------------------- progress


def cell_summary(
    point: Mapping[str, Any], config: Mapping[str, Any], rows: pd.DataFrame, seconds: float
) -> str:
    """One line: grid values (plus width and clients), each method's accuracy (or the failure)."""
    others = [
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in point.items()
        if k not in ("width", "num-clients")
    ]
    width = [] if config.get("client-widths") else [f"width={config['width']:g}"]  # mixed: others
    head = " ".join([*width, f"clients={config['num-clients']}", *others])
    if rows["status"].iloc[0] != "ok":
        return f"{head} | FAILED: {rows['error'].iloc[0]} ({seconds:.0f} s)"
    accs = " ".join(
        f"{m}={a:.3f}"
        for m, a in zip(rows.get("method", []), rows.get("accuracy", []), strict=False)
        if isinstance(a, float | int) and math.isfinite(a)
    )
    return f"{head} | {accs} ({seconds:.0f} s)"


NOT_SPLIT_KEYS = ("methods",)
"""Config keys that never keep rows apart: each row's ``method`` already names what it is."""


def varying_keys(rows: pd.DataFrame) -> list[str]:
    """Run-config columns with more than one distinct value among the rows where the key
    applies (its ``applies`` rule, e.g. ``fedavg-rounds`` only where FedAvg runs), in schema
    order; never :data:`NOT_SPLIT_KEYS`."""
    schema = run_schema()
    some = [k for k in schema if k in rows and k not in NOT_SPLIT_KEYS]
    candidates = [k for k in some if rows[k].astype(str).nunique() > 1]
    applies = applicable(rows, {k: schema[k] for k in candidates})
    return [k for k in candidates if rows[k][applies[k]].astype(str).nunique() > 1]


def applicable(rows: pd.DataFrame, keys: Mapping[str, Any]) -> dict[str, list[bool]]:
    """Per key, per row: whether the key's ``applies`` rule holds for the row's config columns
    (true without a rule, or where the columns cannot answer it). Empty text read back from
    ``results.csv`` as NaN counts as ``""``."""
    ruled = {k: key for k, key in keys.items() if key.applies is not None}
    if not ruled:
        return {k: [True] * len(rows) for k in keys}
    schema = run_schema()
    text = {k for k, key in schema.items() if key.type is str}
    configs = [
        {k: "" if k in text and isinstance(v, float) and math.isnan(v) else v for k, v in r.items()}
        for r in rows[[c for c in rows.columns if c in schema]].to_dict("records")
    ]
    return {
        k: [_holds(ruled[k], c) for c in configs] if k in ruled else [True] * len(rows)
        for k in keys
    }


def _holds(key: Any, config: Mapping[str, Any]) -> bool:
    try:
        return bool(key.applies.of(config))
    except (KeyError, TypeError, ValueError, AttributeError):
        return True


def split_labels(rows: pd.DataFrame, exclude: Sequence[str]) -> pd.Series | None:
    """Per row, ``"key=value, ..."`` of the varying keys not in ``exclude`` (nor ``seed``): what
    a table averaging over ``exclude`` must keep apart (e.g. ``bias=false``); ``None`` when
    nothing else varies."""
    keys = [k for k in varying_keys(rows) if k not in exclude and k != "seed"]
    if not keys:
        return None
    return rows[keys].apply(lambda r: ", ".join(f"{k}={_text(v)}" for k, v in r.items()), axis=1)


def _text(value: Any) -> str:
    """A config value as a label: numbers without trailing zeros (``0.1``, ``4``)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def with_split_methods(
    rows: pd.DataFrame, methods: Sequence[str], exclude: Sequence[str]
) -> tuple[pd.DataFrame, list[str]]:
    """``rows`` whose ``method`` names also carry :func:`split_labels` (``"average (bias=false)"``)
    and the labelled methods in order (each method, then its labels in sorted order)."""
    labels = split_labels(rows, exclude)
    if labels is None or rows.empty:
        return rows, list(methods)
    named = rows.assign(method=rows["method"] + " (" + labels + ")")
    present = set(named["method"])
    order = [f"{m} ({label})" for m in methods for label in sorted(labels.unique())]
    return named, [m for m in order if m in present]


def summary_table(results: pd.DataFrame, value: str = "accuracy") -> pd.DataFrame:
    """Mean ``value`` of the ok rows, methods x widths (empty frame when nothing succeeded),
    methods kept apart by every other varying key but the seed (``average (bias=false)``); for
    accuracy, last rows with the mean endpoint (client model) accuracy."""
    ok = results[results["status"] == "ok"] if "status" in results else results
    if ok.empty or value not in ok or "method" not in ok:
        return pd.DataFrame()
    ok, order = with_split_methods(ok, list(dict.fromkeys(ok["method"])), ["width"])
    table = ok.pivot_table(index="method", columns="width", values=value, aggfunc="mean")
    table = table.reindex([m for m in order if m in table.index])
    if value == "accuracy" and "endpoint_acc_mean" in ok:
        cells = ok.drop_duplicates("cell_id") if "cell_id" in ok else ok
        labels = split_labels(cells, ["width"])
        groups = [cells["width"]] if labels is None else [labels, cells["width"]]
        ends = pd.to_numeric(cells["endpoint_acc_mean"], errors="coerce").groupby(groups).mean()
        if labels is None:
            table.loc["endpoints (mean)"] = ends
        else:
            for label, at_label in ends.groupby(level=0):
                table.loc[f"endpoints (mean) ({label})"] = at_label.droplevel(0)
    return table


# ----------------------------------------------------------------------------- the sweep


def outcome_rows(cid: str, config: Mapping[str, Any], result: Any) -> pd.DataFrame:
    """The rows of an engine :class:`~fedlmc.simulations.engine.CellResult`: its table, or its
    failed row (the ServerApp raised, or produced no rows)."""
    if result.error is not None:
        return failed_row(cid, config, result.error)
    table = result.outcome.table()
    if table.empty:
        return failed_row(cid, config, "the federation produced no rows")
    return rows_of_cell(cid, config, table)


def run_sweep(
    sweep: SweepConfig,
    out_dir: str | os.PathLike,
    *,
    force: bool = False,
    runner: Runner | None = None,
    retry_failed: bool = True,
    progress: bool = True,
    ray_address: str | None = None,
    cells_in_flight: int | None = None,
    verbose: bool = False,
) -> pd.DataFrame:
    """Run the cells of ``sweep`` not yet done in ``out_dir``; returns the whole results table.

    By default every unfinished cell runs in one Flower simulation
    (:mod:`fedlmc.simulations.engine`; ``ray_address`` joins a Ray cluster, ``cells_in_flight``
    overrides how many cells run at once). ``runner(config) -> DataFrame`` instead runs one cell at
    a time, in order. See the module docstring for the files, resuming, failures and ``force``.
    """
    from tqdm.auto import tqdm

    if runner is None and ray_address:
        from fedlmc.simulations.engine import check_ray_address

        check_ray_address(ray_address)  # before anything is written: a clear error at once
    out_dir = Path(out_dir).resolve()
    pairs = unique_cells(sweep)
    points, cells = [p for p, _ in pairs], [c for _, c in pairs]
    ids = [cell_id(c) for c in cells]
    expected = {cid: row_methods(cell) for cid, cell in zip(ids, cells, strict=True)}
    with out_dir_lock(out_dir, "fedlmc sweep"):
        prepare_out_dir(out_dir, sweep_record(sweep, cells), force=force)  # kind checked again
        results = read_results(out_dir, set_aside_bad=True)
        done = finished_cells(results, expected, retry_failed=retry_failed)
        todo = [i for i, cid in enumerate(ids) if cid not in done]
        say = tqdm.write if progress else (lambda _text: None)
        say(
            f"sweep {sweep.name}: {len(cells)} cells, {len(cells) - len(todo)} already done, "
            f"results in {out_dir / RESULTS}"
        )
        bar = tqdm(
            total=len(cells),
            initial=len(cells) - len(todo),
            unit="cell",
            disable=not progress,
            desc=sweep.name,
        )
        configs = {i: runtime_config(cells[i], out_dir / "cells" / ids[i]) for i in todo}
        try:
            if runner is not None:
                for i in todo:
                    start = time.perf_counter()
                    rows = run_cell(runner, ids[i], configs[i])
                    replace_cell_rows(out_dir, ids[i], pd.DataFrame())  # a runner sends none
                    append_rows(out_dir, rows)
                    seconds = time.perf_counter() - start
                    summary = cell_summary(points[i], configs[i], rows, seconds)
                    say(f"[{i + 1}/{len(cells)}] {summary}")
                    bar.update(1)
            elif todo:
                _run_with_engine(
                    [(i, ids[i], points[i], configs[i]) for i in todo],
                    len(cells),
                    out_dir,
                    bar,
                    say,
                    ray_address=ray_address,
                    cells_in_flight=cells_in_flight,
                    verbose=verbose,
                )
        finally:
            bar.close()
    results = read_results(out_dir)
    results = results[results["cell_id"].isin(ids)]
    if progress:
        print_summary(results)
    return results.reset_index(drop=True)


def _run_with_engine(
    todo: Sequence[tuple[int, str, Mapping[str, Any], dict[str, Any]]],
    total: int,
    out_dir: Path,
    bar: Any,
    say: Callable[[str], None],
    *,
    ray_address: str | None,
    cells_in_flight: int | None,
    verbose: bool,
) -> None:
    """Every cell of ``todo`` (index, id, grid point, runtime config) in one engine run; each
    cell's rows are appended (atomically) and its line printed as soon as it finishes."""
    from fedlmc.simulations.engine import CellJob, CellResult, run_cells

    where = {cid: (i, point) for i, cid, point, _config in todo}
    lock = threading.Lock()
    running: set[str] = set()
    replies: dict[str, int] = {}

    def show_in_flight() -> None:
        heard = sum(replies.get(key, 0) for key in running)
        bar.set_postfix_str(f"{len(running)} in flight, client replies: {heard}", refresh=True)

    def started(job: CellJob) -> None:
        with lock:
            running.add(job.key)
            show_in_flight()

    def replied(job: CellJob, count: int) -> None:
        with lock:
            replies[job.key] = replies.get(job.key, 0) + count
            show_in_flight()

    def finished(result: CellResult) -> None:
        rows = outcome_rows(result.key, result.config, result)
        curves = pd.DataFrame()
        if result.error is None and rows["status"].iloc[0] == "ok":
            curves = training_rows(result.outcome, config_columns(result.config))
        with lock:
            replace_cell_rows(out_dir, result.key, curves)  # first: results.csv marks it done
            append_rows(out_dir, rows)
            running.discard(result.key)
            i, point = where[result.key]
            summary = cell_summary(point, result.config, rows, result.seconds)
            say(f"[{i + 1}/{total}] {summary}")
            bar.update(1)
            show_in_flight()

    run_cells(
        [CellJob(cid, config) for _i, cid, _point, config in todo],
        finished,
        on_start=started,
        on_reply=replied,
        ray_address=ray_address,
        max_in_flight=cells_in_flight,
        verbose=verbose,
    )


def print_summary(results: pd.DataFrame) -> None:
    """The pivot of mean merged accuracy (method x width) and the count of failed cells."""
    table = summary_table(results)
    if not table.empty:
        print("\nmean accuracy (method x width):")
        print(table.to_string(float_format=lambda v: f"{v:.4f}"))
    failed = results.loc[results["status"] == "failed", "cell_id"].nunique()
    if failed:
        print(f"{failed} cell(s) failed; see the 'error' column of results.csv")
