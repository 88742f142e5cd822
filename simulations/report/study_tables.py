r"""The reviewers' study tables of ``report.md`` (issue 34): one row per setting, each number the
mean over seeds with its spread beside it (``[report] error-bars``, named in the heading).

A *setting* is one value combination of the varying run-config keys other than the seed
(:func:`setting_keys`: for example ``depth`` and ``width``); a table never averages over any
of them, only over seeds. Each table is a list of :class:`StudyColumn` s: a column of
``results.csv`` read on one method's rows (or once per cell for the values every row of a
cell shares: ``method=None``).

- :func:`temperature_table` ("temperatures as numbers"): the fitted :math:`T` of every
  calibrated merge, the clients' mean :math:`T` and the logit ensemble's, the measured ratio
  :math:`T_\text{merge} / T_\text{logit ensemble}` and LEWC's prediction of it,
  :math:`\|\sum_i w_i^L z_i\| / \|\sum_i w_i z_i\|` (:math:`N^{1-L}` at equal weights), and the
  plain average's logit norm over the logit ensemble's (``logit_norm_ratio_logit_ensemble``,
  the quantity LEWC predicts).
- :func:`barrier_table` (the floor): the plain average's loss barriers at
  :math:`\lambda = 1/2` and their maximum over :math:`\lambda`, raw and calibrated, the accuracy
  barrier's maximum and the accuracy merge gap (for two clients of equal weight the merge gaps
  are the barriers at 1/2, so the loss gaps are not repeated).
- :func:`weight_decay_table`: per weight decay and width, the calibrated barrier at 1/2 and the
  accuracy gap of the plain average and of weight matching, the mean stable rank of the
  clients' hidden weights (:func:`mean_stable_rank`) and the reciprocal orthogonality of the
  unaligned clients.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fedlmc.simulations.records.row_groups import varying_keys
from fedlmc.simulations.report.data import has_values, mean_spread_text, parse_json_column

SETTING_ORDER = ("num-clients", "depth", "weight-decay", "width")
"""The setting keys shown first, in this order; any other varying key follows."""
STABLE_RANK = "stable_rank_mean"
"""The derived per-row column :func:`mean_stable_rank` fills."""


@dataclass(frozen=True)
class StudyColumn:
    """One column of a study table: ``column`` on ``method``'s rows (``None``: one row per
    cell, for the values every row of a cell shares), headed ``heading``."""

    heading: str
    column: str
    method: str | None = None


def setting_keys(rows: pd.DataFrame) -> list[str]:
    """The varying run-config keys but the seed, :data:`SETTING_ORDER` first; ``width``
    always (when the rows have it)."""
    varying = [k for k in varying_keys(rows) if k != "seed"]
    if "width" in rows and "width" not in varying:
        varying.append("width")
    first = [k for k in SETTING_ORDER if k in varying]
    return first + [k for k in varying if k not in first]


def narrow(rows: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """``rows`` with only ``columns`` (those present) and ``cell_id``, ``method`` and ``seed``,
    plus :data:`STABLE_RANK` (:func:`mean_stable_rank`) when asked for: one small frame
    instead of a column added to the wide results."""
    wanted = ["cell_id", "method", "seed", *columns]
    kept = list(dict.fromkeys(c for c in wanted if c in rows and c != STABLE_RANK))
    small = rows[kept].copy()
    if STABLE_RANK in columns:
        small[STABLE_RANK] = mean_stable_rank(rows).to_numpy()
    return small


def mean_stable_rank(rows: pd.DataFrame) -> pd.Series:
    r"""Per row, the mean over hidden weights of ``stable_rank_layers``
    (:math:`\|W\|_F^2 / \|W\|_2^2`, already a mean over the clients); NaN where it is absent."""
    parsed = parse_json_column(rows, "stable_rank_layers")
    return parsed.map(
        lambda v: float(np.mean(v)) if isinstance(v, list) and len(v) else math.nan
    ).astype(float)


def spread_note(rows: pd.DataFrame, kind: str) -> str:
    """What the numbers are: ``mean ± std over 3 seeds``, ``one seed`` or a range of counts."""
    if "seed" not in rows:
        return "one seed"
    per_setting = rows.groupby(setting_keys(rows) or ["seed"], dropna=False)["seed"].nunique()
    low, high = int(per_setting.min()), int(per_setting.max())
    if high < 2:
        return "one seed"
    count = f"{low}" if low == high else f"{low} to {high}"
    return f"mean over {count} seeds" if kind == "none" else f"mean ± {kind} over {count} seeds"


def study_table(rows: pd.DataFrame, columns: Sequence[StudyColumn], kind: str) -> pd.DataFrame:
    """One row per setting (:func:`setting_keys`), one column per :class:`StudyColumn` with
    values, each cell :func:`mean_spread_text` over the seeds; empty when no column has
    values."""
    keys = setting_keys(rows)
    if not keys:
        return pd.DataFrame()
    rows = narrow(rows, [*keys, *(c.column for c in columns)])
    table: dict[str, pd.Series] = {}
    for spec in columns:
        if spec.method is None:
            subset = rows.drop_duplicates("cell_id") if "cell_id" in rows else rows
        else:
            subset = rows[rows["method"] == spec.method]
        if not has_values(subset, spec.column):
            continue
        grouped = subset.groupby(keys, sort=True, dropna=False)[spec.column]
        table[spec.heading] = grouped.apply(lambda v: mean_spread_text(v, kind))
    if not table:
        return pd.DataFrame()
    frame = pd.DataFrame(table).fillna("")
    frame.index = [_setting_label(keys, v) for v in frame.index]
    return frame


def _setting_label(keys: Sequence[str], values) -> str:
    values = values if isinstance(values, tuple) else (values,)
    return ", ".join(f"{k}={_short(v)}" for k, v in zip(keys, values, strict=True))


def _short(value) -> str:
    if isinstance(value, bool | np.bool_):
        return str(bool(value)).lower()
    return f"{value:g}" if isinstance(value, float | int | np.number) else str(value)


def temperature_columns(rows: pd.DataFrame) -> list[StudyColumn]:
    """The temperature table's columns: every calibrated merge's fitted T, the references and
    the plain average's ratios."""
    calibrated = [m for m in dict.fromkeys(rows["method"]) if str(m).endswith("_t")]
    merges = [StudyColumn(f"T of {m}", "temperature", m) for m in calibrated]
    return [
        *merges,
        StudyColumn("clients' T (mean)", "endpoint_temperature_mean"),
        StudyColumn("logit ensemble's T", "logit_ensemble_temperature"),
        StudyColumn(
            "average: T / logit ensemble's T (measured)",
            "temperature_ratio_logit_ensemble",
            "average",
        ),
        StudyColumn(
            "average: LEWC's prediction of that ratio", "lewc_temperature_ratio", "average"
        ),
        StudyColumn(
            "average: logit norm / the logit ensemble's (measured)",
            "logit_norm_ratio_logit_ensemble",
            "average",
        ),
    ]


def temperature_table(rows: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Temperatures as numbers, per setting (module docstring); empty without fitted T."""
    calibrated = rows[rows["method"].astype(str).str.endswith("_t")]
    if not has_values(calibrated, "temperature"):
        return pd.DataFrame()
    return study_table(rows, temperature_columns(rows), kind)


BARRIER_COLUMNS = (
    StudyColumn("loss barrier at 1/2, raw", "loss_barrier_half", "average"),
    StudyColumn("at 1/2, T refitted per lambda", "loss_barrier_half_calibrated", "average"),
    StudyColumn("max over lambda, raw", "loss_barrier_max", "average"),
    StudyColumn("max over lambda, T refitted per lambda", "loss_barrier_max_calibrated", "average"),
    StudyColumn("accuracy barrier, max over lambda", "accuracy_barrier_max", "average"),
    StudyColumn("merge gap, accuracy", "merge_gap_accuracy", "average"),
)


def barrier_table(rows: pd.DataFrame, kind: str) -> pd.DataFrame:
    """The plain average's barriers and merge gaps per setting; empty without its maximum
    barrier (two-client cells, diagnostics on)."""
    if not has_values(rows[rows["method"] == "average"], "loss_barrier_max"):
        return pd.DataFrame()
    return study_table(rows, BARRIER_COLUMNS, kind)


WEIGHT_DECAY_COLUMNS = (
    StudyColumn("average: calibrated barrier at 1/2", "loss_barrier_half_calibrated", "average"),
    StudyColumn("average: accuracy gap", "merge_gap_accuracy", "average"),
    StudyColumn(
        "weight matching: calibrated barrier at 1/2",
        "loss_barrier_half_calibrated",
        "weight_matching",
    ),
    StudyColumn("weight matching: accuracy gap", "merge_gap_accuracy", "weight_matching"),
    StudyColumn("stable rank of the hidden weights (mean)", STABLE_RANK),
    StudyColumn("reciprocal orthogonality (unaligned)", "recip_orth_mean", "average"),
)


def weight_decay_table(rows: pd.DataFrame, kind: str) -> pd.DataFrame:
    """Per weight decay and width (module docstring); empty unless the weight decay varies."""
    if "weight-decay" not in varying_keys(rows):
        return pd.DataFrame()
    return study_table(rows, WEIGHT_DECAY_COLUMNS, kind)


def study_sections(rows: pd.DataFrame, kind: str, markdown_table) -> list[str]:
    """The sections of the tables that have data, each headed and with its spread named
    (``markdown_table``: the report's table writer)."""
    note = spread_note(rows, kind)
    sections = (
        (
            "Temperatures as numbers, per setting",
            "Fitted T (each calibrated merge, the clients, the logit ensemble) and the plain "
            "average's scale against LEWC (ratio 1 = no shrinkage)",
            temperature_table(rows, kind),
        ),
        (
            "The plain average's barriers per setting",
            "Signed barriers at lambda = 1/2 and the maximum over lambda (the floor question), "
            "raw logits and with a temperature fitted at each lambda; the accuracy gap against "
            "the clients' mean",
            barrier_table(rows, kind),
        ),
        (
            "Barriers against weight decay",
            "Calibrated barrier at lambda = 1/2 and accuracy gap of the plain average and "
            "weight matching, the clients' mean stable rank ||W||_F^2 / ||W||_2^2 of the "
            "hidden weights, reciprocal orthogonality of the unaligned clients (0 = orthogonal)",
            weight_decay_table(rows, kind),
        ),
    )
    lines: list[str] = []
    for heading, text, table in sections:
        if table.empty:
            continue
        lines += [
            f"## {heading} ({note})",
            "",
            f"{text}.",
            "",
            markdown_table(table, "setting"),
            "",
        ]
    return lines
