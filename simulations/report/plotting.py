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
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

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
    width_units,
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


def block_grid(count: int, rows: int, width: float = 4.2, height: float = 3.0):
    """A figure of ``count`` blocks of ``rows`` stacked panels, at most 3 blocks a line; the
    axes of each block (``rows`` each) and the spare blocks' (hidden, or a shared legend's
    place). Panels of the same row of every block share their y axis."""
    plt = _pyplot()
    ncols = min(3, count)
    lines = math.ceil(count / ncols)
    fig, axes = plt.subplots(
        rows * lines, ncols, figsize=(width * ncols, height * rows * lines), squeeze=False
    )
    blocks = [[axes[(b // ncols) * rows + r, b % ncols] for r in range(rows)] for b in range(count)]
    spare = [
        [axes[(b // ncols) * rows + r, b % ncols] for r in range(rows)]
        for b in range(count, lines * ncols)
    ]
    for r in range(rows):
        for block in blocks[1:]:
            block[r].sharey(blocks[0][r])
            block[r].yaxis.set_tick_params(labelleft=True)
    for block in spare:
        for ax in block:
            ax.set_visible(False)
    return fig, blocks, spare


def shared_legend(blocks: list, spare: list, styles: Sequence[tuple[str, str]]) -> None:
    """One legend for every panel: the first panel's lines and what each line style means, in
    a spare block when there is one, else on the first panel."""
    from matplotlib.lines import Line2D

    handles, labels = blocks[0][0].get_legend_handles_labels()
    for style, meaning in styles:
        handles.append(Line2D([], [], color="black", linestyle=style))
        labels.append(meaning)
    if spare:
        ax = spare[0][0]
        ax.set_visible(True)
        ax.axis("off")
        ax.legend(handles, labels, loc="center", fontsize=9, frameon=False)
    elif handles:
        blocks[0][0].legend(handles, labels, fontsize=7)


def mark_empty(ax, what: str, zero_means: str = "") -> None:
    """An axis with no finite value (or, with ``zero_means``, only zeros): blanked, with a line
    saying why."""
    values = [np.asarray(line.get_ydata(), dtype=float) for line in ax.get_lines()]
    finite = [v[np.isfinite(v)] for v in values]
    if zero_means and finite and all(len(v) and (v == 0).all() for v in finite):
        what = zero_means
    elif any(len(v) for v in finite):
        return
    ax.cla()
    ax.axis("off")
    ax.text(0.5, 0.5, what, ha="center", va="center", fontsize=9, transform=ax.transAxes)


def save(fig, path: Path, dpi: int) -> Path:
    """Write ``fig`` to ``path`` (titled by :func:`figure_title`, when set) and close it; every
    text inside the canvas (:func:`fit_texts`)."""
    if _TITLE.get():
        fig.suptitle(_TITLE.get(), fontsize=11)
    fig.set_dpi(dpi)  # measured at the resolution it is written with
    fit_texts(fig)
    fig.savefig(path, dpi=dpi)
    _pyplot().close(fig)
    return path


def fit_texts(fig) -> None:
    """Lay ``fig`` out with every text inside its canvas: the suptitle wrapped (at spaces) to
    the figure's width (``tight_layout`` keeps its height above the panels), then each visible
    panel's title and x label wrapped to the panel's width, its y label to the panel's height
    and its legend's labels to three quarters of its width; and the panels laid out again
    around the wrapped texts."""
    renderer = fig.canvas.get_renderer()
    if fig._suptitle is not None:  # tight_layout keeps the suptitle's height above the panels
        wrap_to(fig._suptitle, 0.96 * fig.bbox.width, renderer)
    fig.tight_layout()
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    for ax in panels:
        box = ax.get_window_extent(renderer)
        wrap_to(ax.title, box.width, renderer)
        wrap_to(ax.xaxis.label, box.width, renderer)
        wrap_to(ax.yaxis.label, box.height, renderer)
        for label in ax.get_legend().get_texts() if ax.get_legend() else []:
            wrap_to(label, 0.75 * box.width, renderer)  # the rest: its handle and padding
    fig.tight_layout()


def wrap_to(text, length: float, renderer) -> None:
    """Wrap the Text artist ``text`` at spaces (its own line breaks kept) to the fewest
    characters a line needs so that its extent along its reading direction (the height of a
    vertical label) is at most ``length`` pixels; unchanged when it fits or holds TeX."""
    content = text.get_text()
    if not content or "$" in content:
        return
    vertical = round(text.get_rotation()) % 180 == 90

    def extent() -> float:
        box = text.get_window_extent(renderer)
        return box.height if vertical else box.width

    chars = max(len(line) for line in content.split("\n"))
    while extent() > length and chars > 10:
        chars = min(chars - 1, int(chars * length / extent()))
        lines = [textwrap.fill(line, max(chars, 10)) for line in content.split("\n")]
        text.set_text("\n".join(lines))


def log_axis(ax, values: Sequence[float], base: int, units: dict | None = None) -> None:
    """Log-scaled x axis with a tick at every value that occurs (``units``: a width's label,
    ``4x (512 units)``, :func:`~fedlmc.simulations.report.data.width_units`)."""
    ticks = sorted({float(v) for v in values})
    ax.set_xscale("log", base=base)
    ax.set_xticks(ticks)
    units = units or {}  # "4x (512 units)" -> "4x" over "512"
    texts = [units.get(t, f"{t:g}").replace(" (", "\n").replace(" units)", "") for t in ticks]
    ax.set_xticklabels(texts)
    ax.minorticks_off()


def x_axis(ax, rows: pd.DataFrame, x: str, base: int) -> None:
    """The log x axis of ``x``; a width axis says its hidden units."""
    units = width_units(rows) if x == "width" else {}
    log_axis(ax, rows[x], base, units)
    named = any("units" in label for label in units.values())
    ax.set_xlabel("width: multiplier over hidden units per layer" if named else x)


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
        x_axis(ax, group, x, log_base)
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
        ("ensemble_acc", "ensemble (sample-weighted)", "grey"),
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
        x_axis(ax, rows, x, log_base)
        ax.set_ylabel("merged test accuracy")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        style_legend(ax, [("-", "merged"), (":", "endpoints (mean)")])
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
    fig, blocks, spare = block_grid(len(groups), 2)
    cmap = _pyplot().get_cmap("viridis")
    widths = sorted(data["width"].unique())
    units = width_units(data)
    for (top, bottom), (title, subset) in zip(blocks, groups, strict=True):
        for j, width in enumerate(widths):
            found = list(subset.loc[subset["width"] == width, "_curve"])
            if not found:
                continue
            lam = np.array(found[0]["lam"], dtype=float)
            colour = cmap(j / max(1, len(widths) - 1))
            acc = mean_of_lists([c.get("accuracy", []) for c in found])
            name = units.get(width, f"{width:g}")
            top.plot(lam[: len(acc)], acc, color=colour, label=f"width {name}")
            for key, style in (("nll", "-"), ("nll_calibrated", "--")):
                if all(key in c for c in found):
                    nll = mean_of_lists([c[key] for c in found])
                    bottom.plot(lam[: len(nll)], nll, color=colour, linestyle=style)
        top.set_title(title, fontsize=9)
        top.set_ylabel("test accuracy")
        bottom.set_ylabel("test NLL (nats)")
        for ax in (top, bottom):
            ax.set_xlabel("lambda (1 = client 0, 0 = client 1)", fontsize=8)
            ax.grid(alpha=0.3)
    shared_legend(blocks, spare, [("-", "NLL, raw logits"), ("--", "NLL, fitted temperature")])
    return save(fig, path, settings["dpi"])


def temperature_series(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """The temperature figure's series: the fitted T, then the server split's when present."""
    series = [("temperature", "the row's temperature")]
    if has_values(rows, "temperature_server_split"):
        series.append(("temperature_server_split", "fitted on the server split"))
    return series
