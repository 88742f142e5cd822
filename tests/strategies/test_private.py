"""Differential privacy on the one-shot average (fedlmc.strategies.private): Flower's
server-side fixed-clipping wrapper clips a constructed update exactly and averages, its noise
has the documented scale, bad settings are refused, and the one-round privacy budget from
Flower's RDP accountant (None without its optional dp-accounting dependency). In process."""

from __future__ import annotations

import importlib.util
import io
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

from fedlmc.strategies.private import clip_update, one_round_epsilon, private_one_shot_average
from tests.strategies.test_secure import TINY  # the same tiny private run


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


@pytest.mark.parametrize("side", ["server", "client"])
def test_a_reply_whose_bytes_lie_about_its_shape_is_dropped_by_node(side, task_identity):
    """The payload screen runs in front of Flower's DP wrappers too: a 3-element array labelled
    with the sent shape (4,) is named and left out, and the others are averaged (no noise)."""
    strategy = private_one_shot_average(3, noise_multiplier=0.0, clipping_norm=100.0, side=side)
    strategy.current_arrays = ArrayRecord({"w": Array(np.zeros(4))})
    strategy.sent = strategy.current_arrays
    buffer = io.BytesIO()
    np.save(buffer, np.ones(3), allow_pickle=False)
    liar = _reply([0.0] * 4, 3)
    liar.content["arrays"]["w"] = Array("float64", (4,), "numpy.ndarray", buffer.getvalue())
    replies = [_reply([1.0, 1.0, 1.0, 1.0], 1), _reply([3.0, 3.0, 3.0, 3.0], 2), liar]
    if side == "client":  # the client-side wrapper reads each client's clipping flag
        for reply in replies:
            reply.content["metrics"][KEY_CLIPPING_NORM] = 1
    arrays, _ = strategy.aggregate_train(1, replies)
    assert np.allclose(arrays["w"].numpy(), 2.0)
    (dropped,) = strategy.dropped
    assert dropped.startswith("node ") and "bytes hold shape (3,)" in dropped


def test_the_noise_has_standard_deviation_z_c_over_n(task_identity):
    strategy = private_one_shot_average(2, noise_multiplier=1.0, clipping_norm=2.0)
    zeros, small = [0.0] * 20000, [1e-4] * 20000
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


def test_a_zero_update_is_kept_as_it_is_where_flower_divides_by_zero(task_identity):
    strategy = private_one_shot_average(2, noise_multiplier=0.0, clipping_norm=1.0)
    merged = _aggregate(strategy, [1.0, 2.0], [[1.0, 2.0], [4.0, 6.0]])
    # client 1 did not move (kept), client 2's update (3, 4) of norm 5 is clipped to (0.6, 0.8)
    np.testing.assert_allclose(merged, [1.3, 2.4])
    assert strategy.replies == 2 and strategy.bytes_received == 2 * 2 * 8


def test_clip_update_refuses_an_update_that_is_not_finite():
    sent = [np.zeros(2)]
    with pytest.raises(ValueError, match="norm nan: allowed: a finite norm"):
        clip_update([np.array([np.nan, 0.0])], sent, 1.0)


def test_clip_update_scales_only_updates_longer_than_the_norm():
    sent = [np.zeros(2, dtype=np.float32), np.ones(1, dtype=np.float32)]
    long = clip_update([np.array([3.0, 0.0], np.float32), np.array([5.0], np.float32)], sent, 1.0)
    np.testing.assert_allclose(long[0], [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(long[1], [1.8], rtol=1e-6)
    assert long[0].dtype == np.float32
    short = clip_update([np.array([0.3, 0.0], np.float32), np.ones(1, np.float32)], sent, 1.0)
    np.testing.assert_allclose(short[0], [0.3, 0.0])


def test_the_dp_epsilon_column_is_inf_without_noise_and_falls_with_the_noise():
    from fedlmc.simulations.private.dp_server import dp_epsilon

    assert dp_epsilon(0.0, 2) == math.inf
    found = [dp_epsilon(z, 2) for z in (0.5, 1.0, 5.0)]
    if importlib.util.find_spec("dp_accounting") is None:
        assert all(math.isnan(e) for e in found)  # the accountant is an optional dependency
    else:
        assert found == sorted(found, reverse=True) and found[-1] > 0


DP_MODES = ("server-fixed", "client-fixed")
DP_CLIP = 0.5


def dp_config(mode: str) -> dict:
    """3 tiny clients, ``dp = mode``, no noise, a clipping norm far below their update norms."""
    return {**TINY, "num-clients": 3, "strategy": "average", "init": "shared", "dp": mode} | {
        "dp-noise-multiplier": 0.0,
        "dp-clipping-norm": DP_CLIP,
    }


@pytest.fixture(scope="module")
def dp_runs(federations):
    """The federation of each of :data:`DP_MODES`, the cells of one Flower simulation."""
    return federations({mode: dp_config(mode) for mode in DP_MODES})


@pytest.mark.slow
@pytest.mark.parametrize("mode", DP_MODES)
def test_a_dp_run_merges_the_clipped_updates_within_the_clipping_norm(mode, dp_runs):
    """A real Flower simulation (Ray, 3 tiny clients), ``dp = mode`` with noise
    multiplier 0 and a clipping norm far below the clients' update norms: the merged model's
    step from the server's initialisation has norm at most C (an average of updates clipped
    to C) and close to it (the clients' updates point the same way), the rows say what DP
    gave (epsilon inf: no noise). Client-fixed: Flower's ``fixedclipping_mod`` clipped on
    the clients (the server-side wrapper does not clip)."""

    from fedlmc.simulations.config import validate_run_config
    from fedlmc.simulations.task import build_from_config, load_splits

    clip = DP_CLIP
    config = validate_run_config(dp_config(mode))
    outcome = dp_runs[mode]
    initial = build_from_config(config, load_splits(config)).state_dict()
    merged = outcome.merged["average"]
    step = math.sqrt(sum(float(((merged[k] - initial[k]) ** 2).sum()) for k in initial))
    assert 0.5 * clip < step <= clip * (1 + 1e-5)
    rows = outcome.table().set_index("method")
    assert (rows["dp_epsilon"] == math.inf).all() and (rows["clients_survived"] == 3).all()
    assert (rows["server_sees"] == "sum").all() and rows["endpoint_acc_mean"].isna().all()


def test_the_noise_is_reproducible_from_its_seed(task_identity):
    def noisy(seed: int) -> np.ndarray:
        strategy = private_one_shot_average(2, 1.0, 2.0, noise_seed=seed)
        return _aggregate(strategy, [0.0] * 50, [[1e-3] * 50, [1e-3] * 50])

    assert np.array_equal(noisy(3), noisy(3)) and not np.array_equal(noisy(3), noisy(4))
