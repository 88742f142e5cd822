"""The field's merge methods in a federation (issue 42): a ``compare`` cell queries its
collected clients for their Fisher diagonals and Gram matrices (``query.fisher``,
``query.gram`` on the real ClientApp) and merges with the server's initialisation as the
task-vector base; its rows equal the rules on the same clients in memory, and the query rounds
and their bytes are counted in those rows only (``activation_federated`` too: a compare cell's
clients keep their models for every query). An ``aligned`` cell with ``align = "fisher"``
gives the same merge. In process: the real ClientApp and ServerApp on a Grid that hands each
message to the ClientApp (no Ray)."""

from __future__ import annotations

import math

import pytest
import torch
from flwr.app import Message

from fedlmc.merging.clients import LocalClients
from fedlmc.merging.methods import merge_states
from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.server_app import run_server
from fedlmc.simulations.task import build_from_config, client_train_data, load_splits
from fedlmc.strategies.protocol import (
    GRAM_QUERY,
    record_to_state,
    statistics_from_content,
    statistics_to_content,
)
from tests.simulations.test_client_app_warmup import TINY, ClientAppGrid

METHODS = "average,fisher,fisher_t,regmean,task_arithmetic,ties,dare,ot_fusion,activation_federated"
METHODS += ",ensemble"
CELL = {**TINY, "epochs": 1, "strategy": "compare", "methods": METHODS}
CELL |= {"diagnostics": False, "lambdas": 3, "fisher-samples": 64, "regmean-samples": 64}


@pytest.fixture(scope="module")
def compare_cell():
    """One compare cell of two clients, run once for the module (the task identity set as the
    shared ``task_identity`` fixture sets it, for the module's duration)."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    keys = ("_task_id", "_run_id", "_node_id")
    saved = {k: getattr(TaskIdentity, k) for k in keys}
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SUPERLINK_NODE_ID
    try:
        grid = ClientAppGrid(2)
        yield grid, run_server(grid, CELL, simulated=True)
    finally:
        for key, value in saved.items():
            setattr(TaskIdentity, key, value)


def local_clients(config: dict, template, states, samples: int) -> tuple[LocalClients, list]:
    """The clients ``states`` of a federation of ``config`` in memory, with their training data
    and the bound ``samples`` on their Fisher and Gram samples: what their ClientApps answer."""
    count = len(states)
    data = [client_train_data(config, p, count) for p in range(count)]
    local = LocalClients(
        template,
        states,
        [x for x, _ in data],
        data,
        train_labels=[y for _, y in data],
        fisher_samples=samples,
        regmean_samples=samples,
        seed=config["seed"],
    )
    return local, data


def _in_memory(grid: ClientAppGrid, config: dict):
    """The trained clients as their train replies sent them, and their data in memory."""
    config = validate_run_config(config, check_devices=False)
    splits = load_splits(config)
    template = build_from_config(config, splits)
    states = [record_to_state(reply.content["arrays"]) for _, reply in grid.train_rounds()[-1]]
    local, data = local_clients(config, template, states, 64)
    return template, states, data, local


def test_a_compare_cell_merges_with_its_clients_statistics_and_counts_them(
    compare_cell, task_identity
):
    grid, outcome = compare_cell
    template, states, data, local = _in_memory(grid, CELL)
    counts = [len(y) for _, y in data]
    base = template.state_dict()
    for method in ("fisher", "regmean", "task_arithmetic", "ties", "dare", "ot_fusion"):
        expected, _ = merge_states(method, template, states, counts, clients=local, base=base)
        found = outcome.merged[method]
        for key in expected:
            torch.testing.assert_close(found[key], expected[key], rtol=1e-5, atol=1e-6)
    rows = outcome.table().set_index("method")
    parameters = sum(p.numel() for p in template.parameters())
    plain = rows.loc["average"]
    assert plain["rounds"] == 1 and rows.loc["ensemble", "rounds"] == 1
    for method in ("fisher", "fisher_t", "regmean", "activation_federated"):
        assert rows.loc[method, "rounds"] == 2  # the training round and one query round
        assert rows.loc[method, "bytes_sent_by_clients"] > plain["bytes_sent_by_clients"]
    assert rows.loc["fisher", "client_statistics_bytes"] == 2 * 4 * parameters
    extra = rows.loc["fisher", "bytes_sent_by_clients"] - plain["bytes_sent_by_clients"]
    assert 2 * 4 * parameters <= extra < 2 * 4 * parameters + 1000  # tensors and a few metrics
    assert rows.loc["task_arithmetic", "rounds"] == 1
    assert (rows.loc[["fisher", "regmean", "ties"], "server_sees"] == "sum").all()


def test_an_aligned_fisher_cell_gives_the_same_merge(compare_cell, task_identity):
    grid, outcome = compare_cell
    aligned = {**CELL, "strategy": "aligned", "align": "fisher", "calibration": "server"}
    other = ClientAppGrid(2)
    found = run_server(other, aligned, simulated=True)
    rows = found.table().set_index("method")
    assert list(rows.index) == ["fisher", "fisher_t"] and (rows["rounds"] == 2).all()
    for key, value in outcome.merged["fisher"].items():  # the same clients, the same merge
        torch.testing.assert_close(found.merged["fisher"][key], value, rtol=1e-5, atol=1e-6)
    kept = [k for c in other.contexts.values() for k in c.state.array_records]
    assert kept == []  # the aligned cell's query released every kept model


class PoisonedGramGrid(ClientAppGrid):
    """The ClientApps' grid, partition 2's ``query.gram`` reply rewritten by ``spoil`` (its
    digest and metrics kept)."""

    def __init__(self, num_nodes: int, spoil) -> None:
        super().__init__(num_nodes)
        self.spoil = spoil

    def send_and_receive(self, messages, *, timeout=None):
        replies = super().send_and_receive(messages, timeout=timeout)
        for index, (message, reply) in enumerate(zip(messages, replies, strict=True)):
            kind = message.metadata.message_type.rsplit(".", 1)[-1]
            if kind == GRAM_QUERY and int(message.metadata.dst_node_id) == 3:
                tensors, digest = statistics_from_content(reply.content)
                spoiled = {k: self.spoil(v) for k, v in tensors.items()}
                content = statistics_to_content(spoiled, digest, {"partition-id": 2})
                replies[index] = Message(content, reply_to=message)
        return replies


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [(lambda g: g * 1e6, "x the median"), (lambda g: g * math.nan, "non-finite values")],
    ids=["x1e6", "nan"],
)
def test_each_compare_row_counts_and_names_the_clients_its_method_lost(
    spoil, reason, task_identity
):
    """RegMean's query drops partition 2 (its Grams x1e6: the relative rule; NaN: the reply
    screen); RegMean merges the other two and so does Fisher merging after it (partition 2 is
    asked nothing more); the rows of the methods that never asked keep every client."""
    config = {**CELL, "num-clients": 3, "methods": "average,regmean,regmean_t,fisher,fisher_t"}
    outcome = run_server(PoisonedGramGrid(3, spoil), config, simulated=True)
    rows = outcome.table().set_index("method")
    assert rows.loc["average", "clients_survived"] == 3
    assert rows.loc["average", "clients_dropped"] == 0
    for method in ("regmean", "regmean_t", "fisher", "fisher_t"):
        assert rows.loc[method, "clients_survived"] == 2, method
        assert rows.loc[method, "clients_dropped"] == 1, method
        reasons = rows.loc[method, "clients_dropped_reasons"]
        assert "(partition 2): gram reply:" in reasons and reason in reasons, reasons
        assert "(partition 2)" in rows.loc[method, "clients_failed"]
