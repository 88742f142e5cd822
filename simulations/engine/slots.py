"""The slot broker of the sweep engine (:class:`Broker`): client-slot tokens handed out
oldest cell first, exclusive messages for cells that keep client state, and one thread pulling
the replies of every message in flight (see :mod:`fedlmc.simulations.engine.cells`)."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from logging import WARNING

from flwr.app import Message
from flwr.serverapp import Grid
from flwr.supercore import log

POLL_SECONDS = 0.02  # how often the broker pulls replies and cells look for theirs


class EngineStopped(RuntimeError):
    """Raised inside a cell when the simulation is stopping (Ctrl-C, engine failure)."""


@dataclass(order=True, frozen=True)
class _Ticket:
    """A wait for a client slot: ordered by cell priority, then arrival."""

    priority: int
    arrival: int
    thread: int = field(compare=False)
    node: int = field(compare=False)
    exclusive: bool = field(compare=False)


class Broker:
    """The shared Grid of one simulation, used by every cell through a
    :class:`~fedlmc.simulations.engine.grid_view.CellGrid`.

    Hands out ``slots`` tokens (one per client slot, oldest cell first), pushes a message once
    its token is granted (setting its ``created_at`` then), and pulls the replies of every
    message in flight in one background thread: a reply returns its token and waits for its
    cell (a message's ``on_reply`` listener, if any, hears of it at once: the sweep's progress);
    replies of messages a cell stopped waiting for (timeouts) are dropped when they come.
    Every call on the real Grid goes through one lock.
    """

    def __init__(self, grid: Grid, slots: int, pool_size: int, stop: threading.Event) -> None:
        self.grid = grid
        self.slots = int(slots)
        self.pool_size = int(pool_size)
        self.stop = stop
        self._grid_lock = threading.Lock()
        self._cond = threading.Condition()
        self._free = self.slots
        self._waiting: list[_Ticket] = []
        self._busy: dict[int, int] = {}  # node -> messages in flight there
        self._exclusive_busy: dict[int, int] = {}  # node -> exclusive messages in flight there
        self._placed: dict[str, tuple[int, bool]] = {}  # message id -> (node, exclusive)
        self._tickets = itertools.count()
        self._pending: set[str] = set()
        self._abandoned: set[str] = set()
        self._replies: dict[str, Message] = {}
        self._listeners: dict[str, Callable[[int], None]] = {}
        self._nodes: list[int] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._pull_loop, name="fedlmc-broker", daemon=True)

    # -- lifecycle

    def start(self) -> Broker:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def _check_stop(self) -> None:
        if self.stop.is_set() or self._closed.is_set():
            raise EngineStopped("the simulation is stopping")

    # -- nodes

    def nodes(self) -> list[int]:
        """The pool's node ids, sorted; empty until every SuperNode has registered."""
        self._check_stop()
        if not self._nodes:
            with self._grid_lock:
                nodes = sorted(int(n) for n in self.grid.get_node_ids())
            if len(nodes) >= self.pool_size:
                self._nodes = nodes
        return list(self._nodes)

    # -- slots

    def _blocked(self, ticket: _Ticket) -> bool:
        """Whether ``ticket``'s node cannot take it now (see the module docstring)."""
        if self._exclusive_busy.get(ticket.node, 0) > 0:
            return True
        return ticket.exclusive and self._busy.get(ticket.node, 0) > 0

    def _grantable(self, ticket: _Ticket) -> bool:
        """A free slot, the ticket's node free for it, and no older ticket waiting that could
        run now or that waits for the same node."""
        if self._free <= 0 or self._blocked(ticket):
            return False
        for other in sorted(self._waiting):
            if other == ticket:
                return True
            if other.node == ticket.node or not self._blocked(other):
                return False
        return False

    def _acquire(self, priority: int, node: int, exclusive: bool) -> None:
        """Wait for a slot token for a message to ``node``; cells with a lower ``priority``
        (earlier cells) go first."""
        ticket = _Ticket(priority, next(self._tickets), threading.get_ident(), node, exclusive)
        with self._cond:
            heapq.heappush(self._waiting, ticket)
            try:
                while not self._grantable(ticket):
                    self._check_stop()
                    self._cond.wait(0.2)
            except EngineStopped:
                self._waiting.remove(ticket)
                heapq.heapify(self._waiting)
                self._cond.notify_all()
                raise
            self._waiting.remove(ticket)
            heapq.heapify(self._waiting)
            self._free -= 1
            self._busy[node] = self._busy.get(node, 0) + 1
            if exclusive:
                self._exclusive_busy[node] = self._exclusive_busy.get(node, 0) + 1
            self._cond.notify_all()

    def _release(self, node: int, exclusive: bool) -> None:
        with self._cond:
            self._free_slot(node, exclusive)
            self._cond.notify_all()

    def _free_slot(self, node: int, exclusive: bool) -> None:
        """Return a slot token and the node's place (caller holds ``_cond``)."""
        self._free += 1
        self._busy[node] -= 1
        if exclusive:
            self._exclusive_busy[node] -= 1

    # -- messages

    def push(
        self,
        message: Message,
        priority: int,
        exclusive: bool = False,
        on_reply: Callable[[int], None] | None = None,
    ) -> str | None:
        """Push ``message`` once a client slot is free (and, if ``exclusive``, its node idle);
        its id (None if the Grid refused it). ``on_reply(1)`` is called when its reply arrives."""
        node = int(message.metadata.dst_node_id)
        self._acquire(priority, node, exclusive)
        message.metadata.created_at = time.time()
        try:
            with self._grid_lock:
                ids = list(self.grid.push_messages([message]))
        except BaseException:
            self._release(node, exclusive)
            raise
        if not ids:
            self._release(node, exclusive)
            log(WARNING, "the Grid refused a message to node %s", message.metadata.dst_node_id)
            return None
        with self._cond:
            self._pending.add(ids[0])
            self._placed[ids[0]] = (node, exclusive)
            if on_reply is not None:
                self._listeners[ids[0]] = on_reply
        return ids[0]

    def take(self, message_ids: Iterable[str]) -> list[Message]:
        """The replies that arrived for ``message_ids`` (each handed out once)."""
        with self._cond:
            return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def wait(self, seconds: float) -> None:
        """Sleep until a reply arrives or ``seconds`` pass; :class:`EngineStopped` on stop."""
        self._check_stop()
        with self._cond:
            self._cond.wait(seconds)
        self._check_stop()

    def abandon(self, message_ids: Iterable[str]) -> None:
        """Stop waiting for ``message_ids``: late replies are dropped (their slots come back)."""
        with self._cond:
            for mid in message_ids:
                self._listeners.pop(mid, None)
                if self._replies.pop(mid, None) is None and mid in self._pending:
                    self._abandoned.add(mid)

    def _pull_loop(self) -> None:
        while not self._closed.is_set() and not self.stop.is_set():
            with self._cond:
                pending = set(self._pending)
            if pending:
                try:
                    with self._grid_lock:
                        replies = list(self.grid.pull_messages(pending))
                except Exception as err:  # noqa: BLE001 - the engine is stopping
                    log(WARNING, "pulling replies failed: %s", err)
                    replies = []
                heard = []
                with self._cond:
                    for reply in replies:
                        mid = reply.metadata.reply_to_message_id
                        if mid not in self._pending:
                            continue
                        self._pending.discard(mid)
                        self._free_slot(*self._placed.pop(mid))
                        listener = self._listeners.pop(mid, None)
                        if mid in self._abandoned:
                            self._abandoned.discard(mid)
                        else:
                            self._replies[mid] = reply
                            heard += [listener] if listener is not None else []
                    if replies:
                        self._cond.notify_all()
                self._tell(heard)
            self._closed.wait(POLL_SECONDS)

    @staticmethod
    def _tell(listeners: Iterable[Callable[[int], None]]) -> None:
        """Each listener hears of its reply (outside the lock); a failing one is logged, never
        allowed to stop the pulling of replies."""
        for listener in listeners:
            try:
                listener(1)
            except Exception as err:  # noqa: BLE001 - progress display only
                log(WARNING, "a reply listener failed: %s", err)
