"""A sweep's out dir before the cells run: the sweep record in ``config.json``, the refusal of a
different sweep, and ``force``'s previous files with the rows carried over."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedlmc.io import atomic_write_csv, atomic_write_json, remove_stale_temporaries
from fedlmc.simulations.config import (
    ConfigError,
    SweepConfig,
    canonical_cell_id,
)
from fedlmc.simulations.records.cell_rows import CONFIG, RESULTS
from fedlmc.simulations.records.provenance import versions
from fedlmc.simulations.records.results_file import (
    read_results,
    refuse_mixing,
)
from fedlmc.simulations.records.training_file import keep_cells
from fedlmc.simulations.records.written_paths import OUT_DIR_FILES
from fedlmc.simulations.runs.same_sweep import (
    check_same_sweep,
    describe_difference,
    experiment_of,
    recorded_experiment,
)

__all__ = ["describe_difference", "experiment_of", "prepare_out_dir", "sweep_record"]

# ----------------------------------------------------------------------------- config.json


def sweep_record(sweep: SweepConfig, cells: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What ``config.json`` holds: the sweep, every resolved cell with its id, versions;
    ``cells`` are :func:`~fedlmc.simulations.config.sweep_file.expand_grid`'s (canonical)."""
    return {
        **sweep.to_dict(),
        "source": sweep.source,
        "cells": [{"cell_id": canonical_cell_id(c), "config": dict(c)} for c in cells],
        "versions": versions(),
    }


def prepare_out_dir(out_dir: Path, record: Mapping[str, Any], *, force: bool) -> None:
    """Create ``out_dir``, refuse a run's results or a different sweep there (unless
    ``force``), write config.json."""
    refuse_mixing(out_dir, "sweep")
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out_dir, OUT_DIR_FILES)  # fedlmc's own temporaries only
    if not force:
        check_same_sweep(out_dir, record)
    elif (out_dir / CONFIG).exists():
        try:
            same = recorded_experiment(out_dir) == experiment_of(record)
        except ConfigError:  # unreadable: kept as config.previous.json
            same = False
        if not same:
            supersede(out_dir, set(experiment_of(record)))
    atomic_write_json(out_dir / CONFIG, record)


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
