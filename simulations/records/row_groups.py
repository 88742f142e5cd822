"""Tables over results rows: which run-config keys vary, the labels that split rows into
experiments, the accuracy summary and each cell's one-line summary."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from fedlmc.simulations.config import (
    run_schema,
)

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
    candidates = [k for k in some if _varies(rows[k])]
    applies = applicable(rows, {k: schema[k] for k in candidates})
    return [k for k in candidates if _varies(rows[k][applies[k]])]


def _varies(values: pd.Series) -> bool:
    """Whether ``values`` hold more than one distinct value as text (``astype(str)``; missing
    values as pandas counts them). The texts are compared only where :func:`_one_value` cannot
    tell: most config columns of a results table hold one value (0.8 ms a column as text, 72
    columns, 65 calls for the quick sweep's report)."""
    return not _one_value(values) and values.astype(str).nunique() > 1


def _one_value(values: pd.Series) -> bool:
    """True only when every value of ``values`` is certainly the same text: integers or
    booleans all equal; floats all equal, none missing, of one sign (``-0.0`` is not ``0.0`` as
    text); or Python strings all equal. False otherwise (then the texts decide)."""
    array = values.to_numpy()
    if len(array) == 0:
        return True
    if array.dtype.kind in "biu":
        return bool((array == array[0]).all())
    if array.dtype.kind == "f":
        same_sign = np.signbit(array) == np.signbit(array[0])
        return bool(not np.isnan(array).any() and (array == array[0]).all() and same_sign.all())
    first = array[0]
    return type(first) is str and all(type(v) is str and v == first for v in array)


def applicable(rows: pd.DataFrame, keys: Mapping[str, Any]) -> dict[str, list[bool]]:
    """Per key, per row: whether the key's ``applies`` rule holds for the row's config columns
    (true without a rule, or where the columns cannot answer it). Empty text read back from
    ``results.csv`` as NaN counts as ``""``."""
    ruled = {k: key for k, key in keys.items() if key.applies is not None}
    if not ruled:
        return {k: [True] * len(rows) for k in keys}
    schema = run_schema()
    text = {k for k, key in schema.items() if key.type is str}
    columns = [c for c in rows.columns if c in schema]
    lists = [_native_values(rows[c]) for c in columns]  # to_dict("records"), column by column
    records = zip(*lists, strict=True) if lists else [()] * len(rows)
    configs = [
        {
            k: "" if k in text and isinstance(v, float) and math.isnan(v) else v
            for k, v in zip(columns, record, strict=True)
        }
        for record in records
    ]
    return {
        k: [_holds(ruled[k], c) for c in configs] if k in ruled else [True] * len(rows)
        for k in keys
    }


def _native_values(column: pd.Series) -> list[Any]:
    """The values of ``column`` as ``DataFrame.to_dict("records")`` gives them: a numpy
    column's as Python scalars; an object or extension column's (nullable, Arrow, ``str``)
    through :func:`_native`, as pandas boxes them (``maybe_box_native``)."""
    values = column.tolist()
    if isinstance(column.dtype, np.dtype) and column.dtype != object:
        return values
    return [_native(v) for v in values]


def _native(value: Any) -> Any:
    """A cell as ``to_dict`` boxes it: numpy numbers and booleans as Python's, numpy datetimes
    as Timestamps and Timedeltas, ``pd.NA`` as None (so that a rule reads a missing value as
    None, never as the ambiguous ``pd.NA``)."""
    if value is pd.NA:
        return None
    if isinstance(value, np.integer | np.floating | np.bool_):
        return value.item()
    if isinstance(value, np.datetime64):
        return pd.Timestamp(value)
    if isinstance(value, np.timedelta64):
        return pd.Timedelta(value)
    return value


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


def print_summary(results: pd.DataFrame) -> None:
    """The pivot of mean merged accuracy (method x width) and the count of failed cells."""
    table = summary_table(results)
    if not table.empty:
        print("\nmean accuracy (method x width):")
        print(table.to_string(float_format=lambda v: f"{v:.4f}"))
    failed = results.loc[results["status"] == "failed", "cell_id"].nunique()
    if failed:
        print(f"{failed} cell(s) failed; see the 'error' column of results.csv")
