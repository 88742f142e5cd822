"""The per-layer figures of the report: one line per width (or client count) against the layer
index, one block of panels per method and value of the other varying keys, blocks wrapped at
three a line with one legend for all (``lewc_layers``, ``lewc_vs_llfc``,
``dead_units_and_bias_share``); a panel with no value, or a bias share without biases, is
blanked with a line saying why (:func:`~fedlmc.simulations.report.plotting.mark_empty`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from fedlmc.simulations.report.data import (
    MAX_PANELS,
    json_rows,
    mean_of_lists,
    panels,
    width_units,
)
from fedlmc.simulations.report.plotting import (
    _pyplot,
    block_grid,
    mark_empty,
    merge_identical_panels,
    save,
    shared_legend,
)


class LayerPanel(NamedTuple):
    """One row of a per-layer figure: the solid column, the dashed column (or None), the y
    label, a log scale, and what solid and dashed mean (legend entries, when dashed is set)."""

    solid: str
    dashed: str | None
    ylabel: str
    log: bool
    solid_means: str = ""
    dashed_means: str = ""
    xlabel: str = "layer l (last = logits)"
    zero_means: str = ""
    """Said instead of a panel whose every value is 0 (a bias share without biases)."""


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
        "norm ratio\n||f_l(merge)|| / ||sum_i w_i f_l(theta_i)||",
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
    LayerPanel(
        "dead_unit_fraction_layers",
        None,
        "fraction of hidden units\nnever active",
        False,
        xlabel="hidden layer l (the logits have no dead units)",
    ),
    LayerPanel(
        "bias_share_layers",
        None,
        "bias share ||b|| / (||Wz|| + ||b||)",
        False,
        zero_means="no biases: the bias share is 0 by construction",
    ),
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
    fig, blocks, spare = block_grid(len(groups), len(layer_panels))
    cmap = _pyplot().get_cmap("viridis")
    values = sorted(data[lines].unique())
    units = width_units(data) if lines == "width" else {}
    for block, (title, subset) in zip(blocks, groups, strict=True):
        for j, value in enumerate(values):
            at_value = subset[subset[lines] == value]
            if at_value.empty:
                continue
            colour = cmap(j / max(1, len(values) - 1))
            for ax, panel in zip(block, layer_panels, strict=True):
                for column, style in ((panel.solid, "-"), (panel.dashed, "--")):
                    if column is None:
                        continue
                    mean = mean_of_lists(list(at_value[f"_{column}"]))
                    name = units.get(value, f"{value:g}")
                    label = f"{lines} {name}" if (ax, style) == (block[0], "-") else None
                    ax.plot(
                        range(1, len(mean) + 1), mean, color=colour, linestyle=style, label=label
                    )
        block[0].set_title(title, fontsize=9)
        for ax, panel in zip(block, layer_panels, strict=True):
            if panel.log:
                ax.set_yscale("log")
            ax.set_xlabel(panel.xlabel, fontsize=8)
            ax.set_ylabel(panel.ylabel, fontsize=8)
            ax.grid(alpha=0.3)
            ax.xaxis.get_major_locator().set_params(integer=True)
            mark_empty(ax, f"no value ({panel.ylabel.splitlines()[0]})", panel.zero_means)
    styles = [
        (style, f"{panel.ylabel.splitlines()[0]}: {means}")
        for panel in layer_panels
        if panel.dashed is not None
        for style, means in (("-", panel.solid_means), ("--", panel.dashed_means))
    ]
    shared_legend(blocks, spare, styles)
    return save(fig, path, settings["dpi"])
