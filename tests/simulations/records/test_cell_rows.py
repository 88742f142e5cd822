"""The rows a cell leaves in ``results.csv`` (:mod:`fedlmc.simulations.records.cell_rows`): lead
and config columns before the metrics, a failed row with a one-line reason, a cell whose methods
are not its config's recorded as failed, and an append that replaces the cell's earlier rows."""

from __future__ import annotations

import pandas as pd

from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.records.cell_rows import (
    MAX_ERROR,
    append_rows,
    cell_rows,
    failed_row,
    rows_of_cell,
)
from fedlmc.simulations.records.results_file import read_results

CONFIG = validate_run_config(
    {"methods": "average,ensemble", "out-dir": "/somewhere"}, check_devices=False
)


def metrics(accuracy: float = 0.5) -> pd.DataFrame:
    return pd.DataFrame(
        {"method": ["average", "ensemble"], "accuracy": [accuracy, 0.75], "seed": [99, 99]}
    )


def test_a_finished_cell_has_lead_then_config_then_metric_columns():
    rows = cell_rows("0123456789ab", CONFIG, metrics())
    assert list(rows.columns[:3]) == ["cell_id", "status", "error"]
    assert "out-dir" not in rows  # where it ran is not what it computed
    assert list(rows.columns[-2:]) == ["method", "accuracy"]
    assert (rows["status"] == "ok").all() and (rows["seed"] == CONFIG["seed"]).all()  # not 99
    assert rows["accuracy"].tolist() == [0.5, 0.75]


def test_a_cell_without_exactly_its_methods_is_a_failed_row():
    short = metrics().iloc[:1]
    (row,) = rows_of_cell("c", CONFIG, short).to_dict("records")
    assert row["status"] == "failed"
    assert row["error"] == (
        "the cell reported methods ['average']; expected ['average', 'ensemble'] (its config's)"
    )
    assert len(rows_of_cell("c", CONFIG, metrics())) == 2


def test_a_failure_reason_is_one_line_without_the_traceback_and_cut_short():
    error = ValueError("too few\nclients\nTraceback (most recent call last):\n  File ...")
    (row,) = failed_row("c", CONFIG, error).to_dict("records")
    assert row["error"] == "ValueError: too few clients"
    (long,) = failed_row("c", CONFIG, "x" * 1000).to_dict("records")
    assert len(long["error"]) == MAX_ERROR and long["error"].endswith("...")


def test_appending_a_cell_again_replaces_its_rows(tmp_path):
    append_rows(tmp_path, failed_row("aaaaaaaaaaaa", CONFIG, "first try failed"))
    append_rows(tmp_path, cell_rows("bbbbbbbbbbbb", CONFIG, metrics()))
    table = append_rows(tmp_path, cell_rows("aaaaaaaaaaaa", CONFIG, metrics(0.25)))
    read = read_results(tmp_path)
    assert len(table) == len(read) == 4
    assert set(read["status"]) == {"ok"}
    again = read[read["cell_id"] == "aaaaaaaaaaaa"]
    assert again["accuracy"].tolist() == [0.25, 0.75]
