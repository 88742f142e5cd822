"""A ClientApp written as Flower's quickstart-pytorch writes one (``@app.train()`` trains on the
node's partition and replies with ``arrays`` and a MetricRecord with ``num-examples``; nothing
fedlmc-specific) works with :class:`OneShotAverage` and :class:`PermutationAlignedAverage`: the
strategies' own ``start`` runs Flower's round loop against it on an in-process Grid that hands
every message to the ClientApp (Flower's dispatch to ``@app.train`` / ``@app.evaluate``) with the
node's own Context. The messages carry only the caller's ``train_config`` keys and the keys
:mod:`fedlmc.strategies.protocol` declares."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from fedlmc.merging.methods import merge_states
from fedlmc.strategies import OneShotAverage, PermutationAlignedAverage, StrategyOptions
from fedlmc.strategies.protocol import PROTOCOL_KEYS, QUERY_KEYS, state_to_record
from fedlmc.strategies.screening import UNBOUNDED

IN_FEATURES, CLASSES = 12, 3
SIZES = (48, 112)  # examples per partition: the merge weights 0.3 and 0.7
TRAIN_CONFIG = {"lr": 0.1, "local-epochs": 2}  # what the quickstart's ServerApp sends


@pytest.fixture(autouse=True)
def _server_task(task_identity):
    """Messages need the task identity a ServerApp process has."""


class Net(nn.Module):
    """The quickstart's model, shrunk: two hidden layers of a small MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(IN_FEATURES, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def load_data(partition_id: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The quickstart's ``load_data``: this partition's examples (a fixed linear teacher)."""
    g = torch.Generator().manual_seed(100 + partition_id)
    x = torch.randn(n, IN_FEATURES, generator=g)
    teacher = torch.Generator().manual_seed(0)
    return x, (x @ torch.randn(IN_FEATURES, CLASSES, generator=teacher)).argmax(dim=1)


app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Train the received model locally, reply with its weights and ``num-examples``."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    partition_id = int(context.node_config["partition-id"])
    x, y = load_data(partition_id, SIZES[partition_id])
    torch.manual_seed(partition_id)
    optimizer = torch.optim.SGD(model.parameters(), lr=msg.content["config"]["lr"])
    for _ in range(int(msg.content["config"]["local-epochs"])):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    metrics = {"train_loss": loss.item(), "num-examples": len(x)}
    content = RecordDict(
        {"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)}
    )
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """The quickstart's evaluate handler (loss and accuracy on the node's data)."""
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    partition_id = int(context.node_config["partition-id"])
    x, y = load_data(partition_id, SIZES[partition_id])
    with torch.no_grad():
        logits = model(x)
    metrics = {
        "eval_loss": float(nn.functional.cross_entropy(logits, y)),
        "eval_acc": float((logits.argmax(1) == y).float().mean()),
        "num-examples": len(x),
    }
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


class QuickstartGrid:
    """An in-process Grid: node ``p + 1`` holds partition ``p`` (its node config, as
    ``flower-supernode --node-config`` gives it); every message goes to the quickstart ClientApp
    with its node's Context, and is recorded with its reply."""

    def __init__(self) -> None:
        self.contexts = {
            p + 1: Context(
                run_id=7,
                node_id=p + 1,
                node_config={"partition-id": p, "num-partitions": len(SIZES)},
                state=RecordDict(),
                run_config={},
            )
            for p in range(len(SIZES))
        }
        self.sent: list[Message] = []
        self.trained: dict[int, Message] = {}

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
        replies = []
        for message in messages:
            node = int(message.metadata.dst_node_id)
            reply = app(message, self.contexts[node])
            assert not reply.has_error(), reply.error.reason
            self.sent.append(message)
            if message.metadata.message_type == "train":
                self.trained[node] = reply
            replies.append(reply)
        return replies

    def sent_keys(self) -> set[str]:
        """Every key of every ConfigRecord the strategy sent."""
        return {key for m in self.sent for r in m.content.config_records.values() for key in r}

    def replied_states(self) -> list[dict[str, torch.Tensor]]:
        """The trained weights of partitions 0, 1, ... as the ClientApp replied them."""
        return [
            self.trained[node].content["arrays"].to_torch_state_dict() for node in self.contexts
        ]


def start(strategy, grid: QuickstartGrid, template: nn.Module):
    return strategy.start(
        grid=grid,
        initial_arrays=state_to_record(template.state_dict()),
        num_rounds=1,
        train_config=ConfigRecord(dict(TRAIN_CONFIG)),
    )


def options(**fields) -> StrategyOptions:
    x, y = load_data(9, 64)  # the server's own held-out data
    return StrategyOptions(
        num_clients=len(SIZES), weight_bound=UNBOUNDED, server_data=(x, y), **fields
    )


def test_one_shot_average_merges_a_quickstart_client_app_by_num_examples():
    torch.manual_seed(0)
    template, grid = Net(), QuickstartGrid()
    result = start(OneShotAverage(template, options(calibration="server")), grid, template)
    assert result.report.survivor_ids == [0, 1] and not result.report.failures
    assert result.weights == pytest.approx([s / sum(SIZES) for s in SIZES])
    states = grid.replied_states()
    assert not torch.allclose(states[0]["fc1.weight"], states[1]["fc1.weight"])
    for key, merged in result.merged_state.items():
        expected = sum(w * state[key] for w, state in zip(result.weights, states, strict=True))
        assert torch.allclose(merged, expected, atol=1e-6), key
    assert result.temperature > 0 and result.query_rounds == 0
    assert grid.sent_keys() - set(TRAIN_CONFIG) <= PROTOCOL_KEYS
    assert {m.metadata.message_type for m in grid.sent} == {"train"}


def test_permutation_aligned_average_merges_a_quickstart_client_app():
    torch.manual_seed(0)
    template, grid = Net(), QuickstartGrid()
    strategy = PermutationAlignedAverage(
        template,
        options(calibration="none"),
        method="weight_matching",
        example_input=torch.randn(2, IN_FEATURES),
    )
    result = start(strategy, grid, template)
    assert result.report.survivor_ids == [0, 1] and result.temperature == 1.0
    states = grid.replied_states()
    expected = merge_states(
        "weight_matching", template, states, list(result.weights), spec=strategy.spec
    )[0]
    assert len(strategy.spec.perm_to_axes) == 2  # fc1's and fc2's units, from the graph
    for key, merged in result.merged_state.items():
        assert torch.allclose(merged, expected[key], atol=1e-6), key
    assert grid.sent_keys() - set(TRAIN_CONFIG) <= PROTOCOL_KEYS | QUERY_KEYS
    assert {m.metadata.message_type for m in grid.sent} == {"train"}


def test_the_protocol_keys_are_read_with_their_defaults_and_bad_values_refused():
    from fedlmc.strategies.protocol import holdout_share, keep_model

    assert holdout_share({}) == 0.0 and keep_model({}) is None  # a plain ServerApp's messages
    assert holdout_share({"holdout-share": 0.25}) == 0.25
    assert keep_model({"keep-model": "several-queries"}) == "several-queries"
    with pytest.raises(ValueError, match=r"holdout-share = 1.5; allowed: a number in \[0, 1\)"):
        holdout_share({"holdout-share": 1.5})
    with pytest.raises(ValueError, match="keep-model = 'forever'; allowed: one-query, several"):
        keep_model({"keep-model": "forever"})
