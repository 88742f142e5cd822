"""Whether an out dir may receive a sweep, read without writing and without torch or pandas
(``fedlmc validate --out`` and ``fedlmc sweep``): the experiment recorded in its
``config.json`` (unreadable: said so, with the way to recover) against the sweep's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedlmc.simulations.config import (
    ConfigError,
    SweepConfig,
    canonical_cell_id,
    experiment_values,
)
from fedlmc.simulations.records.results_file import CONFIG, check_writable_folder, refuse_mixing
from fedlmc.simulations.records.written_paths import check_own_files


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


def recorded_experiment(out_dir: Path) -> dict[str, Any]:
    """The experiment (cell id -> values) recorded in ``out_dir/config.json``;
    :class:`ConfigError` saying the file is unreadable (and how to recover) when it is not a
    sweep record fedlmc wrote: not JSON, not an object, or cells without id and config."""
    path = out_dir / CONFIG
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return experiment_of(record)
    except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError) as err:
        why = type(err).__name__ if isinstance(err, (KeyError, TypeError)) else str(err)[:80]
        raise ConfigError(
            f"out dir {str(out_dir)!r}: {CONFIG} is unreadable ({why}), so it cannot be told "
            f"whether the folder holds this sweep; allowed: --force (keeps it as "
            f"config.previous.json and results.csv as results.previous.csv, carries over the "
            f"rows of cells still in the sweep), or another --out"
        ) from None


def check_same_sweep(out_dir: Path, record: Mapping[str, Any]) -> None:
    """:class:`ConfigError` when ``out_dir`` holds a result folder of another kind, an
    unreadable ``config.json`` or a different sweep than ``record``; reads, never writes."""
    refuse_mixing(out_dir, "sweep")
    if not (out_dir / CONFIG).exists():
        return
    before, now = recorded_experiment(out_dir), experiment_of(record)
    if before != now:
        raise ConfigError(
            f"out dir {str(out_dir)!r} holds a different sweep "
            f"({describe_difference(before, now)}); allowed: the same sweep (to resume), "
            f"another --out, or --force"
        )


def check_out_dir_for(sweep: SweepConfig, out_dir: Path) -> None:
    """What ``fedlmc validate --out`` checks without writing or importing torch: ``out_dir`` is
    a writable folder (:func:`check_writable_folder`) whose files fedlmc wrote
    (:func:`check_own_files`) and may receive ``sweep`` (:func:`check_same_sweep`)."""
    from fedlmc.simulations.config.sweep_file import unique_cells

    check_writable_folder(out_dir, "--out")
    check_own_files(out_dir, "--out")
    cells = [{"cell_id": canonical_cell_id(c), "config": c} for _, c in unique_cells(sweep)]
    check_same_sweep(out_dir, {"cells": cells})
