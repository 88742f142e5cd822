"""The field-methods study's figure (issue 42): merged test accuracy against the merge method, one
panel per setting.

:func:`accuracy_by_method_figure` draws, per combination of the varying keys that describe the
clients (width, client count, initialisation, partition, ...; not the seed, nor the keys that
say how a cell merges), one panel: every merge method on the x axis (the order of
:data:`METHOD_ORDER`, then any other), its mean test accuracy over the seeds with the spread as
an error bar, a method run under SecAgg+ as a hollow marker just right of its clear one; the
best of the reference ensembles (sample-count-weighted, equal-weight, per-member calibrated,
logit: whichever has the highest mean accuracy in the panel) and the clients' mean accuracy
as horizontal lines. A method a setting has no rows of
(the task-vector methods under independent initialisation) leaves its place empty. All panels
share the y axis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from fedlmc.merging.method_registry import REFERENCE_METHODS, base_method
from fedlmc.simulations.records.row_groups import varying_keys
from fedlmc.simulations.report.data import aggregate, has_values
from fedlmc.simulations.report.plotting import panel_grid, save

__all__ = [
    "FIELD_METHODS",
    "METHOD_ORDER",
    "accuracy_by_method_figure",
    "best_ensemble",
    "has_field_methods",
    "setting_panels",
]

FIELD_METHODS = ("fisher", "regmean", "task_arithmetic", "ties", "dare", "ot_fusion")
"""The methods of :mod:`fedlmc.merging.field.field_methods`: the figure is drawn when two have
rows."""
METHOD_ORDER = (
    "average",
    "weight_matching",
    "merge_many",
    "cca_merge",
    "ot_fusion",
    "fisher",
    "regmean",
    "task_arithmetic",
    "ties",
    "dare",
)
"""The x axis' order: this project's average and alignments, then the field's methods."""
MERGE_KEYS = ("strategy", "secure-aggregation", "align", "methods", "calibration")
"""The keys that say how a cell merges, not which clients it merges: no panel of their own."""
SECURE = "secagg+"


def has_field_methods(rows: pd.DataFrame) -> bool:
    """Whether at least two of :data:`FIELD_METHODS` have an accuracy."""
    found = {base_method(m) for m in rows["method"].dropna().unique()} & set(FIELD_METHODS)
    return len(found) >= 2 and has_values(rows[rows["method"].isin(FIELD_METHODS)], "accuracy")


def _methods(rows: pd.DataFrame) -> list[str]:
    """The base merge methods with rows, in :data:`METHOD_ORDER` then first appearance."""
    found = [base_method(m) for m in rows["method"].dropna().unique() if m not in REFERENCE_METHODS]
    found = list(dict.fromkeys(m for m in found if m != "fedavg"))
    ordered = [m for m in METHOD_ORDER if m in found]
    return ordered + [m for m in found if m not in ordered]


def _one_row_per_merge(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per cell and base method (a ``_t`` row has its raw row's accuracy), with the
    base method and whether the cell was secure."""
    secure = rows.get("secure-aggregation", pd.Series("off", index=rows.index)).astype(str)
    merged = rows.copy()  # one block: results.csv's many columns come fragmented
    merged["_base"], merged["_secure"] = rows["method"].map(base_method), secure.eq(SECURE)
    merged = merged[~merged["method"].isin(list(REFERENCE_METHODS))]
    keys = ["cell_id", "_base"] if "cell_id" in merged else ["_base", "_secure", "seed"]
    return merged.drop_duplicates(keys)


def _panel_title(keys: list[str], values: tuple, group: pd.DataFrame) -> str:
    """``128 units, 2 clients, IID, shared init``: the setting in words (``key value`` for a key
    without its own words)."""
    words = {
        "num-clients": lambda v: f"{int(v)} clients",
        "partition": lambda v: "IID" if v == "iid" else str(v),
        "init": lambda v: f"{v} init",
    }
    parts = []
    for key, value in zip(keys, values, strict=True):
        if key == "width" and has_values(group, "base-hidden"):
            parts.append(f"{int(round(float(value) * float(group['base-hidden'].iloc[0])))} units")
        elif key in words:
            parts.append(words[key](value))
        else:
            parts.append(f"{key} {value}")
    return ", ".join(parts)


def best_ensemble(group: pd.DataFrame) -> tuple[str, float] | None:
    """The reference ensemble (a row of
    :data:`~fedlmc.merging.method_registry.REFERENCE_METHODS`) with the highest mean accuracy
    over the seeds in ``group``, and that accuracy; ``None`` when no reference row has one."""
    found = group[group["method"].isin(list(REFERENCE_METHODS))]
    if not has_values(found, "accuracy"):
        return None
    means = found.groupby("method")["accuracy"].mean().dropna()
    return str(means.idxmax()), float(means.max())


def _references(ax, group: pd.DataFrame, kind: str) -> None:
    """The best ensemble's (:func:`best_ensemble`) and the clients' mean accuracy (over the
    seeds) as horizontal lines."""
    best = best_ensemble(group)
    if best is not None:
        ax.axhline(best[1], color="grey", ls="--", lw=1)
    clear = group[~group.get("secure-aggregation", pd.Series("off", index=group.index)).eq(SECURE)]
    if has_values(clear, "endpoint_acc_mean"):
        ax.axhline(float(clear["endpoint_acc_mean"].mean()), color="grey", ls=":", lw=1)


def _draw_panel(ax, group: pd.DataFrame, methods: list[str], kind: str) -> None:
    merges = _one_row_per_merge(group)
    for secure, offset, face in ((False, 0.0, None), (True, 0.25, "none")):
        subset = merges[merges["_secure"] == secure]
        if subset.empty:
            continue
        table = aggregate(subset, ["_base"], "accuracy", kind).set_index("_base")
        xs = [i + offset for i, m in enumerate(methods) if m in table.index]
        found = [m for m in methods if m in table.index]
        ax.errorbar(
            xs,
            table.loc[found, "mean"],
            yerr=table.loc[found, "spread"],
            fmt="o" if not secure else "s",
            mfc=face,
            color="C0" if not secure else "C3",
            capsize=3,
            ms=5,
            ls="none",
        )
    _references(ax, group, kind)
    ax.set_xticks(range(len(methods)))
    ax.set_xticklabels(methods, rotation=60, ha="right", fontsize=7)
    ax.grid(alpha=0.3, axis="y")


def setting_panels(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """``(title, rows)`` per setting: each value combination of the varying keys that describe
    the clients (not the seed nor :data:`MERGE_KEYS`), in sorted order."""
    keys = [k for k in varying_keys(rows) if k != "seed" and k not in MERGE_KEYS]
    if not keys:
        return [("", rows)]
    panels = []
    for values, group in rows.groupby(keys, sort=True, dropna=False):
        values = values if isinstance(values, tuple) else (values,)
        panels.append((_panel_title(keys, values, group), group))
    return panels


def accuracy_by_method_figure(rows: pd.DataFrame, path: Path, settings: dict[str, Any]) -> Path:
    """The figure of the module docstring."""
    panels = setting_panels(rows)
    methods = _methods(rows)
    columns = min(4, len(panels))
    grid_rows = -(-len(panels) // columns)
    fig, axes = panel_grid(columns, width=3.6, height=3.3, rows=grid_rows, sharey=True)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (title, group) in zip(axes.flat, panels, strict=False):
        _draw_panel(ax, group, methods, settings["error-bars"])
        ax.set_title(title, fontsize=8)
    axes.flat[0].set_ylabel("merged test accuracy")
    _legend(axes.flat[0])
    return save(fig, path, settings["dpi"])


def _legend(ax) -> None:
    """Every marker and line of the figure, said once (on ``ax``)."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color="C0", marker="o", ls="none", label="in the clear"),
        Line2D([], [], color="C3", marker="s", mfc="none", ls="none", label="SecAgg+"),
        Line2D([], [], color="grey", ls="--", label="best reference ensemble"),
        Line2D([], [], color="grey", ls=":", label="clients' mean"),
    ]
    ax.legend(handles=handles, fontsize=7, loc="lower left")
