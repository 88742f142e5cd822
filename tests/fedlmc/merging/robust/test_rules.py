"""The robust aggregation rules (:mod:`fedlmc.merging.robust.rules`): each equals Flower's
own implementation on the same inputs (``flwr.server.strategy.aggregate``'s ``aggregate_median``,
``aggregate_trimmed_avg``, ``aggregate_krum`` and the Message-API ``select_multikrum``, imported
here only), hand-computed cases (a far client never wins the median nor Krum), the refusals,
the registration (``_t`` rows, ``server_sees``) and the rules run by the real one-shot strategy."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.server.strategy.aggregate import (
    aggregate_krum,
    aggregate_median,
    aggregate_trimmed_avg,
)
from flwr.serverapp.strategy.multikrum import select_multikrum

from fedlmc.merging.method_registry import merge_method, study_methods
from fedlmc.merging.methods import merge_states
from fedlmc.merging.robust.rules import (
    check_krum,
    check_trim_fraction,
    coordinate_median,
    krum_scores,
    krum_selection,
    trimmed_mean,
)
from fedlmc.models.classifiers import build_model
from fedlmc.study.method_policy import evaluation_of

IN_SHAPE = (1, 4, 4)


def tiny(norm: str = "none"):
    torch.manual_seed(0)
    return build_model("mlp", width=1.0, in_shape=IN_SHAPE, depth=2, base_hidden=8, norm=norm)


def clients(n: int, seed: int = 0, norm: str = "none") -> list[dict[str, torch.Tensor]]:
    """``n`` state dicts around one shared start, each moved by its own noise."""
    start = tiny(norm).state_dict()
    g = torch.Generator().manual_seed(seed)
    return [
        {
            k: v + 0.1 * (i + 1) * torch.randn(v.shape, generator=g)
            if v.is_floating_point()
            else v + i
            for k, v in start.items()
        }
        for i in range(n)
    ]


def as_results(states, counts=None) -> list[tuple[list[np.ndarray], int]]:
    counts = counts or [10] * len(states)
    return [([v.numpy() for v in s.values()], c) for s, c in zip(states, counts, strict=True)]


def assert_matches(state, arrays, atol=1e-6) -> None:
    for (key, tensor), array in zip(state.items(), arrays, strict=True):
        assert np.allclose(tensor.numpy(), array, atol=atol), key


@pytest.mark.parametrize("n", [3, 4, 5, 6])
def test_median_is_flowers_aggregate_median(n):
    states = clients(n)
    assert_matches(coordinate_median(states), aggregate_median(as_results(states)))


@pytest.mark.parametrize(("n", "beta"), [(3, 0.2), (5, 0.2), (6, 0.2), (5, 0.0), (7, 0.45)])
def test_trimmed_mean_is_flowers_aggregate_trimmed_avg(n, beta):
    states = clients(n)
    expected = aggregate_trimmed_avg(as_results(states), beta)
    assert_matches(trimmed_mean(states, beta), expected)


@pytest.mark.parametrize(("n", "f", "m"), [(3, 0, 1), (5, 1, 1), (5, 1, 3), (7, 2, 4)])
def test_krum_and_multi_krum_select_what_flower_selects(n, f, m):
    states = clients(n, seed=n + f)
    counts = [10 * (i + 1) for i in range(n)]
    kept = krum_selection(states, f, m)
    if m == 1:  # Flower's Krum returns the chosen client's arrays themselves
        assert_matches(states[kept[0]], aggregate_krum(as_results(states, counts), f, 0))
    # Flower's multi-Krum: the num-examples-weighted average of the selected clients
    merged, _, info = merge_states(
        "multi_krum",
        tiny(),
        states,
        counts,
        options={"krum_byzantine": f, "krum_select": m},
        with_info=True,
    )
    assert json.loads(info["krum_selected"]) == kept
    assert_matches(merged, aggregate_krum(as_results(states, counts), f, m), atol=1e-5)
    # ... and the Message-API strategies' selection is the same set of clients
    contents = [RecordDict({"arrays": ArrayRecord(s)}) for s in states]
    chosen = select_multikrum(contents, num_malicious_nodes=f, num_nodes_to_select=m)
    assert sorted(contents.index(c) for c in chosen) == sorted(kept)


def constant_clients(values) -> list[dict[str, torch.Tensor]]:
    return [{"w": torch.full((3, 2), float(v)), "b": torch.full((4,), float(v))} for v in values]


def test_a_far_client_moves_neither_the_median_nor_krum_by_hand():
    values = [0.0, 0.1, 0.2, 0.3, 10.0]
    states = constant_clients(values)
    assert torch.allclose(coordinate_median(states)["w"], torch.full((3, 2), 0.2))
    # 5 clients, beta 0.2: one trimmed at each end, mean of 0.1, 0.2, 0.3
    assert torch.allclose(trimmed_mean(states, 0.2)["b"], torch.full((4,), 0.2))
    # f = 1: scores are the 2 smallest squared distances (10 coordinates each): client 0 ->
    # 0.01 + 0.04, client 1 -> 0.01 + 0.01, client 2 -> 0.01 + 0.01, client 3 -> 0.01 + 0.04
    scores = krum_scores(states, 1)
    assert scores[:4] == pytest.approx([0.5, 0.2, 0.2, 0.5])
    assert scores[4] == pytest.approx(10 * (9.7**2 + 9.8**2))
    assert krum_selection(states, 1, 1) == [1]  # tie with client 2: the lower index
    assert 4 not in krum_selection(states, 1, 4)
    # the plain average is moved by the far client (to 2.12); Krum is not
    average, _ = merge_states("average", tiny(), states)
    assert torch.allclose(average["w"], torch.full((3, 2), 2.12))
    merged, _ = merge_states("krum", tiny(), states, options={"krum_byzantine": 1})
    assert torch.allclose(merged["w"], torch.full((3, 2), 0.1))


def test_integer_buffers_take_the_maximum_and_weights_do_not_move_the_median():
    states = clients(3, norm="bn")
    key = "hidden.0.norm.num_batches_tracked"
    assert int(coordinate_median(states)[key]) == max(int(s[key]) for s in states)
    heavy, _ = merge_states("median", tiny("bn"), states, [100, 1, 1])
    even, _ = merge_states("median", tiny("bn"), states)
    assert all(torch.equal(heavy[k], even[k]) for k in even)


def test_refusals_are_one_line_naming_the_value():
    with pytest.raises(ValueError, match=r"needs at least 2f \+ 3 = 5 clients; got 4"):
        check_krum(4, 1)
    with pytest.raises(ValueError, match=r"krum_select = 5 .* allowed: 1 \.\. 4"):
        check_krum(5, 1, 5)
    with pytest.raises(ValueError, match="krum_byzantine = -1"):
        check_krum(5, -1)
    with pytest.raises(ValueError, match=r"trim_fraction = 0.5; allowed: a number in \[0, 0.5\)"):
        check_trim_fraction(0.5)
    with pytest.raises(ValueError, match="'krum' with 2 clients: allowed: at least 3 clients"):
        merge_states("krum", tiny(), clients(2))
    # its one refusal reads the method options: f = 1 needs 5 clients, m = 3 with f = 2 needs 7
    with pytest.raises(ValueError, match=r"'krum' with 4 clients: .* at least 5 .* = 1\)$"):
        merge_states("krum", tiny(), clients(4), options={"krum_byzantine": 1})
    with pytest.raises(ValueError, match=r"'multi_krum' with 4 clients: allowed: at least 7"):
        merge_states("multi_krum", tiny(), clients(4), options={"krum_byzantine": 2})
    with pytest.raises(ValueError, match=r"'multi_krum' with 3 clients: allowed: at least 4"):
        merge_states("multi_krum", tiny(), clients(3), options={"krum_select": 4})
    with pytest.raises(ValueError, match="krum_select = 0; allowed: an integer >= 1"):
        merge_states("multi_krum", tiny(), clients(3), options={"krum_select": 0})
    # the study refuses it before any work, leaves it out of its defaults below 3 clients, and
    # a single client is its own merge for Krum as for every method
    from fedlmc.study.context import check_client_count, default_methods

    with pytest.raises(ValueError, match="'krum_t' with 2 clients: allowed: at least 3 clients"):
        check_client_count(["average", "krum_t"], 2)
    assert "krum" not in default_methods(2) and "krum" in default_methods(3)
    assert check_client_count(["krum"], 1) == ["krum"]


def test_the_rules_are_registered_with_their_temperature_rows_and_what_the_server_sees():
    rows = study_methods()
    for name in ("median", "trimmed_mean", "krum", "multi_krum"):
        entry = merge_method(f"{name}_t")
        assert entry.name == name and evaluation_of(entry.name).server_sees == "each model"
        assert not evaluation_of(entry.name).on_path and name in rows and f"{name}_t" in rows


def test_the_one_shot_strategy_merges_with_a_robust_rule(task_identity):
    """The real ``PermutationAlignedAverage(method="median")`` round on replies where one of
    three clients sends weights 1000x the others': its merge is the honest median."""
    from fedlmc.strategies import PermutationAlignedAverage, StrategyOptions
    from fedlmc.strategies.protocol import state_to_record
    from fedlmc.strategies.robust import OFF

    template = tiny()
    states = constant_clients([1.0, 2.0, 2000.0])
    template_states = [
        {k: torch.full_like(v, float(s["w"][0, 0])) for k, v in template.state_dict().items()}
        for s in states
    ]
    replies = [
        Message(
            RecordDict(
                {
                    "arrays": state_to_record(state),
                    "metrics": MetricRecord({"num-examples": 10, "partition-id": pid}),
                }
            ),
            reply_to=Message(RecordDict(), dst_node_id=20 + pid, message_type="train"),
        )
        for pid, state in enumerate(template_states)
    ]
    strategy = PermutationAlignedAverage(
        template,
        StrategyOptions(num_clients=3, min_clients=3, calibration="none", robust=OFF),
        method="median",
    )
    strategy.expect_replies(state_to_record(template.state_dict()), [20, 21, 22])
    found = strategy.merge_round(1, replies)
    assert found.report.survivor_ids == [0, 1, 2]  # the screen is off: the rule alone acts
    for key, tensor in found.merged_state.items():
        assert torch.allclose(tensor, torch.full_like(tensor, 2.0)), key


def test_the_study_asks_krums_one_refusal_at_its_method_options():
    from fedlmc.data.splits import DataSplits
    from fedlmc.study.compare import compare_methods

    x, y = torch.randn(8, *IN_SHAPE), torch.arange(8) % 2
    splits = DataSplits("tiny", (x, y), (x, y), (x, y), 2, IN_SHAPE)
    with pytest.raises(ValueError, match=r"'krum_t' with 4 clients: allowed: at least 5 .* = 1\)"):
        compare_methods(
            tiny(),
            clients(4),
            [1] * 4,
            splits,
            ["krum_t"],
            device="cpu",
            method_options={"krum_byzantine": 1},
        )
