r"""The results-row schema: one tidy row per evaluated method, the columns and how they fill.

Every row of :func:`fedlmc.study.compare_methods` (and of the Flower server, which adds its
round columns) has every column of :func:`row_columns`: the common ones (:data:`COLUMNS`) and
those the registered merge methods' evaluation policies declare
(:func:`fedlmc.study.method_policy.register_evaluation`, ``columns=...``, e.g. the
``auto`` method's ``auto_choice``); a value that does not apply is NaN (numbers) or an empty
string (text, and JSON lists for the per-layer ones). Every column is declared once, with what
it measures, where it applies and its definition, in the column table of :mod:`fedlmc.columns`;
this module derives the lists from it (:func:`column_table` for ``results.csv``,
:func:`columns_markdown` for the docs, :func:`report_tables` for ``report.md``).

**Round columns** (:data:`ROUND_COLUMNS`, added by the Flower server to every row of a
federation, and ``temperature_server_split`` on some) are declared in the same table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fedlmc.columns import (
    COMMON_COLUMNS,
    PREDICTION_KEYS,
    PREDICTION_MEAN_KEYS,
    REPORT_SECTIONS,
    Column,
    check_unique,
)
from fedlmc.merging.method_registry import METHODS, MergeMethod, base_method
from fedlmc.study.method_policy import evaluation_of
from fedlmc.study.server_sees import REFERENCE_SERVER_SEES

__all__ = [
    "COLUMNS",
    "NAN",
    "PREDICTION_KEYS",
    "PREDICTION_MEAN_KEYS",
    "ROUND_COLUMNS",
    "column_applies",
    "column_table",
    "columns_markdown",
    "curve_json",
    "empty_row",
    "endpoint_columns",
    "finite_mean",
    "json_list",
    "method_columns",
    "metric_columns",
    "report_tables",
    "row_columns",
    "server_sees_of",
    "string_columns",
]

COLUMNS = tuple(c.name for c in COMMON_COLUMNS if c.source == "row")
"""The columns every row has besides those the merge methods declare, in order."""
ROUND_COLUMNS = tuple(c.name for c in COMMON_COLUMNS if c.source == "round")
NAN = float("nan")


def method_columns() -> tuple[Column, ...]:
    """The columns the registered merge methods declare, in registration order (a column
    declared by several registrations of one function, e.g. under two names, counted once)."""
    found: dict[str, Column] = {}
    for method in METHODS:
        for column in evaluation_of(method.name).columns:
            found.setdefault(column.name, column)
    return tuple(found.values())


def column_table() -> tuple[Column, ...]:
    """Every results column, in ``results.csv`` order: the row columns, the merge methods' own,
    then the Flower server's round columns."""
    common = [c for c in COMMON_COLUMNS if c.source == "row"]
    server = [c for c in COMMON_COLUMNS if c.source != "row"]
    table = (*common, *method_columns(), *server)
    check_unique(table)
    return table


def row_columns() -> tuple[str, ...]:
    """The columns of every row (:func:`empty_row`): :data:`COLUMNS`, then the methods' own."""
    return tuple(c.name for c in column_table() if c.source == "row")


def string_columns() -> tuple[str, ...]:
    """The row columns holding text (empty where they do not apply)."""
    return tuple(c.name for c in column_table() if c.source == "row" and c.is_string)


def report_tables() -> tuple[tuple[str, str], ...]:
    """``(column, heading)`` of ``report.md``'s per-method mean tables: the columns with a
    ``report_table``, section by section (:data:`fedlmc.columns.REPORT_SECTIONS`)."""
    table = column_table()
    return tuple(
        (c.name, c.measures)
        for section in REPORT_SECTIONS
        for c in table
        if c.report_table == section
    )


def _cell(text: str) -> str:
    """``text`` safe in a Markdown table cell (``|`` escaped, first letter capitalised)."""
    text = " ".join(text.split()).replace("|", "\\|")
    return text[:1].upper() + text[1:]


def _declared_by() -> dict[str, list[str]]:
    by: dict[str, list[str]] = {}
    for method in METHODS:
        for column in evaluation_of(method.name).columns:
            by.setdefault(column.name, []).append(method.name)
    return by


METHOD_SCOPE_RULES: dict[str, tuple[str, Callable[[MergeMethod], bool]]] = {
    "on_path": (
        "merge methods whose merge lies on the path between the clients (registered on_path, a "
        "state dict of the model)",
        lambda m: evaluation_of(m.name).on_path and m.rule.template_shaped,
    ),
    "template_shaped": (
        "merge methods whose merge is a state dict of the model",
        lambda m: m.rule.template_shaped,
    ),
}
"""Per :data:`fedlmc.column_schema.METHOD_SCOPES` entry: what it covers, and whether a registered
method is in it (read from the method's registration)."""


def column_applies(column: Column) -> str:
    """Where ``column`` gets a value: its ``applies`` cells and, for a column of some merge
    methods only (``column.methods``), which, from the registry as it is now: every merge
    method but those named (with their ``_t`` rows; the user's registered methods included)."""
    if not column.methods:
        return column.applies
    what, keeps = METHOD_SCOPE_RULES[column.methods]
    left_out = [m.name for m in METHODS if not keeps(m)]
    but = f" but {', '.join(left_out)} (nor their `_t` rows)" if left_out else ""
    return f"{column.applies}; {what}: every merge method{but}"


def columns_markdown() -> str:
    """The docs' columns table: every column of :func:`column_table`, one row each (a
    method's own columns say which method declares them)."""
    declared = _declared_by()
    lines = [
        "| column | kind | applies to | measures | definition |",
        "|---|---|---|---|---|",
    ]
    for column in column_table():
        applies = column_applies(column)
        if column.name in declared:
            methods = ", ".join(f"`{m}`" for m in declared[column.name])
            plural = "s" if len(declared[column.name]) > 1 else ""
            applies += f" (declared by the {methods} method{plural})"
        texts = (_cell(applies), _cell(column.measures), _cell(column.definition))
        lines.append(f"| `{column.name}` | {column.kind} | " + " | ".join(texts) + " |")
    return "\n".join(lines)


def empty_row(method: str, num_clients: int) -> dict[str, Any]:
    """A row with every column present: NaN numbers, empty strings."""
    row: dict[str, Any] = {name: NAN for name in row_columns()}
    row.update({name: "" for name in string_columns()})
    row["method"] = method
    row["num_clients"] = int(num_clients)
    row["server_sees"] = server_sees_of(method)
    return row


def server_sees_of(method: str) -> str:
    """What the row ``method``'s merge rule needs the server to see: the registered method's
    ``server_sees`` (its evaluation policy's, :func:`fedlmc.study.method_policy.evaluation_of`;
    ``m_t`` as ``m``), :data:`~fedlmc.study.server_sees.REFERENCE_SERVER_SEES` for the ensembles
    and ``fedavg``, empty for any other name."""
    base = base_method(method)
    if base in METHODS:
        return evaluation_of(base).server_sees
    return REFERENCE_SERVER_SEES.get(base, "")


def metric_columns(
    metrics: Mapping[str, float], calibrated: bool, temperature: float
) -> dict[str, float]:
    """The metric columns of a row from test ``accuracy``, ``nll_raw``, ``ece_raw``,
    ``nll_calibrated``, ``ece_calibrated``; ``nll``/``ece`` follow ``calibrated``."""
    suffix = "calibrated" if calibrated else "raw"
    return {
        "accuracy": metrics["accuracy"],
        "nll": metrics[f"nll_{suffix}"],
        "ece": metrics[f"ece_{suffix}"],
        "temperature": temperature if calibrated else 1.0,
        "nll_raw": metrics["nll_raw"],
        "ece_raw": metrics["ece_raw"],
        "nll_calibrated": metrics["nll_calibrated"],
        "ece_calibrated": metrics["ece_calibrated"],
    }


def endpoint_columns(endpoints: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Unweighted mean, min and max test accuracy and mean test NLL of the clients."""
    acc = [e["accuracy"] for e in endpoints]
    return {
        "endpoint_acc_mean": sum(acc) / len(acc),
        "endpoint_acc_min": min(acc),
        "endpoint_acc_max": max(acc),
        "endpoint_nll_mean": sum(e["nll_raw"] for e in endpoints) / len(endpoints),
    }


def finite_mean(values: Sequence[float]) -> float:
    """Mean of the finite values (NaN when there are none)."""
    kept = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(kept) / len(kept) if kept else NAN


def curve_json(curve: Any) -> str:
    """An interpolation curve (DataFrame) as JSON ``{lam, accuracy, nll, nll_calibrated}``."""
    keys = ("lam", "accuracy", "nll", "nll_calibrated")
    return json.dumps({k: [float(v) for v in curve[k]] for k in keys})


def json_list(values: Sequence[float]) -> str:
    """A per-layer (or per-client) column's value: the numbers as a JSON list of floats."""
    return json.dumps([float(v) for v in values])
