"""The client check of :mod:`fedlmc.strategies.robust` (copies, the server-split accuracy rule)
by hand, and in the real one-shot strategy on models trained on mnist5k in process: a client
trained honestly on permuted labels and a free rider (a copy of another client's model) are
dropped by name before the merge, which is then the honest clients' average."""

from __future__ import annotations

import pytest
import torch
from flwr.app import Message, MetricRecord, RecordDict

from fedlmc.averaging import average
from fedlmc.data.loading import load_dataset
from fedlmc.models.classifiers import build_model
from fedlmc.strategies import OneShotAverage, StrategyOptions
from fedlmc.strategies.protocol import state_to_record
from fedlmc.strategies.robust import (
    ACCURACY_MARGIN,
    OFF,
    accuracy_outliers,
    copy_outliers,
)
from fedlmc.train import train_model

LABELS = ["partition 0", "partition 1", "partition 2", "partition 3"]


def states_of(values) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    base = {"w": torch.randn(4, 3, generator=g), "n": torch.tensor(3)}
    return [{"w": base["w"] * v, "n": base["n"]} for v in values]


def test_a_copy_is_named_with_the_client_it_copies_and_honest_clients_are_not():
    states = states_of([1.0, 2.0, 1.0, 1.0 + 1e-9])
    found = copy_outliers(states, LABELS)
    assert sorted(found) == [2, 3]
    assert "a copy of partition 0's" in found[2] and "a copy of partition 0's" in found[3]
    assert copy_outliers(states_of([1.0, 1.01, 1.02]), LABELS) == {}
    assert copy_outliers(states_of([1.0, 1.0 + 1e-3]), LABELS) == {}  # noise above tau passes


def test_the_accuracy_rule_names_only_what_is_far_below_the_median():
    assert list(accuracy_outliers([0.05, 0.89, 0.90])) == [0]  # 1 flipper of 3
    assert sorted(accuracy_outliers([0.9, 0.9, 0.91, 0.05, 0.05])) == [3, 4]  # 2 of 5 collude
    assert accuracy_outliers([0.5, 0.6, 0.7]) == {}  # spread-out honest clients: 3 x MAD
    assert accuracy_outliers([0.90, 0.88, 0.90 - ACCURACY_MARGIN + 0.01]) == {}  # the margin
    assert accuracy_outliers([0.05, 0.9]) == {}  # two clients cannot be judged
    assert accuracy_outliers([0.05, 0.05, 0.9]) == {}  # a poisoned majority is the median
    reason = accuracy_outliers([0.05, 0.89, 0.90])[0]
    assert "accuracy on the server split is 0.05" in reason
    assert "median over clients (0.89)" in reason


@pytest.fixture(scope="module")
def trained():
    """Three clients of one shared start trained on their own 600 mnist5k digits (2 epochs),
    client 2 on labels shifted by one (a label flipper), and the server split."""
    splits = load_dataset("mnist5k")
    x, y = splits.train
    torch.manual_seed(0)
    template = build_model("mlp", width=0.5, in_shape=(1, 28, 28), depth=1, base_hidden=64)
    states = []
    for pid in range(3):
        model = build_model("mlp", width=0.5, in_shape=(1, 28, 28), depth=1, base_hidden=64)
        model.load_state_dict(template.state_dict())
        part = slice(600 * pid, 600 * (pid + 1))
        labels = (y[part] + 1) % 10 if pid == 2 else y[part]
        train_model(
            model, (x[part], labels), epochs=2, lr=0.05, weight_decay=0.0, batch_size=64, seed=pid
        )
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return template, states, splits.server


def reply(node: int, pid: int, state) -> Message:
    metrics = MetricRecord({"num-examples": 600, "partition-id": pid})
    content = RecordDict({"arrays": state_to_record(state), "metrics": metrics})
    return Message(content, reply_to=Message(RecordDict(), dst_node_id=node, message_type="train"))


def test_a_label_flipper_and_a_free_rider_are_dropped_before_the_merge(task_identity, trained):
    template, states, server = trained
    sent = [*states, states[0]]  # partition 3 copies partition 0's model
    replies = [reply(10 + pid, pid, state) for pid, state in enumerate(sent)]
    strategy = OneShotAverage(
        template,
        StrategyOptions(num_clients=4, min_clients=2, calibration="none", server_data=server),
    )
    strategy.expect_replies(state_to_record(template.state_dict()), [10, 11, 12, 13])
    found = strategy.merge_round(1, replies)
    reasons = {f.partition_id: f.reason for f in found.report.failures}
    assert sorted(reasons) == [2, 3], reasons
    assert "a copy of partition 0's" in reasons[3]
    assert "accuracy on the server split" in reasons[2]
    honest = average(states[:2], [0.5, 0.5])
    assert all(torch.allclose(found.merged_state[k], honest[k]) for k in honest)
    # the outlier screen alone lets both through (the flipper's norms are honest ones)
    off = OneShotAverage(
        template,
        StrategyOptions(
            num_clients=4, min_clients=2, calibration="none", server_data=server, client_check="off"
        ),
    )
    off.expect_replies(state_to_record(template.state_dict()), [10, 11, 12, 13])
    assert off.merge_round(1, replies).report.failures == []
    # and without server data only the copy is caught
    no_data = OneShotAverage(
        template, StrategyOptions(num_clients=4, min_clients=2, calibration="none", robust=OFF)
    )
    no_data.expect_replies(state_to_record(template.state_dict()), [10, 11, 12, 13])
    assert [f.partition_id for f in no_data.merge_round(1, replies).report.failures] == [3]
