"""The report's view of ``training.csv``: the tables of ``report.md``'s convergence section
(:func:`convergence_summary`, :func:`per_width_table`, :func:`not_converged_cells`; the text is
:func:`fedlmc.simulations.report.markdown.convergence_section`) and the ``training_curves``
figure (:func:`training_curves_figure`).

The clients' curves are the ``client_epoch`` rows (:mod:`fedlmc.training_columns`); the rules
(settled epoch, still falling) are :mod:`fedlmc.analysis.convergence`'s. Per width (split by
every other varying key but the seed, as the accuracy tables are), over every client curve of
every cell: the final-epoch training loss (mean, min, max), the settled epoch (mean, max) and
how many curves never settled, and how many curves had not converged; then the cells with a
client that had not converged, by ``cell_id``. A results folder without ``training.csv`` (from
before the curves were recorded) gets a section saying so, and no figure.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from fedlmc.analysis.convergence import (
    FALLING_EPOCHS,
    FALLING_THRESHOLD,
    MIN_JUDGED_EPOCHS,
    SETTLE_TOLERANCE,
    curve_summary,
)
from fedlmc.simulations.records.row_groups import split_labels
from fedlmc.simulations.report.data import MAX_PANELS
from fedlmc.simulations.report.plotting import _pyplot, panel_grid, save
from fedlmc.training_columns import CLIENT_EPOCH


def client_curves(training: pd.DataFrame | None) -> pd.DataFrame:
    """The ``client_epoch`` rows of a training table (empty when there is none)."""
    if training is None or training.empty or "phase" not in training:
        return pd.DataFrame()
    return training[training["phase"] == CLIENT_EPOCH].reset_index(drop=True)


def _curve_keys(curves: pd.DataFrame) -> list[str]:
    return ["cell_id", "client"] if "cell_id" in curves else ["client"]


def _group_label(frame: pd.DataFrame) -> pd.Series:
    """Per row, ``width`` plus the other varying keys but the seed (``1 (bias=False)``)."""
    width = frame["width"].map(lambda w: f"{w:g}")
    labels = split_labels(frame, ["width"])
    return width if labels is None else width + " (" + labels + ")"


def convergence_summary(training: pd.DataFrame | None) -> pd.DataFrame:
    """One row per client curve (:func:`fedlmc.analysis.convergence.curve_summary`) with its
    cell's ``width``, ``seed`` (when the table has it) and width group label (``group``)."""
    curves = client_curves(training)
    if curves.empty or "width" not in curves:
        return pd.DataFrame()
    keys = _curve_keys(curves)
    firsts = curves.drop_duplicates(keys).reset_index(drop=True)
    cells = firsts[[*keys, *(c for c in ("width", "seed") if c in firsts)]].assign(
        group=_group_label(firsts).values
    )
    summary = curve_summary(curves, keys).merge(cells, on=keys, how="left")
    summary["width"] = pd.to_numeric(summary["width"], errors="coerce")
    return summary.sort_values(["width", "group", *keys], kind="stable").reset_index(drop=True)


def per_width_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per width group: the final-epoch loss (mean, min, max), the settled epoch (mean, max),
    the curves that never settled and those that had not converged."""
    rows = []
    for group, part in summary.groupby("group", sort=False):
        settled = part["settled_epoch"]
        none = "NaN (none settled)"  # a mean over no settled curve is undefined, not empty
        rows.append(
            {
                "width": group,
                "epochs": int(part["epochs"].max()),
                "final train loss, mean": part["final_train_loss"].mean(),
                "min": part["final_train_loss"].min(),
                "max": part["final_train_loss"].max(),
                "settled epoch of the settled, mean": settled.mean()
                if settled.notna().any()
                else none,
                "settled epoch of the settled, max": settled.max()
                if settled.notna().any()
                else none,
                "never settled": f"{int(settled.isna().sum())} / {len(part)}",
                "not converged": not_converged_count(part),
            }
        )
    return pd.DataFrame(rows).set_index("width")


def not_converged_count(part: pd.DataFrame) -> str:
    """``"k / n"`` curves not converged; where the rule cannot judge some, ``k`` out of the
    judged ones and how many it cannot tell (``"1 / 3 judged, cannot tell for 1"``, ``"cannot
    tell for 4 / 4"``): an unjudged curve is counted neither as converged nor as not."""
    flagged, total = int(part["not_converged"].sum()), len(part)
    unjudged = int((~part["judged"].astype(bool)).sum())
    if unjudged == total:
        return f"cannot tell for {total} / {total}"
    if unjudged:
        return f"{flagged} / {total - unjudged} judged, cannot tell for {unjudged}"
    return f"{flagged} / {total}"


def convergence_verdict(summary: pd.DataFrame) -> str | None:
    """The sentence on whether every client had converged, stated only where the rule is
    defined for every curve (:func:`fedlmc.analysis.convergence.judged`); otherwise why it
    cannot tell. ``None`` when some client had not converged (the cells are listed instead),
    which stands whatever the unjudged curves are."""
    unjudged = summary[~summary["judged"].astype(bool)]
    if summary["not_converged"].any():
        return None
    if unjudged.empty:
        return "Every client had converged by this rule."
    short = unjudged[unjudged["epochs"] < MIN_JUDGED_EPOCHS]
    if len(short):
        epochs = ", ".join(str(int(e)) for e in sorted(short["epochs"].unique()))
        why = (
            f"the {FALLING_THRESHOLD:.0%} rule needs at least {MIN_JUDGED_EPOCHS} epochs, "
            f"the run had {epochs}"
        )
    else:
        why = "a loss at the start or end of the last epochs is not finite and positive"
    return (
        f"Cannot tell whether every client had converged: {len(unjudged)} of {len(summary)} "
        f"curves cannot be judged ({why})."
    )


def not_converged_cells(summary: pd.DataFrame) -> pd.DataFrame:
    """Per cell with a client that had not converged: ``cell_id``, ``width`` (its group label)
    and ``clients``, ``"client (drop over the last epochs), ..."``."""
    flagged = summary[summary["not_converged"]] if len(summary) else summary
    if "cell_id" not in flagged or flagged.empty:
        return pd.DataFrame(columns=["cell_id", "width", "clients"])
    rows = []
    for cid, part in flagged.groupby("cell_id", sort=False):
        drops = ", ".join(
            f"{int(c)} ({d:.1%})"
            for c, d in zip(part["client"], part["last_epochs_drop"], strict=True)
        )
        rows.append({"cell_id": cid, "width": part["group"].iloc[0], "clients": drops})
    return pd.DataFrame(rows)


def convergence_rule_text() -> str:
    """The rules in one paragraph (their constants from :mod:`fedlmc.analysis.convergence`)."""
    return (
        "Over every client of every cell (seeds pooled): the last epoch's mean training loss; "
        f"the settled epoch, the first epoch after which the loss changed by less than "
        f"{SETTLE_TOLERANCE:.0%} relative in every later epoch (never settled: the last epoch "
        f"still changed it by {SETTLE_TOLERANCE:.0%} or more); not converged: the loss fell by "
        f"more than {FALLING_THRESHOLD:.0%} relative over the last {FALLING_EPOCHS} epochs "
        "(fedlmc.analysis.convergence)."
    )


def training_curves_figure(
    training: pd.DataFrame, path: Path, settings: dict[str, Any]
) -> Path | None:
    """One panel per width group; one line per client and cell (colour: the seed and other
    keys, line style: the client); x = epoch, y = training loss (log scale)."""
    curves = client_curves(training)
    if curves.empty or "width" not in curves:
        return None
    keys = _curve_keys(curves)
    curves = curves.assign(_group=_group_label(curves), _width=pd.to_numeric(curves["width"]))
    groups = list(dict.fromkeys(curves.sort_values(["_width", "_group"])["_group"]))[:MAX_PANELS]
    fig, axes = panel_grid(len(groups), width=4.4, height=3.4, sharey=True)
    colors = _pyplot().rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    for ax, group in zip(axes.flat, groups, strict=False):
        part = curves[curves["_group"] == group]
        order = [c for c in ("seed", *keys, "step") if c in part]
        part = part.sort_values(order, kind="stable")
        for index, (key, curve) in enumerate(part.groupby(keys, sort=False)):
            key = key if isinstance(key, tuple) else (key,)
            client = int(key[-1])
            seed = curve["seed"].iloc[0] if "seed" in curve else ""
            curve = curve.sort_values("step")
            ax.plot(
                curve["step"],
                curve["train_loss"],
                color=colors[(index // max(part["client"].nunique(), 1)) % len(colors)],
                linestyle=styles[client % len(styles)],
                label=f"seed {seed}, client {client}",
                lw=1.2,
            )
        ax.set_yscale("log")
        ax.set_title(f"width {group}")
        ax.set_xlabel("epoch")
        ax.set_ylabel("training loss (mean over the epoch)")
        ax.grid(alpha=0.3)
    first = axes.flat[0]
    handles, labels = first.get_legend_handles_labels()
    if 0 < len(labels) <= 16:
        first.legend(fontsize=7)
    return save(fig, path, settings["dpi"])


def has_client_curves(training: pd.DataFrame | None) -> bool:
    """Whether ``training`` holds a finite training loss on a ``client_epoch`` row."""
    curves = client_curves(training)
    if curves.empty or "train_loss" not in curves:
        return False
    return bool(pd.to_numeric(curves["train_loss"], errors="coerce").map(math.isfinite).any())
