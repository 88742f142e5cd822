"""``calibration = "lewc"`` in the one-shot strategies, on hand-built Flower replies: the
temperature is LEWC's prediction from the merge weights and the chain's depth, with no server
data and no query round; from a shared start it is 1, with a warning; a merge or model where
LEWC is undefined is refused when the strategy is built."""

from __future__ import annotations

import logging

import pytest
import torch

from fedlmc.models.classifiers import build_model
from fedlmc.strategies import OneShotAverage, PermutationAlignedAverage, StrategyOptions
from fedlmc.strategies.protocol import state_to_record
from fedlmc.strategies.screening import UNBOUNDED
from tests.strategies.test_one_shot import IN_SHAPE, reply


@pytest.fixture(autouse=True)
def _messages_need_a_task_identity(task_identity):
    """Messages need a run id: what Flower sets for a ServerApp (as run_simulation does)."""
    yield


def chain(seed: int, bias: bool = False):
    torch.manual_seed(seed)
    return build_model("mlp", 1.0, in_shape=IN_SHAPE, depth=2, base_hidden=8, bias=bias)


def lewc_strategy(template, nodes, config=None, **kwargs) -> OneShotAverage:
    options = StrategyOptions(num_clients=len(nodes), calibration="lewc", **kwargs)
    strategy = OneShotAverage(template, options)
    strategy.expect_replies(state_to_record(template.state_dict()), nodes, config)
    return strategy


def test_the_temperature_is_predicted_from_the_weights_without_server_data():
    template, counts = chain(0), [10, 30, 20]
    strategy = lewc_strategy(template, [1, 2, 3], weight_bound=UNBOUNDED)
    assert strategy.server_data is None
    replies = [reply(i + 1, chain(i + 1).state_dict(), i, n=n) for i, n in enumerate(counts)]
    found = strategy.merge_round(1, replies)
    expected = sum((n / 60) ** 3 for n in counts)  # 3 weight layers
    assert found.temperature == pytest.approx(expected)
    assert found.metrics["temperature"] == pytest.approx(expected)
    assert found.query_rounds == 0 and found.calibration_history == ()
    assert found.server_split_temperature != found.server_split_temperature  # NaN: no data


def test_the_temperature_follows_the_bounded_merge_weights():
    template, counts = chain(0), [10, 80]
    strategy = lewc_strategy(template, [1, 2])  # the default bound caps the larger share
    replies = [reply(i + 1, chain(i + 1).state_dict(), i, n=n) for i, n in enumerate(counts)]
    found = strategy.merge_round(1, replies)
    assert found.weights != pytest.approx((10 / 90, 80 / 90))
    assert found.temperature == pytest.approx(sum(w**3 for w in found.weights))


def test_a_shared_start_gives_t_1_and_says_why(caplog):
    template = chain(0)
    strategy = lewc_strategy(template, [1, 2], {"init": "shared"}, weight_bound=UNBOUNDED)
    replies = [reply(i + 1, chain(i + 1).state_dict(), i) for i in range(2)]
    with caplog.at_level(logging.WARNING):
        found = strategy.merge_round(1, replies)
    assert found.temperature == 1.0
    assert "one basin" in caplog.text and "T = 1" in caplog.text


def test_merges_and_models_where_lewc_is_undefined_are_refused_at_construction():
    options = StrategyOptions(num_clients=2, calibration="lewc")
    with pytest.raises(ValueError, match=r"^OneShotAverage: calibration = 'lewc' with biases"):
        OneShotAverage(chain(0, bias=True), options)
    with pytest.raises(ValueError, match="with merge 'weight_matching': LEWC predicts"):
        PermutationAlignedAverage(chain(0), options, method="weight_matching")
    lewc_bias = PermutationAlignedAverage(chain(0, bias=True), options, method="average_lewc_bias")
    assert lewc_bias.merge_method == "average_lewc_bias"
    bn = build_model("mlp", 1.0, in_shape=IN_SHAPE, depth=2, base_hidden=8, bias=False, norm="bn")
    with pytest.raises(ValueError, match="norm-free plain chain"):
        OneShotAverage(bn, options)
