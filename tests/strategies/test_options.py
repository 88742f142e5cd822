"""Tests of fedlmc.strategies.options: one frozen StrategyOptions that ScreenedFedAvg,
OneShotAverage (and its subclasses) and FedAvgBaseline take, the keyword arguments of the same
names still accepted (alone or overriding given options), and every bad value refused by name
when the options are built, before any client trains."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedlmc.models.classifiers import build_model
from fedlmc.strategies import (
    AutoMerge,
    FedAvgBaseline,
    OneShotAverage,
    PermutationAlignedAverage,
    StrategyOptions,
)
from fedlmc.strategies.robust import RobustScreen
from fedlmc.strategies.screening import WeightBound

SETTINGS = ("num_clients", "min_clients", "wait_timeout", "calibration", "keep_client_states")


def template() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", width=0.125, in_shape=(1, 4, 4), norm="none")


def test_options_and_keyword_arguments_configure_the_same_strategy():
    fields = {"num_clients": 3, "min_clients": 2, "calibration": "none", "wait_timeout": 5.0}
    options = StrategyOptions(**fields, keep_client_states=True)
    by_options = OneShotAverage(template(), options)
    by_keywords = OneShotAverage(template(), **fields, keep_client_states=True)
    assert by_options.options == by_keywords.options == options
    for name in SETTINGS:
        assert getattr(by_options, name) == getattr(by_keywords, name) == getattr(options, name)
    aligned = PermutationAlignedAverage(template(), options, method="weight_matching", seed=4)
    assert aligned.options is options and aligned.seed == 4
    server = (torch.zeros(4, 1, 4, 4), torch.zeros(4, dtype=torch.long))
    auto = AutoMerge(template(), options, tolerance=0.1, server_data=server)
    assert auto.method_options == {"auto_tolerance": 0.1} and auto.server_data is server


def test_keyword_arguments_replace_the_values_of_given_options():
    shared = StrategyOptions(num_clients=4, min_clients=3, calibration="none")
    strategy = OneShotAverage(template(), shared, min_clients=1, keep_client_states=True)
    assert (strategy.num_clients, strategy.min_clients, strategy.keep_client_states) == (4, 1, True)
    assert shared.min_clients == 3  # the shared options are not changed
    fedavg = FedAvgBaseline(shared, total_epochs=4, num_rounds=2)
    assert (fedavg.num_clients, fedavg.min_clients, fedavg.schedule) == (4, 3, [2, 2])
    assert FedAvgBaseline(num_clients=2, total_epochs=3, num_rounds=3).schedule == [1, 1, 1]


def test_options_are_frozen_and_replace_checks_the_new_values():
    options = StrategyOptions(num_clients=2, robust=RobustScreen(5.0), weight_bound=WeightBound())
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.num_clients = 3  # type: ignore[misc]
    assert options.replace(num_clients=5).num_clients == 5
    with pytest.raises(ValueError, match="min_clients = 3; allowed: 1 .. num_clients"):
        options.replace(min_clients=3)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_clients": 0}, "num_clients = 0; allowed: an integer >= 1"),
        ({"calibration": "sometimes"}, "calibration = 'sometimes'; allowed: server, federated"),
        ({"wait_timeout": 0}, "wait_timeout = 0; allowed: a number of seconds > 0"),
        ({"query_timeout": float("nan")}, "query_timeout = nan; allowed"),
        ({"temperature_steps": 0}, "temperature_steps = 0; allowed: an integer >= 1"),
        ({"temperature_grid_points": 1}, "temperature_grid_points = 1; allowed: an integer >= 2"),
        ({"robust": 10.0}, "robust = 10.0; allowed: a RobustScreen or None"),
    ],
)
def test_a_bad_value_is_refused_by_name(change, message):
    fields = {"num_clients": 2, **change}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        StrategyOptions(**fields)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        OneShotAverage(template(), **{"calibration": "none", **fields})


def test_an_unknown_or_missing_keyword_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_client'; allowed:"):
        OneShotAverage(template(), num_client=2, calibration="none")
    with pytest.raises(TypeError, match="missing keyword argument 'num_clients'"):
        FedAvgBaseline(total_epochs=1, num_rounds=1)
    with pytest.raises(ValueError, match="calibration = 'server' needs server_data"):
        OneShotAverage(template(), StrategyOptions(num_clients=2))
