r"""The report's figures of the merge gap by initialisation setting: how far the one-shot merge
falls behind its own clients and behind their ensemble, against the number of clients or the
label skew, one panel per setting (:mod:`fedlmc.simulations.report.figure_table` registers them as
``merge_gap_by_init_vs_clients`` and ``merge_gap_by_init_vs_alpha``).

A row's *setting* is how its clients started (:func:`init_setting`): ``shared`` (every client
from the server's initialisation), ``shared + k warm-up rounds`` (``warmup-rounds = k``: k FedAvg
rounds first) or ``independent`` (each client its own). Panels: one row per method
(:data:`GAP_METHODS` present: the plain average and MergeMany, each with its fitted
temperature), one column per setting, all with one y axis. In each panel one colour per line
(:func:`line_keys`): per width; per number of clients (``N = 8``) when the rows vary in
``num-clients`` and it is not on the x axis (the label-skew figure of a sweep over N); per
(width, N) when both vary. The solid line is the gap to the clients,
:math:`\bar A_{\text{endpoints}} - A_{\text{merged}}`
(``merge_gap_accuracy``), the dashed line the gap to the probability ensemble,
:math:`A_{\text{ensemble}} - A_{\text{merged}}` (``ensemble_acc - accuracy``); positive means
the merge is worse; each point is the mean over the cell's seeds. On the label-skew figure the
IID cells sit right of the largest alpha, labelled ``IID``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from fedlmc.simulations.report.data import has_values, init_setting, setting_order
from fedlmc.simulations.report.plotting import _pyplot, log_axis, save

GAP_METHODS = ("average_t", "merge_many_t")
"""The merges drawn, one row of panels each (those present in the rows)."""
SETTING = "_init_setting"
GAPS = (
    ("merge_gap_accuracy", "-", "endpoints' mean - merged"),
    ("_gap_to_ensemble", "--", "ensemble - merged"),
)
IID = "IID"


def gap_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of :data:`GAP_METHODS` with the setting and the gap to the ensemble added."""
    data = rows[rows["method"].isin(GAP_METHODS)].copy()
    if data.empty:
        return data
    data[SETTING] = init_setting(data)
    accuracy = pd.to_numeric(data["accuracy"], errors="coerce")
    data["_gap_to_ensemble"] = pd.to_numeric(data["ensemble_acc"], errors="coerce") - accuracy
    data["merge_gap_accuracy"] = pd.to_numeric(data["merge_gap_accuracy"], errors="coerce")
    return data


def has_init_panels(rows: pd.DataFrame, x: str) -> bool:
    """Whether there is something to draw against ``x``: rows of a gap method with the gap
    columns, ``x`` taking several values and the initialisation varying."""
    if not {"method", "accuracy", "ensemble_acc", "merge_gap_accuracy", "width"} <= set(rows):
        return False
    data = gap_rows(rows)
    if data.empty or not has_values(data, "merge_gap_accuracy") or x not in data:
        return False
    positions = x_positions(data, x)
    return positions.nunique() > 1 and data[SETTING].nunique() > 1


def x_positions(data: pd.DataFrame, x: str) -> pd.Series:
    """Where each row sits on the x axis: the value of ``x``; for ``alpha``, the IID cells at
    ten times the largest alpha (labelled ``IID``, :func:`x_labels`)."""
    values = pd.to_numeric(data[x], errors="coerce")
    if x != "alpha" or "partition" not in data:
        return values
    dirichlet = data["partition"] == "dirichlet"
    largest = values[dirichlet].max() if dirichlet.any() else 1.0
    return values.where(dirichlet, 10 * largest).where(dirichlet | (data["partition"] == "iid"))


def x_labels(data: pd.DataFrame, x: str, positions: pd.Series) -> dict[float, str]:
    """Tick labels: the values, ``IID`` for the IID position of the label-skew figure."""
    labels = {float(p): f"{p:g}" for p in positions.dropna().unique()}
    if x == "alpha" and "partition" in data:
        for p in positions[data["partition"] == "iid"].dropna().unique():
            labels[float(p)] = IID
    return labels


def what_was_run(rows: pd.DataFrame, x: str) -> str:
    """The figure's title: data set, model, width, clients, partition, epochs, biases (the
    values that do not vary; ``x`` is on the axis)."""

    def one(key: str) -> str | None:
        if key not in rows or key == x:
            return None
        values = sorted({str(v) for v in rows[key].dropna()})
        return values[0] if len(values) == 1 else None

    parts = [one("dataset"), one("model")]
    if (w := one("width")) is not None:
        parts.append(width_label(rows, float(w)))
    if (n := one("num-clients")) is not None:
        parts.append(f"{n} clients")
    if x != "alpha" and (p := one("partition")) is not None:
        parts.append(p.upper() if p == "iid" else p)
    if (e := one("epochs")) is not None:
        parts.append(f"{e} local epochs")
    if (b := one("bias")) is not None:
        parts.append("bias-free" if b.lower() == "false" else "with biases")
    return ", ".join(p for p in parts if p)


def width_label(rows: pd.DataFrame, width: float) -> str:
    """``"width 4 (512 units)"`` when one ``base-hidden`` holds for the rows, else ``"width 4"``."""
    bases = set(pd.to_numeric(rows.get("base-hidden", pd.Series(dtype=float)), errors="coerce"))
    bases = {b for b in bases if b == b}
    if len(bases) == 1:
        return f"width {width:g} ({round(bases.pop() * width):d} units)"
    return f"width {width:g}"


class GapLine(NamedTuple):
    """One line of a panel: its label, the gap column, the line style, and the gap's mean per
    x position (over the seeds)."""

    label: str
    column: str
    style: str
    means: pd.Series


def varies(data: pd.DataFrame, key: str) -> bool:
    """Whether ``key`` takes more than one value in ``data``."""
    return key in data and data[key].dropna().nunique() > 1


def line_keys(data: pd.DataFrame, x: str) -> list[str]:
    """The keys whose values split a panel into lines: ``width`` when it varies,
    ``num-clients`` when it varies and is not ``x``; ``width`` alone when neither varies."""
    keys = [k for k in ("width", "num-clients") if k != x and varies(data, k)]
    return keys or ["width"]


def line_label(rows: pd.DataFrame, keys: Sequence[str], values: Sequence[float]) -> str:
    """``"width 4 (512 units)"``, ``"N = 8"`` or ``"width 4 (512 units), N = 8"``."""
    parts = {
        "width": lambda v: width_label(rows, v),
        "num-clients": lambda v: f"N = {v:g}",
    }
    return ", ".join(parts[k](v) for k, v in zip(keys, values, strict=True))


def line_groups(data: pd.DataFrame, keys: Sequence[str]) -> list[tuple[float, ...]]:
    """The sorted value combinations of ``keys`` present in ``data`` (one line, one colour
    each, the same in every panel)."""
    numbers = data[list(keys)].apply(pd.to_numeric, errors="coerce").dropna()
    return sorted(set(numbers.itertuples(index=False, name=None)))


def panel_lines(
    panel: pd.DataFrame, rows: pd.DataFrame, keys: Sequence[str], group: tuple[float, ...]
) -> list[GapLine]:
    """The lines of one (width, N, ...) group in a panel: per gap of :data:`GAPS` present, the
    mean over seeds at each x position (``_x``)."""
    numbers = panel[list(keys)].apply(pd.to_numeric, errors="coerce")
    selected = panel[(numbers == pd.Series(group, index=list(keys))).all(axis=1)]
    label = line_label(rows, keys, group)
    lines = []
    for column, style, what in GAPS:
        means = selected.groupby("_x")[column].mean().dropna()
        if not means.empty:
            lines.append(GapLine(f"{label}: {what}", column, style, means))
    return lines


def panel_width(data: pd.DataFrame, rows: pd.DataFrame, keys: Sequence[str]) -> str:
    """A second line ``"width 4 (512 units)"`` for the panel titles when the lines are not per
    width and all rows have one width; else empty."""
    widths = pd.to_numeric(data["width"], errors="coerce").dropna().unique()
    if "width" in keys or len(widths) != 1:
        return ""
    return f"\n{width_label(rows, float(widths[0]))}"


def merge_gap_by_init_figure(
    rows: pd.DataFrame, x: str, path: Path, settings: dict[str, Any], log_base: int
) -> Path | None:
    """The merge gap against ``x`` (module docstring): rows of panels per method, columns per
    initialisation setting, one shared y axis."""
    data = gap_rows(rows)
    if data.empty:
        return None
    data["_x"] = x_positions(data, x)
    data = data.dropna(subset=["_x"])
    methods = [m for m in GAP_METHODS if (data["method"] == m).any()]
    columns = setting_order(data[SETTING])
    plt = _pyplot()
    fig, axes = plt.subplots(
        len(methods),
        len(columns),
        figsize=(4.6 * len(columns), 3.6 * len(methods) + 0.5),
        squeeze=False,
        sharey=True,
    )
    cmap = plt.get_cmap("viridis")
    keys = line_keys(data, x)
    groups = line_groups(data, keys)
    fixed_width = panel_width(data, rows, keys)
    labels = x_labels(data, x, data["_x"])
    for r, method in enumerate(methods):
        for c, setting in enumerate(columns):
            ax = axes[r, c]
            panel = data[(data["method"] == method) & (data[SETTING] == setting)]
            for j, group in enumerate(groups):
                colour = cmap(0.85 * j / max(1, len(groups) - 1))  # no pale yellow
                for line in panel_lines(panel, rows, keys, group):
                    ax.plot(
                        line.means.index,
                        line.means.values,
                        linestyle=line.style,
                        marker="o",
                        ms=4,
                        color=colour,
                        label=line.label,
                    )
            ax.axhline(0.0, color="black", linewidth=0.8)
            log_axis(ax, list(labels), log_base)
            ax.set_xticklabels([labels[t] for t in sorted(labels)])
            ax.set_xlabel(x)
            ax.set_title(f"{method}, init = {setting}{fixed_width}", fontsize=9)
            ax.grid(alpha=0.3)
            if c == 0:
                ax.set_ylabel("accuracy gap (positive: merge worse)")
            if r == 0 and c == len(columns) - 1:
                ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(f"Merge gap by initialisation: {what_was_run(rows, x)}", fontsize=10)
    return save(fig, path, settings["dpi"])
