"""WatchedGrid: Flower's push-then-pull with each reply told as it arrives, the wrapped Grid's
other calls unchanged, and a Grid that tells its own replies keeping its send_and_receive."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedlmc.simulations.records import watched_grid
from fedlmc.simulations.records.progress import RunProgress
from fedlmc.simulations.records.watched_grid import WatchedGrid


@pytest.fixture(autouse=True)
def _messages_need_a_task_identity(task_identity):
    """Messages need a run id: what Flower sets for a ServerApp."""
    yield


class LinkOnAList(Grid):
    """A Grid whose nodes answer one message per pull, in order: the SuperLink's part, which
    stores a reply under the id of the message it answers (``reply_to_message_id``)."""

    def __init__(self) -> None:
        self.pushed: list[Message] = []
        self.pulls = 0

    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        return [11, 12, 13]

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        self.pushed = list(messages)
        return [str(i) for i in range(len(self.pushed))]

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        self.pulls += 1
        waiting = sorted(message_ids)
        if not waiting:
            return []
        first = self.pushed[int(waiting[0])]
        reply = Message(RecordDict({"c": ConfigRecord({"ok": 1})}), reply_to=first)
        reply.metadata.__dict__["_reply_to_message_id"] = waiting[0]
        return [reply]

    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("WatchedGrid pushes and pulls itself")

    def assigned_partitions(self) -> dict[int, int]:
        return {11: 0, 12: 1, 13: 2}


def train_messages(grid: Grid) -> list[Message]:
    return [
        grid.create_message(RecordDict({"c": ConfigRecord({"x": 1})}), "train", node, "1")
        for node in grid.get_node_ids()
    ]


def test_each_reply_is_told_as_it_is_pulled(monkeypatch):
    monkeypatch.setattr(watched_grid, "POLL_SECONDS", 0.0)
    lines: list[str] = []
    link = LinkOnAList()
    grid = WatchedGrid(link, RunProgress(lines.append))
    assert list(grid.get_node_ids()) == [11, 12, 13]
    assert grid.assigned_partitions() == {11: 0, 12: 1, 13: 2}  # the engine's extra call
    replies = list(grid.send_and_receive(train_messages(grid), timeout=60))
    assert len(replies) == 3 and link.pulls == 3
    told = [line.split("] ", 1)[1].split(" after")[0] for line in lines]
    # at once: the first and the last reply (the others within 5 s of a line are not told)
    assert told == ["training: 1/3 client(s) replied", "training: 3/3 client(s) replied"]


def test_a_grid_with_its_own_listener_keeps_its_send_and_receive():
    heard: list[int] = []

    class Listening(LinkOnAList):
        on_reply = None

        def send_and_receive(self, messages, *, timeout=None):
            messages = list(messages)
            for _ in messages:
                self.on_reply(1)
            return ["reply"] * len(messages)

    link = Listening()
    link.on_reply = heard.append  # the sweep's bar, say
    lines: list[str] = []
    grid = WatchedGrid(link, RunProgress(lines.append))
    assert grid.send_and_receive(train_messages(link), timeout=None) == ["reply"] * 3
    assert heard == [1, 1, 1] and len(lines) == 2  # both heard the replies (first, last told)
    assert link.on_reply == heard.append  # restored after the round


def test_secagg_stages_are_named_and_only_the_masked_replies_told_one_by_one():
    from flwr.common.secure_aggregation.secaggplus_constants import (
        RECORD_KEY_CONFIGS,
        Key,
        Stage,
    )

    from fedlmc.simulations.records.watched_grid import round_kind

    def secure(stage: str) -> list[Message]:
        content = RecordDict({RECORD_KEY_CONFIGS: ConfigRecord({Key.STAGE: stage})})
        return [Message(content, 11, "train", group_id="1")]

    assert round_kind(secure(Stage.SHARE_KEYS)) == ("SecAgg+ share_keys", False)
    what, per_reply = round_kind(secure(Stage.COLLECT_MASKED_VECTORS))
    assert what.startswith("SecAgg+ masked replies") and per_reply
    assert round_kind(train_messages(LinkOnAList())) == ("training", True)
    query = [Message(RecordDict(), 11, "query.temperature", group_id="1")]
    assert round_kind(query) == ("query.temperature", False)
