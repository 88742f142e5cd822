"""The report's figure for clients of different widths: merged accuracy and calibrated barrier
against the width mix (:mod:`fedlmc.simulations.report.figure_table` registers it as ``width_mix``).

A cell's *width mix* is its ``client_widths`` results column (every client's width multiplier,
in partition order) and its ``server_width`` (the merged model's): the x axis has one category
per mix, labelled ``"0.5,4 -> 8"`` (clients -> server), sorted by client count, client widths
and server width. A mix is *mixed* when some client's width differs from the
server's. Lines: one colour per method, solid for ``init = independent`` and dashed for ``init =
shared`` (nested sub-models of one initialisation); each point is the mean over the cell's seeds
with the report's error bars.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fedlmc.simulations.report.data import has_values, spread
from fedlmc.simulations.report.plotting import _pyplot, panel_grid, save

MIX = "_width_mix"
INIT_STYLES = {"independent": "-", "shared": "--"}
PANELS = (
    ("accuracy", "merged test accuracy"),
    ("loss_barrier_half_calibrated", "loss barrier at 1/2, calibrated\n(nats; two-client cells)"),
)


def mix_label(client_widths: str, server_width: float) -> str:
    """``"0.5,4"``, 8 -> ``"0.5,4 -> 8"``."""
    return f"{client_widths} -> {float(server_width):g}"


def is_mixed(client_widths: str, server_width: float) -> bool:
    """Whether some client's width differs from the server's."""
    widths = [float(w) for w in str(client_widths).split(",") if w.strip()]
    return any(w != float(server_width) for w in widths)


def has_mixed_widths(rows: pd.DataFrame) -> bool:
    """Whether any row comes from a cell whose clients' widths differ from the server's."""
    if "client_widths" not in rows or "server_width" not in rows:
        return False
    known = rows.dropna(subset=["client_widths", "server_width"])
    pairs = zip(known["client_widths"], known["server_width"], strict=True)
    return any(is_mixed(c, s) for c, s in pairs)


def with_mix(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with a ``_width_mix`` label column (rows without widths left out)."""
    known = rows.dropna(subset=["client_widths", "server_width"]).copy()
    pairs = zip(known["client_widths"], known["server_width"], strict=True)
    known[MIX] = [mix_label(c, s) for c, s in pairs]
    return known


def mix_order(data: pd.DataFrame) -> list[str]:
    """The mixes' labels sorted by client count, then client widths, then server width."""
    pairs = dict.fromkeys(zip(data["client_widths"], data["server_width"], strict=True))

    def key(pair: tuple[str, float]) -> tuple:
        widths = [float(w) for w in str(pair[0]).split(",")]
        return (len(widths), widths, float(pair[1]))

    return [mix_label(c, s) for c, s in sorted(pairs, key=key)]


def _series(rows: pd.DataFrame, column: str, order: Sequence[str], kind: str):
    """Mean and spread of ``column`` per mix, in ``order`` (NaN where a mix has no value)."""
    values = rows.assign(**{column: pd.to_numeric(rows[column], errors="coerce")})
    grouped = values.groupby(MIX)[column]
    means = grouped.mean().reindex(order)
    spreads = grouped.apply(lambda v: spread(v, kind)).reindex(order)
    return means, spreads


def width_mix_figure(
    rows: pd.DataFrame, methods: Sequence[str], path: Path, settings: dict[str, Any]
) -> Path | None:
    """Merged accuracy (with the mean client and the ensemble as references) and the calibrated
    barrier at lambda = 1/2 against the width mix, per method and ``init``."""
    data = with_mix(rows)
    if data.empty:
        return None
    order = mix_order(data)
    x = list(range(len(order)))
    fig, axes = panel_grid(len(PANELS), width=max(5.0, 0.7 * len(order) + 2), height=4.2)
    colours = _pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    inits = list(dict.fromkeys(data["init"])) if "init" in data else ["independent"]
    for ax, (column, ylabel) in zip(axes.flat, PANELS, strict=False):
        for i, method in enumerate(methods):
            for init in inits:
                subset = data[data["method"] == method]
                if "init" in data:
                    subset = subset[subset["init"] == init]
                if not has_values(subset, column):
                    continue
                means, spreads = _series(subset, column, order, settings["error-bars"])
                ax.errorbar(
                    x,
                    means,
                    yerr=spreads,
                    label=f"{method} ({init})",
                    color=colours[i % len(colours)],
                    linestyle=INIT_STYLES.get(init, ":"),
                    marker="o",
                    ms=4,
                    capsize=3,
                )
        if column == "accuracy":
            _references(ax, data, order, inits, settings["error-bars"])
        ax.set_xticks(x)
        ax.set_xticklabels(order, rotation=60, ha="right", fontsize=7)
        ax.set_xlabel("client widths -> server width")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    return save(fig, path, settings["dpi"])


def _references(ax, data: pd.DataFrame, order: Sequence[str], inits, kind: str) -> None:
    """The clients' mean accuracy (grey) and the ensemble's (black), per ``init``."""
    x = list(range(len(order)))
    for init in inits:
        subset = data[data["init"] == init] if "init" in data else data
        style = INIT_STYLES.get(init, ":")
        for column, method, colour, label in (
            ("endpoint_acc_mean", None, "grey", "clients' mean"),
            ("accuracy", "ensemble", "black", "ensemble"),
        ):
            found = subset if method is None else subset[subset["method"] == method]
            if method is None:  # one value per cell: its first row
                found = found.drop_duplicates(subset=["cell_id"]) if "cell_id" in found else found
            if not has_values(found, column):
                continue
            means, spreads = _series(found, column, order, kind)
            ax.errorbar(
                x,
                means,
                yerr=spreads,
                label=f"{label} ({init})",
                color=colour,
                linestyle=style,
                marker="s",
                ms=3,
                capsize=2,
                alpha=0.7,
            )
