"""The figures of a sweep's report, one drawing function each
(:mod:`fedlmc.simulations.report.figure_table` says which are drawn, from which rows, into which
file;
:mod:`fedlmc.simulations.report.build` lists them).

Conventions every drawing follows: every figure carries the title of what was run
(:func:`figure_title` around the drawing, read by :func:`save`); panels that show the same
quantity share their y axis; what a line style means (solid raw, dashed calibrated, ...) is a
legend entry, not an axis label (:func:`style_legend`); two methods whose lines coincide on a
panel (e.g. ``average`` and ``average_lewc_bias_t`` without biases, equal by definition) are
drawn once, labelled ``a = b (identical here)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from fedlmc.simulations.report.data import (
    MAX_PANELS,
    aggregate,
    has_values,
    init_setting,
    json_rows,
    mean_of_lists,
    panels,
    setting_order,
)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_TITLE: ContextVar[str] = ContextVar("figure_title", default="")


@contextmanager
def figure_title(title: str) -> Iterator[None]:
    """Every figure saved inside gets ``title`` (what was run) above its panels."""
    token = _TITLE.set(title)
    try:
        yield
    finally:
        _TITLE.reset(token)


def panel_grid(
    count: int,
    width: float = 5.0,
    height: float = 3.6,
    rows: int = 1,
    sharey: bool | str = False,
):
    """A figure with ``rows`` x ``count`` panels (``count`` wrapped at 3 columns when rows=1);
    ``sharey``: matplotlib's (``True``: every panel, ``"row"``: each row of panels)."""
    plt = _pyplot()
    if rows == 1:
        ncols = min(3, count)
        nrows = math.ceil(count / ncols)
    else:
        ncols, nrows = count, rows
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, sharey=sharey
    )
    if sharey:  # shared axes hide the tick labels of inner panels: show them on every panel
        for ax in axes.flat:
            ax.yaxis.set_tick_params(labelleft=True)
    flat = list(axes.flat)
    if rows == 1:
        for ax in flat[count:]:
            ax.set_visible(False)
    return fig, axes


def save(fig, path: Path, dpi: int) -> Path:
    """Write ``fig`` to ``path`` (titled by :func:`figure_title`, when set) and close it."""
    if _TITLE.get():
        fig.suptitle(_TITLE.get(), fontsize=11)
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


def style_legend(ax, styles: Sequence[tuple[str, str]], **legend) -> None:
    """The legend of ``ax`` with, after its own entries, one black line per ``(linestyle,
    meaning)``: what solid and dashed mean, said once."""
    from matplotlib.lines import Line2D

    handles, labels = ax.get_legend_handles_labels()
    for style, meaning in styles:
        handles.append(Line2D([], [], color="black", linestyle=style))
        labels.append(meaning)
    if handles:
        ax.legend(handles, labels, **{"fontsize": 7, **legend})


def coinciding(tables: dict[str, list[pd.DataFrame]]) -> dict[str, list[str]]:
    """Methods whose series are all equal (same x, means and spreads) grouped under the first
    of them, in order: ``{"average": ["average", "average_lewc_bias_t"], ...}``."""
    groups: dict[str, list[str]] = {}
    for method, series in tables.items():
        twin = next(
            (
                first
                for first in groups
                if len(tables[first]) == len(series)
                and all(_same_table(a, b) for a, b in zip(tables[first], series, strict=True))
            ),
            None,
        )
        groups.setdefault(twin or method, []).append(method)
    return groups


def _same_table(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    if len(a) != len(b) or list(a.iloc[:, 0]) != list(b.iloc[:, 0]):
        return False
    return all(
        np.allclose(
            np.asarray(a[c], dtype=float),
            np.asarray(b[c], dtype=float),
            rtol=1e-6,
            atol=1e-7,
            equal_nan=True,
        )
        for c in ("mean", "spread")
    )


def coinciding_label(names: Sequence[str]) -> str:
    """``"a"``, or ``"a = b (identical here)"`` for methods drawn once."""
    return names[0] if len(names) == 1 else " = ".join(names) + " (identical here)"


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
    """Per method (colour) and metric (line style, said in the legend when there are several:
    ``metrics`` are ``(column, meaning)``), the mean metric against config key ``x``; one panel
    per value of the other varying keys, sharing the y axis; coinciding methods drawn once
    (:func:`coinciding`)."""
    groups = panels(rows, exclude=[x])
    fig, axes = panel_grid(len(groups), sharey=True)
    styles = ["-", "--", ":", "-."]
    colours = _pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, group) in zip(axes.flat, groups, strict=False):
        tables = {}
        for method in methods:
            subset = group[group["method"] == method]
            tables[method] = [
                aggregate(subset, [x], metric, settings["error-bars"])
                if has_values(subset, metric)
                else pd.DataFrame(columns=[x, "mean", "spread"])
                for metric, _ in metrics
            ]
        for first, names in coinciding(tables).items():
            colour = colours[methods.index(first) % len(colours)]
            label: str | None = coinciding_label(names)
            for table, style in zip(tables[first], styles, strict=False):
                if table.empty:
                    continue
                line_with_spread(ax, table, x, label, color=colour, linestyle=style)
                label = None
        if references:
            draw_references(ax, group, x, settings["error-bars"])
        log_axis(ax, group[x], log_base)
        ax.set_xlabel(x)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        meanings = [(style, m.strip()) for (_, m), style in zip(metrics, styles, strict=False)]
        style_legend(ax, meanings if len(metrics) > 1 else [])
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
    """Merged accuracy against config key ``x``: one panel per method and initialisation
    setting (:func:`~fedlmc.simulations.report.data.init_setting`, when it varies), one line per
    width (mean over seeds and any other varying key), the mean endpoint accuracy dotted."""
    setting = init_setting(rows)
    several = setting.nunique() > 1
    groups = [
        (
            f"{method}, init = {label}" if several else method,
            (rows["method"] == method) & (setting == label),
        )
        for method in methods
        for label in setting_order(setting)
        if ((rows["method"] == method) & (setting == label)).any()
    ][:MAX_PANELS]
    fig, axes = panel_grid(len(groups), sharey=True)
    cmap = _pyplot().get_cmap("viridis")
    widths = sorted(rows["width"].unique())
    for ax, (title, chosen) in zip(axes.flat, groups, strict=False):
        subset = rows[chosen]
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
        ax.set_ylabel("merged test accuracy")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        style_legend(ax, [("-", "merged"), (":", "endpoints (mean)")])
    return save(fig, path, settings["dpi"])


class LayerPanel(NamedTuple):
    """One row of a per-layer figure: the solid column, the dashed column (or None), the y
    label, a log scale, and what solid and dashed mean (legend entries, when dashed is set)."""

    solid: str
    dashed: str | None
    ylabel: str
    log: bool
    solid_means: str = ""
    dashed_means: str = ""


LEWC_COSINE_PANELS = (
    LayerPanel(
        "lewc_cos_layers",
        "lewc_cos_shuffled_layers",
        "LEWC cosine",
        False,
        "same input",
        "shuffled input (baseline)",
    ),
    LayerPanel(
        "lewc_cos_centred_layers", None, "LEWC cosine, centred\non the mean over inputs", False
    ),
)
"""The raw cosine against its shuffled-input baseline, and the centred cosine."""
RAW_LEWC_COSINE_PANELS = (LayerPanel("lewc_cos_layers", None, "LEWC cosine", False),)
"""For results folders from before the baseline and centred columns."""


def lewc_cosine_panels(columns: Sequence[str]) -> tuple[LayerPanel, ...]:
    """:data:`LEWC_COSINE_PANELS` where ``columns`` hold all of theirs, else the raw cosine."""
    wanted = {c for panel in LEWC_COSINE_PANELS for c in panel[:2] if c}
    return LEWC_COSINE_PANELS if wanted <= set(columns) else RAW_LEWC_COSINE_PANELS


LEWC_PANELS: tuple[LayerPanel, ...] = (
    LayerPanel(
        "norm_ratio_layers",
        "lewc_norm_ratio_layers",
        "norm ratio ||f_l(merge)|| / ||sum_i w_i f_l(theta_i)||",
        True,
        "measured",
        "LEWC's prediction",
    ),
    LayerPanel(
        "lewc_error_layers",
        "llfc_scaled_error_layers",
        "relative error of the prediction",
        False,
        "LEWC",
        "LLFC at its best positive scale",
    ),
)
MECHANISM_METHODS = ("average", "average_lewc_bias", "average_lewc_bias_t")
"""The merges whose dead units and bias shares the mechanism figure draws."""
MECHANISM_PANELS: tuple[LayerPanel, ...] = (
    LayerPanel("dead_unit_fraction_layers", None, "fraction of hidden units\nnever active", False),
    LayerPanel("bias_share_layers", None, "bias share ||b|| / (||Wz|| + ||b||)", False),
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
    panel of ``layer_panels`` (its panels sharing the y axis) and one column per method (those
    in ``only``, if given) and value combination of the other varying keys (e.g. ``bias``),
    at most :data:`MAX_PANELS` columns; a method whose curves equal an earlier method's on the
    same value combination is not given a column of its own: the earlier one's title names
    both."""
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
    groups = merge_identical_panels(
        [(title, subset) for title, subset in groups if not subset.empty], columns, lines
    )[:MAX_PANELS]
    if len(layer_panels) == 1:  # one row of panels, wrapped at 3 columns
        fig, grid = panel_grid(len(groups), sharey=True)
        axes = np.array(list(grid.flat)[: len(groups)], dtype=object).reshape(1, -1)
    else:
        fig, axes = panel_grid(len(groups), rows=len(layer_panels), sharey="row")
    cmap = _pyplot().get_cmap("viridis")
    values = sorted(data[lines].unique())
    for col, (title, subset) in enumerate(groups):
        for j, value in enumerate(values):
            at_value = subset[subset[lines] == value]
            if at_value.empty:
                continue
            colour = cmap(j / max(1, len(values) - 1))
            for row, panel in enumerate(layer_panels):
                for column, style in ((panel.solid, "-"), (panel.dashed, "--")):
                    if column is None:
                        continue
                    mean = mean_of_lists(list(at_value[f"_{column}"]))
                    label = f"{lines} {value:g}" if (row, style) == (0, "-") else None
                    axes[row, col].plot(
                        range(1, len(mean) + 1), mean, color=colour, linestyle=style, label=label
                    )
        axes[0, col].set_title(title, fontsize=9)
        for row, panel in enumerate(layer_panels):
            ax = axes[row, col]
            if panel.log:
                ax.set_yscale("log")
            ax.set_xlabel("layer l (last = logits)")
            ax.set_ylabel(panel.ylabel, fontsize=8)
            ax.grid(alpha=0.3)
            ax.xaxis.get_major_locator().set_params(integer=True)
            styles = panel.dashed is not None and col == 0
            if (row, col) == (0, 0) or styles:
                meanings = [("-", panel.solid_means), ("--", panel.dashed_means)]
                style_legend(ax, meanings if styles else [])
    return save(fig, path, settings["dpi"])


def merge_identical_panels(
    groups: list[tuple[str, pd.DataFrame]], columns: Sequence[str], lines: str
) -> list[tuple[str, pd.DataFrame]]:
    """``(title, rows)`` panels with those whose mean curves (per value of ``lines``, every
    parsed column ``_<column>``) equal an earlier panel's dropped, that panel's title naming
    both methods (``average = average_lewc_bias_t (identical here), bias=False``)."""

    def curves(rows: pd.DataFrame) -> list[tuple[Any, str, np.ndarray]]:
        return [
            (value, column, mean_of_lists(list(rows.loc[rows[lines] == value, f"_{column}"])))
            for value in sorted(rows[lines].unique())
            for column in columns
        ]

    kept: list[tuple[list[str], str, pd.DataFrame, list]] = []
    for title, rows in groups:
        method, _, rest = title.partition(", ")
        mine = curves(rows)
        twin = next((k for k in kept if k[1] == rest and _same_curves(k[3], mine)), None)
        if twin is None:
            kept.append(([method], rest, rows, mine))
        else:
            twin[0].append(method)
    return [
        (coinciding_label(names) + (f", {rest}" if rest else ""), rows)
        for names, rest, rows, _ in kept
    ]


def _same_curves(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        va == vb
        and ca == cb
        and len(ma) == len(mb)
        and bool(np.allclose(ma, mb, rtol=1e-6, atol=1e-7, equal_nan=True))
        for (va, ca, ma), (vb, cb, mb) in zip(a, b, strict=True)
    )


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


def lambda_path_figure(rows: pd.DataFrame, path: Path, settings: dict[str, Any]) -> Path | None:
    """Accuracy (top) and NLL (bottom: raw solid, calibrated dashed) along lam, one line per
    width (mean over seeds), one column per method and value of the other varying keys (e.g.
    ``bias``), each row of panels sharing its y axis; coinciding methods drawn once."""
    data, methods = json_rows(rows, ["curve"], lambda c: isinstance(c, dict) and "lam" in c)
    if data.empty or not methods:
        return None
    curves = {  # the curves as lists, compared by merge_identical_panels
        f"_{k}": data["_curve"].map(lambda c, k=k: c.get(k, []))
        for k in ("accuracy", "nll", "nll_calibrated")
    }
    data = pd.concat([data, pd.DataFrame(curves, index=data.index)], axis=1)
    keys = [k for k in ("accuracy", "nll", "nll_calibrated") if data[f"_{k}"].map(len).all()]
    groups = [
        (f"{method}" + (f", {title}" if title else ""), subset[subset["method"] == method])
        for method in methods
        for title, subset in panels(data, exclude=["width"])
    ]
    groups = merge_identical_panels([g for g in groups if not g[1].empty], keys, "width")
    groups = groups[:MAX_PANELS]
    fig, axes = panel_grid(len(groups), rows=2, sharey="row")
    cmap = _pyplot().get_cmap("viridis")
    widths = sorted(data["width"].unique())
    for col, (title, subset) in enumerate(groups):
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
        axes[0, col].set_title(title, fontsize=9)
        axes[0, col].set_ylabel("test accuracy")
        axes[1, col].set_ylabel("test NLL")
        for ax in axes[:, col]:
            ax.set_xlabel("lambda (1 = client 0, 0 = client 1)")
            ax.grid(alpha=0.3)
        axes[0, col].legend(fontsize=7)
    style_legend(axes[1, 0], [("-", "raw logits"), ("--", "fitted temperature")])
    return save(fig, path, settings["dpi"])


def temperature_series(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """The temperature figure's series: the fitted T, then the server split's when present."""
    series = [("temperature", "the row's temperature")]
    if has_values(rows, "temperature_server_split"):
        series.append(("temperature_server_split", "fitted on the server split"))
    return series
