"""The reply screen and the weight bound (:mod:`fedlmc.strategies.screening`) on hand-built real
Flower replies: every malformed train or query reply is dropped by name, the honest ones are merged,
and no client's claimed counts move the merge beyond the documented bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedlmc.merging.calibrate import (
    fit_temperature,
    grid_minimum,
    temperature_grid,
    temperature_statistics,
)
from fedlmc.merging.repair import UnitStats
from fedlmc.models.classifiers import build_model
from fedlmc.permutation import permutation_spec, random_permutations
from fedlmc.simulations.records.training_file import client_epoch_rows
from fedlmc.strategies import NotEnoughClientsError, OneShotAverage, StrategyOptions
from fedlmc.strategies.own_model_rounds import _group_sizes
from fedlmc.strategies.protocol import (
    HISTORY_KEYS,
    history_metrics,
    moments_to_content,
    permutations_to_content,
    state_to_record,
    temperature_stats_to_content,
)
from fedlmc.strategies.screening import (
    MAX_ABS_WEIGHT,
    ScreenError,
    WeightBound,
    bounded_shares,
    screen_align_reply,
    screen_moments_reply,
    screen_temperature_reply,
)
from fedlmc.strategies.temperature_rounds import bound_temperature_stats

IN_SHAPE = (1, 4, 4)


@pytest.fixture(autouse=True)
def _messages_need_a_task_identity(task_identity):
    yield


def tiny(seed: int = 0, norm: str = "none"):
    torch.manual_seed(seed)
    return build_model("mlp", width=1.0, in_shape=IN_SHAPE, depth=2, base_hidden=8, norm=norm)


def reply(node: int, state, metrics: dict) -> Message:
    content = RecordDict({"arrays": state_to_record(state), "metrics": MetricRecord(metrics)})
    return Message(content, reply_to=Message(RecordDict(), dst_node_id=node, message_type="train"))


def constant(template, value: float):
    return {
        k: torch.full_like(v, value) if v.is_floating_point() else v.clone()
        for k, v in template.state_dict().items()
    }


def strategy_for(template, nodes, **kwargs) -> OneShotAverage:
    kwargs.setdefault("calibration", "none")
    kwargs.setdefault("min_clients", 2)
    strategy = OneShotAverage(template, StrategyOptions(num_clients=len(nodes), **kwargs))
    strategy.expect_replies(state_to_record(template.state_dict()), nodes)
    return strategy


def honest(node: int, pid: int, template, value: float, n: int = 10) -> Message:
    return reply(node, constant(template, value), {"num-examples": n, "partition-id": pid})


# ----------------------------------------------------------------------------- train replies


def bad_train_replies(template):
    """(node, partition id, reply, words of the reason) for every malformed train reply."""
    bn = tiny(0, norm="bn")
    float_buffers = {
        k: v.double() if not v.is_floating_point() else v for k, v in bn.state_dict().items()
    }
    ints = {k: v.to(torch.int32) for k, v in constant(template, 3.0).items()}
    bools = {k: v > 0 for k, v in constant(template, 1.0).items()}
    ok = {"num-examples": 10}
    return [
        (21, 2, reply(21, ints, {**ok, "partition-id": 2}), "wrong dtype"),
        (22, 3, reply(22, bools, {**ok, "partition-id": 3}), "wrong dtype"),
        (23, 4, reply(23, constant(template, 1e30), {**ok, "partition-id": 4}), "allowed: |w|"),
        (24, 5, honest(24, 5, template, 1.0, n=math.inf), "num-examples"),
        (25, 6, honest(25, 6, template, 1.0, n=1e-30), "num-examples"),
        (26, 7, honest(26, 7, template, 1.0, n=-3), "num-examples"),
        (27, None, honest(27, -1, template, 1.0), "partition-id"),
        (28, None, honest(28, 99, template, 1.0), "partition-id"),
        (30, 8, reply(30, float_buffers, {**ok, "partition-id": 8}), "missing or unexpected"),
        (31, 9, honest(31, 9, template, math.nan), "non-finite"),
    ]


def test_every_malformed_train_reply_is_dropped_by_node_and_reason_and_the_rest_merged():
    template = tiny(0)
    bad = bad_train_replies(template)
    nodes = [11, 12, 13, *[b[0] for b in bad]]
    strategy = strategy_for(template, nodes)
    replies = [
        honest(11, 0, template, 1.0),
        honest(12, 1, template, 3.0),
        honest(13, 10, template, 2.0),  # not 1.0: a copy of node 11's model is dropped too
        *[b[2] for b in bad],
    ]
    found = strategy.merge_round(1, replies)
    arrays, metrics, report = found.arrays, found.metrics, found.report
    assert report.survivor_ids == [0, 1, 10]
    failures = {f.node_id: f for f in report.failures}
    for node, _pid, _reply, words in bad:
        assert words in failures[node].reason, (node, failures[node].reason)
    assert 12 not in failures
    assert metrics["clients-failed"] == len(bad)
    for key, tensor in arrays.to_torch_state_dict().items():
        if tensor.is_floating_point():
            assert torch.allclose(tensor, torch.full_like(tensor, 2.0)), key


def test_two_replies_claiming_one_partition_are_both_dropped_and_named():
    """Issue 52's spoof in a deployment without server data: node 20 answers first, claims
    partition 0 and 1e30 examples (capped at max-client-share 0.5) and sends a model the
    relative rules pass (a label flipper's; here all 5s, beside honest 1s to 4s); the honest
    partition 0 (node 11) answers after it. The server cannot tell which is honest: both are
    dropped and named, and partitions 1-3 are merged (keeping the first claimant merged the
    spoof at half the weight: 4.0 everywhere)."""
    template = tiny(0)
    strategy = strategy_for(template, [20, 11, 12, 13, 14])
    replies = [
        reply(20, constant(template, 5.0), {"num-examples": 1e30, "partition-id": 0}),
        honest(11, 0, template, 1.0),
        honest(12, 1, template, 2.0),
        honest(13, 2, template, 3.0),
        honest(14, 3, template, 4.0),
    ]
    found = strategy.merge_round(1, replies)
    assert found.report.survivor_ids == [1, 2, 3]
    failures = {f.node_id: f.describe() for f in found.report.failures}
    assert sorted(failures) == [11, 20]
    assert failures[20].startswith("node 20 (partition 0): claims partition-id 0, which node 11")
    assert failures[11].startswith("node 11 (partition 0): claims partition-id 0, which node 20")
    assert all("every claimant is dropped" in text for text in failures.values())
    for key, tensor in found.arrays.to_torch_state_dict().items():
        if tensor.is_floating_point():
            assert torch.allclose(tensor, torch.full_like(tensor, 3.0)), key


def test_integer_buffers_must_keep_their_exact_dtype():
    template = tiny(0, norm="bn")
    strategy = strategy_for(template, [1, 2], min_clients=1)
    state = template.state_dict()
    wrong = {k: (v.to(torch.int32) if not v.is_floating_point() else v) for k, v in state.items()}
    report = strategy.merge_round(
        1,
        [
            reply(1, state, {"num-examples": 5, "partition-id": 0}),
            reply(2, wrong, {"num-examples": 5, "partition-id": 1}),
        ],
    ).report
    assert report.survivor_ids == [0]
    assert "expected int64" in report.failures[0].reason


def test_too_few_honest_clients_is_an_error_naming_the_dropped_ones():
    template = tiny(0)
    strategy = strategy_for(template, [11, 12, 13], min_clients=2)
    replies = [
        honest(11, 0, template, 1.0),
        honest(12, 1, template, 1.0, n=math.inf),
        reply(13, constant(template, 1e30), {"num-examples": 3, "partition-id": 2}),
    ]
    with pytest.raises(NotEnoughClientsError, match=r"node 12 \(partition 1\).*node 13"):
        strategy.aggregate_train(1, replies)


# ----------------------------------------------------------------------------- the weight bound


def test_bounded_shares_cap_each_client_and_redistribute_the_rest():
    assert bounded_shares([1e30, 1, 1], [0.5, 0.5, 0.5]) == pytest.approx([0.5, 0.25, 0.25])
    assert bounded_shares([1, 3], [1.0, 1.0]) == pytest.approx([0.25, 0.75])
    assert bounded_shares([1e30, 7], [0.3, 0.7]) == pytest.approx([0.3, 0.7])
    assert bounded_shares([1e-30, 7], [0.3, 0.7]) == pytest.approx([0.3, 0.7])
    with pytest.raises(ValueError, match="sum to less than 1"):
        bounded_shares([1, 1], [0.2, 0.2])


def merged_value(strategy, replies) -> float:
    arrays, _ = strategy.aggregate_train(1, replies)
    return float(next(iter(arrays.to_torch_state_dict().values())).flatten()[0])


def test_a_client_claiming_1e30_examples_moves_the_merge_no_more_than_the_bound():
    template = tiny(0)
    sizes = {"train": {0: 100, 1: 100, 2: 200}}
    values = (1.0, 2.0, 4.0)  # within the robust screen's factor of their median

    def replies(claim):
        return [
            honest(11, 0, template, values[0], n=100),
            honest(12, 1, template, values[1], n=100),
            honest(13, 2, template, values[2], n=claim),
        ]

    simulated = WeightBound(sizes=sizes)
    truth = merged_value(strategy_for(template, [11, 12, 13], weight_bound=simulated), replies(200))
    assert truth == pytest.approx(0.25 * 1 + 0.25 * 2 + 0.5 * 4)
    attacked = merged_value(
        strategy_for(template, [11, 12, 13], weight_bound=simulated), replies(1e30)
    )
    assert attacked == pytest.approx(truth)  # simulation: its true share whatever it claims
    deployment = WeightBound(max_share=0.4)
    capped = merged_value(
        strategy_for(template, [11, 12, 13], weight_bound=deployment), replies(1e30)
    )
    assert capped == pytest.approx(0.4 * 4 + 0.3 * 1 + 0.3 * 2)  # at most 40 %
    unbounded = merged_value(
        strategy_for(template, [11, 12, 13], weight_bound=WeightBound(max_share=1.0)),
        replies(1e30),
    )
    assert unbounded == pytest.approx(4.0)  # without the bound the client would be the merge


def calibration_logits(seed: int, scale: float, n: int = 200):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    logits = torch.randn(n, 10, generator=g)
    logits[torch.arange(n), y] += 2.0
    return logits * scale, y


def test_a_client_claiming_1e9_calibration_samples_moves_t_no_more_than_the_bound():
    grid = temperature_grid(201)
    honest_data = [calibration_logits(0, 1.0), calibration_logits(1, 1.0)]
    attacker = calibration_logits(2, 30.0)  # over-confident logits: it wants a large T
    per_client = [[[temperature_statistics(z, y, float(u)) for u in grid]] for z, y in honest_data]
    claimed = [
        type(st)(int(1e9), st.nll_sum * 1e9 / 200, st.grad_sum * 1e9 / 200, st.hess_sum * 1e9 / 200)
        for st in (temperature_statistics(*attacker, float(u)) for u in grid)
    ]
    everyone = [*per_client, [claimed]]
    pooled_z = torch.cat([z for z, _ in (*honest_data, attacker)])
    pooled_y = torch.cat([y for _, y in (*honest_data, attacker)])
    fair_t = float(fit_temperature(pooled_z, pooled_y))
    attacker_t = float(fit_temperature(*attacker))

    def grid_t(bound) -> float:
        bounded = bound_temperature_stats(everyone, [0, 1, 2], bound)
        return math.exp(grid_minimum([c[0] for c in bounded], grid)[0])

    unbounded = grid_t(WeightBound(max_share=1.0))
    simulated = grid_t(WeightBound(sizes={"calibration": {0: 200, 1: 200, 2: 200}}))
    deployment = grid_t(WeightBound(max_share=0.5))
    step = math.exp(grid[1] - grid[0])
    assert unbounded == pytest.approx(attacker_t, rel=step - 1)  # the attacker chooses T
    assert simulated == pytest.approx(fair_t, rel=step - 1)  # its true third of the data
    assert fair_t < deployment < attacker_t  # at most half of the fit
    print(f"\nT: fair {fair_t:.3f}, attacker alone {attacker_t:.3f}, unbounded {unbounded:.3f}, ")
    print(f"simulation bound {simulated:.3f}, deployment bound (0.5) {deployment:.3f}")


# ----------------------------------------------------------------------------- query replies


def temperature_reply(counts, nll, grad, hess) -> RecordDict:
    return RecordDict(
        {
            "stats": MetricRecord(
                {"count": counts, "nll-sum": nll, "grad-sum": grad, "hess-sum": hess}
            )
        }
    )


def test_temperature_replies_need_equal_positive_counts_and_finite_sums():
    screen_temperature_reply(
        temperature_reply([5, 5], [1.0, 2.0], [0.1, 0.2], [1, 1]), ["stats"], 2
    )
    bad = [
        (temperature_reply([5, 5], [math.nan, 2.0], [0.1, 0.2], [1, 1]), "non-finite"),
        (temperature_reply([-5, -5], [1.0, 2.0], [0.1, 0.2], [1, 1]), "integer >= 1"),
        (temperature_reply([5, 6], [1.0, 2.0], [0.1, 0.2], [1, 1]), "counts differ"),
        (temperature_reply([5], [1.0], [0.1], [1]), "list of 2"),
        (temperature_reply([5, 5], [-1.0, 2.0], [0.1, 0.2], [1, 1]), "negative nll"),
        (temperature_reply([5, 5], [1.0, 2.0], [0.1, math.inf], [1, 1]), "non-finite"),
    ]
    for content, words in bad:
        with pytest.raises(ScreenError, match=words):
            screen_temperature_reply(content, ["stats"], 2)
    with pytest.raises(ScreenError, match="expected records"):
        screen_temperature_reply(
            temperature_stats_to_content([[], []], {}, per_model=True), ["stats-0"], 0
        )


def moments(sum_, sum_sq, count) -> RecordDict:
    stats = {"a": UnitStats(torch.tensor(sum_), torch.tensor(sum_sq), count)}
    return moments_to_content(stats, {})


def test_moment_replies_need_the_layers_widths_counts_and_a_variance():
    screen_moments_reply(moments([1.0, 2.0], [1.0, 4.0], 2), {"a": 2})
    bad = [
        (moments([1.0, 2.0], [1.0, 4.0], 2), {"a": 3}, "shape"),
        (moments([1.0, 2.0], [1.0, 4.0], 2), {"b": 2}, "missing or unexpected"),
        (moments([1.0, math.nan], [1.0, 4.0], 2), {"a": 2}, "non-finite"),
        (moments([1.0, 2.0], [1.0, 4.0], -2), {"a": 2}, "integer >= 1"),
        (moments([10.0, 2.0], [1.0, 4.0], 2), {"a": 2}, "no variance"),
    ]
    for content, widths, words in bad:
        with pytest.raises(ScreenError, match=words):
            screen_moments_reply(content, widths)


def test_align_replies_need_a_valid_permutation_of_every_group():
    template = tiny(0)
    groups = _group_sizes(permutation_spec(template), template)
    good = {g: torch.randperm(n) for g, n in groups.items()}
    screen_align_reply(permutations_to_content(good, "abc", {}), groups)
    first = next(iter(groups))
    broken = [
        ({**good, first: torch.arange(groups[first] + 1)}, "wrong shape"),
        ({**good, first: torch.zeros(groups[first], dtype=torch.int64)}, "not one of"),
        ({**good, first: torch.arange(groups[first]) - 1}, "not one of"),
        ({g: p for g, p in good.items() if g != first}, "missing or unexpected"),
    ]
    for perms, words in broken:
        with pytest.raises(ScreenError, match=words):
            screen_align_reply(permutations_to_content(perms, "abc", {}), groups)
    floats = RecordDict(
        {
            "perms": ArrayRecord(
                {f"perm/{g}": Array(np.arange(n, dtype=np.float32)) for g, n in groups.items()}
            ),
            "digest": ConfigRecord({"state-digest": "abc"}),
        }
    )
    with pytest.raises(ScreenError, match="must be integers"):
        screen_align_reply(floats, groups)


def test_align_replies_move_attention_heads_as_whole_heads():
    template = build_model("vit", 0.5, depth=1)  # 2 heads of 8 dims
    spec = permutation_spec(template)
    groups = _group_sizes(spec, template)
    good = random_permutations(spec, template.state_dict(), seed=1)
    screen_align_reply(permutations_to_content(good, "abc", {}), groups, spec)
    split = {**good, "blocks.0.attn.qk": torch.arange(16).roll(1)}  # a unit moved across heads
    with pytest.raises(ScreenError, match="'blocks.0.attn.qk' splits a block of 8"):
        screen_align_reply(permutations_to_content(split, "abc", {}), groups, spec)
    swapped = {**good, "blocks.0.attn.vo": torch.arange(16).roll(8)}  # its own head order
    swapped["blocks.0.attn.qk"] = torch.arange(16)
    with pytest.raises(ScreenError, match="move the blocks of family"):
        screen_align_reply(permutations_to_content(swapped, "abc", {}), groups, spec)


def test_the_weight_bound_constant_is_documented_in_the_docs():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    assert f"{MAX_ABS_WEIGHT:g}" in page and "max-client-share" in page


# ----------------------------------------------------------------------------- own ServerApp


def test_a_strategy_tells_its_clients_what_they_need_in_a_users_own_server_app():
    from flwr.app import ConfigRecord as Record

    from fedlmc.strategies import PermutationAlignedAverage
    from fedlmc.strategies.protocol import PROTOCOL_KEYS, holdout_share, keep_model

    readme_config = {"model": "mlp", "width": 0.5, "depth": 2, "base-hidden": 64, "epochs": 2}
    strategy = PermutationAlignedAverage(
        tiny(0),
        StrategyOptions(num_clients=2, calibration="federated"),
        method="activation_federated",
    )
    sent = dict(strategy.round_config(1, Record(dict(readme_config))))
    assert set(sent) - set(readme_config) <= PROTOCOL_KEYS  # no run-config key of fedlmc's
    assert keep_model(sent) == "one-query"  # kept for the align query: no LookupError
    assert holdout_share(sent) == pytest.approx(0.1)  # a held-out share to calibrate on
    plain = OneShotAverage(
        tiny(0), StrategyOptions(num_clients=2, calibration="federated", holdout_share=0.25)
    )
    assert holdout_share(dict(plain.round_config(1, Record({})))) == 0.25
    assert keep_model(dict(plain.round_config(1, Record({})))) is None
    server = OneShotAverage(tiny(0), StrategyOptions(num_clients=2, calibration="none"))
    assert dict(server.round_config(1, Record({"strategy": "compare"}))) == {
        "strategy": "compare",
        "server-round": 1,
    }
    study = OneShotAverage(
        tiny(0), StrategyOptions(num_clients=2, calibration="none", clients_keep_models=True)
    )
    assert keep_model(dict(study.round_config(1, Record({})))) == "several-queries"
    with pytest.raises(ValueError, match=r"holdout-share = 1.0; allowed: a number in \[0, 1\)"):
        StrategyOptions(num_clients=2, calibration="federated", holdout_share=1.0)


def test_the_model_factory_allow_list_refuses_what_it_does_not_name(monkeypatch):
    from fedlmc.models.registry import MODEL_ALLOW_VARIABLE, factory_allowed, import_factory

    assert factory_allowed("os:system", None)  # unset: anything (a trusted simulation)
    assert not factory_allowed("os:system", "")
    assert not factory_allowed("os:system", "mypkg.nets:make_net")
    assert factory_allowed("mypkg.nets:make_net", "mypkg.nets:make_net")
    assert factory_allowed("mypkg.nets:other", "mypkg.nets:*")
    monkeypatch.setenv(MODEL_ALLOW_VARIABLE, "fedlmc.models:build_model")
    with pytest.raises(ValueError, match="'os:system' is not allowed here"):
        import_factory("os:system")
    assert callable(import_factory("fedlmc.models:build_model"))


# ----------------------------------------------------------------------------- train histories


def with_history(node: int, pid: int, template, history: dict) -> Message:
    return reply(
        node, constant(template, 1.0), {"num-examples": 10, "partition-id": pid, **history}
    )


def test_a_bad_training_history_drops_only_the_history_by_name():
    """Histories are screened apart from the weights: a bad one (wrong length, infinity, a
    number for a list, an accuracy above 1, a loss list without its accuracy list) leaves the
    client merged with no history and the reason kept; an honest one (NaN allowed) survives as
    sent."""
    template = tiny(0)
    good = history_metrics([2.0, 1.5], [0.25, 0.5], [2.1, math.nan])
    bad = {
        21: ({**good, HISTORY_KEYS["train_loss"]: [2.0, 1.5, 1.0]}, "allowed: 2 (the epochs)"),
        22: ({**good, HISTORY_KEYS["train_loss"]: [2.0, math.inf]}, "infinite value"),
        23: ({**good, HISTORY_KEYS["train_accuracy"]: 0.5}, "must be a non-empty list"),
        24: ({**good, HISTORY_KEYS["train_accuracy"]: [0.5, 1.5]}, "outside [0, 1]"),
        25: ({HISTORY_KEYS["train_loss"]: [2.0, 1.5]}, "history without"),
    }
    nodes = [11, *bad]
    strategy = OneShotAverage(  # the same model from every client: no copy check here
        template, StrategyOptions(num_clients=len(nodes), calibration="none", client_check="off")
    )
    strategy.expect_replies(state_to_record(template.state_dict()), nodes, {"epochs": 2})
    replies = [with_history(11, 0, template, good)]
    replies += [
        with_history(node, i + 1, template, h) for i, (node, (h, _)) in enumerate(bad.items())
    ]
    report = strategy.merge_round(1, replies).report
    assert report.survivor_ids == [0, 1, 2, 3, 4, 5] and not report.failures
    by_node = {u.node_id: u for u in report.survivors}
    honest_history = by_node[11].history
    assert honest_history["train_loss"] == [2.0, 1.5] and honest_history["train_accuracy"] == [
        0.25,
        0.5,
    ]
    assert honest_history["calibration_loss"][0] == 2.1
    assert math.isnan(honest_history["calibration_loss"][1])
    for node, (_history, words) in bad.items():
        assert by_node[node].history is None
        assert words in by_node[node].history_problem, (node, by_node[node].history_problem)
    # the history lists never reach the round's scalar metrics; a client's rows need a history
    assert not any(key in by_node[11].metrics for key in HISTORY_KEYS.values())
    assert [r["client"] for r in client_epoch_rows(report)] == [0, 0]
