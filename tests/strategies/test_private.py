"""Differential privacy on the one-shot average (fedlmc.strategies.private): Flower's
server-side fixed-clipping wrapper clips a constructed update exactly and averages, its noise
has the documented scale, bad settings are refused, and the one-round privacy budget from
Flower's RDP accountant (None without its optional dp-accounting dependency). In process."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from fedlmc.strategies.private import one_round_epsilon, private_one_shot_average


def _reply(values: list[float], node: int) -> Message:
    content = RecordDict(
        {
            "arrays": ArrayRecord({"w": Array(np.asarray(values, dtype=np.float64))}),
            "metrics": MetricRecord({"num-examples": 100}),
        }
    )
    return Message(content, dst_node_id=node, message_type="train")


def _aggregate(strategy, current: list[float], replies: list[list[float]]) -> np.ndarray:
    strategy.current_arrays = ArrayRecord({"w": Array(np.asarray(current, dtype=np.float64))})
    arrays, _ = strategy.aggregate_train(1, [_reply(v, i + 1) for i, v in enumerate(replies)])
    return arrays["w"].numpy()


def test_each_update_is_clipped_to_the_norm_relative_to_the_sent_arrays(task_identity):
    strategy = private_one_shot_average(2, noise_multiplier=0.0, clipping_norm=2.0)
    start = [1.0, 1.0, 1.0, 1.0]
    got = _aggregate(strategy, start, [[4.0, 5.0, 1.0, 1.0], [1.0, 1.0, 1.6, 1.8]])
    # update 1 = (3, 4, 0, 0), norm 5 -> (1.2, 1.6, 0, 0); update 2 = (0, 0, .6, .8), norm 1 kept
    assert np.allclose(got, [1.6, 1.8, 1.3, 1.4], atol=1e-12)


def test_the_noise_has_standard_deviation_z_c_over_n(task_identity):
    strategy = private_one_shot_average(2, noise_multiplier=1.0, clipping_norm=2.0)
    zeros, small = [0.0] * 20000, [1e-4] * 20000  # a zero update divides by zero in Flower 1.42
    got = _aggregate(strategy, zeros, [small, small])
    assert got.std() == pytest.approx(1.0 * 2.0 / 2, rel=0.05)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 1.0, 1.0), "num_clients = 0"),
        ((2, -0.5, 1.0), "noise multiplier -0.5"),
        ((2, 1.0, 0.0), "clipping norm 0.0"),
    ],
)
def test_bad_settings_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        private_one_shot_average(*args)


def test_one_round_epsilon_falls_with_the_noise_multiplier():
    found = [one_round_epsilon(z, 8, 1e-5) for z in (0.5, 1.0, 2.0, 5.0)]
    if importlib.util.find_spec("dp_accounting") is None:
        assert found == [None] * 4
    else:
        assert found == sorted(found, reverse=True) and found[-1] > 0
        assert one_round_epsilon(1.0, 2, 1e-5) == pytest.approx(found[1])  # no amplification
