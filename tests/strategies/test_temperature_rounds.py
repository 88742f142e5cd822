"""The temperature's query rounds (fedlmc.strategies.temperature_rounds.TemperatureRounds, on
their own): the grid query then Newton rounds fit the temperature a centralised fit on the
answering clients' data finds, a client that fails the grid query is dropped and counted out of
the history, and several models share one grid round. Real Messages, the ClientApp's encoding,
in process."""

from __future__ import annotations

import pytest
import torch
from flwr.app import Error, Message

from fedlmc.evaluation import predict_logits
from fedlmc.merging.calibrate import (
    fit_temperature,
    grid_minimum,
    temperature_grid,
    temperature_statistics,
)
from fedlmc.models.classifiers import build_model
from fedlmc.strategies.protocol import state_to_record, temperature_stats_to_content
from fedlmc.strategies.strategy_utils import ClientUpdate
from fedlmc.strategies.temperature_rounds import TemperatureRounds

IN_SHAPE = (1, 4, 4)


@pytest.fixture(autouse=True)
def _messages_need_a_task_identity(task_identity):
    """Messages need a run id: what Flower sets for a ServerApp."""
    yield


def tiny(seed: int):
    torch.manual_seed(seed)
    return build_model("mlp", width=1.0, in_shape=IN_SHAPE, depth=2, base_hidden=8)


def data(n: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *IN_SHAPE, generator=g), torch.randint(0, 10, (n,), generator=g)


class TemperatureGrid:
    """A Grid whose nodes answer ``query.temperature`` on their own data (real Messages, the
    ClientApp's encoding); the nodes in ``fail_grid`` answer the first (grid) query with an
    error and every later query normally."""

    def __init__(self, model, data_by_node, fail_grid=()):
        self.model, self.data, self.fail_grid, self.asked = model, data_by_node, set(fail_grid), 0

    def send_and_receive(self, messages, *, timeout=None):
        from fedlmc.strategies.protocol import query_models

        self.asked += 1
        replies = []
        for message in messages:
            node = int(message.metadata.dst_node_id)
            if self.asked == 1 and node in self.fail_grid:
                error = Error(code=1002, reason=f"partition-id={node}: RuntimeError: boom")
                replies.append(Message(error, reply_to=message))
                continue
            x, y = self.data[node]
            points = message.content["config"]["log-t"]
            models = query_models(message.content)
            stats = [
                [temperature_statistics(predict_logits(self.model, x), y, u) for u in points]
                for _ in models
            ]
            several = "model-0" in message.content.array_records
            content = temperature_stats_to_content(
                stats if several else stats[0], {"partition-id": node}, per_model=several
            )
            replies.append(Message(content, reply_to=message))
        return replies


def test_federated_temperature_history_counts_the_clients_that_answered_the_grid_query():
    model = tiny(0).eval()
    data_by_node = {node: data(48, seed=node) for node in (0, 1, 2)}
    survivors = [ClientUpdate(n, n, model.state_dict(), 48, {}, 0) for n in (0, 1, 2)]
    grid = TemperatureGrid(model, data_by_node, fail_grid=[2])
    clients = TemperatureRounds(
        grid, survivors, {}, template=model, device="cpu", timeout=5.0, min_clients=2
    )
    temperature, history = clients.fit_temperature(state_to_record(model.state_dict()))
    assert history[0]["round"] == -1 and history[0]["clients"] == 2
    assert all(h["clients"] == 2 for h in history[1:])
    x = torch.cat([data_by_node[n][0] for n in (0, 1)])
    y = torch.cat([data_by_node[n][1] for n in (0, 1)])
    assert temperature == pytest.approx(fit_temperature(predict_logits(model, x), y), rel=1e-3)
    assert [f.node_id for f in clients.dropped] == [2]


def test_several_models_share_one_grid_round_and_each_gets_its_own_minimum():
    model = tiny(0).eval()
    data_by_node = {node: data(32, seed=node) for node in (0, 1)}
    survivors = [ClientUpdate(n, n, model.state_dict(), 32, {}, 0) for n in (0, 1)]
    rounds = TemperatureRounds(
        TemperatureGrid(model, data_by_node),
        survivors,
        {},
        template=model,
        device="cpu",
        timeout=5.0,
        min_clients=2,
        grid_points=101,
    )
    record = state_to_record(model.state_dict())
    minima = rounds.grid_minima([record, record])
    assert rounds.rounds == 1 and len(minima) == 2
    x = torch.cat([data_by_node[n][0] for n in (0, 1)])
    y = torch.cat([data_by_node[n][1] for n in (0, 1)])
    grid = temperature_grid(101)
    logits = predict_logits(model, x)
    central = grid_minimum([[temperature_statistics(logits, y, float(u)) for u in grid]], grid)
    for log_t, stats in minima:
        assert log_t == pytest.approx(central[0])
        assert stats.count == central[1].count == 64
