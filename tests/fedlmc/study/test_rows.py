"""The evaluated columns of a row and the row helpers (:mod:`fedlmc.study.rows`)."""

from __future__ import annotations

import json
import math

from fedlmc.study.rows import (
    ROUND_COLUMNS,
    empty_row,
    endpoint_columns,
    finite_mean,
    json_list,
    metric_columns,
    row_columns,
    server_sees_of,
    string_columns,
)


def test_every_column_is_named_once_and_the_round_columns_are_among_them():
    names = row_columns()
    assert len(names) == len(set(names))
    assert not set(ROUND_COLUMNS) & set(names)  # the round adds them, not the evaluation
    assert set(string_columns()) <= set(names)


def test_an_empty_row_has_every_column_nan_or_empty():
    row = empty_row("weight_matching_t", 3)
    assert set(row) == set(row_columns())
    assert row["method"] == "weight_matching_t" and row["num_clients"] == 3
    assert row["server_sees"] == server_sees_of("weight_matching") != ""
    numbers = [k for k in row if k not in string_columns() and k not in ("num_clients",)]
    assert all(isinstance(row[k], float) and math.isnan(row[k]) for k in numbers)
    assert server_sees_of("no_such_method") == ""


def test_metric_columns_follow_calibration():
    metrics = {"accuracy": 0.9, "nll_raw": 0.5, "ece_raw": 0.1}
    metrics |= {"nll_calibrated": 0.3, "ece_calibrated": 0.05}
    raw = metric_columns(metrics, calibrated=False, temperature=0.4)
    cal = metric_columns(metrics, calibrated=True, temperature=0.4)
    assert (raw["nll"], raw["ece"], raw["temperature"]) == (0.5, 0.1, 1.0)
    assert (cal["nll"], cal["ece"], cal["temperature"]) == (0.3, 0.05, 0.4)
    assert raw["accuracy"] == cal["accuracy"] == 0.9


def test_endpoint_columns_are_unweighted_means_and_extremes():
    ends = [{"accuracy": 0.8, "nll_raw": 0.6}, {"accuracy": 0.9, "nll_raw": 0.2}]
    found = endpoint_columns(ends)
    assert found["endpoint_acc_min"] == 0.8 and found["endpoint_acc_max"] == 0.9
    assert math.isclose(found["endpoint_acc_mean"], 0.85) and math.isclose(
        found["endpoint_nll_mean"], 0.4
    )


def test_finite_mean_skips_nan_and_is_nan_without_values():
    assert finite_mean([1.0, math.nan, 3.0, None]) == 2.0
    assert math.isnan(finite_mean([math.nan]))
    assert json.loads(json_list([1, 2.5])) == [1.0, 2.5]
