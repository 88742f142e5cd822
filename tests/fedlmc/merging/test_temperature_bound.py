"""fedlmc.merging.temperature_bound: which end of the fit's range a temperature is at, and the one
sentence every path that fits a temperature says about it."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from fedlmc.merging import calibrate
from fedlmc.merging.temperature_bound import (
    T_MAX,
    T_MIN,
    TemperatureAtBoundWarning,
    bound_line,
    temperature_bound,
    warn_at_bound,
)


def test_the_fit_clamps_to_these_bounds():
    labels = torch.arange(50) % 10
    confident = torch.nn.functional.one_hot(labels, 10).float() * 50.0  # all right, a margin
    assert (calibrate.T_MIN, calibrate.T_MAX) == (T_MIN, T_MAX)
    assert calibrate.fit_temperature(confident, labels) == T_MIN


def test_each_end_has_its_sentence_and_a_fitted_value_none():
    assert temperature_bound(T_MIN * (1 + 1e-9)) == "lower"
    assert temperature_bound(T_MAX) == "upper"
    assert temperature_bound(0.15) == temperature_bound(math.nan) == ""
    assert bound_line("weight_matching", T_MIN) == (
        "weight_matching: the temperature is the fit's lower bound 0.001: the merged model "
        "classifies the calibration data correctly with a margin, so no finite T is best"
    )
    assert bound_line("average", T_MAX).startswith(
        "average: the temperature is the fit's upper bound 1000: its logits carry no usable"
    )
    assert bound_line("average", 0.15) == ""


def test_a_warning_names_the_callers_line_only_at_a_bound():
    with pytest.warns(TemperatureAtBoundWarning, match="lower bound 0.001") as caught:
        warn_at_bound("the merged model", T_MIN, stacklevel=1)
    assert caught[0].filename == __file__  # the caller's line, not the helper's
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_at_bound("the merged model", 0.5)  # inside the range: nothing
