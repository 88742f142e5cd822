r"""The reviewers' study figures (issue 34): the barrier against weight decay and LEWC's scale
against depth.

- :func:`barrier_vs_weight_decay_figure`: four panels against the weight decay (evenly spaced,
  0 included): the calibrated loss barrier at :math:`\lambda = 1/2` and the accuracy gap of the
  plain average (solid) and weight matching (dashed), the clients' mean stable rank
  :math:`\|W\|_F^2 / \|W\|_2^2` of the hidden weights, and the reciprocal orthogonality of the
  unaligned clients; one colour per width (and value of any other varying key).
- :func:`lewc_scale_vs_depth_figure`: against the MLP's depth (hidden layers; :math:`L` =
  depth + 1 linear layers), left the merged test accuracy (plain average solid, the clients'
  mean dashed), right (log scale) the measured ratio of the merge's fitted temperature to the
  logit ensemble's (solid) and the merge's logit norm over the logit ensemble's
  (``logit_norm_ratio_logit_ensemble``, dash-dot) against LEWC's prediction
  :math:`\|\sum_i w_i^L z_i\| / \|\sum_i w_i z_i\|` (dashed) and its closed form at equal
  weights :math:`N \cdot N^{-L} = N^{1-L}` (for two clients
  :math:`\lambda^L + (1 - \lambda)^L` at :math:`\lambda = 1/2`; dotted, grey).

Every point is the mean over seeds with its spread (``[report] error-bars``) as an error bar.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fedlmc.simulations.records.row_groups import split_labels, varying_keys
from fedlmc.simulations.report.data import aggregate, has_values
from fedlmc.simulations.report.plotting import panel_grid, save, style_legend
from fedlmc.simulations.report.study_tables import STABLE_RANK, narrow


def line_labels(rows: pd.DataFrame, x: str) -> pd.Series:
    """Per row, the line it belongs to: ``width=4`` plus any other varying key but ``x`` and
    the seed (``width=4, num-clients=4``)."""
    width = rows["width"].map(lambda w: f"width={float(w):g}")
    others = split_labels(rows, [x, "width"])
    return width if others is None else width + ", " + others


def even_positions(values: Sequence[float]) -> dict[float, int]:
    """Each distinct value's position on an evenly spaced axis, in increasing order (weight
    decays span 0 and several decades: no log axis holds 0)."""
    return {v: i for i, v in enumerate(sorted({float(v) for v in values}))}


def _series(rows: pd.DataFrame, x: str, column: str, kind: str, method: str | None) -> pd.DataFrame:
    """Mean and spread of ``column`` against ``x`` on ``method``'s rows (``None``: once per
    cell)."""
    if method is None:
        subset = rows.drop_duplicates("cell_id") if "cell_id" in rows else rows
    else:
        subset = rows[rows["method"] == method]
    if not has_values(subset, column):
        return pd.DataFrame(columns=[x, "mean", "spread"])
    return aggregate(subset, [x], column, kind)


def _draw(ax, table: pd.DataFrame, x: str, positions, **style) -> None:
    if table.empty:
        return
    xs = [positions[float(v)] for v in table[x]] if positions else table[x]
    ax.errorbar(xs, table["mean"], yerr=table["spread"], capsize=3, marker="o", ms=4, **style)


WEIGHT_DECAY_PANELS = (
    (
        "loss_barrier_half_calibrated",
        "loss barrier at lambda = 1/2,\ncalibrated (signed, nats)",
        True,
    ),
    ("merge_gap_accuracy", "accuracy gap: clients' mean - merge", True),
    (STABLE_RANK, "stable rank of the hidden weights\n(mean over layers and clients)", False),
    (
        "recip_orth_mean",
        "reciprocal orthogonality ||W_a z_b|| / ||W_a z_a||\n(0 = orthogonal)",
        False,
    ),
)
"""``(column, y label, both methods)``: the barrier panels draw the plain average and weight
matching; the others one value per cell (stable rank) or the unaligned clients
(``average`` rows)."""


def has_weight_decay_study(rows: pd.DataFrame) -> bool:
    """Whether the weight decay varies and the plain average has a calibrated barrier."""
    return "weight-decay" in varying_keys(rows) and has_values(
        rows[rows["method"] == "average"], "loss_barrier_half_calibrated"
    )


def barrier_vs_weight_decay_figure(
    rows: pd.DataFrame, path: Path, settings: dict[str, Any]
) -> Path:
    """The four panels of the module docstring against the weight decay."""
    kind = settings["error-bars"]
    columns = ["weight-decay", "width", *(c for c, _, _ in WEIGHT_DECAY_PANELS)]
    lines_of = line_labels(rows, "weight-decay").to_numpy()
    rows = narrow(rows, columns).assign(_line=lines_of)
    positions = even_positions(rows["weight-decay"])
    fig, axes = panel_grid(2, width=5.2, rows=2)  # 2 x 2
    colours = _colours()
    lines = sorted(set(rows["_line"]), key=_line_order)
    for ax, (column, ylabel, both) in zip(axes.flat, WEIGHT_DECAY_PANELS, strict=False):
        for i, line in enumerate(lines):
            group = rows[rows["_line"] == line]
            colour = colours[i % len(colours)]
            if both:
                for method, style in (("average", "-"), ("weight_matching", "--")):
                    table = _series(group, "weight-decay", column, kind, method)
                    label = line if method == "average" else None
                    _draw(ax, table, "weight-decay", positions, color=colour, ls=style, label=label)
            else:
                method = None if column == STABLE_RANK else "average"
                table = _series(group, "weight-decay", column, kind, method)
                _draw(ax, table, "weight-decay", positions, color=colour, ls="-", label=line)
        ax.set_xticks(list(positions.values()))
        ax.set_xticklabels([f"{v:g}" for v in positions])
        ax.set_xlabel("weight decay")
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        if ax is axes.flat[0]:  # one legend: the colours are the same on every panel
            style_legend(ax, [("-", "plain average"), ("--", "weight matching")])
    return save(fig, path, settings["dpi"])


def _line_order(label: str) -> tuple[float, str]:
    """Lines by width, then label."""
    try:
        return (float(label.split(",")[0].split("=")[1]), label)
    except (IndexError, ValueError):
        return (float("inf"), label)


def _colours() -> list[str]:
    import matplotlib.pyplot as plt

    return plt.rcParams["axes.prop_cycle"].by_key()["color"]


def has_depth_study(rows: pd.DataFrame) -> bool:
    """Whether the depth varies and the plain average has a measured temperature ratio and
    LEWC's prediction of it: a plain chain, whose depth is LEWC's (a residual network, a
    ResNet or a ViT, has no single depth exponent: ``lewc_undefined_reason``, and its ``depth``
    counts blocks, not the figure's ``L = depth + 1`` layers)."""
    plain = rows[rows["method"] == "average"]
    return (
        "depth" in varying_keys(rows)
        and has_values(plain, "temperature_ratio_logit_ensemble")
        and has_values(plain, "lewc_temperature_ratio")
    )


def lewc_closed_form(depth: int, clients: int) -> float:
    r""":math:`N \cdot N^{-L} = N^{1-L}` with :math:`L` = ``depth`` + 1 linear layers: LEWC's
    ratio of the merged logits to the logit ensemble's at equal weights :math:`w_i = 1/N`, for
    any logits: :math:`\sum_i w_i^L z_i = N^{-L} \sum_i z_i = N^{1-L} \sum_i w_i z_i`."""
    return float(clients) ** (1 - (depth + 1))


DEPTH_SCALES = (
    "temperature_ratio_logit_ensemble",
    "lewc_temperature_ratio",
    "logit_norm_ratio_logit_ensemble",
)
"""The scale panel's columns (plain average rows): solid, dashed, dash-dot."""


def lewc_scale_vs_depth_figure(rows: pd.DataFrame, path: Path, settings: dict[str, Any]) -> Path:
    """The two panels of the module docstring against the depth."""
    kind = settings["error-bars"]
    columns = ["depth", "width", "num-clients", "accuracy", "endpoint_acc_mean", *DEPTH_SCALES]
    lines_of = line_labels(rows, "depth").to_numpy()
    rows = narrow(rows, columns).assign(_line=lines_of)
    fig, axes = panel_grid(2, width=5.4, rows=1)
    accuracy, scale = axes.flat[0], axes.flat[1]
    colours = _colours()
    for i, line in enumerate(sorted(set(rows["_line"]), key=_line_order)):
        group, colour = rows[rows["_line"] == line], colours[i % len(colours)]
        _draw(
            accuracy,
            _series(group, "depth", "accuracy", kind, "average"),
            "depth",
            None,
            color=colour,
            ls="-",
            label=line,
        )
        _draw(
            accuracy,
            _series(group, "depth", "endpoint_acc_mean", kind, None),
            "depth",
            None,
            color=colour,
            ls="--",
        )
        for column, style in zip(DEPTH_SCALES, ("-", "--", "-."), strict=True):
            label = line if style == "-" else None
            table = _series(group, "depth", column, kind, "average")
            _draw(scale, table, "depth", None, color=colour, ls=style, label=label)
    depths = sorted({int(d) for d in rows["depth"]})
    clients = sorted({int(n) for n in rows["num-clients"]}) if "num-clients" in rows else [2]
    for n in clients:
        scale.plot(depths, [lewc_closed_form(d, n) for d in depths], color="grey", ls=":", lw=1)
    scale.set_yscale("log")
    for ax, ylabel in ((accuracy, "merged test accuracy"), (scale, "merge / logit ensemble")):
        ax.set_xticks(depths)
        ax.set_xlabel("depth (hidden layers; L = depth + 1)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    style_legend(accuracy, [("-", "plain average"), ("--", "clients' mean")])
    style_legend(
        scale,
        [
            ("-", "fitted T ratio (measured)"),
            ("--", "LEWC: ||sum w^L z|| / ||sum w z||"),
            ("-.", "||z_merge|| / ||sum w z|| (measured)"),
            (":", "N^(1-L) (equal weights)"),
        ],
    )
    return save(fig, path, settings["dpi"])
