"""The private API behind :mod:`fedlmc.strategies.flower_compat`: each test fails when the
private API it wraps changes (its signature, checked with ``inspect``, or what it does,
exercised for real). The engine's (Python's and Ray's) are in
``tests/simulations/engine/test_compat.py``."""

from __future__ import annotations

import inspect

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedlmc.strategies.flower_compat import construct_messages


def parameters(func) -> list[tuple[str, inspect._ParameterKind]]:
    return [(p.name, p.kind) for p in inspect.signature(func).parameters.values()]


POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD


def test_flower_fedavg_still_builds_its_messages_in_construct_messages():
    assert parameters(FedAvg._construct_messages) == [
        ("self", POSITIONAL),
        ("record", POSITIONAL),
        ("node_ids", POSITIONAL),
        ("message_type", POSITIONAL),
    ]


def test_construct_messages_gives_one_message_per_node_with_the_record(task_identity):
    weights = np.arange(6, dtype=np.float32).reshape(2, 3)
    record = RecordDict(
        {
            "arrays": ArrayRecord({"w": Array(weights)}),
            "config": ConfigRecord({"lr": 0.1, "round": 3}),
        }
    )
    messages = construct_messages(FedAvg(), record, [11, 7, 42], MessageType.TRAIN)
    assert [int(m.metadata.dst_node_id) for m in messages] == [11, 7, 42]
    assert {m.metadata.message_type for m in messages} == {MessageType.TRAIN}
    for message in messages:
        assert np.array_equal(message.content["arrays"]["w"].numpy(), weights)
        assert dict(message.content["config"]) == {"lr": 0.1, "round": 3}
    assert construct_messages(FedAvg(), record, [], MessageType.EVALUATE) == []
