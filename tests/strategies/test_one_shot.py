"""Aggregation logic of the fedlmc strategies on hand-built Flower replies (real Messages)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from fedlmc.averaging import average, load_state
from fedlmc.evaluation import predict_logits
from fedlmc.merging.calibrate import (
    bn_statistics,
    fit_temperature,
    reset_bn_stats,
    temperature_statistics,
)
from fedlmc.merging.temperature_bound import T_MIN, TemperatureAtBoundWarning, bound_line
from fedlmc.models.classifiers import apply_permutation, build_model, permutation_spec
from fedlmc.permutation import random_permutations
from fedlmc.strategies import (
    InconsistentShapesError,
    NotEnoughClientsError,
    OneShotAverage,
    PermutationAlignedAverage,
    StrategyOptions,
)
from fedlmc.strategies.protocol import (
    bn_stats_from_content,
    bn_stats_to_content,
    record_to_state,
    state_to_record,
    temperature_stats_from_content,
    temperature_stats_to_content,
)
from fedlmc.strategies.screening import UNBOUNDED

IN_SHAPE = (1, 4, 4)


@pytest.fixture(autouse=True)
def _messages_need_a_task_identity(task_identity):
    """Messages need a run id: what Flower sets for a ServerApp (as run_simulation does)."""
    yield


def tiny(seed: int, norm: str = "none"):
    torch.manual_seed(seed)
    return build_model("mlp", width=1.0, in_shape=IN_SHAPE, depth=2, base_hidden=8, norm=norm)


def data(n: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *IN_SHAPE, generator=g), torch.randint(0, 10, (n,), generator=g)


def instruction(node_id: int) -> Message:
    return Message(RecordDict(), dst_node_id=node_id, message_type="train")


def reply(node_id: int, state, pid: int, n: int = 10) -> Message:
    metrics = MetricRecord({"num-examples": n, "partition-id": pid, "train-loss": float(pid)})
    content = RecordDict({"arrays": state_to_record(state), "metrics": metrics})
    return Message(content, reply_to=instruction(node_id))


def error_reply(node_id: int, pid: int) -> Message:
    error = Error(code=1001, reason=f"partition-id={pid}: RuntimeError: boom")
    return Message(error, reply_to=instruction(node_id))


def strategy_for(template, nodes, **kwargs) -> OneShotAverage:
    kwargs.setdefault("calibration", "none")
    strategy = OneShotAverage(template, StrategyOptions(num_clients=len(nodes), **kwargs))
    strategy.expect_replies(state_to_record(template.state_dict()), nodes)
    return strategy


def constant_state(template, value: float):
    return {k: torch.full_like(v, value) for k, v in template.state_dict().items()}


def test_merge_is_weighted_by_num_examples():
    template = tiny(0)
    strategy = strategy_for(template, [11, 12], weight_bound=UNBOUNDED)
    replies = [
        reply(11, constant_state(template, 1.0), 0, n=1),
        reply(12, constant_state(template, 4.0), 1, n=3),
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    for tensor in record_to_state(arrays).values():
        assert torch.equal(tensor, torch.full_like(tensor, 3.25))  # 1/4 * 1 + 3/4 * 4
    assert metrics["num-examples"] == 4
    assert metrics["train-loss"] == pytest.approx(0.75)  # 1/4 * 0 + 3/4 * 1
    assert metrics["temperature"] == 1.0


def test_replies_are_sorted_by_partition_id_not_arrival_or_node_id():
    template = tiny(0)
    states = {pid: tiny(pid + 1).state_dict() for pid in range(3)}
    nodes = {0: 900, 1: 5, 2: 40}
    strategy = strategy_for(template, list(nodes.values()), keep_client_states=True)
    arrival = [reply(nodes[p], states[p], p, n=10 + p) for p in (2, 0, 1)]
    found = strategy.merge_round(1, arrival)
    assert found.report.survivor_ids == [0, 1, 2]
    assert [u.node_id for u in found.report.survivors] == [900, 5, 40]
    for update, pid in zip(found.report.survivors, range(3), strict=True):
        assert all(torch.equal(update.state[k], states[pid][k]) for k in states[pid])
    expected = average([states[p] for p in range(3)], [10, 11, 12])
    merged = record_to_state(found.arrays)
    assert all(torch.equal(merged[k], expected[k]) for k in expected)
    assert all(torch.equal(found.merged_state[k], expected[k]) for k in expected)
    assert found.weights == pytest.approx((10 / 33, 11 / 33, 12 / 33))


def test_error_and_nan_replies_are_dropped_and_recorded():
    template = tiny(0)
    good = {0: tiny(1).state_dict(), 3: tiny(4).state_dict()}
    nan = {k: torch.full_like(v, math.nan) for k, v in tiny(3).state_dict().items()}
    strategy = strategy_for(template, [1, 2, 3, 4])
    replies = [reply(4, good[3], 3), error_reply(2, 1), reply(3, nan, 2), reply(1, good[0], 0)]
    found = strategy.merge_round(1, replies)
    arrays, metrics, report = found.arrays, found.metrics, found.report
    assert report.survivor_ids == [0, 3]
    assert [f.partition_id for f in report.failures] == [1, 2]
    assert "boom" in report.failures[0].reason
    assert "non-finite" in report.failures[1].reason
    expected = average([good[0], good[3]], [10, 10])
    merged = record_to_state(arrays)
    assert all(torch.equal(merged[k], expected[k]) for k in expected)
    assert metrics["clients-survived"] == 2 and metrics["clients-failed"] == 2
    arrays_bytes = sum(t.numel() * t.element_size() for t in good[0].values())
    assert metrics["bytes-received"] == 3 * arrays_bytes  # two survivors + the NaN reply


def test_missing_reply_counts_as_failure():
    template = tiny(0)
    strategy = strategy_for(template, [1, 2, 3])
    found = strategy.merge_round(
        1, [reply(1, tiny(1).state_dict(), 0), reply(2, tiny(2).state_dict(), 1)]
    )
    assert found.report.survivor_ids == [0, 1]
    assert [(f.node_id, f.reason) for f in found.report.failures] == [
        (3, "no reply before the timeout")
    ]


def test_too_few_survivors_is_a_clear_error():
    template = tiny(0)
    strategy = strategy_for(template, [1, 2, 3], min_clients=2)
    with pytest.raises(
        NotEnoughClientsError, match=r"only 1 client\(s\) survived.*min-clients = 2"
    ):
        strategy.aggregate_train(1, [reply(1, tiny(1).state_dict(), 0), error_reply(2, 1)])


def test_wrong_shape_is_dropped_against_the_reference():
    template = tiny(0)
    wide = build_model("mlp", in_shape=IN_SHAPE, depth=2, base_hidden=9)
    strategy = strategy_for(template, [1, 2, 3])
    replies = [
        reply(1, tiny(1).state_dict(), 0),
        reply(2, wide.state_dict(), 1),
        reply(3, tiny(3).state_dict(), 2),
    ]
    report = strategy.merge_round(1, replies).report
    assert report.survivor_ids == [0, 2]
    assert "wrong shape" in report.failures[0].reason
    assert report.failures[0].partition_id == 1


def test_shape_disagreement_without_reference_raises():
    template = tiny(0)
    wide = build_model("mlp", in_shape=IN_SHAPE, depth=2, base_hidden=9)
    strategy = OneShotAverage(template, StrategyOptions(num_clients=2, calibration="none"))
    strategy.expect_replies(ArrayRecord(), [1, 2])
    with pytest.raises(InconsistentShapesError, match="partition 1 vs partition 0"):
        strategy.aggregate_train(
            1, [reply(1, tiny(1).state_dict(), 0), reply(2, wide.state_dict(), 1)]
        )


def test_server_calibration_fits_the_merged_model_on_server_data():
    template = tiny(0)
    server = data(128, seed=5)
    states = [tiny(1).state_dict(), tiny(2).state_dict()]
    strategy = strategy_for(template, [1, 2], calibration="server", server_data=server)
    found = strategy.merge_round(1, [reply(1, states[0], 0), reply(2, states[1], 1)])
    model = load_state(template, average(states, [1, 1]))
    expected = fit_temperature(predict_logits(model, server[0]), server[1])
    metrics = found.metrics
    assert metrics["temperature"] == pytest.approx(expected, rel=1e-9)
    assert metrics["log-temperature"] == pytest.approx(math.log(expected), rel=1e-9)
    assert found.temperature == metrics["temperature"] == found.server_split_temperature
    assert found.calibration_history == () and found.bn_source == "none"


def test_batchnorm_statistics_are_reestimated_on_server_data():
    template = tiny(0, norm="bn")
    server = data(96, seed=3)
    clients = []
    for seed in (1, 2):
        model = tiny(seed, norm="bn")
        reset_bn_stats(model, data(64, seed=seed + 10))  # non-trivial running stats
        clients.append(model.state_dict())
    strategy = strategy_for(template, [1, 2], server_data=server)
    arrays, metrics = strategy.aggregate_train(
        1, [reply(1, clients[0], 0), reply(2, clients[1], 1)]
    )
    expected = reset_bn_stats(load_state(template, average(clients, [1, 1])), server).state_dict()
    merged = record_to_state(arrays)
    assert metrics["bn-reestimated"] == 1
    running = [k for k in expected if "running_mean" in k or "running_var" in k]
    assert running
    for key in expected:
        assert torch.allclose(merged[key].double(), expected[key].double(), atol=1e-6), key
    plain = average(clients, [1, 1])
    assert not torch.allclose(merged[running[0]], plain[running[0]])


def test_weight_matching_undoes_a_permutation_that_plain_averaging_cannot():
    template = tiny(0)
    base = tiny(1).state_dict()
    spec = permutation_spec(template)
    permuted = apply_permutation(spec, random_permutations(spec, base, seed=3), base)
    replies = [reply(1, base, 0), reply(2, permuted, 1)]
    aligned = PermutationAlignedAverage(
        template, StrategyOptions(num_clients=2, calibration="none"), method="weight_matching"
    )
    aligned.expect_replies(state_to_record(template.state_dict()), [1, 2])
    merged = record_to_state(aligned.aggregate_train(1, replies)[0])
    for key in base:
        assert torch.allclose(merged[key], base[key], atol=1e-6), key
    plain = strategy_for(template, [1, 2])
    averaged = record_to_state(plain.aggregate_train(1, replies)[0])
    assert not all(torch.allclose(averaged[k], base[k], atol=1e-3) for k in base)


def sequential(seed: int) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(784, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 10),
    )


def test_a_plain_sequential_gets_its_spec_when_the_strategy_is_built():
    """A user's own nn.Sequential (no permutation_spec(), no config): without an example the
    strategy is refused when it is built, naming what to pass, not after every client
    trained; with ``example_input`` or ``server_data`` the spec is derived then, and weight
    matching undoes a known permutation of the hidden units."""
    template = sequential(0)
    with pytest.raises(
        ValueError,
        match=r"PermutationAlignedAverage\(method='weight_matching'\)"
        r".*no permutation_spec\(\) method.*pass example_input=",
    ):
        PermutationAlignedAverage(template, StrategyOptions(num_clients=2, calibration="none"))
    x = torch.randn(2, 1, 28, 28)
    by_example = PermutationAlignedAverage(
        template, StrategyOptions(num_clients=2, calibration="none"), example_input=x
    )
    by_data = PermutationAlignedAverage(
        template,
        StrategyOptions(
            num_clients=2,
            calibration="server",
            server_data=(torch.randn(8, 1, 28, 28), torch.arange(8) % 10),
        ),
    )
    groups = by_example.spec.perm_to_axes
    assert len(groups) == 2 and by_data.spec.perm_to_axes == groups  # the two hidden layers
    with pytest.raises(ValueError, match="PermutationAlignedAverage.*pass example_input="):
        PermutationAlignedAverage(  # an example of the wrong shape fails now, too
            template,
            StrategyOptions(num_clients=2, calibration="none"),
            example_input=torch.randn(2, 5),
        )
    base = sequential(1).state_dict()
    spec = by_example.spec
    permuted = apply_permutation(spec, random_permutations(spec, base, seed=3), base)
    by_example.expect_replies(state_to_record(template.state_dict()), [1, 2])
    merged = record_to_state(
        by_example.aggregate_train(1, [reply(1, base, 0), reply(2, permuted, 1)])[0]
    )
    for key in base:
        assert torch.allclose(merged[key], base[key], atol=1e-6), key


def test_the_lewc_bias_merge_runs_in_a_strategy_and_refuses_norm_layers():
    template = tiny(0)
    states = [tiny(1).state_dict(), tiny(2).state_dict()]
    replies = [reply(1, states[0], 0, n=1), reply(2, states[1], 1, n=3)]
    strategy = PermutationAlignedAverage(
        template,
        StrategyOptions(num_clients=2, calibration="none", weight_bound=UNBOUNDED),
        method="average_lewc_bias",
    )
    strategy.expect_replies(state_to_record(template.state_dict()), [1, 2])
    merged = record_to_state(strategy.aggregate_train(1, replies)[0])
    weights = [0.25, 0.75]
    for depth, layer in enumerate(["hidden.0.linear", "hidden.1.linear", "classifier"], 1):
        expected = sum(
            w**depth * sd[f"{layer}.bias"] for w, sd in zip(weights, states, strict=True)
        )
        assert torch.allclose(merged[f"{layer}.bias"], expected, atol=1e-6)
        plain = sum(w * sd[f"{layer}.weight"] for w, sd in zip(weights, states, strict=True))
        assert torch.allclose(merged[f"{layer}.weight"], plain, atol=1e-6)
    with pytest.raises(ValueError, match="norm-free"):  # refused before any client trains
        PermutationAlignedAverage(
            tiny(0, norm="ln"),
            StrategyOptions(num_clients=2, calibration="none"),
            method="average_lewc_bias",
        )


def test_bad_strategy_arguments_name_the_value():
    template = tiny(0)
    with pytest.raises(ValueError, match="calibration = 'sometimes'"):
        OneShotAverage(template, StrategyOptions(num_clients=2, calibration="sometimes"))
    with pytest.raises(ValueError, match="needs server_data"):
        OneShotAverage(template, StrategyOptions(num_clients=2, calibration="server"))
    with pytest.raises(ValueError, match="min_clients = 3"):
        OneShotAverage(template, StrategyOptions(num_clients=2, min_clients=3, calibration="none"))
    with pytest.raises(ValueError, match="unknown merge method 'weight'; allowed: average"):
        PermutationAlignedAverage(
            template, StrategyOptions(num_clients=2, calibration="none"), method="weight"
        )
    with pytest.raises(ValueError, match="use OneShotAverage"):
        PermutationAlignedAverage(
            template, StrategyOptions(num_clients=2, calibration="none"), method="average"
        )
    with pytest.raises(ValueError, match="'activation_matching' needs server data; got none"):
        PermutationAlignedAverage(
            template,
            StrategyOptions(num_clients=2, calibration="none"),
            method="activation_matching",
        )


def test_krum_in_a_plain_serverapp_refuses_a_min_clients_below_its_fewest_clients():
    """Issue 52: ``min_clients = 2`` lets a round merge 2 survivors, fewer than Krum's
    ``2f + 3``: the registry's refusal, asked at construction, names the count (the run
    config's check asks the same refusal)."""
    template = tiny(0)

    def krum(min_clients, **method_options):
        options = StrategyOptions(num_clients=7, min_clients=min_clients, calibration="none")
        return PermutationAlignedAverage(
            template, options, method="krum", method_options=method_options
        )

    with pytest.raises(ValueError, match="'krum' with as few as 2 clients: allowed: at least 3"):
        krum(2)
    assert krum(3).merge_method == "krum"
    with pytest.raises(ValueError, match=r"at least 5 clients \(2 x krum_byzantine \+ 3"):
        krum(4, krum_byzantine=1)
    assert krum(5, krum_byzantine=1).method_options == {"krum_byzantine": 1}


def test_query_payloads_round_trip_exactly():
    model = tiny(0, norm="bn")
    x, y = data(32)
    bn = bn_statistics(model, x)
    back = bn_stats_from_content(bn_stats_to_content(bn, {"partition-id": 3}))
    assert set(back) == set(bn)
    for name, st in bn.items():
        assert torch.equal(back[name].sum, st.sum) and torch.equal(back[name].sum_sq, st.sum_sq)
        assert back[name].count == st.count
    logits = predict_logits(model, x)
    stats = [temperature_statistics(logits, y, u) for u in (-0.3, 0.0, 2.5)]
    assert temperature_stats_from_content(temperature_stats_to_content(stats, {})) == stats


class _NodesGrid:
    """The nodes of a deployment, as a Grid lists them; ``assigned``: the partitions a
    simulation's engine assigns (``None``: a deployment, which assigns none)."""

    def __init__(self, nodes, assigned=None) -> None:
        self.nodes = list(nodes)
        if assigned is not None:
            self.assigned_partitions = lambda: dict(assigned)

    def get_node_ids(self) -> list[int]:
        return self.nodes


def _warnings_of_configure_train(strategy, grid) -> list[str]:
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler(level=logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        arrays = state_to_record(strategy.template.state_dict())
        strategy.configure_train(1, arrays, ConfigRecord(), grid)
    finally:
        logger.removeHandler(handler)
    return [r.getMessage() for r in records if r.levelno == logging.WARNING]


def test_a_deployment_without_server_data_is_warned_that_clients_cannot_be_checked_on_data():
    template = tiny(0)
    nodes = [5, 6, 7]
    strategy = OneShotAverage(template, StrategyOptions(num_clients=3, calibration="none"))
    (line,) = _warnings_of_configure_train(strategy, _NodesGrid(nodes))
    assert line.startswith("fedlmc warning: a deployment without server data: a poisoned")
    assert "max-client-share" in line and "server_data=(x, y)" in line and "\n" not in line
    with_data = OneShotAverage(
        template, StrategyOptions(num_clients=3, calibration="none", server_data=data())
    )
    assert _warnings_of_configure_train(with_data, _NodesGrid(nodes)) == []
    simulated = _NodesGrid(nodes, assigned={5: 0, 6: 1, 7: 2})  # a simulation: not warned
    assert _warnings_of_configure_train(strategy, simulated) == []


def _round_log(strategy, replies):
    """One merge round, its Flower log lines (INFO and above) and its Python warnings."""
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler(level=logging.INFO)
    handler.emit = records.append
    logger = logging.getLogger("flwr")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = strategy.merge_round(1, replies)
    finally:
        logger.removeHandler(handler)
    return found, [r.getMessage() for r in records], list(caught)


def test_a_strategys_temperature_at_the_fits_bound_is_said_in_its_log():
    """PermutationAlignedAverage on a model and a permuted copy, calibrated on server data whose
    labels are the model's own predictions: T is the fit's lower bound, and the log says so in
    one ``fedlmc warning:`` line right after the round's (the sentence ``fedlmc run`` says), not
    a second time as a Python warning."""
    template = tiny(0)
    base = tiny(1).state_dict()
    spec = permutation_spec(template)
    permuted = apply_permutation(spec, random_permutations(spec, base, seed=3), base)
    x = data(64, seed=5)[0]
    own = predict_logits(load_state(template, base), x).argmax(dim=1)
    options = StrategyOptions(num_clients=2, calibration="server", server_data=(x, own))
    aligned = PermutationAlignedAverage(template, options, method="weight_matching")
    aligned.expect_replies(state_to_record(template.state_dict()), [1, 2])
    found, lines, caught = _round_log(aligned, [reply(1, base, 0), reply(2, permuted, 1)])
    assert found.temperature == T_MIN
    said = [i for i, line in enumerate(lines) if line.startswith("fedlmc warning:")]
    assert [lines[i] for i in said] == [f"fedlmc warning: {bound_line('weight_matching', T_MIN)}"]
    assert "temperature 0.0010" in lines[said[0] - 1]  # right after the round's line
    assert not [w for w in caught if issubclass(w.category, TemperatureAtBoundWarning)]
    mixed = own.clone()
    mixed[::3] = data(64, seed=5)[1][::3]  # a third of the labels not the model's: T inside
    options = StrategyOptions(num_clients=2, calibration="server", server_data=(x, mixed))
    inside = PermutationAlignedAverage(template, options, method="weight_matching")
    inside.expect_replies(state_to_record(template.state_dict()), [1, 2])
    found, lines, _ = _round_log(inside, [reply(1, base, 0), reply(2, permuted, 1)])
    assert T_MIN < found.temperature < 1.0
    assert not [line for line in lines if line.startswith("fedlmc warning:")]
