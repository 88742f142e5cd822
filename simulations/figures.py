"""The figures of a sweep's report, one drawing function each
(:mod:`fedlmc.simulations.figure_table` says which are drawn, from which rows, into which file;
:mod:`fedlmc.simulations.report` lists them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedlmc.simulations.report_data import (
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
    """Merged accuracy against config key ``x``: one panel per method and initialisation
    setting (:func:`~fedlmc.simulations.report_data.init_setting`, when it varies), one line per
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
    fig, axes = panel_grid(len(groups))
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
        ax.set_ylabel("merged test accuracy (dotted: endpoints)")
        ax.set_title(title, fontsize=9)
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


def temperature_series(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """The temperature figure's series: the fitted T, then the server split's when present."""
    series = [("temperature", "")]
    if has_values(rows, "temperature_server_split"):
        series.append(("temperature_server_split", " (server split)"))
    return series
