"""The table ``fedlmc run`` prints: the rows' main columns, why the others are left out, what
ran (SecAgg+'s sum, rounds and bytes), a warning for each row a reader should not take at
face value (an alignment that aligned nothing, a temperature at a bound of the fit, an
accuracy at chance) and, last, the clients merged and those dropped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from fedlmc.simulations.config import cell_default_methods_note
from fedlmc.simulations.config.dp import is_dp
from fedlmc.simulations.config.secure import is_secure
from fedlmc.simulations.records.clients_line import clients_line

SHOWN_COLUMNS = (
    "method",
    "accuracy",
    "nll",
    "temperature",
    "ece",
    "endpoint_acc_mean",
    "ensemble_acc",
    "loss_barrier_half",
    "loss_barrier_half_calibrated",
    "lewc_cos_mean",
    "clients_survived",
)


def show_rows(rows: pd.DataFrame, config: Mapping[str, Any], csv_path: str | None) -> None:
    """Print a run's rows (the :data:`SHOWN_COLUMNS` with a value, a line for each left out),
    the note on cell-dependent default methods, a warning for each method that aligned
    nothing; append the rows to ``csv_path`` (a new file, or a ``fedlmc run --csv`` table of
    the same columns: :func:`~fedlmc.simulations.records.written_paths.append_csv_rows`); last,
    how many clients were merged and which were dropped
    (:func:`~fedlmc.simulations.records.clients_line.clients_line`)."""
    shown, left_out = shown_columns(rows, config)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(rows[shown].to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    for line in left_out:
        print(line)
    if is_secure(config) and {"rounds", "bytes_sent_by_clients"} <= set(rows.columns):
        first = rows.iloc[0]
        print(
            f"SecAgg+ ({config['secure-aggregation']}): the server saw only the sum of the "
            f"client models; {int(first['rounds'])} message rounds, "
            f"{first['bytes_sent_by_clients'] / 1e6:.2f} MB sent by the clients"
        )
    note = cell_default_methods_note(config)
    if note is not None:
        print(note)
    print_alignment_flags(rows)
    if csv_path:
        from fedlmc.simulations.records.written_paths import append_csv_rows

        appended = append_csv_rows(csv_path, rows)
        print(f"rows {'appended' if appended else 'written'} to {csv_path}")
    line = clients_line(rows.to_dict("records"), int(config.get("num-clients", 0)))
    if line is not None:  # last: how many clients were merged, each one dropped by name
        print(line)


def print_alignment_flags(rows: pd.DataFrame) -> None:
    """One ``warning:`` line per method that aligned nothing (``aligned_groups == 0``: its rows
    are the plain average; :func:`fedlmc.merging.alignment_record.nothing_aligned_lines`) and
    per row whose temperature is at a bound of the fit or whose accuracy is at chance
    (:func:`fedlmc.study.flags.flag_lines`)."""
    from fedlmc.merging.alignment_record import nothing_aligned_lines
    from fedlmc.study.flags import flag_lines

    records = rows.to_dict("records")
    for line in [*nothing_aligned_lines(records), *flag_lines(records)]:
        print(f"warning: {line}")


def shown_columns(rows, config=None) -> tuple[list[str], list[str]]:
    """The :data:`SHOWN_COLUMNS` ``fedlmc run`` prints: those with a value in some row; and a
    line per column left out because it has none in any row, saying why: under SecAgg+ the
    server never sees a client's model (the endpoints, the ensemble, the barriers, LEWC need
    them), a DP run evaluates only its released merge; otherwise the column does not apply
    to the run (the two-client barriers for three clients), naming where it applies (its cells
    and, from the registry, its merge methods: :func:`fedlmc.study.rows.column_applies`)."""
    from fedlmc.study.rows import column_applies, column_table

    applies = {c.name: column_applies(c) for c in column_table()}
    present = [c for c in SHOWN_COLUMNS if c in rows.columns]
    empty = [c for c in present if rows[c].isna().all()]
    why = None
    if config is not None and is_secure(config):
        why = "under SecAgg+ the server never sees a client's model, only their sum"
    elif config is not None and is_dp(config):
        why = "a DP run evaluates only the released noisy merge, not the clients' models"
    if why is not None:
        lines = [f"not shown: {c} ({why})" for c in empty]
    else:
        lines = [f"not shown: {c} (no value in any row; applies to: {applies[c]})" for c in empty]
    return [c for c in present if c not in empty], lines
