"""Clients of different widths in the federation (issue 22): the width keys are validated before
any work, grids move a width mix and its client count together, each ClientApp builds its own
width (``init = shared``: the first units of the server's initialisation), the server drops a
reply of the wrong width by name and merges the rest at the server width, and the study
evaluates each client at its own width. The embedding and the merge maths are tested in
tests/fedlmc/permutation/test_embed.py and tests/fedlmc/merging/test_widths.py."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedlmc.averaging import load_state
from fedlmc.data.loading import load_dataset
from fedlmc.evaluation import predict_logits
from fedlmc.merging.methods import merge_states
from fedlmc.models.classifiers import build_model
from fedlmc.simulations.config import (
    ConfigError,
    canonical_run_config,
    cell_default_methods_note,
    cell_id,
    client_widths,
    default_methods,
    expand_grid,
    method_list,
    mixed_widths,
    server_width,
    sweep_from_mapping,
    validate_run_config,
)
from fedlmc.simulations.task import build_from_config, client_seed, client_setup, load_splits
from fedlmc.strategies import PermutationAlignedAverage, StrategyOptions
from fedlmc.strategies.protocol import record_to_state, state_to_record
from fedlmc.strategies.screening import ClientReferences
from fedlmc.study.compare import compare_methods

TINY = {"dataset": "mnist5k", "model": "mlp", "depth": 2, "base-hidden": 16, "epochs": 1}


# ----------------------------------------------------------------------------- keys


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"client-widths": "0.5,x"}, "client-widths = '0.5,x': width 'x' is not a number > 0"),
        ({"client-widths": "0.5,0"}, "width '0' is not a number > 0"),
        ({"client-widths": "0.5,1,2"}, "3 widths; allowed: one per client, num-clients = 2"),
        ({"client-widths": "0.5,2", "server-width": 1}, "server-width = 1: allowed: 0 (the"),
        ({"server-width": 0.5}, "at least the widest client's width 1"),
        (  # an explicit list is checked as given (the default follows the cell: below)
            {"client-widths": "0.5,2", "methods": "average,ensemble"},
            "merge method 'average' needs clients of one width (client widths 0.5,2, server "
            "width 2); allowed for mixed widths: embed_average, embed_weight_matching",
        ),
        (
            {"client-widths": "0.5,2", "strategy": "average"},
            "merge method 'average' needs clients of one width",
        ),
        (
            {"client-widths": "1,1", "server-width": 2, "strategy": "fedavg"},
            "the FedAvg baseline needs every client at the server width",
        ),
        (
            {"client-widths": "1,2", "strategy": "aligned", "align": "embed_average", "norm": "ln"},
            "norm = 'ln' with client widths 1,2 and server width 2",
        ),
        (  # even without a norm: the attention heads do not embed
            {"client-widths": "1,2", "methods": "embed_average", "model": "vit", "norm": "none"},
            "client-widths = '1,2' with model 'vit': a narrow vit does not embed exactly into a "
            "wider one; allowed for mixed widths: mlp, vgg11, resnet20",
        ),
    ],
)
def test_width_keys_are_refused_with_one_line_naming_the_value(values, words):
    with pytest.raises(ConfigError) as found:
        validate_run_config(values, check_devices=False)
    assert words in str(found.value) and "\n" not in str(found.value)


def test_default_methods_follow_the_cell_and_the_note_says_so():
    """``methods`` left at its default: a mixed-width cell gets the mixed-width counterparts
    of the default methods (issue 30: ``client-widths=0.5,4 width=4`` was refused)."""
    mixed = validate_run_config({"client-widths": "0.5,4", "width": 4}, check_devices=False)
    assert method_list(mixed) == [
        "embed_average",
        "embed_average_t",
        "embed_weight_matching",
        "embed_weight_matching_t",
        "ensemble",
        "ensemble_equal",
        "ensemble_calibrated",
    ]
    note = cell_default_methods_note(mixed)
    assert note.startswith("methods = embed_average,embed_average_t,")
    assert "mixed-width counterparts of the default average,average_t," in note
    assert "client widths 0.5,4, server width 4" in note
    # a one-width cell keeps the default and gets no note; so does an explicit mixed list
    plain = validate_run_config({"width": 4}, check_devices=False)
    assert plain["methods"] == default_methods() and cell_default_methods_note(plain) is None
    chosen = {"client-widths": "0.5,4", "methods": "heterofl,ensemble"}
    assert cell_default_methods_note(validate_run_config(chosen, check_devices=False)) is None
    # in a sweep, each cell of a grid over the width mix gets its own defaults
    sweep = sweep_from_mapping(
        {"name": "mix", "grid": {"client-widths": ["", "0.5,4"]}}, check_devices=False
    )
    assert [c["methods"] for c in expand_grid(sweep)] == [default_methods(), mixed["methods"]]


def test_widths_resolve_to_one_cell_per_experiment():
    mixed = {"client-widths": "0.5,2", "strategy": "aligned", "align": "embed_average"}
    config = validate_run_config(mixed, check_devices=False)
    assert client_widths(config) == (0.5, 2.0) and server_width(config) == 2.0
    assert mixed_widths(config)
    # server-width 0 is the widest client's; width has no effect beside client-widths
    assert cell_id(config) == cell_id({**mixed, "server-width": 2.0, "width": 4.0})
    assert cell_id(config) != cell_id({**mixed, "server-width": 4.0})
    plain = validate_run_config({"width": 0.5}, check_devices=False)
    assert client_widths(plain) == (0.5, 0.5) and not mixed_widths(plain)
    assert canonical_run_config({**plain, "server-width": 0.5})["server-width"] == 0.0
    wider = {"width": 0.5, "server-width": 1, "strategy": "aligned", "align": "embed_average"}
    assert mixed_widths(validate_run_config(wider, check_devices=False))  # embedded: 0.5 -> 1


def test_a_linked_grid_axis_moves_a_width_mix_with_its_client_count():
    sweep = sweep_from_mapping(
        {
            "name": "mix",
            "run": {"methods": "embed_average,ensemble"},
            "grid": {
                "init": ["independent", "shared"],
                "num-clients+client-widths+server-width": [[2, "0.5,4", 0], [4, "0.5,1,2,4", 8]],
            },
        },
        check_devices=False,
    )
    cells = expand_grid(sweep)
    keys = ("init", "num-clients", "client-widths", "server-width")
    assert [tuple(c[k] for k in keys) for c in cells] == [
        ("independent", 2, "0.5,4", 0.0),  # the widest client's width counts as 0
        ("independent", 4, "0.5,1,2,4", 8.0),
        ("shared", 2, "0.5,4", 0.0),
        ("shared", 4, "0.5,1,2,4", 8.0),
    ]
    # an override of one of its keys replaces the whole linked axis
    again = sweep_from_mapping(sweep.to_dict(), ["num-clients=3"], check_devices=False)
    assert list(again.grid) == ["init"] and again.run["num-clients"] == 3
    for grid, words in (
        ({"num-clients+client-widths": [[2]]}, "a list of 2 values, one per key"),
        ({"num-clients+client-widths": [[2, "1,2,3"]]}, "3 widths; allowed: one per client"),
        ({"num-clients+client-widths": [[2, "1,2"]], "num-clients": [2]}, "on two grid axes"),
    ):
        with pytest.raises(ConfigError, match=words):
            sweep_from_mapping({"name": "bad", "grid": grid}, check_devices=False)


# ----------------------------------------------------------------------------- the ClientApp


def train_message(config: dict, arrays: ArrayRecord) -> Message:
    content = RecordDict({"arrays": arrays, "config": ConfigRecord(config)})
    return Message(content, dst_node_id=101, message_type="train")


def test_each_client_builds_its_width_and_shared_init_is_the_nested_slice(task_identity):
    from flwr.app import Context

    from fedlmc.simulations.client_app import _initial_model, app

    values = {**TINY, "client-widths": "0.5,2", "strategy": "aligned", "align": "embed_average"}
    config = validate_run_config({**values, "init": "shared"}, check_devices=False)
    splits = load_splits(config)
    server = build_from_config(config, splits)  # the server's template: width 2, the cell seed
    message = train_message(config, state_to_record(server.state_dict()))
    narrow = _initial_model(client_setup(config), splits, 0, message)
    wide = server.state_dict()
    for key, tensor in narrow.state_dict().items():  # every tensor: the first units of the wide
        block = wide[key][tuple(slice(0, n) for n in tensor.shape)]
        assert torch.equal(tensor, block), key
    first = "hidden.0.linear.weight"
    assert narrow.state_dict()[first].shape[0] * 4 == wide[first].shape[0]
    # independent: a width-0.5 model of its own seed; the reply has partition 0's shapes
    independent = _initial_model(
        client_setup({**config, "init": "independent"}), splits, 0, message
    )
    alone = build_from_config(config, splits, seed=client_seed(0, 0), width=0.5)
    for key, tensor in alone.state_dict().items():
        assert torch.equal(independent.state_dict()[key], tensor), key
    node = {"partition-id": 0, "num-partitions": 2}
    context = Context(run_id=7, node_id=101, state=RecordDict(), run_config={}, node_config=node)
    reply = app(train_message({**values, "server-round": 1}, ArrayRecord()), context)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    shapes = {k: tuple(v.shape) for k, v in record_to_state(reply.content["arrays"]).items()}
    assert shapes == {k: tuple(v.shape) for k, v in alone.state_dict().items()}


# ----------------------------------------------------------------------------- the server


def tiny_mlp(width: float, seed: int):
    torch.manual_seed(seed)
    return build_model("mlp", width=width, in_shape=(1, 4, 4), depth=2, base_hidden=8)


def reply(node: int, state, pid: int, n: int) -> Message:
    metrics = MetricRecord({"num-examples": n, "partition-id": pid})
    content = RecordDict({"arrays": state_to_record(state), "metrics": metrics})
    return Message(content, reply_to=Message(RecordDict(), dst_node_id=node, message_type="train"))


def test_a_reply_of_the_wrong_width_is_dropped_by_name_and_the_rest_merged(task_identity):
    narrow, wide = tiny_mlp(0.5, 1), tiny_mlp(1.0, 2)
    widths = {0: 0.5, 1: 1.0, 2: 0.5}
    shapes = {p: (narrow if w < 1 else wide).state_dict() for p, w in widths.items()}
    references = ClientReferences.of_states(shapes, {p: f"width {w:g}" for p, w in widths.items()})
    strategy = PermutationAlignedAverage(
        tiny_mlp(1.0, 0),
        StrategyOptions(num_clients=3, calibration="none", client_references=references),
        method="embed_average",
    )
    strategy.expect_replies(state_to_record(strategy.template.state_dict()), [11, 12, 13])
    replies = [
        reply(11, narrow.state_dict(), 0, 10),
        reply(12, wide.state_dict(), 1, 30),
        reply(13, tiny_mlp(1.0, 3).state_dict(), 2, 10),  # partition 2 is a width-0.5 client
    ]
    found = strategy.merge_round(1, replies)
    assert found.report.survivor_ids == [0, 1]
    (failure,) = found.report.failures
    assert failure.node_id == 13 and failure.partition_id == 2
    assert "wrong shape" in failure.reason and "(width 0.5 for partition 2)" in failure.reason
    assert found.weights == (0.5, 0.5)  # a deployment's bound: max-client-share 0.5
    states = [narrow.state_dict(), wide.state_dict()]
    expected, _ = merge_states("embed_average", strategy.template, states, found.weights)
    for key, tensor in found.merged_state.items():
        assert tensor.shape == expected[key].shape and torch.allclose(tensor, expected[key]), key


# ----------------------------------------------------------------------------- the study


def test_the_study_evaluates_each_client_at_its_own_width():
    full = load_dataset("mnist5k")
    splits = replace(full, server=(full.server[0][:100], full.server[1][:100]))
    splits = replace(splits, test=(full.test[0][:200], full.test[1][:200]))
    models = [
        build_model("mlp", width=w, in_shape=splits.in_shape, depth=2, base_hidden=16)
        for w in (0.5, 2.0)
    ]
    states = [m.state_dict() for m in models]
    server = build_model("mlp", width=2.0, in_shape=splits.in_shape, depth=2, base_hidden=16)
    comparison = compare_methods(
        server,
        states,
        [1, 1],
        splits,
        ["embed_average", "embed_average_t", "ensemble"],
        diagnostics=False,
        device="cpu",
        client_templates=models,
    )
    own = [
        float((predict_logits(m.eval(), splits.test[0]).argmax(1) == splits.test[1]).float().mean())
        for m in models
    ]
    for row in comparison.rows:
        assert json.loads(row["endpoint_acc_clients"]) == pytest.approx(own)
    merged = load_state(server, comparison.merged["embed_average"])
    first = "hidden.0.linear.weight"
    assert merged.state_dict()[first].shape == server.state_dict()[first].shape
    with pytest.raises(ValueError, match="2 models for 1 client"):
        compare_methods(server, states[:1], None, splits, ["ensemble"], client_templates=models)
