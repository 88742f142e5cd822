"""The Grid a SecAgg+ round runs on, seen through its replies
(:mod:`fedlmc.strategies.secure_grid`): which nodes sent no good reply and why, each failure on
one line, and the payload counted, on real Flower messages (the dead-node error the SuperLink
sends, a client's error reply)."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from fedlmc.strategies.secure_grid import (
    WatchingGrid,
    failure_text,
    reply_bytes,
    unanswered_nodes,
)
from tests.strategies.test_secure_dropped import client_error_reply, unavailable_reply


@pytest.fixture(autouse=True)
def server_task(task_identity):
    """Messages need the identity a ServerApp process has."""


def sent(node: int, message_id: str) -> Message:
    message = Message(RecordDict(), dst_node_id=node, message_type="train")
    message.metadata.__dict__["_message_id"] = message_id
    return message


def answered(message: Message, payload: bytes = b"") -> Message:
    content = RecordDict({"configs": ConfigRecord({"masked": [payload]})})
    content["metrics"] = MetricRecord({"n": 3})
    return Message(content, reply_to=message)


def test_every_node_without_a_good_reply_is_named_with_its_reason():
    messages = [sent(1, "a"), sent(2, "b"), sent(3, "c"), sent(4, "d")]
    replies = [
        answered(messages[0]),
        unavailable_reply(messages[1]),  # from node 0, matched by the message it answers
        client_error_reply(messages[2], ValueError("line one\nclient partition 2: bad value")),
    ]
    found = unanswered_nodes(messages, replies, 30.0)
    assert sorted(found) == [2, 3, 4]
    assert found[2].startswith("Error: Node Unavailable")
    assert found[3] == "client partition 2: bad value"  # the last line: no traceback
    assert found[4] == "no reply within the timeout (30 s)"
    assert unanswered_nodes(messages[:1], replies[:1], None) == {}


def test_a_failure_is_its_last_line_and_the_payload_is_counted():
    assert failure_text(RuntimeError("Traceback ...\n  at x\n'ValueError: boom'")) == (
        "ValueError: boom"
    )
    message = sent(1, "a")
    reply = answered(message, b"x" * 100)
    assert reply_bytes(reply) == 100 + 8  # the bytes value and one metric number
    assert reply_bytes(unavailable_reply(message)) == 0


def test_the_watching_grid_counts_the_bytes_and_delegates_the_rest():
    class Grid:
        run = "the run"

        def send_and_receive(self, messages, *, timeout=None):
            return [answered(m, b"y" * 10) for m in messages if m.metadata.dst_node_id != 2]

    grid = WatchingGrid(Grid())
    grid.send_and_receive([sent(1, "a"), sent(2, "b")], timeout=5.0)
    assert grid.bytes_received == 18 and grid.unanswered == {2: "no reply within the timeout (5 s)"}
    assert grid.run == "the run"
