"""A sweep's out dir before the cells run: the sweep record in ``config.json``, the refusal of a
different sweep, and ``force``'s previous files with the rows carried over."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedlmc.io import atomic_write_csv, atomic_write_json, remove_stale_temporaries
from fedlmc.simulations.config import (
    ConfigError,
    SweepConfig,
    cell_id,
    experiment_values,
)
from fedlmc.simulations.records.cell_rows import CONFIG, RESULTS
from fedlmc.simulations.records.provenance import versions
from fedlmc.simulations.records.results_file import (
    read_results,
    refuse_mixing,
    sweep_record_of,
)
from fedlmc.simulations.records.training_file import keep_cells
from fedlmc.simulations.records.written_paths import OUT_DIR_FILES

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
    remove_stale_temporaries(out_dir, OUT_DIR_FILES)  # fedlmc's own temporaries only
    path = out_dir / CONFIG
    if path.exists():
        before, now = experiment_of(sweep_record_of(out_dir)), experiment_of(record)
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
