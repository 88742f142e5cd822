"""``report.md``: the report a reader takes in top to bottom in a few minutes.

Every table of a sweep is in ``report_full.md`` (:func:`fedlmc.simulations.report.markdown.
report_markdown`); ``report.md`` keeps one row per distinct quantity:

- rows identical by construction are shown once, named together: a method and its ``_t`` row
  have the same accuracy (a temperature never changes a prediction), ``average_lewc_bias_t``
  is ``average_t`` without biases (:func:`merged_rows`);
- a table whose every cell is the same value is one sentence (:func:`table_or_constant`), and
  so is a communication table whose methods all sent the same;
- widths are headed with their hidden units (``4x (512 units)``, :func:`width_units`), the
  multiplier of ``base-hidden`` stated once;
- the convergence section keeps its per-width table and verdict; the list of cells with a
  client that had not converged is in the full report;
- the rows to read with care are counted (:func:`flag_section`: an alignment that aligned
  nothing, a temperature at a bound of its fit, an accuracy at chance).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from fedlmc.merging.alignment_record import nothing_aligned_lines
from fedlmc.simulations.records.row_groups import varying_keys, with_split_methods
from fedlmc.simulations.report.data import (
    aggregate,
    axis_rows,
    has_values,
    mean_spread_table,
    mean_spread_text,
    ok_rows,
    one_value,
    reference_table,
    spread_legend,
    table1,
    width_units,
)
from fedlmc.simulations.report.markdown import (
    CONVERGENCE_HEADING,
    coinciding_methods_notes,
    failed_and_figures,
    markdown_table,
)
from fedlmc.simulations.report.training import (
    convergence_rule_text,
    convergence_summary,
    convergence_verdict,
    not_converged_cells,
    per_width_table,
)

FULL_REPORT = "report_full.md"
"""Every table of the sweep, beside ``report.md``."""


def with_width_labels(table: pd.DataFrame, labels: Mapping[Any, str]) -> pd.DataFrame:
    """``table`` with its width columns (or width index, also ``"1 (bias=false)"``) renamed
    by ``labels``."""
    texts = {f"{w:g}": text for w, text in labels.items()}

    def relabel(value: Any) -> Any:
        if value in labels:
            return labels[value]
        head, space, rest = str(value).partition(" ")
        return f"{texts[head]}{space}{rest}" if isinstance(value, str) and head in texts else value

    return table.rename(columns=relabel).rename(index=relabel)


def merged_rows(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``table`` with rows equal on every cell shown once, their labels joined by ``=``, and a
    note for each join (a method and its ``_t`` row: one model, one accuracy)."""
    groups: dict[tuple, list[str]] = {}
    for label, row in table.iterrows():
        groups.setdefault(tuple(row.astype(str)), []).append(str(label))
    merged = pd.DataFrame(
        [list(key) for key in groups],
        index=[" = ".join(labels) for labels in groups.values()],
        columns=table.columns,
    )
    merged.index.name = table.index.name
    return merged, [" = ".join(labels) for labels in groups.values() if len(labels) > 1]


def table_or_constant(heading: str, table: pd.DataFrame, index_name: str) -> list[str]:
    """The section ``heading`` with ``table``, or one sentence when every cell is the same."""
    values = {str(v) for v in table.to_numpy().ravel() if str(v) != ""}
    if len(values) == 1 and table.size > 1:
        return [f"**{heading}**: {values.pop()} in every cell.", ""]
    return [f"## {heading}", "", markdown_table(table, index_name), ""]


ENDPOINTS = "endpoints (clients' mean)"
"""The main accuracy table's first row: the clients' mean accuracy (``endpoint_acc_mean``)."""
INSIDE_SPREAD = "†"
"""Marks a gap smaller than the seed spread (:func:`gap_inside_spread`)."""


def gap_inside_spread(gaps: pd.Series, merged: pd.Series, ends: pd.Series) -> bool | None:
    """Whether the mean gap is inside the seed spread: ``|mean(gaps)| < max(std(merged),
    std(ends))``, the std over seeds with ddof = 1 of the merge's accuracy and of its cells'
    endpoint mean; ``None`` (undefined) with fewer than two seeds of either."""
    merged, ends = merged.dropna(), ends.dropna()
    if len(merged) < 2 or len(ends) < 2 or gaps.dropna().empty:
        return None
    return abs(float(gaps.mean())) < max(float(merged.std(ddof=1)), float(ends.std(ddof=1)))


def accuracy_gap_cell(part: pd.DataFrame, kind: str) -> str:
    """One merge's cell: ``mean ± spread; gap +g`` with :data:`INSIDE_SPREAD` after a gap
    inside the seed spread (the endpoints' own row: its accuracy only)."""
    accuracy = pd.to_numeric(part["accuracy"], errors="coerce")
    text = mean_spread_text(accuracy, kind)
    if not text or part["method"].iloc[0].startswith(ENDPOINTS):
        return text
    ends = pd.to_numeric(part["endpoint_acc_mean"], errors="coerce")
    gaps = (ends - accuracy).dropna()
    if gaps.empty:
        return text
    mark = INSIDE_SPREAD if gap_inside_spread(gaps, accuracy, ends) else ""
    return f"{text}; gap {gaps.mean():+.4f}{mark}"


def accuracy_gap_table(rows: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Methods x widths: each merge's accuracy and its gap to the endpoints' mean
    (:func:`accuracy_gap_cell`), under a first row of the endpoints' mean accuracy (one value a
    cell); methods split by the other varying keys. Without ``endpoint_acc_mean``: the
    accuracies alone (:func:`mean_spread_table`)."""
    methods = list(dict.fromkeys(rows["method"]))
    if not has_values(rows, "endpoint_acc_mean"):
        return mean_spread_table(rows, "accuracy", methods, kind)
    cells = rows.drop_duplicates("cell_id") if "cell_id" in rows else rows
    ends = cells.assign(method=ENDPOINTS, accuracy=cells["endpoint_acc_mean"])
    data, order = with_split_methods(
        pd.concat([ends, rows], ignore_index=True), [ENDPOINTS, *methods], ["width"]
    )
    texts = {key: accuracy_gap_cell(part, kind) for key, part in data.groupby(["method", "width"])}
    table = pd.Series(texts).unstack()
    return table.reindex([m for m in order if m in table.index]).fillna("")


def accuracy_gap_note(table: pd.DataFrame) -> list[str]:
    """What the gap and its mark mean, under a table that shows them."""
    if not table.index.str.startswith(ENDPOINTS).any():
        return []
    return [
        f"`{ENDPOINTS}`: the clients' mean accuracy in the same cells. After each merge's "
        "accuracy, "
        "`gap` is the gap to the endpoints' mean (endpoints − merge; the `merge_gap_accuracy` "
        "column): the endpoints' mean accuracy minus the merge's, averaged over seeds; positive: "
        f"the merge is worse than its clients on average. {INSIDE_SPREAD}: the gap is inside the "
        "seed spread, |gap| < the larger std over seeds (ddof = 1) of the merge's accuracy and "
        "of the endpoints' mean: at this many seeds the two are not told apart. With one seed "
        f"the spread is undefined and no gap is marked (the cell says n=1).",
        "",
    ]


def accuracy_section(rows: pd.DataFrame, kind: str, labels: Mapping[Any, str]) -> list[str]:
    """Merged test accuracy per method and width with the endpoints' mean and each merge's gap
    to it (:func:`accuracy_gap_table`), rows identical by construction merged."""
    table, joined = merged_rows(accuracy_gap_table(rows, kind))
    lines = table_or_constant("Merged test accuracy", with_width_labels(table, labels), "method")
    lines += accuracy_gap_note(table)
    if joined:
        lines += [
            "Rows joined by `=` are equal on every cell: a method and its `_t` row are one "
            "model (a temperature never changes a prediction), and `average_lewc_bias_t` is "
            f"`average_t` without biases. Joined here: {'; '.join(joined)}.",
            "",
        ]
    return lines


def temperature_section(rows: pd.DataFrame, kind: str, labels: Mapping[Any, str]) -> list[str]:
    """The fitted temperatures of the ``_t`` rows, identical rows merged."""
    calibrated = [m for m in dict.fromkeys(rows["method"]) if m.endswith("_t")]
    if not calibrated or not has_values(rows[rows["method"].isin(calibrated)], "temperature"):
        return []
    table, _ = merged_rows(mean_spread_table(rows, "temperature", calibrated, kind))
    return table_or_constant(
        "Fitted temperature of the calibrated merges", with_width_labels(table, labels), "method"
    )


def communication_section(rows: pd.DataFrame, labels: Mapping[Any, str]) -> list[str]:
    """What the clients sent and the message rounds per width; one row when every method
    sent the same (a compare cell's methods share one training round)."""
    if not has_values(rows, "bytes_sent_by_clients") or not has_values(rows, "rounds"):
        return []
    sent = aggregate(rows, ["method", "width"], "bytes_sent_by_clients", "none")
    rounds = aggregate(rows, ["method", "width"], "rounds", "none")
    text = [
        f"{b / 1e3:,.1f} kB / {r:g}" if math.isfinite(b) and math.isfinite(r) else ""
        for b, r in zip(sent["mean"], rounds["mean"], strict=True)
    ]
    table = sent.assign(text=text).pivot(index="method", columns="width", values="text")
    table, _ = merged_rows(table.fillna(""))
    if len(table) == 1:
        table.index = ["every method"]
    table.index.name = "method"
    return [
        "## Communication: what the clients sent (kB) / message rounds, mean over cells",
        "",
        markdown_table(with_width_labels(table, labels), "method"),
        "",
    ]


def flag_section(rows: pd.DataFrame) -> list[str]:
    """How many cells hold a row to read with care, per method and reason."""
    lines = [f"**Warning**: {text}." for text in nothing_aligned_lines(rows.to_dict("records"))]
    cells = rows["cell_id"].nunique() if "cell_id" in rows else len(rows)
    for column, value, what in (
        ("temperature_at_bound", "lower", "a temperature at the fit's lower bound 0.001"),
        ("temperature_at_bound", "upper", "a temperature at the fit's upper bound 1000"),
        ("at_chance", 1.0, "an accuracy no better than guessing"),
    ):
        if column not in rows:
            continue
        hit = rows[rows[column] == value]
        for method, part in hit.groupby("method", sort=False):
            count = part["cell_id"].nunique() if "cell_id" in part else len(part)
            lines.append(f"**Note**: {method} has {what} in {count} of {cells} cell(s).")
    return [line for text in lines for line in (text, "")]


def convergence_lines(training: pd.DataFrame | None, labels: Mapping[Any, str]) -> list[str]:
    """The per-width convergence table and its verdict (the cells: the full report)."""
    summary = None if training is None else convergence_summary(training)
    if summary is None or summary.empty:
        return []
    lines = [
        CONVERGENCE_HEADING,
        "",
        convergence_rule_text(),
        "",
        markdown_table(with_width_labels(per_width_table(summary), labels), "width"),
        "",
    ]
    verdict = convergence_verdict(summary)
    if verdict is None:
        flagged = not_converged_cells(summary)
        verdict = (
            f"{len(flagged)} cell(s) had a client that had not converged; each, with the drop "
            f"of its clients' loss, is listed in [{FULL_REPORT}]({FULL_REPORT})."
        )
    return [*lines, verdict, ""]


def header_lines(
    results: pd.DataFrame, rows: pd.DataFrame, record: Mapping[str, Any], settings: Mapping
) -> list[str]:
    """Title, description, cells, the spread and the width unit stated once, the link."""
    title = settings.get("title") or record.get("name") or "report"
    cells = results["cell_id"].nunique() if "cell_id" in results else 0
    failed = results.loc[results.get("status", pd.Series(dtype=str)) == "failed"]
    lines = [f"# {title}", ""]
    if record.get("description"):
        lines += [record["description"], ""]
    lines += [
        f"{cells} cell(s), {failed['cell_id'].nunique() if len(failed) else 0} failed; "
        f"varying: {', '.join(varying_keys(rows)) or 'nothing'}. "
        + spread_legend(settings["error-bars"]),
        "",
    ]
    base = one_value(rows, "base-hidden")
    if one_value(rows, "model") == "mlp" and base is not None:
        lines += [
            f"Widths are multiples of {base:g} hidden units per layer (`base-hidden`); the "
            "tables head each with its units.",
            "",
        ]
    lines += [
        f"Every table of the sweep (each quantity per method, the reviewers' questions per "
        f"setting, the cells that had not converged): [{FULL_REPORT}]({FULL_REPORT}).",
        "",
    ]
    return lines


def summary_markdown(
    results: pd.DataFrame,
    record: Mapping[str, Any],
    figures: Sequence[Path],
    out_dir: Path,
    settings: Mapping[str, Any],
    training: pd.DataFrame | None = None,
) -> str:
    """The text of ``report.md`` (module docstring)."""
    rows = ok_rows(results)
    kind = settings["error-bars"]
    lines = header_lines(results, rows, {"name": out_dir.name, **record}, settings)
    if not rows.empty and "method" in rows:
        labels = width_units(rows)
        lines += flag_section(rows)
        lines += accuracy_section(rows, kind, labels)
        lines += [line for note in coinciding_methods_notes(rows) for line in (note, "")]
        refs = reference_table(rows, kind)
        if not refs.empty:
            lines += table_or_constant(
                "Reference accuracies: the clients and their ensembles",
                with_width_labels(refs, labels),
                "width",
            )
        first = table1(rows, kind)
        if not first.empty:
            lines += [
                "## Barriers at lambda = 1/2, the paper's Table 1 layout",
                "",
                "Signed, L(theta_1/2) - (L_a + L_b)/2, loss in nats, accuracy as a fraction "
                "(0.30 = 30 points); two-client cells.",
                "",
                markdown_table(with_width_labels(first, labels), "width"),
                "",
            ]
        lines += temperature_section(rows, kind, labels)
        lines += communication_section(rows, labels)
        lines += convergence_lines(training, labels)
        lines += axis_sections(rows, kind)
    lines += failed_and_figures(results, rows, figures, out_dir)
    return "\n".join(lines)


def axis_sections(rows: pd.DataFrame, kind: str) -> list[str]:
    """Merged accuracy against each other axis that varies (clients, label skew, ...)."""
    methods = list(dict.fromkeys(rows["method"]))
    lines: list[str] = []
    for axis in ("alpha", "num-clients", "weight-decay", "partition", "calibration-holdout"):
        subset = axis_rows(rows, axis)
        if axis in varying_keys(subset):
            table, _ = merged_rows(mean_spread_table(subset, "accuracy", methods, kind, x=axis))
            lines += table_or_constant(f"Merged test accuracy by {axis}", table, "method")
    return lines
