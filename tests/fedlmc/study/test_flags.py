"""Rows a reader should not take at face value: a temperature at the fit's bounds (the real
fit, on logits that force each bound), an accuracy within two standard errors of chance."""

from __future__ import annotations

import math

import pytest
import torch

from fedlmc.merging.calibrate import T_MAX, T_MIN, fit_temperature
from fedlmc.study.flags import chance_threshold, flag_columns, flag_lines, temperature_bound


def test_the_fit_ends_at_its_bounds_and_the_row_says_which():
    labels = torch.arange(200) % 10
    confident = torch.nn.functional.one_hot(labels, 10).float() * 50.0  # all right, a margin
    assert temperature_bound(fit_temperature(confident, labels)) == "lower"
    wrong = torch.nn.functional.one_hot((labels + 1) % 10, 10).float() * 50.0  # all wrong
    assert temperature_bound(fit_temperature(wrong, labels)) == "upper"
    mixed = confident + torch.randn(200, 10, generator=torch.Generator().manual_seed(0)) * 40
    fitted = fit_temperature(mixed, labels)
    assert T_MIN < fitted < T_MAX and temperature_bound(fitted) == ""
    assert temperature_bound(math.nan) == "" and temperature_bound(1.0) == ""


def test_chance_is_two_standard_errors_above_one_over_the_classes():
    assert chance_threshold(10, 1000) == pytest.approx(0.1 + 2 * math.sqrt(0.09 / 1000))
    assert round(chance_threshold(10, 1000), 3) == 0.119
    flags = [
        flag_columns({"accuracy": a, "temperature": 1.0}, 10, 1000)["at_chance"]
        for a in (0.082, 0.100, 0.118, 0.120, 0.5)
    ]
    assert flags == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert math.isnan(flag_columns({"accuracy": math.nan}, 10, 1000)["at_chance"])


def test_flagged_rows_are_said_in_words():
    rows = [
        {"method": "average_t", "accuracy": 0.95, "temperature_at_bound": "lower", "at_chance": 0},
        {"method": "weight_matching", "accuracy": 0.9, "temperature_at_bound": "", "at_chance": 0},
    ]
    assert flag_lines(rows) == [
        "average_t: the temperature is the fit's lower bound 0.001: the merged model classifies "
        "the calibration data correctly with a margin, so no finite T is best"
    ]
