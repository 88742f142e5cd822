"""A Flower Grid that tells each reply as it arrives (:class:`WatchedGrid`).

Flower's ``Grid.send_and_receive`` pushes a round's messages and blocks until every reply is in
(or the timeout): nothing is heard of the clients while they train. :class:`WatchedGrid` wraps
any Grid and does the same push-then-pull itself, polling every :data:`POLL_SECONDS`, so that a
:class:`~fedlmc.simulations.records.progress.RoundWatch` hears of each reply at once (the lines
and bar of :mod:`fedlmc.simulations.records.progress`). A Grid that already tells its replies
(one with an ``on_reply`` listener, the sweep engine's
:class:`~fedlmc.simulations.engine.grid_view.CellGrid`, whose pushes wait for client slots)
keeps its own ``send_and_receive``, with the watch added to its listener for the round. Every
other call goes to the wrapped Grid unchanged
(:class:`~fedlmc.simulations.records.forwarding_grid.ForwardingGrid`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid

from fedlmc.simulations.records.forwarding_grid import ForwardingGrid
from fedlmc.simulations.records.progress import RoundWatch, RunProgress

SECAGG_CONFIGS = "secaggplus_configs"
"""The record of Flower's SecAgg+ messages that names their stage (``stage``)."""
SECAGG_TRAINING_STAGE = "collect_masked_vectors"
"""The SecAgg+ stage in which each client computes (trains), then sends its masked vector."""
POLL_SECONDS = 0.2
"""How often the replies of a round are pulled (Flower's deployment Grid polls every 3 s): each
round waited half a poll on average after its last reply, and a SecAgg+ aggregation is four
rounds; one pull is one small request to the SuperLink."""


class WatchedGrid(ForwardingGrid):
    """``grid`` with each round's replies told to ``progress`` (module docstring)."""

    def __init__(self, grid: Grid, progress: RunProgress) -> None:
        self.grid = grid
        self.progress = progress

    def __getattr__(self, name: str) -> Any:  # e.g. the engine's assigned_partitions()
        if name == "grid":  # not set yet (a copy being built)
            raise AttributeError(name)
        return getattr(self.grid, name)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        """Flower's ``send_and_receive`` (same arguments and result), each reply told as it
        arrives."""
        messages = list(messages)
        what, per_reply = round_kind(messages)
        watch = self.progress.round(what, len(messages), per_reply)
        try:
            if hasattr(self.grid, "on_reply"):  # the engine's Grid tells each reply itself
                return self._through_listener(messages, timeout, watch)
            return self._pulled(messages, timeout, watch)
        finally:
            watch.close()

    def _through_listener(
        self, messages: list[Message], timeout: float | None, watch: RoundWatch
    ) -> Iterable[Message]:
        previous: Callable[[int], None] | None = self.grid.on_reply

        def heard(count: int) -> None:
            if previous is not None:
                previous(count)
            watch.replied(count)

        self.grid.on_reply = heard
        try:
            return self.grid.send_and_receive(messages, timeout=timeout)
        finally:
            self.grid.on_reply = previous

    def _pulled(
        self, messages: list[Message], timeout: float | None, watch: RoundWatch
    ) -> list[Message]:
        """Push, then pull every :data:`POLL_SECONDS` until every reply is in or ``timeout``
        seconds passed (``None``: no limit), as Flower's Grids do."""
        pending = set(self.grid.push_messages(messages))
        end = time.time() + (timeout if timeout is not None else 0.0)
        replies: list[Message] = []
        while timeout is None or time.time() < end:
            new = list(self.grid.pull_messages(pending))
            replies.extend(new)
            pending.difference_update(m.metadata.reply_to_message_id for m in new)
            if new:
                watch.replied(len(new))
            if not pending:
                break
            time.sleep(POLL_SECONDS)
        return replies


def round_kind(messages: list[Message]) -> tuple[str, bool]:
    """What a round of ``messages`` is and whether each reply is told: ``("training", True)``
    for Flower's train messages; under SecAgg+ (a ``secaggplus_configs`` record naming the
    protocol's stage) the stage in which the clients compute and send their masked vectors
    (trained models, or a temperature round's sums) is told per reply, the others (``SecAgg+
    share_keys``, ...) only their waits."""
    if not messages:
        return "", False
    first = messages[0]
    config = first.content.get(SECAGG_CONFIGS) if first.has_content() else None
    stage = config.get("stage") if config is not None else None
    if stage is not None:
        if stage == SECAGG_TRAINING_STAGE:
            return "SecAgg+ masked replies (models, or temperature sums)", True
        return f"SecAgg+ {stage}", False
    kind = first.metadata.message_type
    return ("training", True) if kind == "train" else (kind, False)
