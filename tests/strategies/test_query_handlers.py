"""The query handlers a ClientApp must register (:mod:`fedlmc.strategies.query_handlers`): a
ClientApp written as Flower's quickstart writes one (only ``@app.train()``) under a strategy told
``method="fisher"`` stops at the first query in one line naming the handler and the docs' table,
and merges nothing; the table covers every method that queries the clients."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from fedlmc.merging.method_registry import METHODS
from fedlmc.strategies import PermutationAlignedAverage, StrategyOptions
from fedlmc.strategies.protocol import state_to_record
from fedlmc.strategies.query_handlers import METHOD_QUERIES, QUERIES_DOC, query_handlers_table
from fedlmc.strategies.screening import UNBOUNDED
from fedlmc.strategies.strategy_utils import MissingQueryHandlerError

IN_FEATURES, CLASSES, SIZES = 6, 3, (20, 30)


@pytest.fixture(autouse=True)
def _server_task(task_identity):
    """Messages need the task identity a ServerApp process has."""


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(IN_FEATURES, 8), nn.ReLU(), nn.Linear(8, CLASSES))


app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """The quickstart's handler: one SGD step on the node's data, its weights and count back."""
    model = net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    n = SIZES[int(context.node_config["partition-id"])]
    x = torch.randn(n, IN_FEATURES)
    loss = nn.functional.cross_entropy(model(x), torch.randint(0, CLASSES, (n,)))
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    content = {
        "arrays": ArrayRecord(model.state_dict()),
        "metrics": MetricRecord({"num-examples": n}),
    }
    return Message(RecordDict(content), reply_to=msg)


class TrainOnlyGrid:
    """An in-process Grid handing every message to the train-only ClientApp; an exception the
    ClientApp raises comes back as Flower's runtime sends it (an error reply whose reason is
    ``"<class ...>:<'message'>"``, ``flwr.server.superlink.fleet.vce.vce_api``)."""

    def __init__(self) -> None:
        self.contexts = {
            p + 1: Context(7, p + 1, {"partition-id": p, "num-partitions": 2}, RecordDict(), {})
            for p in range(len(SIZES))
        }
        self.sent: list[str] = []

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
        replies = []
        for message in messages:
            self.sent.append(message.metadata.message_type)
            try:
                replies.append(app(message, self.contexts[int(message.metadata.dst_node_id)]))
            except Exception as ex:  # as Flower's runtime reports a ClientApp's exception
                error = Error(code=2, reason=str(type(ex)) + ":<'" + str(ex) + "'>")
                replies.append(Message(error, reply_to=message))
        return replies


def test_a_train_only_client_app_under_fisher_stops_in_one_line_naming_the_handler():
    torch.manual_seed(0)
    template, grid = net(), TrainOnlyGrid()
    options = StrategyOptions(num_clients=2, weight_bound=UNBOUNDED, calibration="none")
    example = torch.randn(2, IN_FEATURES)
    strategy = PermutationAlignedAverage(template, options, method="fisher", example_input=example)
    with pytest.raises(MissingQueryHandlerError) as stopped:
        strategy.start(
            grid=grid,
            initial_arrays=state_to_record(template.state_dict()),
            num_rounds=1,
            train_config=ConfigRecord({"lr": 0.1}),
        )
    line = str(stopped.value)
    assert "\n" not in line and "Traceback" not in line
    assert "query handler 'fisher'" in line and '@app.query("fisher")' in line
    assert "method='fisher'" in line and QUERIES_DOC in line
    assert grid.sent == ["train", "train", "query.fisher", "query.fisher"]


def test_the_table_covers_every_method_that_queries_the_clients():
    queriers = {m.name for m in METHODS if m.needs.clients or m.needs.clients_for_data}
    assert queriers == set(METHOD_QUERIES)
    table = query_handlers_table()
    assert '| `fisher` (and `fisher_t`) | always | `@app.query("fisher")` |' in table
    assert '`@app.query("gram")`' in table and '`@app.query("temperature")`' in table
