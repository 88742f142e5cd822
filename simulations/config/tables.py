"""Tables read from the registries and declarations: what ``fedlmc methods|models|keys|columns``
prints and what the docs show (a test checks that the docs pages hold exactly these tables), and
``pyproject.toml``'s ``[tool.flwr.app.config]`` block (``fedlmc keys --pyproject``; a test checks
that the file holds exactly it). Imports nothing heavy."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fedlmc.merging.method_registry import (
    CALIBRATED_SUFFIX,
    METHODS,
    REFERENCE_DATA,
    REFERENCE_METHODS,
    MergeMethod,
)
from fedlmc.models.registry import MODELS
from fedlmc.simulations.config import FEDAVG, option_key, run_schema
from fedlmc.simulations.config.schema import Key, bounds_text
from fedlmc.simulations.config.values import Mode
from fedlmc.strategies.secure_forms import NOT_BUILT, runs_securely, secure_form
from fedlmc.study.method_policy import evaluation_of
from fedlmc.study.rows import columns_markdown, server_sees_of
from fedlmc.training_columns import training_columns_markdown

__all__ = [
    "PYPROJECT_TABLE",
    "columns_table",
    "key_facts",
    "keys_table",
    "methods_table",
    "models_table",
    "pyproject_config",
    "secure_methods_table",
    "with_pyproject_config",
]

FEDAVG_DESCRIPTION = "baseline: Flower's multi-round FedAvg with the same total local epochs"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _data_source(method: MergeMethod) -> str:
    if method.needs.clients:
        return (
            f'each client\'s own (a federation only: `strategy = "{Mode.ALIGNED}"`, or '
            f"`{Mode.COMPARE}` querying its clients)"
        )
    if method.needs.base:
        return 'none, but the clients\' common base (`init = "shared"`)'
    if method.needs.server_data and method.needs.clients_for_data:
        return "server split, or the clients' (calibration = federated)"
    return "server split" if method.needs.server_data else "none"


def methods_table() -> str:
    """Every registered merge method with what it needs, then the reference rows."""
    rows = [
        [
            f"`{m.name}`, `{m.name}{CALIBRATED_SUFFIX}`",
            _data_source(m),
            _yes(m.needs.many_clients),
            _yes(m.rule.reestimate_bn),
            _yes(m.needs.mixed_widths),
            m.description,
            server_sees_of(m.name),
        ]
        for m in METHODS
    ]
    rows += [
        [f"`{name}`", REFERENCE_DATA.get(name, "none"), "yes", "-", "-", text, server_sees_of(name)]
        for name, text in REFERENCE_METHODS.items()
    ]
    rows.append(
        [f"`{FEDAVG}`", "none", "yes", "no", "no", FEDAVG_DESCRIPTION, server_sees_of(FEDAVG)]
    )
    header = [
        "method (rows)",
        "data it needs",
        "N > 2",
        "BN re-estimated",
        "mixed widths",
        "what",
        "server sees",
    ]
    return _table(header, rows)


def _secure_row(method: MergeMethod) -> list[str]:
    """A method's row of :func:`secure_methods_table`."""
    name = f"`{method.name}`, `{method.name}{CALIBRATED_SUFFIX}`"
    sees, form = evaluation_of(method.name).server_sees, secure_form(method.name)
    if runs_securely(method.name):
        cell = (
            f'`strategy = "{Mode.AVERAGE}"`'
            if method.name == "average"
            else f'`strategy = "{Mode.ALIGNED}"`, `align = "{method.name}"`'
        )
        runs = "yes, plus the holder masks (about twice the bytes)"
        return [name, sees, runs if form.divide_by_holders else "yes", cell]
    if sees == "sum":
        return [name, sees, "not built", f"would need {form.note or NOT_BUILT}"]
    return [name, sees, "no", "its rule needs more than a sum"]


def secure_methods_table() -> str:
    """Every registered merge method: what its rule needs the server to see, whether
    ``secure-aggregation = "secagg+"`` runs it (a ``sum`` rule with its ``sum_exponents``) and
    with which run config, or what it would need."""
    rows = [_secure_row(m) for m in METHODS]
    header = ["method (rows)", "server sees", "runs under SecAgg+", "run config, or why not"]
    return _table(header, rows)


def _literal(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str | bool) else repr(value)


def models_table() -> str:
    """Every registered model: default norm (and the others it takes), options (run-config
    key) and description."""
    rows = []
    keys = run_schema()
    for entry in MODELS:
        options = ", ".join(
            f"`{name}={_literal(o.default)}`"
            + (f" (`{option_key(name)}`)" if o.public or option_key(name) in keys else "")
            for name, o in entry.options.items()
        )
        others = [n for n in entry.norms if n != entry.default_norm]
        norm = f"`{entry.default_norm}`" + (f" (also {', '.join(others)})" if others else "")
        rows.append([f"`{entry.name}`", norm, options, entry.description])
    return _table(["model", "default norm", "options (run-config key)", "what"], rows)


def _identity(spec: Key) -> str:
    """Whether and when a key counts in a cell's identity (``cell_id``)."""
    if spec.runtime:
        return "no: runtime"
    if spec.applies is not None:
        return f"only when {spec.applies.text}"
    return f"yes; {spec.resolve.text}" if spec.resolve is not None else "yes"


def keys_table() -> str:
    """Every run-config key: type, default, meaning and the allowed names where they are few,
    or the range of a numeric key (its :class:`~fedlmc.simulations.config.schema.Range`), and
    whether it is part of a sweep cell's identity (runtime keys never are; a key that can
    affect a run only when another key says so counts only then)."""
    rows = [[f"`{key}`", *key_facts(spec)] for key, spec in run_schema().items()]
    return _table(["key", "type", "default", "meaning", "in a cell's identity"], rows)


def key_facts(spec: Key) -> list[str]:
    """A key's type, default, meaning (with its allowed names or range) and identity: its row
    of :func:`keys_table` (markdown: names and the default in backticks)."""
    meaning = spec.doc
    if spec.allowed is not None:
        meaning += ": " + ", ".join(f"`{name}`" for name in spec.allowed())
    if (bounds := bounds_text(spec)) is not None:
        meaning += f"; {bounds}"
    return [spec.type.__name__, f"`{_literal(spec.default)}`", meaning, _identity(spec)]


def columns_table() -> str:
    """Every results column (:func:`fedlmc.study.rows.columns_markdown`): what it measures, where it
    applies, its definition; the merge methods' own columns included."""
    return columns_markdown()


def training_columns_table() -> str:
    """Every column of ``training.csv`` after ``cell_id`` and the run-config columns
    (:func:`fedlmc.training_columns.training_columns_markdown`)."""
    return training_columns_markdown()


PYPROJECT_TABLE = "[tool.flwr.app.config]"
PYPROJECT_COMMENT = (
    "# Every key of fedlmc.simulations.config.run_schema() with its default, generated by",
    "# `fedlmc keys --pyproject` (a test checks it); override with",
    '# flwr run . <connection> --run-config "key=value ..."',
)


def _toml(value: Any) -> str:
    """A TOML literal of a scalar default (strings as basic strings, ``true``/``false``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, str) else repr(value)


def pyproject_config() -> str:
    """``pyproject.toml``'s ``[tool.flwr.app.config]`` block: every run-config key with its
    default, in :func:`fedlmc.simulations.config.run_schema` order."""
    lines = [PYPROJECT_TABLE, *PYPROJECT_COMMENT]
    lines += [f"{key} = {_toml(spec.default)}" for key, spec in run_schema().items()]
    return "\n".join(lines) + "\n"


def _block_span(lines: list[str]) -> tuple[int, int]:
    """``(start, end)`` line indices of the ``[tool.flwr.app.config]`` block (header to the line
    before the next table header, trailing blank lines left out); ``ValueError`` when absent."""
    if PYPROJECT_TABLE not in lines:
        raise ValueError(f"no {PYPROJECT_TABLE} table; allowed: a pyproject.toml with one")
    start = lines.index(PYPROJECT_TABLE)
    end = start + 1
    while end < len(lines) and not lines[end].startswith("["):
        end += 1
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    return start, end


def _pyproject_config_of(text: str) -> str:
    """The ``[tool.flwr.app.config]`` block of the pyproject text ``text``, as written."""
    lines = text.split("\n")
    start, end = _block_span(lines)
    return "\n".join(lines[start:end]) + "\n"


def with_pyproject_config(text: str) -> str:
    """The pyproject text ``text`` with its ``[tool.flwr.app.config]`` block replaced by
    :func:`pyproject_config`."""
    lines = text.split("\n")
    start, end = _block_span(lines)
    lines[start:end] = pyproject_config().rstrip("\n").split("\n")
    return "\n".join(lines)
