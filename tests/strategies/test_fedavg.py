"""The multi-round FedAvg baseline (:mod:`fedlmc.strategies.fedavg`) on hand-built Flower
replies (real Messages): the rounds share the total local epochs, a round's config says its
epochs and a shared init, the survivors are averaged by their example counts, and the result's
per-round curve reads the round's records (NaN where none)."""

from __future__ import annotations

import math

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from fedlmc.models.classifiers import build_model
from fedlmc.strategies import FedAvgBaseline, StrategyOptions, epochs_per_round
from fedlmc.strategies.fedavg import MERGED_TEST_ACCURACY, MERGED_TEST_LOSS, FedAvgResult
from fedlmc.strategies.protocol import record_to_state, state_to_record

IN_SHAPE = (1, 4, 4)


@pytest.fixture(autouse=True)
def _messages_need_a_task_identity(task_identity):
    """Messages need a run id: what Flower sets for a ServerApp (as run_simulation does)."""
    yield


def tiny(seed: int):
    torch.manual_seed(seed)
    return build_model("mlp", width=1.0, in_shape=IN_SHAPE, depth=2, base_hidden=8, norm="none")


def instruction(node_id: int) -> Message:
    return Message(RecordDict(), dst_node_id=node_id, message_type="train")


def reply(node_id: int, state, pid: int, n: int = 10) -> Message:
    metrics = MetricRecord({"num-examples": n, "partition-id": pid, "train-loss": float(pid)})
    content = RecordDict({"arrays": state_to_record(state), "metrics": metrics})
    return Message(content, reply_to=instruction(node_id))


def error_reply(node_id: int, pid: int) -> Message:
    error = Error(code=1001, reason=f"partition-id={pid}: RuntimeError: boom")
    return Message(error, reply_to=instruction(node_id))


def constant_state(template, value: float):
    return {k: torch.full_like(v, value) for k, v in template.state_dict().items()}


def test_fedavg_rounds_share_the_total_local_epochs():
    assert epochs_per_round(10, 3) == [4, 3, 3]
    assert sum(epochs_per_round(7, 7)) == 7
    with pytest.raises(ValueError, match="fedavg-rounds = 4"):
        epochs_per_round(3, 4)
    strategy = FedAvgBaseline(StrategyOptions(num_clients=2), total_epochs=5, num_rounds=2)
    assert [strategy.local_epochs(r) for r in (1, 2)] == [3, 2]


def test_fedavg_baseline_averages_survivors_by_num_examples():
    template = tiny(0)
    strategy = FedAvgBaseline(StrategyOptions(num_clients=3), total_epochs=2, num_rounds=2)
    strategy.expect_replies(state_to_record(template.state_dict()), [1, 2, 3])
    replies = [
        reply(1, constant_state(template, 2.0), 0, n=1),
        error_reply(2, 1),
        reply(3, constant_state(template, 6.0), 2, n=1),
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)
    assert all(torch.equal(t, torch.full_like(t, 4.0)) for t in record_to_state(arrays).values())
    assert metrics["clients-survived"] == 2 and metrics["clients-failed"] == 1


def test_a_round_config_says_its_epochs_and_a_shared_init():
    strategy = FedAvgBaseline(StrategyOptions(num_clients=2), total_epochs=5, num_rounds=2)
    config = strategy.round_config(2, ConfigRecord({"lr": 0.1}))
    assert config["epochs"] == 2 and config["init"] == "shared" and config["lr"] == 0.1
    with pytest.raises(ValueError, match=r"^server_round = 3; allowed: 1 \.\. 2 "):
        strategy.local_epochs(3)


def test_the_round_curve_reads_each_rounds_records_nan_where_none():
    result = FedAvgResult(
        arrays=ArrayRecord(),
        train_metrics_clientapp={1: MetricRecord({"train-loss": 0.5, "train-accuracy": 0.75})},
        evaluate_metrics_clientapp={},
        evaluate_metrics_serverapp={
            2: MetricRecord({MERGED_TEST_LOSS: 0.25, MERGED_TEST_ACCURACY: 0.875})
        },
        reports={2: None, 1: None},
    )
    first, second = result.round_curve()
    assert first["round"] == 1 and second["round"] == 2
    assert first["clients_train_loss"] == 0.5 and first["clients_train_accuracy"] == 0.75
    assert math.isnan(first["merged_test_loss"]) and math.isnan(second["clients_train_loss"])
    assert second["merged_test_loss"] == 0.25 and second["merged_test_accuracy"] == 0.875
