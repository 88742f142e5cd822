"""Figures and a markdown report from a sweep's ``results.csv``.

:func:`build_report` reads ``out_dir/results.csv`` (and ``config.json`` for the title and the
``[report]`` settings), keeps the ``ok`` rows and writes, under ``out_dir/figures/``, only the
figures whose data exists:

- ``accuracy_vs_width.png``: merged test accuracy per method against the width multiplier
  (log2 axis), mean over seeds with error bars (std or sem, ``[report] error-bars``); the mean
  endpoint (client model) accuracy and the ensemble accuracy are dashed reference lines.
  ``X_t`` methods are drawn only without ``X`` (temperature never changes the argmax).
- ``barrier_vs_width.png``: two-client cells, the loss barrier at lambda = 1/2 (signed, the
  paper's Table 1 quantity) with raw logits (solid) and a fitted temperature (dashed), per method.
- ``merge_gap_vs_width.png``: any number of clients, the merged model's test NLL minus the mean
  endpoint's, raw (solid) and calibrated (dashed), per method.
- ``temperature_vs_width.png``: the fitted temperature of the ``_t`` methods (solid) and, where
  rows have it, the server split's temperature for the same merged model (dashed).
- ``lewc_layers.png``: LEWC cosine per layer (1 = the merged layer output equals the
  exponentially weighted prediction), one line per width, one panel per method.
- ``lewc_vs_llfc.png``: per layer, on the combined weights (before BatchNorm re-estimation or
  REPAIR), top: the measured norm ratio ``||f_l(merged)|| / ||sum_i w_i f_l(theta_i)||``
  (solid) against LEWC's prediction of it (dashed; LLFC makes no claim about the scale);
  bottom: the relative error of LEWC's prediction (solid) and of LLFC's at its best positive
  scale (dashed); one line per width, one column per method and value of the other varying keys.
- ``dead_units_and_bias_share.png``: per layer of the plain average (and ``average_lewc_bias``),
  the fraction of hidden units never active on the diagnostic inputs (top) and the share of the
  pre-activation that comes from the bias (bottom); one line per client count (or width).
- ``accuracy_vs_alpha.png`` / ``accuracy_vs_clients.png``: when ``alpha`` / ``num-clients`` vary.
- ``client_barriers_vs_clients.png``: cells of three or more clients, the calibrated loss
  barrier at lambda = 1/2 on each client's path to the merge (the path's shape, not the merge's
  quality), mean (solid) and worst client (dashed), against the number of clients.
- ``pairwise_barriers.png``: the N x N loss barrier at lambda = 1/2 between clients (raw), per
  method, for the widest width of the first cell that has the matrix.
- ``lambda_paths.png``: test accuracy and NLL (raw and calibrated) along
  ``theta(lam) = lam theta_a + (1 - lam) theta_b`` for two-client cells, one line per width.

When a config key other than the x axis and ``seed`` varies too, figures get one panel per
value combination of those keys. ``report.md`` holds the tables (markdown) and links to the
figures.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedlmc.io import atomic_write_text
from fedlmc.merging.methods import REFERENCE_METHODS
from fedlmc.simulations.report_schema import REPORT_SCHEMA
from fedlmc.simulations.sweep import (
    read_results,
    split_labels,
    summary_table,
    varying_keys,
    with_split_methods,
)
from fedlmc.study.rows import ReportTables

FIGURES = "figures"
MAX_PANELS = 12


# ----------------------------------------------------------------------------- data


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


# ----------------------------------------------------------------------------- drawing


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
    data = rows.assign(**{f"_{c}": parse_json_column(rows, c) for c in columns})
    data = data[data[f"_{columns[0]}"].map(valid)]
    return data, accuracy_methods(data)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def panel_grid(count: int, width: float = 5.0, height: float = 3.6, rows: int = 1):
    """A figure with ``rows`` x ``count`` panels (``count`` wrapped at 3 columns when rows=1)."""
    plt = _pyplot()
    if rows == 1:
        ncols = min(3, count)
        nrows = math.ceil(count / ncols)
    else:
        ncols, nrows = count, rows
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    flat = list(axes.flat)
    if rows == 1:
        for ax in flat[count:]:
            ax.set_visible(False)
    return fig, axes


def save(fig, path: Path, dpi: int) -> Path:
    """Write ``fig`` to ``path`` and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    _pyplot().close(fig)
    return path


def log_axis(ax, values: Sequence[float], base: int) -> None:
    """Log-scaled x axis with a tick at every value that occurs."""
    ticks = sorted({float(v) for v in values})
    ax.set_xscale("log", base=base)
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t:g}" for t in ticks])
    ax.minorticks_off()


def line_with_spread(ax, table: pd.DataFrame, x: str, label: str, **style) -> None:
    """One line of means with error bars (``table`` from :func:`aggregate`)."""
    ax.errorbar(
        table[x],
        table["mean"],
        yerr=table["spread"],
        label=label,
        capsize=3,
        marker=style.pop("marker", "o"),
        ms=4,
        **style,
    )


def metric_vs_axis(
    rows: pd.DataFrame,
    x: str,
    metrics: Sequence[tuple[str, str]],
    methods: Sequence[str],
    ylabel: str,
    path: Path,
    settings: dict[str, Any],
    *,
    references: bool = False,
    log_base: int = 2,
) -> Path:
    """Per method (colour) and metric (line style), the mean metric against config key ``x``."""
    groups = panels(rows, exclude=[x])
    fig, axes = panel_grid(len(groups))
    styles = ["-", "--", ":", "-."]
    colours = _pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, group) in zip(axes.flat, groups, strict=False):
        for i, method in enumerate(methods):
            subset = group[group["method"] == method]
            for (metric, suffix), style in zip(metrics, styles, strict=False):
                if not has_values(subset, metric):
                    continue
                table = aggregate(subset, [x], metric, settings["error-bars"])
                label = f"{method}{suffix}"
                line_with_spread(
                    ax, table, x, label, color=colours[i % len(colours)], linestyle=style
                )
        if references:
            draw_references(ax, group, x, settings["error-bars"])
        log_axis(ax, group[x], log_base)
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save(fig, path, settings["dpi"])


def draw_references(ax, rows: pd.DataFrame, x: str, kind: str) -> None:
    """Dashed lines: mean endpoint accuracy and ensemble accuracy against ``x``."""
    per_cell = rows.drop_duplicates("cell_id") if "cell_id" in rows else rows
    for column, label, colour in (
        ("endpoint_acc_mean", "endpoints (mean)", "black"),
        ("ensemble_acc", "ensemble", "grey"),
        ("logit_ensemble_acc", "logit ensemble", "tab:brown"),
    ):
        if has_values(per_cell, column):
            table = aggregate(per_cell, [x], column, kind)
            line_with_spread(ax, table, x, label, color=colour, linestyle="--", marker="")


def accuracy_by_width_lines(
    rows: pd.DataFrame,
    x: str,
    methods: Sequence[str],
    path: Path,
    settings: dict[str, Any],
    log_base: int,
) -> Path:
    """Merged accuracy against config key ``x``: one panel per method, one line per width
    (mean over seeds and any other varying key), the mean endpoint accuracy dotted."""
    fig, axes = panel_grid(len(methods))
    cmap = _pyplot().get_cmap("viridis")
    widths = sorted(rows["width"].unique())
    for ax, method in zip(axes.flat, methods, strict=False):
        subset = rows[rows["method"] == method]
        for j, width in enumerate(widths):
            at_width = subset[subset["width"] == width]
            if not has_values(at_width, "accuracy"):
                continue
            colour = cmap(j / max(1, len(widths) - 1))
            table = aggregate(at_width, [x], "accuracy", settings["error-bars"])
            line_with_spread(ax, table, x, f"width {width:g}", color=colour)
            if has_values(at_width, "endpoint_acc_mean"):
                ends = aggregate(at_width, [x], "endpoint_acc_mean", "none")
                ax.plot(ends[x], ends["mean"], color=colour, linestyle=":")
        log_axis(ax, rows[x], log_base)
        ax.set_xlabel(x)
        ax.set_ylabel("merged test accuracy (dotted: endpoints)")
        ax.set_title(method, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save(fig, path, settings["dpi"])


def lewc_figure(rows: pd.DataFrame, path: Path, settings: dict[str, Any]) -> Path | None:
    """LEWC cosine against layer index, one line per width, one panel per method."""
    data, methods = json_rows(rows, ["lewc_cos_layers"])
    if data.empty or not methods:
        return None
    fig, axes = panel_grid(len(methods))
    cmap = _pyplot().get_cmap("viridis")
    widths = sorted(data["width"].unique())
    for ax, method in zip(axes.flat, methods, strict=False):
        subset = data[data["method"] == method]
        for j, width in enumerate(widths):
            curves = [c for c in subset.loc[subset["width"] == width, "_lewc_cos_layers"]]
            if not curves:
                continue
            mean = mean_of_lists(curves)
            ax.plot(
                range(1, len(mean) + 1),
                mean,
                marker="o",
                ms=3,
                color=cmap(j / max(1, len(widths) - 1)),
                label=f"width {width:g}",
            )
        ax.set_xticks(range(1, max(len(v) for v in subset["_lewc_cos_layers"]) + 1))
        ax.set_xlabel("layer (last = logits)")
        ax.set_ylabel("LEWC cosine")
        ax.set_title(method, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save(fig, path, settings["dpi"])


LayerPanel = tuple[str, str | None, str, bool]
"""One row of a per-layer figure: solid column, dashed column (or None), y label, log scale."""

LEWC_PANELS: tuple[LayerPanel, ...] = (
    (
        "norm_ratio_layers",
        "lewc_norm_ratio_layers",
        "norm ratio ||f_l(merge)|| / ||sum w_i f_l||\n(solid measured, dashed LEWC's prediction)",
        True,
    ),
    (
        "lewc_error_layers",
        "llfc_scaled_error_layers",
        "relative error (solid LEWC,\ndashed LLFC at its best positive scale)",
        False,
    ),
)
MECHANISM_METHODS = ("average", "average_lewc_bias", "average_lewc_bias_t")
"""The merges whose dead units and bias shares the mechanism figure draws."""
MECHANISM_PANELS: tuple[LayerPanel, ...] = (
    ("dead_unit_fraction_layers", None, "fraction of hidden units\nnever active", False),
    ("bias_share_layers", None, "bias share ||b|| / (||Wz|| + ||b||)", False),
)


def layer_figure(
    rows: pd.DataFrame,
    path: Path,
    settings: dict[str, Any],
    layer_panels: Sequence[LayerPanel],
    lines: str = "width",
    only: Sequence[str] | None = None,
) -> Path | None:
    """Per-layer lines (mean over seeds), one line per value of ``lines``, one figure row per
    panel of ``layer_panels`` and one column per method (those in ``only``, if given) and value
    combination of the other varying keys (e.g. ``bias``), at most :data:`MAX_PANELS` columns."""
    columns = [c for panel in layer_panels for c in panel[:2] if c]
    data, methods = json_rows(rows, columns)
    methods = [m for m in methods if only is None or m in only]
    if data.empty or not methods:
        return None
    groups = [
        (f"{method}" + (f", {title}" if title else ""), subset[subset["method"] == method])
        for method in methods
        for title, subset in panels(data, exclude=[lines])
    ]
    groups = [(title, subset) for title, subset in groups if not subset.empty][:MAX_PANELS]
    fig, axes = panel_grid(len(groups), rows=len(layer_panels))
    cmap = _pyplot().get_cmap("viridis")
    values = sorted(data[lines].unique())
    for col, (title, subset) in enumerate(groups):
        for j, value in enumerate(values):
            at_value = subset[subset[lines] == value]
            if at_value.empty:
                continue
            colour = cmap(j / max(1, len(values) - 1))
            for row, (solid, dashed, _, _) in enumerate(layer_panels):
                for column, style in ((solid, "-"), (dashed, "--")):
                    if column is None:
                        continue
                    mean = mean_of_lists(list(at_value[f"_{column}"]))
                    label = f"{lines} {value:g}" if (row, style) == (0, "-") else None
                    axes[row, col].plot(
                        range(1, len(mean) + 1), mean, color=colour, linestyle=style, label=label
                    )
        axes[0, col].set_title(title, fontsize=9)
        for row, (_, _, ylabel, log) in enumerate(layer_panels):
            if log:
                axes[row, col].set_yscale("log")
            axes[row, col].set_xlabel("layer l (last = logits)")
            axes[row, col].set_ylabel(ylabel, fontsize=8)
            axes[row, col].grid(alpha=0.3)
            axes[row, col].xaxis.get_major_locator().set_params(integer=True)
        axes[0, col].legend(fontsize=7)
    return save(fig, path, settings["dpi"])


def pairwise_figure(rows: pd.DataFrame, path: Path, settings: dict[str, Any]) -> Path | None:
    """Heat maps of ``pairwise_loss_barrier_half``, one per method, for one cell: the widest
    width among the cells with the most clients that have the matrix (first seed)."""
    data, methods = json_rows(rows, ["pairwise_loss_barrier_half"])
    if data.empty or not methods:
        return None
    data = data[data["num-clients"] == data["num-clients"].max()]
    data = data[data["width"] == data["width"].max()]
    cell = data["cell_id"].iloc[0] if "cell_id" in data else None
    data = data[data["cell_id"] == cell] if cell is not None else data
    fig, axes = panel_grid(len(methods), width=3.6, height=3.2)
    for ax, method in zip(axes.flat, methods, strict=False):
        found = data.loc[data["method"] == method, "_pairwise_loss_barrier_half"]
        if found.empty:
            continue
        matrix = np.array(found.iloc[0], dtype=float)
        image = ax.imshow(matrix, cmap="magma")
        fig.colorbar(image, ax=ax, fraction=0.046)
        ax.set_xticks(range(len(matrix)))
        ax.set_yticks(range(len(matrix)))
        ax.set_xlabel("client j")
        ax.set_ylabel("client i")
        ax.set_title(f"{method}, width {data['width'].iloc[0]:g}", fontsize=9)
    return save(fig, path, settings["dpi"])


def mean_of_lists(lists: Sequence[Sequence[float]]) -> np.ndarray:
    """Element-wise mean of equally long lists (the shortest length when they differ)."""
    length = min(len(v) for v in lists)
    return np.nanmean(np.array([list(v)[:length] for v in lists], dtype=float), axis=0)


def lambda_path_figure(rows: pd.DataFrame, path: Path, settings: dict[str, Any]) -> Path | None:
    """Accuracy and NLL (raw solid, calibrated dashed) along lam, per method and width."""
    data, methods = json_rows(rows, ["curve"], lambda c: isinstance(c, dict) and "lam" in c)
    if data.empty or not methods:
        return None
    fig, axes = panel_grid(len(methods), rows=2)
    cmap = _pyplot().get_cmap("viridis")
    widths = sorted(data["width"].unique())
    for col, method in enumerate(methods):
        subset = data[data["method"] == method]
        for j, width in enumerate(widths):
            found = list(subset.loc[subset["width"] == width, "_curve"])
            if not found:
                continue
            lam = np.array(found[0]["lam"], dtype=float)
            colour = cmap(j / max(1, len(widths) - 1))
            acc = mean_of_lists([c.get("accuracy", []) for c in found])
            axes[0, col].plot(lam[: len(acc)], acc, color=colour, label=f"width {width:g}")
            for key, style in (("nll", "-"), ("nll_calibrated", "--")):
                if all(key in c for c in found):
                    nll = mean_of_lists([c[key] for c in found])
                    axes[1, col].plot(lam[: len(nll)], nll, color=colour, linestyle=style)
        axes[0, col].set_title(method, fontsize=9)
        axes[0, col].set_ylabel("test accuracy")
        axes[1, col].set_ylabel("test NLL (solid raw, dashed calibrated)")
        for ax in axes[:, col]:
            ax.set_xlabel("lambda (1 = client 0, 0 = client 1)")
            ax.grid(alpha=0.3)
        axes[0, col].legend(fontsize=7)
    return save(fig, path, settings["dpi"])


# ----------------------------------------------------------------------------- markdown


def fmt(value: Any) -> str:
    """A table cell: 4 significant decimals for floats, '' for NaN."""
    if isinstance(value, float | np.floating):
        return "" if not math.isfinite(value) else f"{value:.4f}"
    return str(value)


def label(value: Any) -> str:
    """A header or index label: numbers in their shortest form (``0.125``, ``8``)."""
    if isinstance(value, float | np.floating | int | np.integer) and not isinstance(value, bool):
        return f"{value:g}"
    return str(value)


def markdown_table(frame: pd.DataFrame, index_name: str = "") -> str:
    """``frame`` (index included) as a GitHub markdown table."""
    header = [index_name or (frame.index.name or "")] + [label(c) for c in frame.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for index, row in frame.iterrows():
        lines.append("| " + " | ".join([label(index)] + [fmt(v) for v in row]) + " |")
    return "\n".join(lines)


def mean_spread_table(
    rows: pd.DataFrame, value: str, methods: Sequence[str], kind: str, x: str = "width"
) -> pd.DataFrame:
    """Methods x ``x`` cells ``mean ± spread`` (just the mean for one seed); each method split
    by the other varying keys (``average (bias=false)``), never averaged over them."""
    rows, methods = with_split_methods(rows[rows["method"].isin(methods)], methods, [x])
    table = aggregate(rows, ["method", x], value, kind)
    text = table.apply(
        lambda r: (
            ""
            if not math.isfinite(r["mean"])
            else (
                f"{r['mean']:.4f} ± {r['spread']:.4f}"
                if r["count"] > 1 and kind != "none"
                else f"{r['mean']:.4f}"
            )
        ),
        axis=1,
    )
    pivot = table.assign(text=text).pivot(index="method", columns=x, values="text")
    return pivot.reindex([m for m in methods if m in pivot.index]).fillna("")


def width_labels(pairs: Sequence[tuple[float, str]]) -> list[str]:
    """``(width, split label)`` pairs as table headings: ``"1 (bias=False)"``."""
    return [f"{width:g} ({label})" for width, label in pairs]


def reference_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean endpoint accuracy (mean/min/max) and ensemble accuracy per width."""
    cells = rows.drop_duplicates("cell_id")
    columns = [
        c
        for c in (
            "endpoint_acc_mean",
            "endpoint_acc_min",
            "endpoint_acc_max",
            "ensemble_acc",
            "logit_ensemble_acc",
        )
        if has_values(cells, c)
    ]
    if not columns:
        return pd.DataFrame()
    numeric = cells[["width", *columns]].apply(pd.to_numeric, errors="coerce")
    labels = split_labels(cells, ["width"])
    if labels is None:
        return numeric.groupby("width").mean().T
    table = numeric.drop(columns="width").groupby([cells["width"], labels]).mean().T
    table.columns = width_labels(table.columns)
    return table


TABLE1_METHODS = (("average", "no permutation"), ("weight_matching", "weight matching"))
TABLE1_COLUMNS = (
    ("accuracy_barrier_half", "accuracy barrier (points)", 100.0),
    ("loss_barrier_half", "loss barrier", 1.0),
    ("loss_barrier_half_calibrated", "loss barrier, calibrated", 1.0),
)


def table1(rows: pd.DataFrame) -> pd.DataFrame:
    """The paper's Table 1 layout: per width, barriers at lambda = 1/2 (signed; accuracy in
    percentage points) of plain averaging and of weight matching, mean over seeds; one row per
    width and value of the other varying keys (``1 (bias=false)``)."""
    columns: dict[str, pd.Series] = {}
    for method, name in TABLE1_METHODS:
        subset = rows[rows["method"] == method]
        labels = split_labels(subset, ["width"])
        groups = [subset["width"]] if labels is None else [subset["width"], labels]
        for column, heading, scale in TABLE1_COLUMNS:
            if has_values(subset, column):
                values = pd.to_numeric(subset[column], errors="coerce") * scale
                found = values.groupby(groups).mean()
                if labels is not None:
                    found.index = width_labels(found.index)
                columns[f"{name}: {heading}"] = found
    return pd.DataFrame(columns)


MEAN_TABLES = ReportTables()
"""Per-method tables of ``report.md`` (mean over cells), in order: ``(column, heading)`` of every
column declared with a ``report_table`` (:func:`fedlmc.study.rows.report_tables`; the heading is
what the column measures; definitions in :mod:`fedlmc.columns`), read on every use."""


def lewc_scope_section(rows: pd.DataFrame, methods: Sequence[str]) -> list[str]:
    """Which weights each method's LEWC/LLFC columns measure, and why LEWC's are NaN where
    they are (``lewc_measured_on``, ``lewc_undefined_reason``)."""
    if "lewc_measured_on" not in rows:
        return []
    found = rows[rows["method"].isin(methods)]
    scope = found[["method", "lewc_measured_on", "lewc_undefined_reason"]].fillna("")
    scope = scope[scope["lewc_measured_on"] != ""].drop_duplicates()
    if scope.empty:
        return []
    lines = ["## What the LEWC and LLFC columns measure", "", "| method | weights | LEWC |"]
    lines.append("|---|---|---|")
    for _, row in scope.iterrows():
        reason = row["lewc_undefined_reason"] or "defined"
        lines.append(f"| {row['method']} | {row['lewc_measured_on']} | {reason} |")
    return [*lines, ""]


def temperature_series(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """The temperature figure's series: the fitted T, then the server split's when present."""
    series = [("temperature", "")]
    if has_values(rows, "temperature_server_split"):
        series.append(("temperature_server_split", " (server split)"))
    return series


def temperature_gap_section(rows: pd.DataFrame, kind: str) -> list[str]:
    """``log T - log T_server_split`` per method (split by every other varying key, e.g.
    calibration-holdout) and width: how far the temperature the strategy fitted (federated: on
    the clients' data) is from the one the server split gives for the same merged model."""
    if not has_values(rows, "temperature_server_split"):
        return []
    subset = rows[rows["temperature_server_split"].notna() & rows["temperature"].notna()].copy()
    subset["log_t_gap"] = np.log(subset["temperature"]) - np.log(subset["temperature_server_split"])
    labels = list(dict.fromkeys(subset["method"]))
    return [
        "## Temperature: log T (as calibrated) - log T (fitted on the server split)",
        "",
        "Same merged model; 0 = the calibration agrees with the server split; negative = a "
        "lower (sharper) temperature. Federated calibration fits on the clients' data: their "
        "held-out shares (calibration-holdout > 0) or their training data (= 0).",
        "",
        markdown_table(mean_spread_table(subset, "log_t_gap", labels, kind), "method"),
        "",
    ]


def communication_section(rows: pd.DataFrame, methods: Sequence[str]) -> list[str]:
    """Per method and width: mean ``bytes_sent_by_clients`` (kB) / mean ``rounds``."""
    if not has_values(rows, "bytes_sent_by_clients") or not has_values(rows, "rounds"):
        return []
    subset = rows[rows["method"].isin(methods)]
    sent = aggregate(subset, ["method", "width"], "bytes_sent_by_clients", "none")
    rounds = aggregate(subset, ["method", "width"], "rounds", "none")
    text = [
        f"{b / 1e3:,.1f} kB / {r:g}" if math.isfinite(b) and math.isfinite(r) else ""
        for b, r in zip(sent["mean"], rounds["mean"], strict=True)
    ]
    table = sent.assign(text=text).pivot(index="method", columns="width", values="text")
    table = table.reindex([m for m in methods if m in table.index]).fillna("")
    return [
        "## Communication: what the clients sent / message rounds, mean over cells",
        "",
        "bytes_sent_by_clients (their trained weights plus every query reply) in kB, then the "
        "rounds (training plus query rounds).",
        "",
        markdown_table(table, "method"),
        "",
    ]


AUTO_METHODS = ("auto", "auto_t")
ALWAYS_ALIGNED = ("weight_matching", "weight_matching_t")


def auto_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per width: what ``auto`` picked in how many cells, its mean calibrated-NLL gap, its mean
    ``merge_seconds`` and, where the same sweep has ``weight_matching`` rows, theirs and the
    ratio (auto / always weight matching; below 1 = saved)."""
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
        entry = {
            "width": width,
            "auto picked (cells)": ", ".join(f"{c} x{n}" for c, n in counts.items()),
            "auto_nll_gap (nats)": pd.to_numeric(group["auto_nll_gap"]).mean(),
            "auto merge s": pd.to_numeric(group["merge_seconds"]).mean(),
        }
        same = aligned[aligned["width"] == width]
        if has_values(same, "merge_seconds"):
            seconds = pd.to_numeric(same["merge_seconds"]).mean()
            entry["weight matching merge s"] = seconds
            entry["auto / weight matching time"] = entry["auto merge s"] / seconds
        table.append(entry)
    return pd.DataFrame(table).set_index("width")


def auto_section(rows: pd.DataFrame) -> list[str]:
    """The ``auto`` table (:func:`auto_table`) with its heading, when there are auto rows."""
    table = auto_table(rows)
    if table.empty:
        return []
    return [
        "## auto: the merge it picked and its cost against always weight matching",
        "",
        "Per width, over cells: auto_nll_gap = the plain average's calibrated NLL minus the "
        "endpoints' mean on the calibration data; merge seconds include the alignment, its "
        "query rounds, averaging, BN re-estimation and REPAIR.",
        "",
        markdown_table(table, "width"),
        "",
    ]


def report_markdown(
    results: pd.DataFrame,
    record: dict[str, Any],
    figures: Sequence[Path],
    out_dir: Path,
    settings: dict[str, Any],
) -> str:
    """The text of ``report.md``."""
    rows = ok_rows(results)
    title = settings.get("title") or record.get("name") or out_dir.name
    kind = settings["error-bars"]
    cells = results["cell_id"].nunique() if "cell_id" in results else 0
    failed = results.loc[results.get("status", pd.Series(dtype=str)) == "failed"]
    lines = [f"# {title}", ""]
    if record.get("description"):
        lines += [record["description"], ""]
    lines += [
        f"{cells} cell(s), {failed['cell_id'].nunique() if len(failed) else 0} failed; "
        f"varying: {', '.join(varying_keys(rows)) or 'nothing'}.",
        "",
    ]
    versions = record.get("versions", {})
    if versions:
        lines += ["Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()), ""]
    if not rows.empty and "method" in rows:
        methods = list(dict.fromkeys(rows["method"]))
        spread_note = "" if kind == "none" else f" (mean ± {kind} over seeds)"
        lines += [
            f"## Merged test accuracy{spread_note}",
            "",
            markdown_table(mean_spread_table(rows, "accuracy", methods, kind), "method"),
            "",
        ]
        refs = reference_table(rows)
        if not refs.empty:
            lines += [
                "## Reference accuracies (mean over cells)",
                "",
                markdown_table(refs, "width"),
                "",
            ]
        base = accuracy_methods(rows)
        first = table1(rows)
        if not first.empty:
            lines += [
                "## Barriers at lambda = 1/2, the paper's Table 1 layout",
                "",
                "Two-client cells, mean over seeds; signed: L(theta_1/2) - (L_a + L_b)/2, "
                "accuracy in percentage points (chord minus midpoint). "
                "Definitions: fedlmc.study.rows.",
                "",
                markdown_table(first, "width"),
                "",
            ]
        for column, heading in MEAN_TABLES:
            if has_values(rows[rows["method"].isin(base)], column):
                lines += [
                    f"## {heading}",
                    "",
                    markdown_table(mean_spread_table(rows, column, base, kind), "method"),
                    "",
                ]
        lines += lewc_scope_section(rows, base)
        calibrated = [m for m in methods if m.endswith("_t")]
        if calibrated and has_values(rows[rows["method"].isin(calibrated)], "temperature"):
            lines += [
                "## Fitted temperature",
                "",
                markdown_table(mean_spread_table(rows, "temperature", calibrated, kind), "method"),
                "",
            ]
        lines += auto_section(rows)
        lines += temperature_gap_section(rows, kind)
        lines += communication_section(rows, methods)
        for axis in ("alpha", "num-clients", "weight-decay", "partition", "calibration-holdout"):
            subset = axis_rows(rows, axis)
            if axis in varying_keys(subset):
                lines += [
                    f"## Merged test accuracy by {axis}",
                    "",
                    markdown_table(
                        mean_spread_table(subset, "accuracy", methods, kind, x=axis), "method"
                    ),
                    "",
                ]
    if len(failed):
        lines += ["## Failed cells", "", "| cell_id | error |", "|---|---|"]
        for _, row in failed.drop_duplicates("cell_id").iterrows():
            lines.append(f"| {row['cell_id']} | {str(row['error']).replace('|', '/')} |")
        lines.append("")
    if figures:
        lines += ["## Figures", ""]
        for path in figures:
            rel = os.path.relpath(path, out_dir)
            lines += [f"### {path.stem.replace('_', ' ')}", "", f"![{path.stem}]({rel})", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- entry point


def report_settings(record: dict[str, Any]) -> dict[str, Any]:
    """The ``[report]`` settings of ``config.json`` over the defaults."""
    settings = {k: spec.default for k, spec in REPORT_SCHEMA.items()}
    settings.update(record.get("report", {}))
    return settings


def draw_figures(rows: pd.DataFrame, fig_dir: Path, settings: dict[str, Any]) -> list[Path]:
    """Every figure whose data exists (see the module docstring)."""
    if rows.empty or "method" not in rows or "width" not in rows:
        return []
    fig_dir.mkdir(parents=True, exist_ok=True)
    methods = accuracy_methods(rows)
    varying = varying_keys(rows)
    dirichlet = axis_rows(rows, "alpha")
    plans: list[tuple[bool, Callable[[], Path | None]]] = [
        (
            has_values(rows, "accuracy"),
            lambda: metric_vs_axis(
                rows,
                "width",
                [("accuracy", "")],
                methods,
                "merged test accuracy",
                fig_dir / "accuracy_vs_width.png",
                settings,
                references=True,
            ),
        ),
        (
            has_values(rows[rows["method"].isin(methods)], "loss_barrier_half"),
            lambda: metric_vs_axis(
                rows,
                "width",
                [("loss_barrier_half", " raw"), ("loss_barrier_half_calibrated", " calibrated")],
                methods,
                "loss barrier at lambda = 1/2 (signed)",
                fig_dir / "barrier_vs_width.png",
                settings,
            ),
        ),
        (
            has_values(rows[rows["method"].isin(methods)], "merge_gap_loss"),
            lambda: metric_vs_axis(
                rows,
                "width",
                [("merge_gap_loss", " raw"), ("merge_gap_loss_calibrated", " calibrated")],
                methods,
                "merged NLL - mean endpoint NLL",
                fig_dir / "merge_gap_vs_width.png",
                settings,
            ),
        ),
        (
            has_values(rows[rows["method"].str.endswith("_t")], "temperature"),
            lambda: metric_vs_axis(
                rows,
                "width",
                temperature_series(rows),
                [m for m in dict.fromkeys(rows["method"]) if m.endswith("_t")],
                "fitted temperature T",
                fig_dir / "temperature_vs_width.png",
                settings,
            ),
        ),
        (
            has_values(rows, "lewc_cos_mean") or "lewc_cos_layers" in rows,
            lambda: lewc_figure(rows, fig_dir / "lewc_layers.png", settings),
        ),
        (
            "norm_ratio_layers" in rows,
            lambda: layer_figure(rows, fig_dir / "lewc_vs_llfc.png", settings, LEWC_PANELS),
        ),
        (
            "dead_unit_fraction_layers" in rows,
            lambda: layer_figure(
                rows,
                fig_dir / "dead_units_and_bias_share.png",
                settings,
                MECHANISM_PANELS,
                "num-clients" if "num-clients" in varying else "width",
                only=MECHANISM_METHODS,
            ),
        ),
        (
            "alpha" in varying_keys(dirichlet),
            lambda: accuracy_by_width_lines(
                dirichlet, "alpha", methods, fig_dir / "accuracy_vs_alpha.png", settings, 10
            ),
        ),
        (
            "num-clients" in varying,
            lambda: accuracy_by_width_lines(
                rows, "num-clients", methods, fig_dir / "accuracy_vs_clients.png", settings, 2
            ),
        ),
        (
            "num-clients" in varying
            and has_values(rows, "client_to_merge_path_loss_barrier_half_calibrated_mean"),
            lambda: metric_vs_axis(
                rows[pd.to_numeric(rows["num-clients"]) > 2],
                "num-clients",
                [
                    ("client_to_merge_path_loss_barrier_half_calibrated_mean", " mean"),
                    ("client_to_merge_path_loss_barrier_half_calibrated_worst", " worst"),
                ],
                methods,
                "barrier at 1/2 on the path client -> merge,\n"
                "calibrated (path shape, not merge quality)",
                fig_dir / "client_barriers_vs_clients.png",
                settings,
            ),
        ),
        (
            "pairwise_loss_barrier_half" in rows,
            lambda: pairwise_figure(rows, fig_dir / "pairwise_barriers.png", settings),
        ),
        ("curve" in rows, lambda: lambda_path_figure(rows, fig_dir / "lambda_paths.png", settings)),
    ]
    drawn = [draw() for wanted, draw in plans if wanted]
    return [p for p in drawn if p is not None]


def build_report(out_dir: str | os.PathLike) -> list[Path]:
    """Write the figures and ``report.md`` of the sweep in ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    if not (out_dir / "results.csv").exists():
        raise ValueError(f"out_dir={str(out_dir)!r} has no results.csv; run the sweep first")
    results = read_results(out_dir)
    record = read_record(out_dir)
    settings = report_settings(record)
    rows = ok_rows(results)
    figures = draw_figures(rows, out_dir / FIGURES, settings)
    report = out_dir / "report.md"
    atomic_write_text(report, report_markdown(results, record, figures, out_dir, settings))
    return [*figures, report]


def read_record(out_dir: Path) -> dict[str, Any]:
    """``config.json`` of the sweep, or an empty dict."""
    try:
        return json.loads((out_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


__all__ = ["build_report", "draw_figures", "report_markdown", "summary_table"]
