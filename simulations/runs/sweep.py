"""Run every cell of a sweep as a Flower federation and keep tidy, resumable results.

Engine: all unfinished cells run in **one** Flower simulation
(:mod:`fedlmc.simulations.engine.cells`: one Ray session, one pool of warm ClientApp actors,
several cells in flight so that every client slot stays busy while finished cells merge and
evaluate on the server). ``ray_address`` joins an existing Ray cluster. A custom ``runner(config)
-> DataFrame`` (tests, other back ends) runs the cells one after another instead.

Output folder ``out_dir``:

- ``config.json``: the sweep (``name``, ``run``, ``grid``, ``report``), every cell's resolved run
  config with its ``cell_id``, and the versions of fedlmc, flwr, torch, Python plus the device.
- ``results.csv``: one row per (cell, method): ``cell_id``, ``status`` (``ok`` / ``failed``),
  ``error``, the run-config columns (hyphenated keys, as in the TOML), then the metric columns of
  :func:`fedlmc.simulations.runs.federation.run_federation`. A cell's rows are appended as soon as
  the cell finishes, atomically: the old rows plus the new ones go to a temporary file that
  ``os.replace`` puts in place, so a kill at any moment leaves either the old or the new file.
- ``training.csv``: the clients' per-epoch training curves and FedAvg's per-round curve, one
  row per cell x client x epoch (:mod:`fedlmc.simulations.records.training_file`), written
  (atomically, sorted by cell) just before the cell's rows are appended to ``results.csv``; a
  re-run cell's rows replace its old ones. A custom ``runner`` returns no curves: its cells get
  none.
- ``cells/<cell_id>/``: the ``out-dir`` handed to each cell (merged weights, if any).

Cells finish, and their rows are appended, in any order; the rows of a cell do not depend on
what ran before or beside it.

Resume: a rerun skips every cell whose rows are all in ``results.csv`` and valid (its ``ok``
rows hold exactly the methods of :func:`fedlmc.simulations.config.row_methods`); lines that fail
the schema on read (cut off, junk, an unclosed quote, text in a numeric column, a control
character: :mod:`fedlmc.simulations.records.results_file`) are moved to ``results.rejected.csv``
with a warning, and their cells, like any cell that lost a row, run again, their new rows replacing
the old. A cell whose runner or federation reports other methods than its config's is recorded
as failed. A folder holding the results of a ``fedlmc run`` is refused. Failed cells (the runner
raised, e.g. too few clients survived) are recorded as one row with ``status = "failed"`` and
the reason, the sweep goes on, and a rerun retries them (``retry_failed=False`` keeps them);
the retry's rows replace the failed row. A killed sweep, rerun, thus ends with the same rows as
an uninterrupted one: no cell twice, none missing.

A sweep holds its ``out_dir``'s lock (:func:`fedlmc.simulations.records.out_dir_lock.out_dir_lock`)
while it writes: a second sweep, a ``fedlmc run`` or a ``fedlmc report`` on the folder is refused,
and the folder's kind is checked again under the lock. A different sweep (another set of cells)
under an existing ``out_dir`` is refused unless
``force=True``; then the old ``results.csv`` / ``config.json`` are kept as
``results.previous.csv`` / ``config.previous.json``, and the rows of cells that are still in the
new sweep are carried over (same cell id = same resolved experiment).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fedlmc.simulations.config import (
    SweepConfig,
    absolute_paths,
    canonical_cell_id,
    client_epochs,
    row_methods,
    unique_cells,
)
from fedlmc.simulations.records.cell_rows import (
    RESULTS,
    append_rows,
    config_columns,
    failed_row,
    outcome_rows,
    rows_of_cell,
)
from fedlmc.simulations.records.out_dir_lock import out_dir_lock
from fedlmc.simulations.records.progress import bar_file, redrawn
from fedlmc.simulations.records.results_file import (
    finished_cells,
    read_results,
)
from fedlmc.simulations.records.row_groups import cell_summary, print_summary
from fedlmc.simulations.records.training_file import replace_cell_rows, training_rows
from fedlmc.simulations.runs.out_dir import prepare_out_dir, sweep_record

Runner = Callable[[Mapping[str, Any]], pd.DataFrame]


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


def cells_bar(name: str, total: int, done: int, *, shown: bool) -> Any:
    """The sweep's tqdm bar over its cells (``done`` of ``total`` at the start; disabled unless
    ``shown``), on stderr: into a file or a pipe, one plain line per update
    (:func:`~fedlmc.simulations.records.progress.bar_file`)."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=done,
        unit="cell",
        disable=not shown,
        desc=name,
        file=bar_file(),
        ascii=not sys.stderr.isatty(),
    )


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
    (:mod:`fedlmc.simulations.engine.cells`; ``ray_address`` joins a Ray cluster,
    ``cells_in_flight`` overrides how many cells run at once). ``runner(config) -> DataFrame``
    instead runs one cell at a time, in order. See the module docstring for the files, resuming,
    failures and ``force``.
    """
    from tqdm.auto import tqdm

    if runner is None and ray_address:
        from fedlmc.simulations.engine.ray_runtime import check_ray_address

        check_ray_address(ray_address)  # before anything is written: a clear error at once
    out_dir = Path(out_dir).resolve()
    pairs = unique_cells(sweep)
    points, cells = [p for p, _ in pairs], [c for _, c in pairs]
    ids = [canonical_cell_id(c) for c in cells]
    expected = {cid: row_methods(cell) for cid, cell in zip(ids, cells, strict=True)}
    with out_dir_lock(out_dir, "fedlmc sweep"):
        prepare_out_dir(out_dir, sweep_record(sweep, cells), force=force)  # kind checked again
        results = read_results(out_dir, set_aside_bad=True)
        done = finished_cells(results, expected, retry_failed=retry_failed)
        todo = [i for i, cid in enumerate(ids) if cid not in done]
        say = tqdm.write if progress else (lambda _text: None)
        work = client_epochs([cells[i] for i in todo])
        say(
            f"sweep {sweep.name}: {len(cells)} cells, {len(cells) - len(todo)} already done, "
            f"{work:,} client-epochs of training to go, results in {out_dir / RESULTS}"
        )
        bar = cells_bar(sweep.name, len(cells), len(cells) - len(todo), shown=progress)
        configs = {i: runtime_config(cells[i], out_dir / "cells" / ids[i]) for i in todo}
        try:
            with redrawn(bar):  # its elapsed time and time left move between cells
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
    from fedlmc.simulations.engine.cells import run_cells
    from fedlmc.simulations.engine.sweep_server import CellJob, CellResult

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
