"""The Grid a SecAgg+ round runs on, seen through the replies it receives: their payload
(:func:`reply_bytes`, the round's ``bytes_sent_by_clients``), the nodes that sent no good
reply with the reason (:func:`unanswered_nodes`), each failure on one line
(:func:`failure_text`). :mod:`fedlmc.strategies.secure` records with it which clients dropped
at which stage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["WatchingGrid", "failure_text", "reply_bytes", "unanswered_nodes"]


def failure_text(failure: Any) -> str:
    """A failure on one line: an error reply's last non-empty line of its reason (the client's
    exception message, without Ray's traceback), else ``str(failure)``."""
    error = failure.args[0] if isinstance(failure, Exception) and failure.args else failure
    reason = getattr(error, "reason", None)
    text = str(reason if reason is not None else failure)
    lines = [line.strip(" '>\"") for line in text.splitlines() if line.strip(" '>\"")]
    return lines[-1] if lines else text


class WatchingGrid:
    """A Grid seen through the replies it receives: their bytes, and in ``unanswered`` the
    nodes of the last :meth:`send_and_receive` that sent no good reply, with the reason
    (:func:`unanswered_nodes`); everything else delegated."""

    def __init__(self, grid: Any) -> None:
        self._grid = grid
        self.bytes_received = 0
        self.unanswered: dict[int, str] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages, *, timeout: float | None = None):
        messages = list(messages)
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        self.bytes_received += sum(reply_bytes(r) for r in replies)
        self.unanswered.update(unanswered_nodes(messages, replies, timeout))
        return replies


def unanswered_nodes(
    messages: Sequence[Any], replies: Sequence[Any], timeout: float | None
) -> dict[int, str]:
    """``{node id: reason}`` for every destination of ``messages`` without a good reply: an
    error reply's reason (:func:`failure_text`; the SuperLink answers a message to a node whose
    heartbeats stopped with an error of its own, matched by ``reply_to_message_id``) or "no
    reply within the timeout"."""
    ids = [(m.metadata.message_id, m.metadata.dst_node_id) for m in messages]
    sent = {message_id: node for message_id, node in ids if message_id}
    answered = {r.metadata.src_node_id for r in replies if not r.has_error()}
    errors = {}
    for reply in replies:
        if reply.has_error():
            node = sent.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
            errors[node] = failure_text(reply.error)
    missing = f"no reply within the timeout ({timeout:g} s)" if timeout else "no reply"
    return {
        node: errors.get(node, missing)
        for node in dict.fromkeys(m.metadata.dst_node_id for m in messages)
        if node not in answered
    }


def reply_bytes(message: Any) -> int:
    """The payload of a reply: its arrays' bytes, its ``bytes`` config values and 8 bytes per
    other config or metric number (0 for an error reply)."""
    if message.has_error():
        return 0
    content = message.content
    total = sum(a.nbytes for r in content.array_records.values() for a in r.values())
    for record in [*content.config_records.values(), *content.metric_records.values()]:
        for value in record.values():
            items = value if isinstance(value, list) else [value]
            total += sum(len(v) if isinstance(v, bytes | str) else 8 for v in items)
    return int(total)
