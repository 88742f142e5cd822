"""The clients' side of a federation after training: the calibration holdout, client-side
activation matching kept in the node's context, REPAIR statistics, and the merge methods that
run on the clients (``activation_federated``, ``auto`` and REPAIR under federated calibration),
checked against the same computation done centrally on the clients' data."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fedlmc.averaging import average, load_state
from fedlmc.evaluation import metrics_from_logits, predict_logits
from fedlmc.merging.calibrate import fit_temperature
from fedlmc.merging.clients import LocalClients
from fedlmc.merging.method_registry import study_methods
from fedlmc.merging.methods import merge_states
from fedlmc.merging.repair import repair, unit_statistics
from fedlmc.permutation import apply_permutation, permutation_spec
from fedlmc.permutation.matching import activation_matching
from fedlmc.simulations.config import ConfigError, canonical_run_config, validate_run_config
from fedlmc.simulations.config.run_plan import plan_run
from fedlmc.simulations.task import (
    build_from_config,
    client_calibration_data,
    client_data,
    client_train_data,
    load_splits,
    split_for_calibration,
)
from fedlmc.strategies.protocol import (
    permutations_from_content,
    state_digest,
    state_to_record,
    unit_stats_from_content,
)

TINY = {
    "dataset": "mnist5k",
    "model": "mlp",
    "width": 0.25,
    "depth": 2,
    "base-hidden": 64,
    "epochs": 1,
    "batch-size": 128,
    "num-clients": 2,
    "timeout": 120.0,
}
FEDERATED = {**TINY, "strategy": "aligned", "calibration": "federated"}
HOLDOUT = {"holdout-share": 0.1}  # what a strategy with calibration = "federated" sends
KEEP = {**HOLDOUT, "keep-model": "one-query"}  # ... and with a merge that queries its clients


# ----------------------------------------------------------------------------- holdout


def test_federated_calibration_holds_out_a_stratified_share_never_trained_on():
    config = validate_run_config({**FEDERATED, "align": "weight_matching"})
    (x, y) = client_data(config, 1, 2)
    (xt, yt), (xh, yh) = split_for_calibration(config, (x, y), 1, 0.1)
    assert len(yh) == round(0.1 * len(y)) and len(yt) + len(yh) == len(y)
    rows = {tuple(r.tolist()) for r in x.flatten(1)[:, ::7]}
    held = {tuple(r.tolist()) for r in xh.flatten(1)[:, ::7]}
    trained = {tuple(r.tolist()) for r in xt.flatten(1)[:, ::7]}
    assert held <= rows and not held & trained  # a disjoint share of the partition
    for label in range(10):  # stratified: every class held out in proportion
        assert abs(int((yh == label).sum()) - 0.1 * int((y == label).sum())) <= 1
    assert torch.equal(client_train_data(config, 1, 2)[1], yt)
    assert torch.equal(client_calibration_data(config, 1, 2)[1], yh)


def test_no_holdout_unless_calibration_is_federated():
    for values in (
        {**TINY, "strategy": "compare", "calibration": "federated"},
        {**TINY, "strategy": "average", "calibration": "server"},
        {**FEDERATED, "calibration-holdout": 0.0},  # in-sample, as in the first release
    ):
        config = validate_run_config(values)
        whole = client_data(config, 0, 2)
        assert torch.equal(client_train_data(config, 0, 2)[1], whole[1])
        assert torch.equal(client_calibration_data(config, 0, 2)[1], whole[1])
    server = canonical_run_config(validate_run_config({**TINY, "calibration-holdout": 0.3}))
    assert server["calibration-holdout"] == 0.1  # without effect: reset, one cell


def test_bad_holdout_is_refused_with_the_value_and_what_is_allowed():
    with pytest.raises(ConfigError, match=r"calibration-holdout.*1\.0.*\[0, 1\)"):
        validate_run_config({**FEDERATED, "calibration-holdout": 1.0})
    config = validate_run_config({**FEDERATED, "calibration-holdout": 0.01})
    x, y = client_data(config, 0, 2)
    with pytest.raises(ValueError, match=r"\(calibration-holdout\) = 0.01 of partition 0's 20"):
        split_for_calibration(config, (x[:20], y[:20]), 0, 0.01)


# ----------------------------------------------------------------------------- ClientApp


def node_context(pid: int) -> Context:
    return Context(
        run_id=7,
        node_id=pid + 100,
        state=RecordDict(),
        run_config={},
        node_config={"partition-id": pid, "num-partitions": 2},
    )


def ask(context: Context, message_type: str, config: dict, arrays=None) -> Message:
    from fedlmc.simulations.client_app import app

    content = RecordDict({"arrays": arrays or ArrayRecord(), "config": ConfigRecord(config)})
    message = Message(content, dst_node_id=context.node_id, message_type=message_type)
    reply = app(message, context)
    assert not reply.has_error() or message_type == "query.align", reply.error.reason
    return reply


def test_client_side_activation_matching_uses_the_model_kept_in_its_context(task_identity):
    config = {**FEDERATED, "align": "activation_federated"}
    context = node_context(1)
    trained = ask(context, "train", {**config, **KEEP, "server-round": 1})
    own = {
        k: torch.from_numpy(a.numpy().copy())
        for k, a in next(iter(trained.content.array_records.values())).items()
    }
    kept = [k for k in context.state.array_records if k.startswith("fedlmc-trained/")]
    assert len(kept) == 1  # kept between the train and the align round

    resolved = validate_run_config(config)
    splits = load_splits(resolved)
    reference = build_from_config(resolved, splits, seed=11).eval()
    reply = ask(context, "query.align", {**config, **KEEP}, state_to_record(reference.state_dict()))
    perms, digest = permutations_from_content(reply.content)
    assert digest == state_digest(own)
    own_model = load_state(build_from_config(resolved, splits), own).eval()
    x = client_train_data(resolved, 1, 2)[0]
    expected = activation_matching(reference, own_model, x)
    assert set(perms) == set(expected)
    for group, perm in expected.items():
        assert torch.equal(perms[group], perm)
    assert (
        max(a.numpy().itemsize for a in next(iter(reply.content.array_records.values())).values())
        == 4
    )

    again = ask(context, "query.align", {**config, **KEEP}, state_to_record(reference.state_dict()))
    assert again.has_error() and "no trained model of this cell kept" in again.error.reason


def test_the_client_holds_out_and_keeps_what_the_message_says_not_what_the_run_config_says(
    task_identity,
):
    """A run config of federated client-side matching without the protocol keys: no holdout, no
    kept model; the protocol keys without such a run config: both."""
    config = {**FEDERATED, "align": "activation_federated"}
    resolved = validate_run_config(config)
    context = node_context(0)
    plain = ask(context, "train", {**config, "server-round": 1})
    assert plain.content["metrics"]["num-examples"] == len(client_data(resolved, 0, 2)[1])
    assert "epoch-calibration-loss" not in plain.content["metrics"]
    assert not list(context.state.array_records)
    told = ask(context, "train", {**TINY, **KEEP, "server-round": 1})
    held = len(client_train_data(validate_run_config(TINY), 0, 2, holdout=0.1)[1])
    assert told.content["metrics"]["num-examples"] == held < len(client_data(resolved, 0, 2)[1])
    assert len(told.content["metrics"]["epoch-calibration-loss"]) == 1
    assert len(list(context.state.array_records)) == 1


def test_one_temperature_query_answers_for_several_models(task_identity):
    from fedlmc.merging.calibrate import temperature_statistics
    from fedlmc.simulations.client_app import app
    from fedlmc.strategies.protocol import models_query_content, temperature_stats_by_model

    config = {**FEDERATED, "align": "auto"}
    resolved = validate_run_config(config)
    splits = load_splits(resolved)
    models = [build_from_config(resolved, splits, seed=s).eval() for s in (1, 2, 3)]
    content = models_query_content(
        [state_to_record(m.state_dict()) for m in models],
        {**config, **HOLDOUT, "log-t": [-1.0, 0.5]},
    )
    message = Message(content, dst_node_id=100, message_type="query.temperature")
    reply = app(message, node_context(0))
    assert not reply.has_error(), reply.error.reason
    got = temperature_stats_by_model(reply.content)
    x, y = client_calibration_data(resolved, 0, 2)
    expected = [
        [temperature_statistics(predict_logits(m, x), y, u) for u in (-1.0, 0.5)] for m in models
    ]
    assert got == expected and got[0] != got[1]


def test_a_node_keeps_a_bounded_number_of_trained_models(task_identity):
    from fedlmc.simulations.client_app import KEPT_MODELS, keep_trained_model

    context = node_context(0)
    record = ArrayRecord({"w": torch.zeros(3)})
    for index in range(KEPT_MODELS + 3):
        keep_trained_model(context, f"fedlmc-trained/cell{index}", record)
    kept = list(context.state.array_records)
    assert kept == [f"fedlmc-trained/cell{i}" for i in range(3, KEPT_MODELS + 3)]


def test_unit_stats_query_returns_the_moments_of_the_named_layers(task_identity):
    config = {**FEDERATED, "align": "average_repair"}
    resolved = validate_run_config(config)
    model = build_from_config(resolved, load_splits(resolved), seed=5).eval()
    reply = ask(
        node_context(0),
        "query.unit_stats",
        {**config, **HOLDOUT, "layers": ["hidden.1.linear"]},
        state_to_record(model.state_dict()),
    )
    got = unit_stats_from_content(reply.content)
    expected = unit_statistics(model, client_train_data(resolved, 0, 2)[0], ["hidden.1.linear"])
    assert set(got) == {"hidden.1.linear"}
    assert got["hidden.1.linear"].count == expected["hidden.1.linear"].count
    assert torch.allclose(got["hidden.1.linear"].sum, expected["hidden.1.linear"].sum)
    assert torch.allclose(got["hidden.1.linear"].sum_sq, expected["hidden.1.linear"].sum_sq)


# ----------------------------------------------------------------------------- registry


def test_client_side_matching_is_only_for_federations_and_compare_cells():
    assert "activation_federated" not in study_methods()
    template = build_from_config(validate_run_config(TINY), load_splits(validate_run_config(TINY)))
    states = [template.state_dict(), template.state_dict()]
    with pytest.raises(ValueError, match="'activation_federated' runs on the clients"):
        merge_states("activation_federated", template, states)
    # a compare cell queries its collected clients for it: its clients keep their models
    cell = validate_run_config({**TINY, "methods": "average,activation_federated"})
    assert plan_run(cell).client.keeps_model
    assert not plan_run({**cell, "methods": "average"}).client.keeps_model


def test_local_clients_recover_a_known_permutation_through_activation_federated():
    """Client 1 is client 0 with its hidden units permuted: matching on client 1's own data
    finds the inverse exactly, so the merge is client 0's function (in process, no Flower)."""
    from fedlmc.permutation import random_permutations

    config = validate_run_config(TINY)
    splits = load_splits(config)
    template = build_from_config(config, splits, seed=1).eval()
    spec = permutation_spec(template)
    first = template.state_dict()
    scramble = random_permutations(spec, first, seed=3)
    second = apply_permutation(spec, scramble, first)
    x = [client_data(config, pid, 2)[0] for pid in (0, 1)]
    held = [client_calibration_data(config, pid, 2) for pid in (0, 1)]
    clients = LocalClients(template, [first, second], x, held)
    merged, aligned, info = merge_states(
        "activation_federated", template, [first, second], clients=clients, with_info=True
    )
    # the row says so: every group aligned, exactly the units the scramble moved
    moved = sum(int((p != torch.arange(len(p))).sum()) for p in scramble.values())
    assert info == {"aligned_groups": len(spec.perm_to_axes), "aligned_units_moved": moved}
    for key, tensor in first.items():
        assert torch.allclose(aligned[1][key], tensor), key
        assert torch.allclose(merged[key], tensor, atol=1e-6), key
    assert not torch.allclose(second["hidden.0.linear.weight"], first["hidden.0.linear.weight"])


# ----------------------------------------------------------------------------- Flower + Ray


FEDERATIONS = {
    "activation_federated": {},
    "average_repair": {},
    "auto": {"auto-tolerance": 10.0},
}
"""The merges this module runs in a federation (``align``: its extra keys), one simulation."""


@pytest.fixture(scope="module")
def federated(federations):
    """The 2-client federations of :data:`FEDERATIONS` with federated calibration, as the cells
    of one Flower simulation (``tests/conftest.py``: ``run_federations``)."""
    return federations({align: config_of(align) for align in FEDERATIONS})


def config_of(align: str) -> dict:
    return {**FEDERATED, "align": align, **FEDERATIONS[align]}


def federate(federated, align: str):
    """The 2-client federation with ``align``: the config, the outcome, the clients' state
    dicts and weights, and a template model."""
    config = validate_run_config(config_of(align))
    outcome = federated[align]
    survivors = outcome.reports[align].survivors
    assert [u.partition_id for u in survivors] == [0, 1]
    states = [u.state for u in survivors]
    weights = [float(u.num_examples) for u in survivors]
    return config, outcome, states, weights, build_from_config(config, load_splits(config))


@pytest.mark.slow
def test_activation_federated_merges_what_central_matching_on_the_clients_data_gives(federated):
    config, outcome, states, weights, template = federate(federated, "activation_federated")
    models = [load_state(template, sd).eval() for sd in states]
    perms = activation_matching(models[0], models[1], client_train_data(config, 1, 2)[0])
    spec = permutation_spec(template)
    expected = average([states[0], apply_permutation(spec, perms, states[1])], weights)
    merged = outcome.merged["activation_federated"]
    for key, tensor in expected.items():
        assert torch.allclose(merged[key], tensor, atol=1e-6), key
    assert any(not torch.equal(p, torch.arange(len(p))) for p in perms.values())

    rows = outcome.table()
    assert list(rows["method"]) == ["activation_federated", "activation_federated_t"]
    metrics = outcome.results["activation_federated"].train_metrics_clientapp[1]
    # Rounds: training, the align round, then the temperature grid and its Newton rounds.
    assert (rows["rounds"] == 1 + metrics["query-rounds"]).all()
    assert 3 <= metrics["query-rounds"] <= 2 + 8
    weights_bytes = sum(t.numel() * 4 for t in states[0].values())
    perm_bytes = sum(len(p) * 4 for p in perms.values())
    assert (rows["bytes_sent_by_clients"] > 2 * weights_bytes + perm_bytes).all()
    assert perm_bytes < weights_bytes / 20  # indices, not weights or activations


@pytest.mark.slow
def test_federated_repair_equals_repair_on_the_clients_pooled_training_data(federated):
    config, outcome, states, weights, template = federate(federated, "average_repair")
    merged_plain = load_state(template, average(states, weights)).eval()
    endpoints = [load_state(template, sd).eval() for sd in states]
    x = torch.cat([client_train_data(config, pid, 2)[0] for pid in (0, 1)])
    expected = repair(merged_plain, endpoints, weights, x).state_dict()
    merged = outcome.merged["average_repair"]
    for key, tensor in expected.items():
        assert torch.allclose(merged[key], tensor, atol=1e-4, rtol=1e-4), key
    assert not torch.allclose(
        merged["hidden.0.linear.weight"], merged_plain.hidden[0].linear.weight
    )
    metrics = outcome.results["average_repair"].train_metrics_clientapp[1]
    layers = 2  # the two hidden linears; N + L = 4 statistics rounds
    assert metrics["query-rounds"] >= 2 + layers + 2


@pytest.mark.slow
def test_federated_auto_measures_its_gap_on_the_clients_held_out_data(federated):
    config, outcome, states, weights, template = federate(federated, "auto")
    held = [client_calibration_data(config, pid, 2) for pid in (0, 1)]
    x, y = torch.cat([h[0] for h in held]), torch.cat([h[1] for h in held])

    def calibrated(state) -> float:
        logits = predict_logits(load_state(template, state).eval(), x)
        return metrics_from_logits(logits, y, fit_temperature(logits, y))["nll"]

    gap = calibrated(average(states, weights)) - sum(calibrated(s) for s in states) / 2
    row = outcome.table().iloc[0]
    assert row["auto_choice"] == "average"  # within the (large) tolerance: no alignment
    assert row["auto_nll_gap"] == pytest.approx(gap, abs=2e-3)  # grid minimum vs exact fit
    # The in-process clients (fedlmc.merging.clients) give the federation's numbers exactly.
    train = [client_train_data(config, pid, 2)[0] for pid in (0, 1)]
    local = LocalClients(template, states, train, held)
    nlls = local.calibrated_nlls([average(states, weights), *states], [True, False, False])
    assert row["auto_nll_gap"] == pytest.approx(nlls[0] - (nlls[1] + nlls[2]) / 2, abs=1e-9)
    # One grid round scored the plain average and both endpoints; then the temperature's grid
    # and Newton rounds.
    metrics = outcome.results["auto"].train_metrics_clientapp[1]
    assert 3 <= metrics["query-rounds"] <= 2 + 8
    merged = outcome.merged["auto"]
    for key, tensor in average(states, weights).items():
        assert torch.allclose(merged[key], tensor, atol=1e-6)
