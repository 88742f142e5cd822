"""Markdown tables read from the registries and the row schema: what ``fedlmc methods|models|keys``
prints and what the docs pages show (``docs/gen_tables.py`` writes them there; a test checks
that the pages hold exactly these tables).
Imports nothing heavy."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fedlmc.merging.methods import CALIBRATED_SUFFIX, METHODS, REFERENCE_METHODS, MergeMethod
from fedlmc.models.registry import MODELS
from fedlmc.simulations.config import FEDAVG, option_key, run_schema
from fedlmc.study import rows as row_schema

__all__ = ["columns_table", "keys_table", "methods_table", "models_table"]

FEDAVG_DESCRIPTION = "baseline: Flower's multi-round FedAvg with the same total local epochs"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _data_source(method: MergeMethod) -> str:
    if method.needs_clients:
        return 'each client\'s own (federation only: `strategy = "aligned"`)'
    if method.needs_server_data and method.clients_for_data:
        return "server split, or the clients' (calibration = federated)"
    return "server split" if method.needs_server_data else "none"


def methods_table() -> str:
    """Every registered merge method with what it needs, then the reference rows."""
    rows = [
        [
            f"`{m.name}`, `{m.name}{CALIBRATED_SUFFIX}`",
            _data_source(m),
            _yes(m.many_clients),
            _yes(m.reestimate_bn),
            m.description,
        ]
        for m in METHODS
    ]
    rows += [[f"`{name}`", "none", "yes", "-", text] for name, text in REFERENCE_METHODS.items()]
    rows.append([f"`{FEDAVG}`", "none", "yes", "no", FEDAVG_DESCRIPTION])
    header = ["method (rows)", "data it needs", "N > 2", "BN re-estimated", "what"]
    return _table(header, rows)


def _literal(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str | bool) else repr(value)


def models_table() -> str:
    """Every registered model: default norm, options (run-config key) and description."""
    rows = []
    keys = run_schema()
    for entry in MODELS:
        options = ", ".join(
            f"`{name}={_literal(o.default)}`"
            + (f" (`{option_key(name)}`)" if o.public or option_key(name) in keys else "")
            for name, o in entry.options.items()
        )
        rows.append([f"`{entry.name}`", f"`{entry.default_norm}`", options, entry.description])
    return _table(["model", "default norm", "options (run-config key)", "what"], rows)


def keys_table() -> str:
    """Every run-config key: type, default, meaning and the allowed names where they are few."""
    rows = []
    for key, spec in run_schema().items():
        meaning = spec.doc
        if spec.allowed is not None:
            meaning += ": " + ", ".join(f"`{name}`" for name in spec.allowed())
        rows.append([f"`{key}`", spec.type.__name__, f"`{_literal(spec.default)}`", meaning])
    return _table(["key", "type", "default", "meaning"], rows)


def columns_table() -> str:
    """Every results-row column of :mod:`fedlmc.study.rows` in row order: its kind of value and
    which rows carry it (every row of the study, or the Flower server's round columns)."""
    json_columns = {*row_schema.LAYER_COLUMNS, "curve"}
    text_columns = {*row_schema.STRING_COLUMNS, *row_schema.ROUND_STRING_COLUMNS}

    def kind(name: str) -> str:
        if name in json_columns:
            return "JSON"
        return "text" if name in text_columns else "number"

    table = [[f"`{c}`", kind(c), "every row (`COLUMNS`)"] for c in row_schema.COLUMNS]
    table += [
        [f"`{c}`", kind(c), "federations (`ROUND_COLUMNS`)"] for c in row_schema.ROUND_COLUMNS
    ]
    return _table(["column", "value", "in which rows"], table)
