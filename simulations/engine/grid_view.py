"""The Grid view of one cell (:class:`CellGrid`): the shared Grid of the sweep engine as one
cell's ServerApp sees it, its own nodes and partitions, its messages through the slot broker
(see :mod:`fedlmc.simulations.engine.cells`): a
:class:`~fedlmc.simulations.records.forwarding_grid.ForwardingGrid` over the shared Grid."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedlmc.simulations.engine.slots import POLL_SECONDS, Broker
from fedlmc.simulations.records.forwarding_grid import ForwardingGrid
from fedlmc.strategies.protocol import NUM_PARTITIONS_KEY, PARTITION_KEY, PARTITION_RECORD


class CellGrid(ForwardingGrid):
    """What one cell's ServerApp sees of the shared Grid (see the module docstring);
    ``on_reply(1)`` (optional) hears of each client reply to the cell as the broker receives it
    (the sweep's progress bar counts them)."""

    def __init__(
        self,
        broker: Broker,
        num_clients: int,
        priority: int,
        exclusive: bool = False,
        on_reply: Callable[[int], None] | None = None,
    ) -> None:
        self.broker = broker
        self.num_clients = int(num_clients)
        self.priority = int(priority)
        self.exclusive = bool(exclusive)
        self.on_reply = on_reply
        self._mine: set[str] = set()

    def set_run(self, run: Any) -> None:  # the shared Grid's run is already set
        return None

    @property
    def grid(self) -> Grid:
        """The sweep's shared Grid (its ``run`` is this view's)."""
        return self.broker.grid

    def get_node_ids(self) -> list[int]:
        """The first ``num-clients`` node ids of the pool (sorted), once all have registered."""
        return self.broker.nodes()[: self.num_clients]

    def assigned_partitions(self) -> dict[int, int]:
        """Node id -> the partition id this cell sends it (the strategies trust this, not the
        partition id a reply claims:
        :func:`fedlmc.strategies.strategy_utils.assigned_partitions`)."""
        return {node: index for index, node in enumerate(self.get_node_ids())}

    def get_nodes(self) -> Iterable[Any]:
        mine = set(self.get_node_ids())
        return [n for n in self.broker.grid.get_nodes() if int(n.node_id) in mine]

    def _with_partition(self, message: Message) -> Message:
        """``message`` with this cell's ``partition-id`` / ``num-partitions`` for its node, in a
        RecordDict of its own (strategies share one RecordDict between messages)."""
        nodes = self.get_node_ids()
        node = int(message.metadata.dst_node_id)
        if node in nodes and message.has_content():
            partition = ConfigRecord(
                {PARTITION_KEY: nodes.index(node), NUM_PARTITIONS_KEY: self.num_clients}
            )
            message.content = RecordDict(
                {**dict(message.content.items()), PARTITION_RECORD: partition}
            )
        return message

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        ids = []
        for message in messages:
            mid = self.broker.push(
                self._with_partition(message), self.priority, self.exclusive, self.on_reply
            )
            if mid is not None:
                ids.append(mid)
                self._mine.add(mid)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        replies = self.broker.take(message_ids)
        self._mine.difference_update(r.metadata.reply_to_message_id for r in replies)
        return replies

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[Message]:
        """Push each message when a slot frees, wait up to ``timeout`` seconds per message
        (from its push) for the replies; those still missing are left behind."""
        deadlines: dict[str, float] = {}
        for message in messages:
            for mid in self.push_messages([message]):
                deadlines[mid] = time.time() + timeout if timeout is not None else math.inf
        replies: list[Message] = []
        while deadlines:
            for reply in self.pull_messages(list(deadlines)):
                deadlines.pop(reply.metadata.reply_to_message_id, None)
                replies.append(reply)
            now = time.time()
            if not deadlines or all(d <= now for d in deadlines.values()):
                break
            self.broker.wait(POLL_SECONDS)
        self.close(list(deadlines))
        return replies

    def close(self, message_ids: Sequence[str] | None = None) -> None:
        """Stop waiting for ``message_ids`` (default: every message of this cell)."""
        ids = list(self._mine if message_ids is None else message_ids)
        self.broker.abandon(ids)
        self._mine.difference_update(ids)
