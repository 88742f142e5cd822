"""The post-merge pipeline written once: the study and the strategies finish a merge the same
way, and its guards (BatchNorm, REPAIR, missing data) hold."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch
from flwr.app import Message, MetricRecord, RecordDict

from fedlmc.averaging import average, load_state
from fedlmc.data.splits import DataSplits
from fedlmc.evaluation import predict_logits
from fedlmc.merging.calibrate import fit_temperature, reset_bn_stats
from fedlmc.merging.clients import LocalClients
from fedlmc.merging.merge_job import Alignment
from fedlmc.merging.method_registry import METHODS, merge_method, register_method
from fedlmc.merging.post_merge import (
    ServerData,
    calibrate,
    post_merge,
    reestimates_batchnorm,
    repairs,
)
from fedlmc.merging.repair import repair
from fedlmc.merging.temperature_bound import (
    T_MAX,
    T_MIN,
    TemperatureAtBoundWarning,
    bound_line,
)
from fedlmc.strategies import OneShotAverage, PermutationAlignedAverage, StrategyOptions
from fedlmc.strategies.protocol import state_to_record
from fedlmc.strategies.queries import ClientRounds
from fedlmc.strategies.screening import UNBOUNDED
from fedlmc.study.compare import compare_methods
from tests.strategies.test_one_shot import IN_SHAPE, tiny

WEIGHTS = [0.25, 0.75]


@pytest.fixture(autouse=True)
def _messages_need_a_task_identity(task_identity):
    yield


def data(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *IN_SHAPE, generator=g), torch.randint(0, 10, (n,), generator=g)


def splits() -> DataSplits:
    return DataSplits("noise", data(64, 0), data(96, 1), data(80, 2), 10, IN_SHAPE)


def client_states(norm: str) -> list[dict[str, torch.Tensor]]:
    states = []
    for seed in (1, 2):
        model = tiny(seed, norm)
        reset_bn_stats(model, data(64, seed + 10))  # non-trivial running statistics
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return states


def reply(node_id: int, state, pid: int, n: int) -> Message:
    metrics = MetricRecord({"num-examples": n, "partition-id": pid})
    content = RecordDict({"arrays": state_to_record(state), "metrics": metrics})
    instruction = Message(RecordDict(), dst_node_id=node_id, message_type="train")
    return Message(content, reply_to=instruction)


def strategy_round(template, states, method: str, server):
    """One round of the strategy for ``method`` on ``states`` (num-examples 1 and 3)."""
    options = StrategyOptions(
        num_clients=2, calibration="server", server_data=server, weight_bound=UNBOUNDED
    )
    if method == "average":
        strategy = OneShotAverage(template, options)
    else:
        strategy = PermutationAlignedAverage(template, options, method=method)
    strategy.expect_replies(state_to_record(template.state_dict()), [1, 2])
    return strategy.merge_round(1, [reply(1, states[0], 0, 1), reply(2, states[1], 1, 3)])


def study(template, states, method: str, cells: DataSplits):
    return compare_methods(
        template, states, [1, 3], cells, [method, f"{method}_t"], diagnostics=False, device="cpu"
    )


def assert_same_state(a, b) -> None:
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize(
    ("norm", "method", "bn_source", "repaired"),
    [
        ("bn", "average", "server", False),  # a BatchNorm model: its statistics re-estimated
        ("none", "average_repair", "none", True),  # a REPAIR-able model: repaired
        ("bn", "average_repair", "server", False),  # REPAIR of a BatchNorm model is the reset
    ],
)
def test_the_study_and_a_strategy_finish_a_merge_identically(norm, method, bn_source, repaired):
    cells = splits()
    template = tiny(0, norm)
    states = client_states(norm)
    comparison = study(template, states, method, cells)
    found = strategy_round(template, states, method, cells.server)
    assert (found.bn_source, found.repaired) == (bn_source, repaired)
    assert found.weights == tuple(WEIGHTS)
    assert_same_state(comparison.merged[method], found.merged_state)
    plain = average(states, WEIGHTS)
    assert not all(torch.equal(plain[k], found.merged_state[k]) for k in plain)  # it did work
    calibrated = next(r for r in comparison.rows if r["method"] == f"{method}_t")
    assert calibrated["temperature"] == found.temperature
    direct = load_state(template, found.merged_state)
    assert found.temperature == fit_temperature(
        predict_logits(direct, cells.server[0]), cells.server[1]
    )


def test_the_pipeline_on_server_data_is_bn_reset_and_repair_on_that_data():
    x, y = data(96, 1)
    source = ServerData(x, y)
    bn_states = client_states("bn")
    done = post_merge(
        tiny(0, "bn"), average(bn_states, WEIGHTS), bn_states, WEIGHTS, "average", source
    )
    expected = reset_bn_stats(load_state(tiny(0, "bn"), average(bn_states, WEIGHTS)), x)
    assert_same_state(done.state, expected.state_dict())
    states = client_states("none")
    template = tiny(0)
    merged = average(states, WEIGHTS)
    done = post_merge(template, merged, states, WEIGHTS, "average_repair", source, device="cpu")
    endpoints = [load_state(template, sd).eval() for sd in states]
    expected = repair(load_state(template, merged).eval(), endpoints, WEIGHTS, x)
    assert_same_state(done.state, expected.state_dict())
    assert done.bn_source == "none" and done.repaired and not done.model.training


def test_repair_needs_two_endpoints_no_batchnorm_and_the_method_asking_for_it():
    entry = merge_method("average_repair")
    mlp, bn = tiny(0), tiny(0, "bn")
    assert repairs(mlp, entry, 2)
    assert not repairs(mlp, entry, 1)  # the merge is that client: nothing to repair
    assert not repairs(bn, entry, 2)  # for BatchNorm, REPAIR is re-estimating the statistics
    assert not repairs(mlp, merge_method("average"), 2)
    # a method opting out of BatchNorm re-estimation is still not repaired on a BatchNorm model
    # (the study's former guard handed such a model to REPAIR, which refuses BatchNorm)
    opted_out = replace(entry, rule=replace(entry.rule, reestimate_bn=False))
    assert not reestimates_batchnorm(bn, opted_out) and not repairs(bn, opted_out, 2)
    assert reestimates_batchnorm(bn, entry) and not reestimates_batchnorm(mlp, entry)
    assert not reestimates_batchnorm(bn, merge_method("average_lewc_bias"))


@pytest.fixture
def opted_out_repair():
    """A registered method asking for REPAIR but opting out of BatchNorm re-estimation."""
    register_method(
        "kept_statistics_repair",
        description="plain average, REPAIR asked, BatchNorm statistics kept (test)",
        reestimate_bn=False,
        repair=True,
    )(lambda job: Alignment(list(job.states)))
    yield "kept_statistics_repair"
    METHODS.remove("kept_statistics_repair")


def test_a_batchnorm_merge_opting_out_is_neither_reset_nor_repaired_by_either(opted_out_repair):
    """The study's former guard (REPAIR unless BatchNorm was re-estimated) handed this BatchNorm
    model to REPAIR, which refuses it; the one guard keeps its statistics in both callers."""
    cells, template, states = splits(), tiny(0, "bn"), client_states("bn")
    comparison = study(template, states, opted_out_repair, cells)
    found = strategy_round(template, states, opted_out_repair, cells.server)
    assert (found.bn_source, found.repaired) == ("none", False)
    assert_same_state(comparison.merged[opted_out_repair], found.merged_state)
    assert_same_state(found.merged_state, average(states, WEIGHTS))


def test_one_endpoint_is_left_as_it_is():
    states = client_states("none")[:1]
    source = ServerData(*data(96, 1))
    done = post_merge(tiny(0), states[0], states, [1.0], "average_repair", source, device="cpu")
    assert not done.repaired
    assert_same_state(done.state, states[0])


def test_repair_without_data_is_a_clear_error():
    states = client_states("none")
    with pytest.raises(ValueError, match="'average_repair' repairs .* needs data"):
        post_merge(tiny(0), average(states, WEIGHTS), states, WEIGHTS, "average_repair", None)


def test_a_batchnorm_merge_without_data_keeps_its_statistics_and_says_so():
    states = client_states("bn")
    merged = average(states, WEIGHTS)
    with pytest.warns(RuntimeWarning, match="running statistics kept"):
        done = post_merge(tiny(0, "bn"), merged, states, WEIGHTS, "average", None, device="cpu")
    assert done.bn_source == "none" and not done.bn_reestimated
    assert_same_state(done.state, merged)


def test_calibrate_fits_on_the_source_and_is_one_without_it():
    model = tiny(3)
    x, y = data(96, 1)
    with pytest.warns(TemperatureAtBoundWarning):  # an untrained model, random labels: T_MAX
        found = calibrate(model, ServerData(x, y))
    assert found.temperature == fit_temperature(predict_logits(model, x), y)
    assert found.temperature != 1.0 and found.history == ()
    assert calibrate(model, None).temperature == 1.0


def test_the_clients_query_rounds_are_a_statistics_source():
    for method in ("bn_statistics", "unit_statistics", "temperature"):
        assert callable(getattr(ClientRounds, method)) and callable(getattr(ServerData, method))
    assert ClientRounds.name == "federated" and ServerData(*data(4, 0)).name == "server"


def test_in_memory_clients_are_a_statistics_source_equal_to_their_union():
    """The clients' summed statistics (fedlmc.merging.clients.LocalClients, what the query rounds
    compute) finish a merge as the server data of their union would (whole batches each)."""
    train = [data(256, 20), data(256, 21)]
    calibration = [data(40, 30), data(50, 31)]
    union = ServerData(
        torch.cat([x for x, _ in train]), torch.cat([y for _, y in train])
    )  # BatchNorm batches of 256: the same batches as the clients'
    for norm, method in (("bn", "average"), ("none", "average_repair")):
        template, states = tiny(0, norm), client_states(norm)
        clients = LocalClients(template, states, [x for x, _ in train], calibration, device="cpu")
        merged = average(states, WEIGHTS)
        on_clients = post_merge(template, merged, states, WEIGHTS, method, clients, device="cpu")
        central = post_merge(template, merged, states, WEIGHTS, method, union, device="cpu")
        assert on_clients.bn_source == ("federated" if norm == "bn" else "none")
        assert on_clients.repaired == central.repaired == (norm == "none")
        for key, value in central.state.items():
            assert torch.allclose(on_clients.state[key], value, rtol=1e-5, atol=1e-6), key
        assert any(not torch.equal(on_clients.state[k], merged[k]) for k in merged)  # it did work
    x = torch.cat([x for x, _ in calibration])
    y = torch.cat([y for _, y in calibration])
    model = on_clients.model
    expected = fit_temperature(predict_logits(model, x), y)
    assert calibrate(model, clients).temperature == pytest.approx(expected, rel=1e-9)


def _warnings_of(call) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if issubclass(w.category, TemperatureAtBoundWarning)]


def test_calibrate_says_a_temperature_at_the_fits_bound_in_one_line():
    """The library's calibration call: a T at the fit's lower bound (labels the model's own
    predictions: every sample right with a margin) or at its upper bound (an untrained model on
    random labels) is a one-line warning, the sentence the study's rows say; a fitted T inside
    the range is not, nor ``warn=False``."""
    model = tiny(3)
    x, random_labels = data(96, 1)
    own = predict_logits(model, x).argmax(dim=1)
    (caught,) = _warnings_of(lambda: calibrate(model, ServerData(x, own)))
    assert str(caught.message) == bound_line("the merged model", T_MIN)
    assert "lower bound 0.001" in str(caught.message) and "\n" not in str(caught.message)
    (caught,) = _warnings_of(lambda: calibrate(model, ServerData(x, random_labels)))
    assert str(caught.message) == bound_line("the merged model", T_MAX)
    assert calibrate(model, ServerData(x, own), warn=False).temperature == T_MIN
    assert _warnings_of(lambda: calibrate(model, ServerData(x, own), warn=False)) == []
    mixed = own.clone()
    mixed[::3] = random_labels[::3]  # a third of the labels not the model's: a finite best T
    assert T_MIN < calibrate(model, ServerData(x, mixed)).temperature < T_MAX
    assert _warnings_of(lambda: calibrate(model, ServerData(x, mixed))) == []
