"""The sweep engine: many cells (federations) in one Flower simulation, on warm clients.

One call of :func:`run_cells` starts **one** Flower simulation (``flwr.simulation.run_simulation``:
one Ray session, one pool of ClientApp actors, as many virtual SuperNodes as the widest cell has
clients) whose ServerApp (:class:`SweepServer`) runs every cell on the same Grid, several at once:

- each cell is :func:`fedlmc.simulations.server_app.run_server` (every strategy, federated
calibration
  queries, FedAvg, the rows and files of one federation) in a thread of its own, on a
  :class:`CellGrid`: a view of the shared Grid that shows the cell only the first
  ``num-clients`` node ids (sorted) and adds ``partition-id`` / ``num-partitions`` of that cell
  to every message it sends (a ConfigRecord named ``partition``; the ClientApp prefers it to
  its node config). The same warm actors thus serve every cell; they keep their loaded data
  sets and partitions (:mod:`fedlmc.simulations.task`, bounded caches keyed by what determines them)
  and rebuild the model for every message;
- client slots: Flower runs ``S = floor(resources / (num-cpus, num-gpus))`` actors (per Ray
  node; fractional GPU shares allowed) and gives each message to a free one. A
  :class:`Broker` hands out ``S`` slot tokens, oldest cell first: a message is pushed only when
  a slot is free and its token comes back only with its reply (a late reply included), so a
  message never waits in a queue and a cell's ``timeout`` counts from the moment a client
  slot takes its message (its ``created_at`` is set then; the test-only ``hang`` failure
  sleeps past exactly that deadline). One broker thread pulls the replies of every message
  in flight, so concurrent cells never see each other's replies;
- client state: a cell whose clients keep their trained model in the node's ``context.state``
  between rounds (client-side activation matching,
  :func:`fedlmc.simulations.config.keeps_trained_model`) sends *exclusive* messages: one runs on a
  node only while no other message runs there, and no message runs on a node while an exclusive one
  does (Flower's simulation stores a node's context after each message, so two messages on one
  node at once would lose one's update). Other cells keep sharing nodes freely; a message never
  overtakes an older waiting one for the same node;
- threads (:mod:`fedlmc.simulations.threads`): each client slot computes with ``max(1,
  floor(num-cpus))`` threads and the server's merges and evaluations with ``server-cpus``
  threads (default: the cores the slots leave, at least one), whatever ``OMP_NUM_THREADS`` /
  ``MKL_NUM_THREADS`` the caller's shell sets;
- cells in flight: ``ceil(S / num-clients) + 1`` by default (``max_in_flight``), so that while
  one cell merges and evaluates on the server, the next one trains;
- determinism: a cell gives the same numbers whatever runs before or beside it. Clients
  derive every seed from ``(seed, partition-id, round)`` and a Ray actor runs one message at a
  time; on the server, :func:`fedlmc.simulations.task.build_from_config` seeds and builds under a
  lock (the only use of the global RNG) and everything else uses explicit generators.

Results reach the caller through ``on_done(CellResult)``, called (one at a time) as each cell
finishes, in any order. A cell whose ServerApp raises (too few clients, timeout, NaN, ...) gives
a result with ``error`` set; the others go on. When the simulation itself ends early (Ctrl-C,
engine failure), the cells in flight stop at their next message and report nothing.

``ray_address`` (``"auto"``, ``"HOST:PORT"`` or ``"ray://HOST:PORT"``) joins an existing Ray
cluster instead of starting a local one; an address where nothing answers is refused at once
with :class:`ClusterError` (``ray.init`` would otherwise retry for minutes).

This is the only module that calls ``flwr.simulation.run_simulation`` (deprecated in Flower
1.42 but working; if it disappears, this is the one call to replace).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from fedlmc.simulations.config import keeps_trained_model
from fedlmc.simulations.server_app import ServerOutcome, run_server
from fedlmc.simulations.threads import (
    config_slot_threads,
    server_threads,
    thread_environment,
    thread_variables,
    threads_of_this_process,
)
from fedlmc.strategies.protocol import NUM_PARTITIONS_KEY, PARTITION_KEY

PARTITION_RECORD = "partition"  # ConfigRecord a cell adds to each message it sends
POLL_SECONDS = 0.02  # how often the broker pulls replies and cells look for theirs
CONNECT_TIMEOUT = 5.0  # seconds to reach a --ray-address before refusing it


class EngineError(RuntimeError):
    """The simulation stopped before every cell had finished (the unfinished cells report
    nothing: a sweep retries them on its next run)."""


class EngineStopped(RuntimeError):
    """Raised inside a cell when the simulation is stopping (Ctrl-C, engine failure)."""


class ClusterError(ValueError):
    """No Ray cluster answers at the given address, or none can host a client."""


@dataclass
class CellJob:
    """One cell to run: ``key`` (e.g. the cell id) and its validated run config."""

    key: str
    config: dict[str, Any]


@dataclass
class CellResult:
    """A finished cell: the ServerApp's outcome, or the exception that ended it."""

    key: str
    config: dict[str, Any]
    outcome: ServerOutcome | None = None
    error: BaseException | None = None
    seconds: float = 0.0


@dataclass
class EngineStats:
    """What the engine used (filled by :func:`run_cells`, for benchmarks and progress)."""

    slots: int = 0
    max_in_flight: int = 0
    supernodes: int = 0
    simulations: int = 0
    server_threads: int = 0
    startup_seconds: list[float] = field(default_factory=list)


# ----------------------------------------------------------------------------- Flower settings


def backend_config(
    config: Mapping[str, Any], ray_init_args: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Flower's backend config: per-client resources and the arguments of ``ray.init``."""
    init_args: dict[str, Any] = {"include_dashboard": False}
    init_args.update(ray_init_args or {})
    return {
        "client_resources": {
            "num_cpus": float(config["num-cpus"]),
            "num_gpus": float(config["num-gpus"]),
        },
        "init_args": init_args,
    }


class _DropDeprecationNotice(logging.Filter):
    """Hides Flower's run_simulation deprecation notice (printed on every call otherwise)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "DEPRECATED FEATURE" not in record.getMessage()


@contextmanager
def quiet_flower(verbose: bool) -> Iterator[None]:
    """Flower's logger at WARNING (our strategies' warnings still show) unless ``verbose``."""
    logger = logging.getLogger("flwr")
    level, notice = logger.level, _DropDeprecationNotice()
    if not verbose:
        logger.setLevel(logging.WARNING)
        logger.addFilter(notice)
    try:
        with warnings.catch_warnings():
            if not verbose:  # Ray's tip about CUDA_VISIBLE_DEVICES for num_gpus=0 actors
                warnings.filterwarnings("ignore", message="Tip: In future versions of Ray")
            yield
    finally:
        logger.setLevel(level)
        logger.removeFilter(notice)


# ----------------------------------------------------------------------------- Ray


def _address_host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a Ray address (``auto`` resolved the way Ray resolves it)."""
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address

        try:
            address = canonicalize_bootstrap_address("auto") or ""
        except ConnectionError as err:
            raise ClusterError(
                f"--ray-address auto: no running Ray cluster found on this machine ({err}); "
                "start one with `ray start --head`, or give HOST:PORT"
            ) from None
    address = address.removeprefix("ray://")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_ray_address(address: str) -> None:
    """Refuse at once an address where nothing listens (``ray.init`` retries for minutes)."""
    target = _address_host_port(address)
    if target is None:
        raise ClusterError(
            f"--ray-address {address!r}: allowed: auto, HOST:PORT (the head's GCS port, 6379 "
            "by default) or ray://HOST:PORT"
        )
    try:
        with socket.create_connection(target, timeout=CONNECT_TIMEOUT):
            pass
    except OSError as err:
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise ClusterError(
            f"--ray-address {address}: no Ray cluster answers at {target[0]}:{target[1]} "
            f"({reason}); start one with `ray start --head --port {target[1]}` or fix the address"
        ) from None


def init_ray(
    ray_address: str | None,
    ray_init_args: Mapping[str, Any] | None = None,
    worker_threads: int = 1,
) -> None:
    """Start Ray locally or join the cluster at ``ray_address`` (no-op when Ray is already up).

    Ray's workers (the client slots) get ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ... =
    ``worker_threads`` (:mod:`fedlmc.simulations.threads`), whatever this process's environment
    says: a local Ray's inherit them from the environment ``ray.init`` starts it in (restored
    afterwards), a cluster's through the ``runtime_env``.

    As Flower's ``RayBackend.init_ray`` (which then finds Ray running): the driver's
    ``sys.path`` reaches the workers through ``PYTHONPATH``, logging at WARNING. A local Ray's
    workers inherit it from this process's environment; only a cluster's get it through a
    ``runtime_env`` (which, locally, would keep Ray from using its pre-started workers and
    cost about 2 s of start-up). A local Ray runs its workers, the clients, at this process's
    priority (Ray's default, ``nice 15``, lets any other job, and the server's own evaluation,
    take their CPU: on a shared 2-core machine the clients trained 3 times slower); a
    cluster keeps the setting its ``ray start`` gave it.
    """
    import ray

    if ray.is_initialized():
        return
    args: dict[str, Any] = {
        "include_dashboard": False,
        "logging_level": "WARNING",
        "log_to_driver": True,
    }
    args.update(ray_init_args or {})
    if ray_address:
        args["address"] = ray_address
    joining = bool(args.get("address")) and args["address"] != "local"
    if joining:
        check_ray_address(str(args["address"]))
    pythonpath = os.pathsep.join(sys.path)
    if os.environ.get("PYTHONPATH"):
        pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
    os.environ["PYTHONPATH"] = pythonpath
    threads = thread_variables(worker_threads)
    if joining:
        args.setdefault("runtime_env", {"env_vars": {"PYTHONPATH": pythonpath, **threads}})
    else:
        args.setdefault("_system_config", {"worker_niceness": 0})
    try:
        with thread_environment(worker_threads):  # a local Ray's workers inherit it
            ray.init(**args)
    except ConnectionError as err:
        raise ClusterError(f"--ray-address {ray_address}: {' '.join(str(err).split())}") from None


def client_slots(client_resources: Mapping[str, float]) -> int:
    """How many ClientApp actors Flower starts for ``client_resources`` (its own count)."""
    import ray
    from flwr.simulation.ray_transport.ray_actor import pool_size_from_resources

    try:
        return pool_size_from_resources(dict(client_resources))
    except ValueError:
        total = ray.cluster_resources()
        raise ClusterError(
            f"num-cpus = {client_resources['num_cpus']:g}, num-gpus = "
            f"{client_resources['num_gpus']:g}: no Ray node can host one client (cluster: "
            f"{total.get('CPU', 0):g} CPUs, {total.get('GPU', 0):g} GPUs); lower them"
        ) from None


def resources_of(config: Mapping[str, Any]) -> tuple[float, float]:
    """``(num-cpus, num-gpus)``: what one client slot of ``config`` asks Ray for."""
    return float(config["num-cpus"]), float(config["num-gpus"])


def default_in_flight(slots: int, jobs: Sequence[CellJob]) -> int:
    """``ceil(S / num-clients) + 1`` (the narrowest cell's clients): the slots stay busy and
    one more cell merges and evaluates on the server meanwhile."""
    fewest = min(int(job.config["num-clients"]) for job in jobs)
    return math.ceil(slots / fewest) + 1


# ----------------------------------------------------------------------------- slots and replies


@dataclass(order=True, frozen=True)
class _Ticket:
    """A wait for a client slot: ordered by cell priority, then arrival."""

    priority: int
    arrival: int
    thread: int = field(compare=False)
    node: int = field(compare=False)
    exclusive: bool = field(compare=False)


class Broker:
    """The shared Grid of one simulation, used by every cell through a :class:`CellGrid`.

    Hands out ``slots`` tokens (one per client slot, oldest cell first), pushes a message once
    its token is granted (setting its ``created_at`` then), and pulls the replies of every
    message in flight in one background thread: a reply returns its token and waits for its
    cell; replies of messages a cell stopped waiting for (timeouts) are dropped when they come.
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

    def push(self, message: Message, priority: int, exclusive: bool = False) -> str | None:
        """Push ``message`` once a client slot is free (and, if ``exclusive``, its node idle);
        its id (None if the Grid refused it)."""
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
                with self._cond:
                    for reply in replies:
                        mid = reply.metadata.reply_to_message_id
                        if mid not in self._pending:
                            continue
                        self._pending.discard(mid)
                        self._free_slot(*self._placed.pop(mid))
                        if mid in self._abandoned:
                            self._abandoned.discard(mid)
                        else:
                            self._replies[mid] = reply
                    if replies:
                        self._cond.notify_all()
            self._closed.wait(POLL_SECONDS)


class CellGrid(Grid):
    """What one cell's ServerApp sees of the shared Grid (see the module docstring)."""

    def __init__(
        self, broker: Broker, num_clients: int, priority: int, exclusive: bool = False
    ) -> None:
        self.broker = broker
        self.num_clients = int(num_clients)
        self.priority = int(priority)
        self.exclusive = bool(exclusive)
        self._mine: set[str] = set()

    def set_run(self, run: Any) -> None:  # the shared Grid's run is already set
        return None

    @property
    def run(self) -> Any:
        return self.broker.grid.run

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> list[int]:
        """The first ``num-clients`` node ids of the pool (sorted), once all have registered."""
        return self.broker.nodes()[: self.num_clients]

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
            mid = self.broker.push(self._with_partition(message), self.priority, self.exclusive)
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


# ----------------------------------------------------------------------------- the ServerApp


class SweepServer:
    """The ServerApp of one engine simulation: runs ``jobs`` on one Grid, several at once."""

    def __init__(
        self,
        jobs: Sequence[CellJob],
        *,
        slots: int,
        pool_size: int,
        max_in_flight: int,
        on_done: Callable[[CellResult], None],
        on_start: Callable[[CellJob], None] | None,
        stop: threading.Event,
    ) -> None:
        self.jobs = list(jobs)
        self.slots = slots
        self.pool_size = pool_size
        self.max_in_flight = max(1, int(max_in_flight))
        self.on_done = on_done
        self.on_start = on_start
        self.stop = stop
        self.finished: set[str] = set()
        self.fatal: BaseException | None = None
        self._report_lock = threading.Lock()

    def app(self) -> ServerApp:
        server = ServerApp()
        server.main()(self.main)
        return server

    def main(self, grid: Grid, context: Context) -> None:
        broker = Broker(grid, self.slots, self.pool_size, self.stop).start()
        gate = threading.BoundedSemaphore(self.max_in_flight)
        threads = []
        try:
            for priority, job in enumerate(self.jobs):
                while not gate.acquire(timeout=0.2):
                    if self.stop.is_set():
                        return
                if self.stop.is_set():
                    gate.release()
                    return
                thread = threading.Thread(
                    target=self._run_cell,
                    args=(broker, job, priority, gate),
                    name=f"fedlmc-cell-{job.key}",
                    daemon=True,  # a cell busy computing must not hold the process at exit
                )
                thread.start()
                threads.append(thread)
            while any(t.is_alive() for t in threads) and not self.stop.is_set():
                time.sleep(0.05)
        finally:
            broker.close()

    def _run_cell(
        self, broker: Broker, job: CellJob, priority: int, gate: threading.BoundedSemaphore
    ) -> None:
        start = time.perf_counter()
        exclusive = keeps_trained_model(job.config)
        grid = CellGrid(broker, job.config["num-clients"], priority, exclusive)
        result = CellResult(job.key, job.config)
        try:
            try:
                if self.on_start is not None:
                    self.on_start(job)
                result.outcome = run_server(grid, job.config, simulated=True)
            except EngineStopped:
                return
            except Exception as err:  # noqa: BLE001 - a failed cell is a result, the others go on
                result.error = err
            finally:
                grid.close()
            result.seconds = time.perf_counter() - start
            self._report(result)
        finally:
            gate.release()  # after the report: the next cell starts once this one is counted

    def _report(self, result: CellResult) -> None:
        with self._report_lock:
            if self.stop.is_set():
                return
            try:
                self.on_done(result)
                self.finished.add(result.key)
            except BaseException as err:  # e.g. results.csv cannot be written: stop everything
                self.fatal = err
                self.stop.set()


# ----------------------------------------------------------------------------- driver

EXIT_GRACE_SECONDS = 3.0
_exit_armed = False


def exit_even_if_stuck(code: int, grace: float = EXIT_GRACE_SECONDS) -> None:
    """Make sure the process can exit after an interrupted simulation.

    When the simulation stops early (Ctrl-C), Flower shuts Ray down while its worker threads
    still wait in ``ray.get`` for the running clients; those threads never return and the
    interpreter would wait for them forever at exit. This arms a timer at the start of the
    interpreter's shutdown (after the caller has printed and flushed what it had to say):
    if the process has not exited ``grace`` seconds later, it exits with ``code``. With
    ``grace = 0`` (Ctrl-C) it exits at once: the cells' threads still running would otherwise
    be torn down by the interpreter's finalisation, which can abort the process (SIGABRT from a
    thread killed inside torch) instead of exiting with ``code``. Results are safe: every
    cell's rows were written atomically when it finished, and Ray is already shut down.
    """
    global _exit_armed
    if _exit_armed:
        return
    _exit_armed = True

    def leave() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)

    def arm() -> None:
        if grace <= 0:
            leave()
        timer = threading.Timer(grace, leave)
        timer.daemon = True
        timer.start()

    # runs before concurrent.futures joins its worker threads (registered later, called first)
    threading._register_atexit(arm)


def run_cells(
    jobs: Sequence[CellJob],
    on_done: Callable[[CellResult], None],
    *,
    on_start: Callable[[CellJob], None] | None = None,
    ray_address: str | None = None,
    ray_init_args: Mapping[str, Any] | None = None,
    max_in_flight: int | None = None,
    verbose: bool = False,
    stats: EngineStats | None = None,
) -> None:
    """Run every job in one Flower simulation per client-resource setting (usually one).

    ``on_done`` receives each finished cell (errors included) as it finishes; a failure of
    ``on_done`` stops the engine and is re-raised. Raises :class:`ClusterError` for an
    unreachable ``ray_address`` or resources no node can host, and :class:`EngineError` when
    the simulation ends with cells unfinished (they reported nothing).
    """
    groups: dict[tuple[float, float], list[CellJob]] = {}
    for job in jobs:
        groups.setdefault(resources_of(job.config), []).append(job)
    stats = stats if stats is not None else EngineStats()
    for group in groups.values():
        _run_group(
            group, on_done, on_start, ray_address, ray_init_args, max_in_flight, verbose, stats
        )


def _run_group(
    jobs: Sequence[CellJob],
    on_done: Callable[[CellResult], None],
    on_start: Callable[[CellJob], None] | None,
    ray_address: str | None,
    ray_init_args: Mapping[str, Any] | None,
    max_in_flight: int | None,
    verbose: bool,
    stats: EngineStats,
) -> None:
    import ray
    from flwr.simulation import run_simulation

    from fedlmc.simulations.client_app import app as client_app

    backend = backend_config(jobs[0].config, ray_init_args)
    pool_size = max(int(job.config["num-clients"]) for job in jobs)
    stop = threading.Event()
    start = time.perf_counter()
    with quiet_flower(verbose):
        try:
            init_ray(ray_address, backend["init_args"], config_slot_threads(jobs[0].config))
            slots = client_slots(backend["client_resources"])
        except BaseException:
            if ray.is_initialized():
                ray.shutdown()
            raise
        stats.startup_seconds.append(time.perf_counter() - start)
        stats.slots, stats.supernodes = slots, max(stats.supernodes, pool_size)
        stats.max_in_flight = max_in_flight or default_in_flight(slots, jobs)
        stats.simulations += 1
        server = SweepServer(
            jobs,
            slots=slots,
            pool_size=pool_size,
            max_in_flight=stats.max_in_flight,
            on_done=on_done,
            on_start=on_start,
            stop=stop,
        )
        stats.server_threads = server_threads(
            jobs[0].config["server-cpus"], slots, jobs[0].config["num-cpus"]
        )
        try:
            with threads_of_this_process(stats.server_threads):
                run_simulation(
                    server_app=server.app(),
                    client_app=client_app,
                    num_supernodes=pool_size,
                    backend_config=backend,
                    verbose_logging=verbose,
                )
        except KeyboardInterrupt:
            exit_even_if_stuck(130, grace=0.0)
            raise
        except SystemExit as exc:  # flwr_exit() on engine failures
            exit_even_if_stuck(1)
            raise EngineError(f"the Flower simulation engine exited with code {exc.code}") from exc
        except Exception as exc:  # e.g. "Simulation Runtime crashed" (the Ray backend failed)
            exit_even_if_stuck(1)
            raise EngineError(f"the Flower simulation failed: {exc}") from exc
        finally:
            stop.set()
            if ray.is_initialized():  # Flower shuts Ray down itself, unless it failed early
                ray.shutdown()
    if server.fatal is not None:
        raise server.fatal
    missing = [job.key for job in jobs if job.key not in server.finished]
    if missing:
        raise EngineError(
            f"the simulation ended with {len(missing)} cell(s) unfinished (see the Flower log)"
        )
