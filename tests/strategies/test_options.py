"""Tests of fedlmc.strategies.options: one frozen StrategyOptions that ScreenedFedAvg,
OneShotAverage (and its subclasses) and FedAvgBaseline take as their only way to receive these
settings (a keyword argument of a field's name is refused), and every bad value refused by name
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


def template() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", width=0.125, in_shape=(1, 4, 4), norm="none")


def test_every_strategy_reads_its_settings_from_the_options_it_was_given():
    server = (torch.zeros(4, 1, 4, 4), torch.zeros(4, dtype=torch.long))
    options = StrategyOptions(
        num_clients=3, min_clients=2, calibration="none", keep_client_states=True
    )
    plain = OneShotAverage(template(), options)
    assert plain.options is options
    assert (plain.num_clients, plain.min_clients, plain.server_data) == (3, 2, None)
    aligned = PermutationAlignedAverage(template(), options, method="weight_matching", seed=4)
    assert aligned.options is options and aligned.seed == 4
    with_data = options.replace(server_data=server, calibration="server")
    auto = AutoMerge(template(), with_data, tolerance=0.1, seed=2)
    assert auto.method_options == {"auto_tolerance": 0.1} and auto.server_data is server
    assert auto.seed == 2 and auto.options.calibration == "server"
    shared = StrategyOptions(num_clients=4, min_clients=3, calibration="none")
    fedavg = FedAvgBaseline(shared, total_epochs=4, num_rounds=2)
    assert (fedavg.num_clients, fedavg.min_clients, fedavg.schedule) == (4, 3, [2, 2])
    assert fedavg.options is shared


@pytest.mark.parametrize(
    "build",
    [
        lambda: OneShotAverage(template(), num_clients=2, calibration="none"),
        lambda: PermutationAlignedAverage(template(), num_clients=2, calibration="none"),
        lambda: AutoMerge(template(), num_clients=2, server_data=None),
        lambda: FedAvgBaseline(num_clients=2, total_epochs=3, num_rounds=3),
        lambda: OneShotAverage(
            template(), StrategyOptions(num_clients=2, calibration="none"), min_clients=1
        ),
    ],
)
def test_a_field_given_as_a_keyword_argument_is_a_type_error(build):
    with pytest.raises(TypeError, match="unexpected keyword argument|missing 1 required"):
        build()


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


def test_an_unknown_field_or_an_options_of_another_kind_is_refused_by_name():
    options = StrategyOptions(num_clients=2, calibration="none")
    with pytest.raises(TypeError, match="num_client"):
        options.replace(num_client=3)
    with pytest.raises(
        TypeError, match=r"options = \{'num_clients': 2\}; allowed: a StrategyOptions"
    ):
        OneShotAverage(template(), {"num_clients": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="calibration = 'server' needs server_data"):
        OneShotAverage(template(), StrategyOptions(num_clients=2))
