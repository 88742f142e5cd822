"""The rows and tables of a sweep's report: which rows count (:func:`ok_rows`,
:func:`axis_rows`), means and spreads over seeds (:func:`aggregate`), panels by the other
varying keys (:func:`panels`), JSON columns parsed (:func:`json_rows`), and the tables that
``report.md`` shows (:func:`mean_spread_table`, :func:`reference_table`, :func:`table1`,
:func:`auto_table`)."""

from __future__ import annotations

import json
import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from fedlmc.merging.method_registry import REFERENCE_METHODS
from fedlmc.simulations.records.row_groups import split_labels, varying_keys, with_split_methods

MAX_PANELS = 12


def ok_rows(results: pd.DataFrame) -> pd.DataFrame:
    """The rows of cells that succeeded."""
    if "status" not in results:
        return results
    return results[results["status"] == "ok"].reset_index(drop=True)


def axis_rows(rows: pd.DataFrame, axis: str) -> pd.DataFrame:
    """The rows where ``axis`` matters: Dirichlet cells for ``alpha``, else all rows."""
    if axis == "alpha" and "partition" in rows:
        return rows[rows["partition"] == "dirichlet"]
    return rows


def has_values(rows: pd.DataFrame, column: str) -> bool:
    """``column`` exists and holds at least one finite number."""
    return column in rows and pd.to_numeric(rows[column], errors="coerce").notna().any()


def accuracy_methods(rows: pd.DataFrame) -> list[str]:
    """Methods drawn on accuracy plots: ``X_t`` left out when ``X`` is there; no ensembles."""
    methods = list(dict.fromkeys(rows["method"])) if "method" in rows else []
    return [
        m
        for m in methods
        if m not in REFERENCE_METHODS and not (m.endswith("_t") and m[:-2] in methods)
    ]


def spread(values: pd.Series, kind: str) -> float:
    """Standard deviation or standard error of ``values`` (0 for a single value)."""
    values = pd.to_numeric(values, errors="coerce").dropna()
    if kind == "none" or len(values) < 2:
        return 0.0
    std = float(values.std(ddof=1))
    return std / math.sqrt(len(values)) if kind == "sem" else std


FEW_SEEDS = 3
"""Below this many values a table cell names its count: ``0.9200 ± 0.0100 (n=2)``."""


def spread_legend(kind: str) -> str:
    """What a table cell ``mean ± spread (n=k)`` means, for the top of a report."""
    what = {
        "std": "the standard deviation over seeds (ddof = 1)",
        "sem": "the standard error over seeds (ddof = 1 std / sqrt(n))",
    }.get(kind)
    shown = f"a cell is the mean ± {what}" if what else "a cell is the mean over seeds"
    return (
        f"Every table averages over seeds only: {shown}; a cell from fewer than {FEW_SEEDS} "
        "seeds names its count, (n=2) or (n=1)."
    )


def spread_text(mean: float, spread_value: float, count: int, kind: str) -> str:
    """One table cell: ``mean ± spread`` (``kind`` ``std`` or ``sem``, :func:`spread`), then
    ``(n=count)`` when ``count`` < :data:`FEW_SEEDS`; no ``±`` for one value or ``kind =
    "none"``; empty for a mean that is not finite."""
    if not math.isfinite(mean):
        return ""
    text = f"{mean:.4f}"
    if count > 1 and kind != "none":
        text += f" ± {spread_value:.4f}"
    return f"{text} (n={count})" if count < FEW_SEEDS else text


def aggregate(rows: pd.DataFrame, by: Sequence[str], value: str, kind: str) -> pd.DataFrame:
    """Mean and spread of ``value`` over the rows of each ``by`` group, sorted by ``by``."""
    numeric = rows.assign(**{value: pd.to_numeric(rows[value], errors="coerce")})
    grouped = numeric.groupby(list(by), sort=True)[value]
    table = grouped.mean().rename("mean").to_frame()
    table["spread"] = grouped.apply(lambda v: spread(v, kind))
    table["count"] = grouped.count()
    return table.reset_index()


def panels(rows: pd.DataFrame, exclude: Sequence[str]) -> list[tuple[str, pd.DataFrame]]:
    """``(title, rows)`` per value combination of the varying keys not in ``exclude``."""
    keys = [k for k in varying_keys(rows) if k not in exclude and k != "seed"]
    if not keys:
        return [("", rows)]
    groups = rows.groupby(keys, sort=True, dropna=False)
    out = []
    for values, group in list(groups)[:MAX_PANELS]:
        values = values if isinstance(values, tuple) else (values,)
        out.append((", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True)), group))
    return out


BARRIER_OF_GAP = {
    "merge_gap_accuracy": "accuracy_barrier_half",
    "merge_gap_loss": "loss_barrier_half",
    "merge_gap_loss_calibrated": "loss_barrier_half_calibrated",
}
"""Each merge-gap column and the barrier at lambda = 1/2 it equals for two clients of equal
weight (the merged model is then the path's midpoint)."""


def gaps_are_barriers(rows: pd.DataFrame) -> bool:
    """Whether every merge-gap column equals its barrier at lambda = 1/2 on every row
    (:data:`BARRIER_OF_GAP`, :func:`same_values`): a sweep of two-client cells of equal
    weight, where a merge-gap figure would repeat the barrier figure. The ensembles' rows
    (a merge gap, no path) are left out."""
    merges = rows[~rows["method"].isin(list(REFERENCE_METHODS))] if "method" in rows else rows
    pairs = [(g, b) for g, b in BARRIER_OF_GAP.items() if g in merges]
    return bool(pairs) and all(same_values(merges, g, b) for g, b in pairs)


def same_values(rows: pd.DataFrame, first: str, second: str) -> bool:
    """Whether columns ``first`` and ``second`` hold the same number on every row (NaN where
    the other is NaN, at least one finite value): a table or figure
    of ``second`` would repeat one of ``first``. Equal within 1e-6 relative and 1e-7
    absolute: two float32 computations of one quantity (a merge gap and a barrier) differ
    by about 1e-8, far below the 4 decimals shown."""
    if first not in rows or second not in rows:
        return False
    a = pd.to_numeric(rows[first], errors="coerce").to_numpy(dtype=float)
    b = pd.to_numeric(rows[second], errors="coerce").to_numpy(dtype=float)
    if not np.isfinite(a).any() or not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    return bool(np.allclose(a, b, rtol=1e-6, atol=1e-7, equal_nan=True))


def run_title(rows: pd.DataFrame) -> str:
    """What was run, for a figure's title: data set(s), model(s), clients, partition and epochs
    from the rows' run-config columns (``mnist5k, mlp, 2 clients, partition iid, 12
    epochs``; a range where a count varies: ``2-8 clients``); empty when the rows have none
    of them."""
    parts = []
    for key, unit in (
        ("dataset", ""),
        ("model", ""),
        ("num-clients", "clients"),
        ("partition", ""),
        ("epochs", "epochs"),
    ):
        if key not in rows:
            continue
        values = list(dict.fromkeys(rows[key].dropna()))
        if not values:
            continue
        if unit and len(values) > 1:
            numbers = sorted(float(v) for v in values)
            parts.append(f"{numbers[0]:g}-{numbers[-1]:g} {unit}")
        elif unit:
            parts.append(f"{float(values[0]):g} {unit if float(values[0]) != 1 else unit[:-1]}")
        else:
            prefix = "partition " if key == "partition" else ""
            parts.append(prefix + " / ".join(str(v) for v in values))
    return ", ".join(parts)


def parse_json_column(rows: pd.DataFrame, column: str) -> pd.Series:
    """``column`` parsed as JSON; unparsable or empty cells become ``None``."""

    def parse(text: Any) -> Any:
        if not isinstance(text, str) or not text.strip():
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return None

    return rows[column].map(parse) if column in rows else pd.Series([None] * len(rows))


def _non_empty_list(value: Any) -> bool:
    return isinstance(value, list) and len(value) > 0


def json_rows(
    rows: pd.DataFrame, columns: Sequence[str], valid: Callable[[Any], bool] = _non_empty_list
) -> tuple[pd.DataFrame, list[str]]:
    """The rows whose JSON ``columns`` are present, parsed into ``_<column>``, keeping those whose
    first column passes ``valid``; and the methods to draw (:func:`accuracy_methods`). Empty
    when a column is missing."""
    if any(column not in rows for column in columns):
        return rows.iloc[0:0], []
    parsed = pd.DataFrame({f"_{c}": parse_json_column(rows, c) for c in columns}, index=rows.index)
    data = pd.concat([rows, parsed], axis=1)  # one join: ``assign`` on a wide frame fragments it
    data = data[data[f"_{columns[0]}"].map(valid)]
    return data, accuracy_methods(data)


def mean_of_lists(lists: Sequence[Sequence[float] | None]) -> np.ndarray:
    """Element-wise mean of equally long lists (the shortest length when they differ), NaN
    entries left out; NaN where every list has NaN (e.g. a centred cosine of a constant layer).
    Missing lists (``None``: a column the row leaves empty, LEWC's on a residual network) are
    left out; with none left the mean is empty (nothing to draw)."""
    lists = [v for v in lists if v is not None]
    if not lists:
        return np.zeros(0)
    length = min(len(v) for v in lists)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "Mean of empty slice": all NaN
        return np.nanmean(np.array([list(v)[:length] for v in lists], dtype=float), axis=0)


def mean_spread_table(
    rows: pd.DataFrame, value: str, methods: Sequence[str], kind: str, x: str = "width"
) -> pd.DataFrame:
    """Methods x ``x`` cells ``mean ± spread`` (:func:`spread_text`: the seed count where
    fewer than :data:`FEW_SEEDS`); each method split
    by the other varying keys (``average (bias=false)``), never averaged over them."""
    rows, methods = with_split_methods(rows[rows["method"].isin(methods)], methods, [x])
    table = aggregate(rows, ["method", x], value, kind)
    text = table.apply(lambda r: spread_text(r["mean"], r["spread"], int(r["count"]), kind), axis=1)
    pivot = table.assign(text=text).pivot(index="method", columns=x, values="text")
    return pivot.reindex([m for m in methods if m in pivot.index]).fillna("")


def width_labels(pairs: Sequence[tuple[float, str]]) -> list[str]:
    """``(width, split label)`` pairs as table headings: ``"1 (bias=False)"``."""
    return [f"{width:g} ({label})" for width, label in pairs]


def reference_table(rows: pd.DataFrame, kind: str = "none") -> pd.DataFrame:
    """Endpoint accuracy (mean/min/max over the clients) and the reference ensembles' accuracy
    (sample-count-weighted, equal-weight, per-member calibrated, logit) per width, averaged
    over seeds: numbers for ``kind = "none"``, else :func:`mean_spread_text` cells."""
    cells = rows.drop_duplicates("cell_id")
    columns = [
        c
        for c in (
            "endpoint_acc_mean",
            "endpoint_acc_min",
            "endpoint_acc_max",
            "ensemble_acc",
            "ensemble_equal_acc",
            "ensemble_calibrated_acc",
            "logit_ensemble_acc",
        )
        if has_values(cells, c)
    ]
    if not columns:
        return pd.DataFrame()
    numeric = cells[columns].apply(pd.to_numeric, errors="coerce")
    labels = split_labels(cells, ["width"])
    grouped = numeric.groupby(cells["width"] if labels is None else [cells["width"], labels])
    if kind == "none":
        table = grouped.mean().T
    else:
        table = grouped.agg(lambda v: mean_spread_text(v, kind)).T
    if labels is not None:
        table.columns = width_labels(table.columns)
    return table


TABLE1_METHODS = (("average", "no permutation"), ("weight_matching", "weight matching"))
TABLE1_COLUMNS = (
    ("accuracy_barrier_half", "accuracy barrier", 1.0),
    ("loss_barrier_half", "loss barrier", 1.0),
    ("loss_barrier_half_calibrated", "loss barrier, T refitted per lambda", 1.0),
)


def table1(rows: pd.DataFrame, kind: str = "none") -> pd.DataFrame:
    """The paper's Table 1 layout: per width, barriers at lambda = 1/2 (signed; accuracy as a
    fraction, like every accuracy of the report) of plain averaging and of weight matching,
    mean over seeds (``kind`` ``std`` or ``sem``: the text of :func:`mean_spread_text`, the
    seed count where fewer than :data:`FEW_SEEDS`); one row per width and value of the other
    varying keys (``1 (bias=false)``)."""
    columns: dict[str, pd.Series] = {}
    for method, name in TABLE1_METHODS:
        subset = rows[rows["method"] == method]
        labels = split_labels(subset, ["width"])
        groups = [subset["width"]] if labels is None else [subset["width"], labels]
        for column, heading, scale in TABLE1_COLUMNS:
            if has_values(subset, column):
                values = pd.to_numeric(subset[column], errors="coerce") * scale
                found = values.groupby(groups).mean()
                if kind != "none":
                    found = values.groupby(groups).apply(lambda v: mean_spread_text(v, kind))
                if labels is not None:
                    found.index = width_labels(found.index)
                columns[f"{name}: {heading}"] = found
    return pd.DataFrame(columns)


def mean_spread_text(values: pd.Series, kind: str) -> str:
    """:func:`spread_text` of the finite values: ``"mean ± spread"``, ``(n=k)`` where fewer
    than :data:`FEW_SEEDS`; empty when there is none."""
    finite = pd.to_numeric(values, errors="coerce").dropna()
    if finite.empty:
        return ""
    return spread_text(float(finite.mean()), spread(finite, kind), len(finite), kind)


AUTO_METHODS = ("auto", "auto_t")
ALWAYS_ALIGNED = ("weight_matching", "weight_matching_t")


def auto_table(rows: pd.DataFrame, kind: str = "std") -> pd.DataFrame:
    """Per width: what ``auto`` picked in how many cells, its calibrated-NLL gap and its
    ``merge_seconds`` (:func:`mean_spread_text` over the cells) and, where the same sweep has
    ``weight_matching`` rows, theirs and the ratio of the means (auto / always weight
    matching; below 1 = saved)."""
    if "auto_choice" not in rows:
        return pd.DataFrame()
    picked = rows["auto_choice"].map(lambda v: isinstance(v, str) and v != "")
    auto = rows[rows["method"].isin(AUTO_METHODS) & picked].drop_duplicates("cell_id")
    if auto.empty:
        return pd.DataFrame()
    aligned = rows[rows["method"].isin(ALWAYS_ALIGNED)].drop_duplicates("cell_id")
    table = []
    for width, group in auto.groupby("width"):
        counts = group["auto_choice"].value_counts().sort_index()
        auto_seconds = pd.to_numeric(group["merge_seconds"])
        entry = {
            "width": width,
            "auto picked (cells)": ", ".join(f"{c} x{n}" for c, n in counts.items()),
            "auto_nll_gap (nats)": mean_spread_text(group["auto_nll_gap"], kind),
            "auto merge s": mean_spread_text(auto_seconds, kind),
        }
        same = aligned[aligned["width"] == width]
        if has_values(same, "merge_seconds"):
            seconds = pd.to_numeric(same["merge_seconds"])
            entry["weight matching merge s"] = mean_spread_text(seconds, kind)
            entry["auto / weight matching time"] = auto_seconds.mean() / seconds.mean()
        table.append(entry)
    return pd.DataFrame(table).set_index("width")


def init_setting(rows: pd.DataFrame) -> pd.Series:
    """Each row's initialisation setting: ``shared``, ``shared + k warm-up rounds`` or
    ``independent`` (``init`` and ``warmup-rounds``; ``independent`` when ``init`` is absent,
    the default)."""
    init = rows["init"] if "init" in rows else pd.Series("independent", index=rows.index)
    warm = pd.to_numeric(rows.get("warmup-rounds", 0), errors="coerce")
    warm = pd.Series(warm, index=rows.index).fillna(0).astype(int)
    return pd.Series(
        [
            f"{i} + {k} warm-up round{'s' if k > 1 else ''}" if k and i == "shared" else str(i)
            for i, k in zip(init, warm, strict=True)
        ],
        index=rows.index,
    )


def setting_order(settings: pd.Series) -> list[str]:
    """``shared`` first, then the warm-up settings by rounds, ``independent`` last."""

    def key(label: str) -> tuple[int, int]:
        if label == "independent":
            return (2, 0)
        rounds = int(label.split(" + ")[1].split()[0]) if " + " in label else 0
        return (0 if label.startswith("shared") else 1, rounds)

    return sorted(set(settings), key=key)


def width_units(rows: pd.DataFrame) -> dict[Any, str]:
    """Width multiplier -> ``"4x (512 units)"`` for an MLP of one ``base-hidden`` (its hidden
    units per layer), else ``"4x"``."""
    if "width" not in rows:
        return {}
    widths = sorted(pd.to_numeric(rows["width"], errors="coerce").dropna().unique())
    base = one_value(rows, "base-hidden")
    mlp = one_value(rows, "model") == "mlp"
    if not (mlp and isinstance(base, numbers.Real) and math.isfinite(base)):
        return {w: f"{w:g}x" for w in widths}
    return {w: f"{w:g}x ({round(w * base):,} units)" for w in widths}


def one_value(rows: pd.DataFrame, column: str) -> Any:
    """The one value of ``column`` over ``rows`` (``None`` when it has several or none)."""
    values = rows[column].dropna().unique() if column in rows else []
    return values[0] if len(values) == 1 else None
