"""The text of ``report_full.md``, every table: markdown tables (:func:`markdown_table`) and the
sections of the report (:func:`report_markdown`)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fedlmc.analysis.convergence import MIN_JUDGED_EPOCHS
from fedlmc.merging.alignment_record import nothing_aligned_lines
from fedlmc.merging.method_registry import REFERENCE_METHODS
from fedlmc.simulations.records.row_groups import varying_keys
from fedlmc.simulations.report.data import (
    BARRIER_OF_GAP,
    accuracy_methods,
    aggregate,
    auto_table,
    axis_rows,
    has_values,
    mean_spread_table,
    ok_rows,
    panels,
    reference_table,
    same_values,
    spread_legend,
    table1,
)
from fedlmc.simulations.report.figure_table import omitted_figures
from fedlmc.simulations.report.study_tables import study_sections
from fedlmc.simulations.report.training import (
    convergence_rule_text,
    convergence_summary,
    convergence_verdict,
    not_converged_cells,
    per_width_table,
)
from fedlmc.study.rows import report_tables
from fedlmc.training_columns import TRAINING_FILE


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


def nothing_aligned_section(rows: pd.DataFrame) -> list[str]:
    """A warning per method that aligned 0 permutation groups (its rows are the plain average:
    :func:`fedlmc.merging.alignment_record.nothing_aligned_lines`); nothing when none did."""
    flagged = nothing_aligned_lines(rows.to_dict("records"))
    return [line for text in flagged for line in (f"**Warning**: {text}.", "")]


def lewc_scope_section(rows: pd.DataFrame, methods: Sequence[str]) -> list[str]:
    """Which weights each method's LEWC/LLFC columns measure, and why LEWC's are NaN where
    they are (``lewc_measured_on``, ``lewc_undefined_reason``)."""
    if "lewc_measured_on" not in rows:
        return []
    found = rows[rows["method"].isin(methods)]
    scope = found[["method", "lewc_measured_on", "lewc_undefined_reason"]].astype(object)
    scope = scope.fillna("")  # an all-empty column reads as float64 NaN
    scope = scope[scope["lewc_measured_on"] != ""].drop_duplicates()
    if scope.empty:
        return []
    lines = ["## What the LEWC and LLFC columns measure", "", "| method | weights | LEWC |"]
    lines.append("|---|---|---|")
    for _, row in scope.iterrows():
        reason = row["lewc_undefined_reason"] or "defined"
        lines.append(f"| {row['method']} | {row['lewc_measured_on']} | {reason} |")
    return [*lines, ""]


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


def auto_section(rows: pd.DataFrame, kind: str) -> list[str]:
    """The ``auto`` table (:func:`auto_table`) with its heading, when there are auto rows."""
    table = auto_table(rows, kind)
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


def coinciding_methods_notes(rows: pd.DataFrame) -> list[str]:
    """One line per pair of merge methods with the same test accuracy and NLL on every cell
    of a value combination of the other varying keys (``average`` and ``average_lewc_bias_t``
    without biases: equal by definition), which the figures draw once."""
    if "cell_id" not in rows:
        return []
    merges = [m for m in dict.fromkeys(rows["method"]) if m not in REFERENCE_METHODS]
    values = [c for c in ("accuracy", "nll") if c in rows]
    notes = []
    for title, group in panels(rows, exclude=["width"]):
        per_method = {m: group[group["method"] == m].set_index("cell_id")[values] for m in merges}
        for i, first in enumerate(merges):
            for second in merges[i + 1 :]:
                a, b = per_method[first], per_method[second]
                if len(a) and a.index.equals(b.index) and _close(a, b):
                    where = f" where {title}" if title else ""
                    notes.append(
                        f"{second} equals {first} on every cell{where} (same accuracy and NLL: "
                        "the figures draw them once)."
                    )
    return notes


def _close(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    x, y = a.to_numpy(dtype=float), b.to_numpy(dtype=float)
    return bool(np.allclose(x, y, rtol=1e-6, atol=1e-7, equal_nan=True))


def per_method_tables(rows: pd.DataFrame, methods: Sequence[str], kind: str) -> list[str]:
    """One mean table per ``report_table`` column with values for ``methods``
    (:func:`fedlmc.study.rows.report_tables`, in order); a column equal to an earlier one on
    every row (:func:`~fedlmc.simulations.report.data.same_values`: for two clients of equal
    weight the merge gaps are the barriers at lambda = 1/2) gets its heading and a line
    naming the table it repeats instead of the table."""
    subset = rows[rows["method"].isin(methods)]
    shown: list[tuple[str, str]] = []
    lines: list[str] = []
    for column, heading in report_tables():
        if not has_values(subset, column):
            continue
        same = next((h for c, h in shown if same_values(subset, c, column)), None)
        if same is not None:
            lines += [
                f"## {heading}",
                "",
                f'Equal to "{same}" on every row of this sweep (two clients of equal weight: '
                "the merged model is the midpoint of the path between them); not repeated."
                if column in BARRIER_OF_GAP.values()
                else f'Equal to "{same}" on every row of this sweep; not repeated.',
                "",
            ]
            continue
        shown.append((column, heading))
        lines += [
            f"## {heading}",
            "",
            markdown_table(mean_spread_table(rows, column, methods, kind), "method"),
            "",
        ]
    return lines


CONVERGENCE_HEADING = "## Convergence of the clients' training"


def convergence_section(training: pd.DataFrame | None) -> list[str]:
    """Per width, the clients' final-epoch training loss, settled epoch and the not-converged
    count, then the cells with a client that had not converged
    (:mod:`fedlmc.simulations.report.training`); without ``training.csv``, a line saying so."""
    if training is None:
        return [
            CONVERGENCE_HEADING,
            "",
            f"No {TRAINING_FILE} in this folder (results written before the clients' per-epoch "
            "curves were recorded): no convergence table and no training_curves figure; rerun "
            "the sweep into a new folder to get them.",
            "",
        ]
    summary = convergence_summary(training)
    if summary.empty:
        return [CONVERGENCE_HEADING, "", f"{TRAINING_FILE} holds no client curves.", ""]
    lines = [
        CONVERGENCE_HEADING,
        "",
        convergence_rule_text(),
        "",
        markdown_table(per_width_table(summary), "width"),
        "",
    ]
    verdict = convergence_verdict(summary)
    if verdict is not None:
        return [*lines, verdict, ""]
    flagged = not_converged_cells(summary)
    lines += [
        "Cells with a client that had not converged (client: drop over the last epochs):",
        "",
        "| cell_id | width | clients |",
        "|---|---|---|",
    ]
    lines += [f"| {r.cell_id} | {r.width} | {r.clients} |" for r in flagged.itertuples()]
    unjudged = int((~summary["judged"].astype(bool)).sum())
    if unjudged:
        lines += [
            "",
            f"The rule cannot judge {unjudged} other curve(s) (fewer than "
            f"{MIN_JUDGED_EPOCHS} epochs or a loss that is not finite and positive).",
        ]
    return [*lines, ""]


def report_markdown(
    results: pd.DataFrame,
    record: dict[str, Any],
    figures: Sequence[Path],
    out_dir: Path,
    settings: dict[str, Any],
    training: pd.DataFrame | None = None,
) -> str:
    """The text of ``report_full.md``, every table (``training``: the folder's
    ``training.csv``, ``None`` when it has none); ``report.md`` is the short report
    (:func:`fedlmc.simulations.report.summary.summary_markdown`)."""
    rows = ok_rows(results)
    kind = settings["error-bars"]
    title = settings.get("title") or record.get("name") or out_dir.name
    lines = report_header(results, rows, record, title, kind)
    lines += nothing_aligned_section(rows)
    if not rows.empty and "method" in rows:
        lines += method_sections(rows, kind, training)
    lines += failed_and_figures(results, rows, figures, out_dir)
    return "\n".join(lines)


def report_header(
    results: pd.DataFrame, rows: pd.DataFrame, record: dict[str, Any], title: str, kind: str
) -> list[str]:
    """The title, the sweep's description, the cell counts and varying keys, the spread's
    legend and the versions."""
    cells = results["cell_id"].nunique() if "cell_id" in results else 0
    failed = results.loc[results.get("status", pd.Series(dtype=str)) == "failed"]
    lines = [f"# {title}", ""]
    if record.get("description"):
        lines += [record["description"], ""]
    lines += [
        f"{cells} cell(s), {failed['cell_id'].nunique() if len(failed) else 0} failed; "
        f"varying: {', '.join(varying_keys(rows)) or 'nothing'}.",
        "",
        spread_legend(kind),
        "",
    ]
    versions = record.get("versions", {})
    if versions:
        lines += ["Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()), ""]
    return lines


def method_sections(rows: pd.DataFrame, kind: str, training: pd.DataFrame | None) -> list[str]:
    """Every section over the merge methods' rows (``rows`` has a ``method`` column)."""
    methods = list(dict.fromkeys(rows["method"]))
    spread_note = "" if kind == "none" else f" (mean ± {kind} over seeds)"
    lines = [
        f"## Merged test accuracy{spread_note}",
        "",
        markdown_table(mean_spread_table(rows, "accuracy", methods, kind), "method"),
        "",
    ]
    lines += [line for note in coinciding_methods_notes(rows) for line in (note, "")]
    refs = reference_table(rows, kind)
    if not refs.empty:
        lines += [f"## Reference accuracies{spread_note}", "", markdown_table(refs, "width"), ""]
    base = accuracy_methods(rows)
    lines += table1_section(rows, kind)
    lines += per_method_tables(rows, base, kind)
    lines += lewc_scope_section(rows, base)
    lines += fitted_temperature_section(rows, methods, kind)
    lines += study_sections(rows, kind, markdown_table)
    lines += auto_section(rows, kind)
    lines += temperature_gap_section(rows, kind)
    lines += communication_section(rows, methods)
    lines += convergence_section(training)
    lines += accuracy_by_axis_sections(rows, methods, kind)
    return lines


def table1_section(rows: pd.DataFrame, kind: str) -> list[str]:
    """The barriers at lambda = 1/2 in the paper's Table 1 layout (none without two-client
    cells)."""
    first = table1(rows, kind)
    if first.empty:
        return []
    return [
        "## Barriers at lambda = 1/2, the paper's Table 1 layout",
        "",
        f"Two-client cells, mean{'' if kind == 'none' else f' ± {kind}'} over seeds; "
        "signed: L(theta_1/2) - (L_a + L_b)/2, "
        "accuracy as a fraction like every accuracy here (chord minus midpoint: "
        "0.30 = 30 points; the paper prints points). Definitions: fedlmc.study.rows.",
        "",
        markdown_table(first, "width"),
        "",
    ]


def fitted_temperature_section(rows: pd.DataFrame, methods: Sequence[str], kind: str) -> list[str]:
    """The calibrated (``_t``) methods' fitted temperatures (none without any)."""
    calibrated = [m for m in methods if m.endswith("_t")]
    if not calibrated or not has_values(rows[rows["method"].isin(calibrated)], "temperature"):
        return []
    return [
        "## Fitted temperature",
        "",
        markdown_table(mean_spread_table(rows, "temperature", calibrated, kind), "method"),
        "",
    ]


def accuracy_by_axis_sections(rows: pd.DataFrame, methods: Sequence[str], kind: str) -> list[str]:
    """The merged test accuracy against each sweep axis that varies (alpha, num-clients, ...)."""
    lines: list[str] = []
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
    return lines


def failed_and_figures(
    results: pd.DataFrame, rows: pd.DataFrame, figures: Sequence[Path], out_dir: Path
) -> list[str]:
    """The failed cells with their errors, then the figures (both reports end with them)."""
    lines: list[str] = []
    failed = results.loc[results.get("status", pd.Series(dtype=str)) == "failed"]
    if len(failed):
        lines += ["## Failed cells", "", "| cell_id | error |", "|---|---|"]
        for _, row in failed.drop_duplicates("cell_id").iterrows():
            lines.append(f"| {row['cell_id']} | {str(row['error']).replace('|', '/')} |")
        lines.append("")
    if figures:
        lines += ["## Figures", ""]
        lines += [line for note in omitted_figures(rows) for line in (note, "")]
        for path in figures:
            rel = os.path.relpath(path, out_dir)
            lines += [f"### {path.stem.replace('_', ' ')}", "", f"![{path.stem}]({rel})", ""]
    return lines
