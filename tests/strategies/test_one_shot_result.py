"""A one-shot strategy's round is the merge result of its merge (fedlmc.strategies.
one_shot_result): the same state and temperature as the library's pipeline on the same clients,
plus the round around it. In process, no Flower run."""

from __future__ import annotations

import pytest
import torch

from fedlmc.merging.merge_result import MergeResult, calibrated, merge_and_finish
from fedlmc.merging.post_merge import ServerData, calibrate
from fedlmc.strategies.one_shot_result import OneShotResult, OneShotRound

try:  # rootdir on sys.path, or tests/ itself (pytest's default import mode)
    from tests.strategies.test_one_shot import data, reply, strategy_for, tiny
except ImportError:
    from strategies.test_one_shot import data, reply, strategy_for, tiny


@pytest.fixture(autouse=True)
def _messages_need_a_task_identity(task_identity):
    """Messages need a run id: what Flower sets for a ServerApp."""
    yield


def test_a_round_is_the_library_s_merge_result_with_the_round_around_it():
    template, server = tiny(0), data(128, seed=5)
    states = [tiny(1).state_dict(), tiny(2).state_dict()]
    strategy = strategy_for(template, [1, 2], calibration="server", server_data=server)
    found = strategy.merge_round(1, [reply(1, states[0], 0), reply(2, states[1], 1)])
    expected = merge_and_finish("average", template, states, server_data=server)
    expected = calibrated(expected, calibrate(expected.model, ServerData(*server), warn=False))
    assert isinstance(found, MergeResult) and issubclass(OneShotResult, OneShotRound)
    assert all(torch.equal(found.state[k], expected.state[k]) for k in expected.state)
    assert found.temperature == expected.temperature == found.metrics["temperature"]
    assert found.merged_state is found.state and found.merge_info == found.info == {}
    assert found.merge_seconds == found.seconds > 0 and found.weights == (0.5, 0.5)
    assert found.aligned == [] and found.server_saw == "each model"  # no client states kept
