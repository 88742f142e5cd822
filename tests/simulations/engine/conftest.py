"""A scripted in-process Grid for the Grid view and slot broker tests (no Ray, fast):
:class:`ScriptedGrid` as the fixture ``scripted_grid``, and ``broker_factory``,
``shared_messages``, ``metrics_of``."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator

import pytest

from fedlmc.simulations.engine.slots import Broker


class ScriptedGrid:
    """An in-process Grid: each pushed message is answered after ``delay(message)`` seconds by
    a reply echoing the destination node and the message's config; it records when each
    message was pushed and answered and how many were outstanding at once."""

    def __init__(self, nodes: list[int], delay) -> None:
        self.nodes = list(nodes)
        self.delay = delay
        self.lock = threading.Lock()
        self.replies: dict[str, object] = {}
        self.pushed: dict[str, float] = {}
        self.answered: dict[str, float] = {}
        self.outstanding = 0
        self.most_outstanding = 0

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def push_messages(self, messages: Iterable) -> list[str]:
        ids = []
        for message in messages:
            mid = uuid.uuid4().hex
            message.metadata.__dict__["_message_id"] = mid
            with self.lock:
                self.pushed[mid] = time.time()
                self.outstanding += 1
                self.most_outstanding = max(self.most_outstanding, self.outstanding)
            threading.Timer(self.delay(message), self._answer, args=(message,)).start()
            ids.append(mid)
        return ids

    def _answer(self, message) -> None:
        from flwr.app import Message, MetricRecord, RecordDict

        values = {}
        for record in message.content.config_records.values():
            values.update(record)
        metrics = MetricRecord(
            {
                "node": int(message.metadata.dst_node_id),
                "partition-id": int(values.get("partition-id", -1)),
                "num-partitions": int(values.get("num-partitions", -1)),
                "cell": int(values["cell"]),
                "created-at": float(message.metadata.created_at),
            }
        )
        reply = Message(RecordDict({"metrics": metrics}), reply_to=message)
        with self.lock:
            mid = message.metadata.message_id
            self.replies[mid] = reply
            self.answered[mid] = time.time()
            self.outstanding -= 1

    def pull_messages(self, message_ids: Iterable[str]) -> list:
        with self.lock:
            return [self.replies.pop(m) for m in list(message_ids) if m in self.replies]


def shared_messages(cell: int, nodes: list[int]) -> tuple[list, object]:
    """One message per node, all sharing one RecordDict (as Flower's strategies do)."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

    content = RecordDict({"arrays": ArrayRecord(), "config": ConfigRecord({"cell": cell})})
    return [Message(content, dst_node_id=n, message_type="train") for n in nodes], content


def metrics_of(replies) -> list[dict]:
    return sorted(
        (dict(next(iter(r.content.metric_records.values()))) for r in replies),
        key=lambda m: m["partition-id"],
    )


@pytest.fixture
def scripted_grid() -> type[ScriptedGrid]:
    return ScriptedGrid


@pytest.fixture(name="shared_messages")
def _shared_messages() -> Callable:
    return shared_messages


@pytest.fixture(name="metrics_of")
def _metrics_of() -> Callable:
    return metrics_of


@pytest.fixture
def broker_factory() -> Iterator:
    made: list[Broker] = []

    def make(grid, slots: int, pool_size: int) -> Broker:
        broker = Broker(grid, slots, pool_size, threading.Event()).start()
        made.append(broker)
        return broker

    yield make
    for broker in made:
        broker.close()
