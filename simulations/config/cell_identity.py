"""A cell's identity: its run config with the keys that cannot affect it reset
(:func:`canonical_run_config`) and the hash that names it (:func:`cell_id`;
:func:`canonical_cell_id` for a cell already canonical)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from fedlmc.simulations.config.keys import run_schema, runtime_keys
from fedlmc.simulations.config.validate import validate_run_config


def canonical_run_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (validated) with the keys that cannot affect the run reset to their defaults
    and the keys that stand for another value resolved, as each key declares (:data:`RUN_KEYS`:
    ``applies`` and ``resolve``, every rule read on ``config`` itself): e.g. ``alpha`` unless
    ``partition = "dirichlet"``, model options the chosen model does not have, ``methods``,
    ``lambdas`` and ``diagnostics`` unless ``strategy = "compare"``, and ``bias = auto``
    resolved to the model's default, so ``auto`` and the value it stands for are one cell.
    ``fedlmc keys`` lists every rule."""
    canonical = dict(config)
    for name, key in run_schema().items():
        if key.applies is not None and not key.applies.of(config):
            canonical[name] = key.default
        elif key.resolve is not None:
            canonical[name] = key.resolve.of(config)
    return canonical


def experiment_values(config: Mapping[str, Any]) -> dict[str, Any]:
    """The keys that define the experiment: the run config minus :func:`runtime_keys`."""
    runtime = runtime_keys()
    return {k: config[k] for k in sorted(config) if k not in runtime}


def cell_id(config: Mapping[str, Any]) -> str:
    """12 hex digits of SHA-256 over the resolved run config minus :func:`runtime_keys`.

    Stable across processes and key order; any default filled in by
    :func:`validate_run_config` is part of the hash, runtime-only keys and keys without effect
    (:func:`canonical_run_config`) are not.
    """
    return canonical_cell_id(canonical_run_config(validate_run_config(config, check_devices=False)))


def canonical_cell_id(canonical: Mapping[str, Any]) -> str:
    """:func:`cell_id` of a run config that is already validated and canonical (a cell of
    :func:`~fedlmc.simulations.config.sweep_file.expand_grid`), without validating and
    resolving it again: canonicalising is idempotent, so ``cell_id(cell) ==
    canonical_cell_id(cell)`` for every such cell (a test checks every shipped config's cells).
    A sweep names its cells this way; validating each cell again for its id took three of the
    four validations a sweep's start made per cell."""
    text = json.dumps(experiment_values(canonical), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
