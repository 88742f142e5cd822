"""The robust screen (:mod:`fedlmc.strategies.robust`) and the identity and metric screens of a
train round, on hand-built real Flower replies: a well-formed poisoned model is dropped by name
and the merge equals the honest clients' merge; honest clients are never dropped; a simulation
trusts the partitions it assigned; every reason is plain text. The same attacks through a real
simulation: ``tests/simulations/test_server_app_poisoned_clients.py``."""

from __future__ import annotations

import math
import traceback

import pytest
import torch
from flwr.app import Message, MetricRecord, RecordDict

from fedlmc.merging.calibrate import temperature_grid, temperature_statistics
from fedlmc.merging.repair import UnitStats
from fedlmc.models.classifiers import build_model
from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.config.schema import ConfigError
from fedlmc.strategies import OneShotAverage, StrategyOptions
from fedlmc.strategies.protocol import HISTORY_KEYS, state_to_record
from fedlmc.strategies.queries import ClientRounds
from fedlmc.strategies.robust import (
    OFF,
    OutlierError,
    RobustScreen,
    check_temperature_bounds,
    moments_outliers,
    nll_outliers,
    num_classes_of,
    weight_outliers,
)
from fedlmc.strategies.strategy_utils import ClientUpdate, plain_text, screen_replies

IN_SHAPE = (1, 4, 4)


@pytest.fixture(autouse=True)
def _messages_need_a_task_identity(task_identity):
    yield


def model(seed: int, norm: str = "bn"):
    torch.manual_seed(seed)
    return build_model("mlp", width=1.0, in_shape=IN_SHAPE, depth=2, base_hidden=16, norm=norm)


def honest_state(seed: int, shared: bool = False) -> dict[str, torch.Tensor]:
    """A model's weights after a small seeded change (``shared``: all from seed 0's start)."""
    state = model(0 if shared else seed).state_dict()
    g = torch.Generator().manual_seed(100 + seed)
    return {
        k: v + 0.05 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v.clone()
        for k, v in state.items()
    }


def poisoned(state, attack: str):
    out = {}
    for key, tensor in state.items():
        if not tensor.is_floating_point():
            out[key] = tensor.clone()
        elif attack == "constant":
            out[key] = torch.full_like(tensor, 9.9e5)
        elif attack == "bn_shift":
            out[key] = tensor + 1e4 if key.endswith("running_mean") else tensor.clone()
        else:
            factor = {"scaled100": 100.0, "scaled1e4": 1e4, "negated": -100.0, "minus": -1.0}
            out[key] = tensor * factor[attack]
    return out


def reply(node: int, state, metrics: dict) -> Message:
    content = RecordDict({"arrays": state_to_record(state), "metrics": MetricRecord(metrics)})
    return Message(content, reply_to=Message(RecordDict(), dst_node_id=node, message_type="train"))


ATTACKS = ("scaled100", "scaled1e4", "constant", "negated", "bn_shift")


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_poisoned_model_is_dropped_and_the_merge_is_the_honest_merge(attack):
    template = model(0)
    honest = [honest_state(seed) for seed in (1, 2, 3)]
    nodes = [11, 12, 13, 14]
    states = [*honest[:2], poisoned(honest_state(4), attack), honest[2]]

    def merged(chosen, indices):
        strategy = OneShotAverage(
            template, StrategyOptions(num_clients=len(indices), calibration="none")
        )
        strategy.expect_replies(
            state_to_record(template.state_dict()), [nodes[i] for i in indices], num_partitions=4
        )
        replies = [
            reply(nodes[i], chosen[i], {"num-examples": 10, "partition-id": i}) for i in indices
        ]
        return strategy.merge_round(1, replies)

    attacked = merged(states, [0, 1, 2, 3])
    assert attacked.report.survivor_ids == [0, 1, 3]
    (failure,) = attacked.report.failures
    assert failure.node_id == 13 and failure.partition_id == 2
    assert "x the median over clients" in failure.reason
    reference = merged(states, [0, 1, 3])  # the honest clients alone
    for key, tensor in reference.merged_state.items():
        assert torch.equal(attacked.merged_state[key], tensor), key


def test_honest_clients_are_never_dropped_and_two_clients_cannot_be_judged():
    independent = [honest_state(seed) for seed in range(8)]
    assert weight_outliers(independent, RobustScreen()) == {}
    assert weight_outliers([honest_state(s, shared=True) for s in range(8)], RobustScreen()) == {}
    pair = [honest_state(1), poisoned(honest_state(2), "scaled100")]
    assert weight_outliers(pair, RobustScreen()) == {}  # the median of two is their mean
    assert weight_outliers([*pair, honest_state(3)], OFF) == {}


def test_a_negated_model_under_a_shared_start_points_away_from_the_median():
    states = [honest_state(s, shared=True) for s in range(3)]
    states.append(poisoned(honest_state(3, shared=True), "minus"))  # same norms, sign flipped
    found = weight_outliers(states, RobustScreen())
    assert list(found) == [3] and "cosine" in found[3]


def test_the_factor_is_validated_once():
    for bad in (1.0, 0.5, -3.0, math.nan, True):
        with pytest.raises(ValueError, match="outlier_factor"):
            RobustScreen(bad)
    assert RobustScreen(2.0).applies(3) and not RobustScreen(2.0).applies(2)
    with pytest.raises(
        ConfigError, match=r"outlier-factor = 1.0: allowed: a number in \(1, 1e\+300\]"
    ):
        validate_run_config({"outlier-factor": 1.0})
    assert validate_run_config({})["outlier-factor"] == 10.0


# ----------------------------------------------------------------------------- query replies


def logits_and_labels(seed: int, n: int = 300, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    z = torch.randn(n, 10, generator=g, dtype=torch.float64)
    z[torch.arange(n), y] += 2.0
    return z * scale, y


def test_honest_temperature_sums_satisfy_the_exact_bounds_and_a_huge_gradient_does_not():
    for seed, scale in ((0, 0.1), (1, 3.0), (2, 50.0)):
        z, y = logits_and_labels(seed, scale=scale)
        for log_t in temperature_grid(41):
            st = temperature_statistics(z, y, log_t)
            check_temperature_bounds(st.count, st.nll_sum, st.grad_sum, st.hess_sum, 10)
    st = temperature_statistics(*logits_and_labels(3), 0.0)
    with pytest.raises(OutlierError, match="grad-sum 1e\\+300 above"):
        check_temperature_bounds(st.count, st.nll_sum, 1e300, st.hess_sum, 10)
    with pytest.raises(OutlierError, match="below -nll-sum"):
        check_temperature_bounds(st.count, st.nll_sum, -1e300, st.hess_sum, 10)
    with pytest.raises(OutlierError, match="hess-sum"):
        check_temperature_bounds(st.count, st.nll_sum, st.grad_sum, -1e300, 10)


def test_an_inflated_nll_curve_is_dropped_and_honest_ones_kept():
    grid = temperature_grid(21)
    clients = [[[temperature_statistics(*logits_and_labels(s), u) for u in grid]] for s in range(4)]
    assert nll_outliers(clients, RobustScreen(), 10) == {}
    inflated = [
        [type(st)(st.count, st.nll_sum * 1e3, st.grad_sum, st.hess_sum) for st in m]
        for m in clients[3]
    ]
    found = nll_outliers([*clients[:3], inflated], RobustScreen(), 10)
    assert list(found) == [3] and "NLL per sample" in found[3]


def unit_stats(seed: int, shift: float = 0.0) -> dict[str, UnitStats]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(200, 8, generator=g, dtype=torch.float64) + shift
    return {"layer": UnitStats(sum=x.sum(0), sum_sq=(x**2).sum(0), count=200)}


def test_moments_shifted_to_1e4_but_consistent_are_dropped():
    honest = [unit_stats(s) for s in range(3)]
    assert moments_outliers(honest, RobustScreen()) == {}
    found = moments_outliers([*honest, unit_stats(9, shift=1e4)], RobustScreen())
    assert list(found) == [3] and "root mean square of layer 'layer'" in found[3]
    assert moments_outliers([honest[0], unit_stats(9, shift=1e4)], RobustScreen()) == {}


def test_the_classes_come_from_the_model():
    assert num_classes_of(model(0)) == 10
    assert num_classes_of(torch.nn.Sequential(torch.nn.Linear(3, 7))) == 7
    assert num_classes_of(torch.nn.Sequential(torch.nn.ReLU())) is None


# ----------------------------------------------------------------------------- identities


def test_a_simulation_trusts_the_partitions_it_assigned_and_names_the_spoofer():
    state = honest_state(1)
    replies = [
        reply(11, state, {"num-examples": 10, "partition-id": 0}),
        reply(12, honest_state(2), {"num-examples": 10, "partition-id": 0}),  # spoofs 0
        reply(13, honest_state(3), {"num-examples": 10, "partition-id": 2}),
    ]
    reference = None
    report = screen_replies(replies[::-1], reference, [11, 12, 13], assigned={11: 0, 12: 1, 13: 2})
    assert report.survivor_ids == [0, 2]  # the honest partition 0 stays, whatever came first
    (failure,) = report.failures
    assert (failure.node_id, failure.partition_id) == (12, 1)
    assert "claims partition-id 0; the server assigned partition 1 to node 12" in failure.reason


def test_a_deployment_drops_every_claimant_of_one_partition_by_node_id():
    replies = [
        reply(21, honest_state(1), {"num-examples": 10, "partition-id": 0}),
        reply(22, honest_state(2), {"num-examples": 10, "partition-id": 0}),
        reply(23, honest_state(3), {"num-examples": 10, "partition-id": 1}),
    ]
    report = screen_replies(replies, None, [21, 22, 23])
    assert [u.node_id for u in report.survivors] == [23]
    first, second = report.failures
    assert (first.node_id, second.node_id) == (21, 22)
    assert second.describe().startswith("node 22 (partition 0): claims partition-id 0, which ")
    assert "which node 21 also claims" in second.reason
    assert "which node 22 also claims" in first.reason


def test_an_error_reply_is_named_by_its_assigned_partition():
    error = Message(RecordDict(), dst_node_id=31, message_type="train")
    from flwr.app import Error

    failed = Message(Error(code=1, reason="boom"), reply_to=error)
    report = screen_replies([failed], None, [31, 32], assigned={31: 4, 32: 5})
    described = sorted(f.describe() for f in report.failures)
    assert described == [
        "node 31 (partition 4): client error: boom",
        "node 32 (partition 5): no reply before the timeout",
    ]


def test_every_drop_reason_is_plain_text():
    reason = (
        "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::Actor.run()"
        "\x1b[39m repr=<flwr.simulation.ray_actor.ClientAppActor object at 0x7f4744a82050>)\n"
        "    ^^^^^^^^^^\n"
        '  File "/x/ray_actor.py", line 65, in run\n'
        "    raise ClientAppException(str(ex)) from ex\n"
        "Exception occurred. Message: \x1b[31mboom\x1b[0m\x00 in <ray.actor.ActorHandle object "
        "at 0x7f00beef>'>"
    )
    text = plain_text(reason)
    assert "\x1b" not in text and "\x00" not in text and "0x" not in text and "File" not in text
    assert "ClientAppActor" in text and "boom in ActorHandle" in text and "\n" not in text
    assert len(plain_text("x" * 1000)) == 300


def test_a_client_error_with_its_traceback_names_the_error_once():
    """The ClientApp's error reply (``partition-id=1: InjectedFailure: boom`` and its traceback,
    whose last line repeats the error, with its module) reads as the error, once; a different
    error in the traceback is kept."""
    from fedlmc.simulations.client_app import InjectedFailure

    try:
        raise InjectedFailure("injected failure on partition 1")
    except InjectedFailure as err:
        reason = f"partition-id=1: {type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"
    assert "fedlmc.simulations.client_app.InjectedFailure: injected" in reason  # twice in all
    said = "partition-id=1: InjectedFailure: injected failure on partition 1"
    assert plain_text(reason) == said
    assert plain_text(reason + "ValueError: another") == said + " ValueError: another"


def test_a_client_error_relayed_by_ray_names_the_error_not_ray_internals():
    """The reason Flower's simulation sends for a ClientApp that raised, built as Flower builds
    it (``vce_api``: ``str(type(ex)) + ":<'" + str(ex) + "'>"``) from Ray's own error of an
    actor task: the failure names the partition and the client's exception, and none of Ray's
    wrapper, worker header, process id, address or actor id."""
    from flwr.clientapp.client_app import ClientAppException
    from ray.exceptions import RayTaskError

    try:
        try:
            raise ValueError("bad batch on partition-id=3")
        except ValueError as cause:
            raise ClientAppException(str(cause)) from cause
    except ClientAppException as wrapped:
        relayed = RayTaskError(
            "ClientAppActor.run",
            traceback.format_exc(),
            wrapped,
            proctitle="ray::ClientAppActor.run",
            pid=23140,
            ip="127.0.0.1",
            actor_repr="<flwr.simulation.ray_actor.ClientAppActor object at 0x7fb89c8e6350>",
            actor_id="e9da09d21208f634f2767a7e01000000",
        ).as_instanceof_cause()
    reason = str(type(relayed)) + ":<'" + str(relayed) + "'>"
    assert "pid=23140" in reason and "actor_id=e9da" in reason  # what Ray sends
    error = Message(RecordDict(), dst_node_id=31, message_type="train")
    from flwr.app import Error

    failed = Message(Error(code=1, reason=reason), reply_to=error)
    (failure,) = screen_replies([failed], None, [31]).failures
    assert failure.describe() == (
        "node 31 (partition 3): client error: ValueError: bad batch on partition-id=3"
    )


# ----------------------------------------------------------------------------- metrics


def test_huge_history_losses_and_timings_are_removed_by_name_and_the_weights_merged():
    history = {HISTORY_KEYS["train_loss"]: [1e308], HISTORY_KEYS["train_accuracy"]: [0.5]}
    metrics = {"num-examples": 10, "partition-id": 0, "train-seconds": 1e300, **history}
    nan_time = {"num-examples": 10, "partition-id": 1, "train-seconds": math.nan}
    report = screen_replies(
        [reply(1, honest_state(1), metrics), reply(2, honest_state(2), nan_time)], None, [1, 2]
    )
    first, second = report.survivors
    assert first.history is None and "outside [0, 1e+06]" in first.history_problem
    assert "train-seconds" not in first.metrics and first.dropped_metrics == ("train-seconds",)
    assert first.metric_problems[0].startswith("train-seconds = 1e+300; allowed")
    assert "train-seconds" not in second.metrics and second.dropped_metrics == ("train-seconds",)


def test_a_float64_reply_under_client_side_matching_is_named_for_its_dtype():
    template = model(0, norm="none")
    state = {k: v.double() for k, v in template.state_dict().items()}
    update = ClientUpdate(1, 7, state, 10, {}, 0)
    rounds = ClientRounds(
        None, [update], {}, template=template, device="cpu", timeout=1.0, min_clients=1
    )
    reason = rounds._digest_reason(update)
    assert reason.startswith("sent float64 weights") and "the model is float32" in reason
    same = ClientUpdate(1, 7, template.state_dict(), 10, {}, 0)
    assert "other than those it sent" in rounds._digest_reason(same)
