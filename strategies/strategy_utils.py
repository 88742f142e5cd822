"""Framework glue shared by the fedlmc strategies: screening client replies and talking to nodes.

A one-shot merge must not be poisoned by one bad client. :func:`screen_replies` turns the raw
reply messages of a training round into

- the surviving :class:`ClientUpdate` objects, sorted by the ``partition-id`` each client reports
  (node ids are random and replies arrive in arrival order, so this is the only stable order), and
- one :class:`Failure` per dropped reply: error replies, malformed replies (not exactly one
  ArrayRecord and one MetricRecord with ``num-examples`` and ``partition-id``), arrays whose keys or
  shapes differ from the reference the server sent, non-finite arrays, nodes the SuperLink
  reported lost (one failure each, :class:`Senders`) and nodes that did not answer before the
  timeout.

Nothing here does science (the merging itself is in :mod:`fedlmc.merging.methods`), and nothing here
encodes messages (:mod:`fedlmc.strategies.protocol` does, for the ClientApp too).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result
from flwr.supercore import log

from fedlmc.merging.temperature_bound import bound_line
from fedlmc.strategies.payload import check_record, declared_shape, sent_bytes
from fedlmc.strategies.protocol import (
    HISTORY_KEYS,
    NUM_EXAMPLES_KEY,
    PARTITION_KEY,
    Shapes,
    StateDict,
    record_to_state,
    single_record,
    tensor_bytes,
)
from fedlmc.strategies.query_handlers import missing_handler_line
from fedlmc.strategies.screening import (
    ClientReferences,
    Reference,
    ScreenError,
    check_count,
    check_partition_id,
    check_train_arrays,
    check_weight_values,
    partition_problems,
    screen_history,
    screen_scalar_metrics,
)

_PARTITION_IN_REASON = re.compile(r"partition-id=(\d+)")
_TERMINAL_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-_]")
_OBJECT_REPR = re.compile(r"<class '([\w.()]+)'>|<([\w.()]+?)(?: object)? at 0x[0-9a-fA-F]+>")
_TRACEBACK_NOISE = re.compile(
    r"\s*(Traceback \(most recent call last\):|[\^~]+|The above exception was the direct "
    r"cause of the following exception:|During handling of the above exception.*)\s*"
)
_FRAME = re.compile(r'\s*File ".*", line \d+.*')
_RAY_WRAPPER = re.compile(r"<class 'ray\.exceptions\.\w+(?:\(\w+\))?'>:<'(.*)'>", re.S)
_RAY_HEADER = re.compile(r"(?:\x1b\[[0-9;]*m)?ray::\S+\(\)(?:\x1b\[[0-9;]*m)? \(pid=\d+.*")
_RAY_FIELDS = re.compile(r"\s*\b(?:pid|ip|actor_id|node_id|worker_id)=[^,)\s]+,?")
_CAUSE = "The above exception was the direct cause of the following exception:"
_FLOWER_WRAPPER = "Exception ClientAppException occurred. Message:"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_ERROR_LINE = re.compile(r"\s*(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*: .*)")
MAX_REASON_CHARS = 300
"""Longest drop reason kept (the rest is cut, marked by an ellipsis)."""


def _without_traceback(text: str) -> list[str]:
    """The lines of ``text`` without traceback headers, frames (``File ...`` and the source
    line under it) and caret markers."""
    kept: list[str] = []
    after_frame = False
    for line in text.splitlines():
        if _FRAME.fullmatch(line):
            after_frame = True
            continue
        if (after_frame and line.startswith("    ")) or _TRACEBACK_NOISE.fullmatch(line):
            continue
        after_frame = False
        kept.append(line)
    return _without_repeated_errors(kept)


def _without_repeated_errors(lines: list[str]) -> list[str]:
    """``lines`` less a traceback's last line (``pkg.mod.ValueError: boom``) where the text
    before it already says ``ValueError: boom`` (a ClientApp's own one-line reason followed by
    its traceback)."""
    kept: list[str] = []
    for line in lines:
        short = _ERROR_LINE.fullmatch(line)
        if short and short.group(1) in " ".join(kept):
            continue
        kept.append(line)
    return kept


def plain_text(reason: str) -> str:
    """``reason`` as one plain line: no terminal escape codes or control characters, no
    traceback frames, an object or class repr (``<ray.actor.ActorHandle object at 0x7f...>``)
    reduced to its class name, runs of whitespace as one space, at most
    :data:`MAX_REASON_CHARS` characters. Every drop reason passes here (:class:`Failure`), so
    logs, errors and results.csv hold the same plain text. A ClientApp error relayed by Ray
    (:func:`without_ray_internals`) keeps the client's own exception only."""
    text = _TERMINAL_ESCAPE.sub("", without_ray_internals(str(reason)))
    text = " ".join(_without_traceback(text))
    text = _OBJECT_REPR.sub(lambda m: (m.group(1) or m.group(2)).rsplit(".", 1)[-1], text)
    text = " ".join(_CONTROL.sub(" ", text).split())
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 3].rstrip() + "..."
    return text


def without_ray_internals(reason: str) -> str:
    """A ClientApp error as Flower's simulation relays it from Ray
    (``<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'ray::ClientAppActor.run()
    (pid=..., ip=..., actor_id=..., repr=...) ValueError: boom ... ClientAppException ...
    Message: boom'>``) reduced to the client's exception (``ValueError: boom``): no Ray
    wrapper, no worker header, no process id, address or actor id."""
    text = _RAY_WRAPPER.sub(r"\1", reason)
    cause, marker, rest = text.partition(_CAUSE)
    if marker and _FLOWER_WRAPPER in rest:  # Flower re-raised the client's exception
        text = cause
    return _RAY_FIELDS.sub("", _RAY_HEADER.sub("", text))


class ClientsFailedError(RuntimeError):
    """The federation failed because of its clients (the CLI exits 1, not 2)."""


class NodesUnavailableError(ClientsFailedError):
    """Fewer nodes than expected connected before the waiting timeout."""


class NotEnoughClientsError(ClientsFailedError):
    """Fewer clients than ``min_clients`` survived a round."""


class MissingQueryHandlerError(ClientsFailedError):
    """No client answered a query: their ClientApp registers no handler for it
    (:func:`fedlmc.strategies.query_handlers.missing_handler_line`)."""


class InconsistentShapesError(ClientsFailedError, ValueError):
    """Surviving clients sent arrays with different keys or shapes."""


@dataclass
class ClientUpdate:
    """One surviving client's reply: its weights as a state dict and what it reported."""

    partition_id: int
    node_id: int
    state: StateDict
    num_examples: int
    metrics: dict[str, Any]
    tensor_bytes: int
    history: dict[str, list[float]] | None = None
    """The screened per-epoch history (field of
    :data:`~fedlmc.strategies.protocol.HISTORY_KEYS` -> one value per epoch); ``None`` when the
    client sent none or it failed the screen (``history_problem`` says why)."""
    history_problem: str = ""
    metric_problems: tuple[str, ...] = ()
    """Scalar metrics removed by the screen (``"train-seconds = 1e+300; allowed: ..."``)."""

    @property
    def dropped_metrics(self) -> tuple[str, ...]:
        """The keys of the scalar metrics the screen removed."""
        return tuple(problem.split(" = ", 1)[0] for problem in self.metric_problems)


@dataclass
class Failure:
    """A reply (or a missing reply) that was dropped, and why."""

    node_id: int
    partition_id: int | None
    reason: str
    tensor_bytes: int = 0
    stage: str = "train"
    """The message type whose reply was dropped (``train`` or a query action)."""
    lost: bool = False
    """The node sent nothing: the SuperLink reported it gone, or no reply came in time."""

    def __post_init__(self) -> None:
        self.reason = plain_text(self.reason)

    def describe(self) -> str:
        """``node N (partition P): [stage reply: ]reason`` (``partition not known`` when the
        reply named none and the server assigned none)."""
        who = (
            f"partition {self.partition_id}"
            if self.partition_id is not None
            else "partition not known"
        )
        where = "" if self.stage == "train" else f"{self.stage} reply: "
        return f"node {self.node_id} ({who}): {where}{self.reason}"


@dataclass
class RoundReport:
    """What happened to the replies of one round: survivors (sorted) and failures."""

    survivors: list[ClientUpdate] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    query_failures: list[Failure] = field(default_factory=list)
    """Query replies dropped after the merge (the client stays merged; its answer is unused)."""

    @property
    def dropped(self) -> list[Failure]:
        """Every dropped reply: training round (and alignment) first, then later queries."""
        return [*self.failures, *self.query_failures]

    @property
    def dropped_nodes(self) -> list[int]:
        """Distinct nodes with at least one dropped reply."""
        return sorted({f.node_id for f in self.dropped})

    @property
    def survivor_ids(self) -> list[int]:
        return [u.partition_id for u in self.survivors]

    @property
    def bytes_received(self) -> int:
        """Tensor bytes of every reply's arrays, dropped ones included."""
        return sum(u.tensor_bytes for u in self.survivors) + sum(
            f.tensor_bytes for f in self.failures
        )

    def failure_text(self) -> str:
        return "; ".join(f.describe() for f in self.dropped) or "none"

    def drop(self, failure: Failure) -> None:
        """Move the survivor of ``failure.node_id`` to the failures (e.g. its alignment failed)."""
        self.survivors = [u for u in self.survivors if u.node_id != failure.node_id]
        self.failures.append(failure)


# ----------------------------------------------------------------------------- screening


def _shape_problem(shapes: Shapes, reference: Shapes) -> str | None:
    if set(shapes) != set(reference):
        key = sorted(set(shapes) ^ set(reference))[0]
        return f"wrong arrays: key {key!r} is missing or unexpected"
    for key, shape in reference.items():
        if shapes[key] != shape:
            return f"wrong shape: {key!r} has {shapes[key]}, expected {shape}"
    return None


def _partition_from_reason(reason: str | None) -> int | None:
    found = _PARTITION_IN_REASON.search(reason or "")
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class Senders:
    """Who a round's replies answer for: ``destinations``, message id -> destination node of
    every message sent (the Grid sets a message's id when it pushes it), and ``earlier``, node
    -> the partition id the node claimed in an earlier reply that passed the screen (in a
    deployment the only way to name a node lost before it replied)."""

    destinations: Mapping[str, int] = field(default_factory=dict)
    earlier: Mapping[int, int] = field(default_factory=dict)

    @classmethod
    def of_messages(
        cls, messages: Iterable[Message], earlier: Mapping[int, int] | None = None
    ) -> Senders:
        """The destinations of the pushed ``messages`` (those without an id are left out)."""
        destinations = {
            m.metadata.message_id: int(m.metadata.dst_node_id)
            for m in messages
            if m.metadata.message_id
        }
        return cls(destinations, dict(earlier or {}))

    def node_of(self, reply: Message) -> int:
        """The node ``reply`` answers for. The SuperLink answers a message to a node whose
        heartbeats stopped with an error of its own ("Node Unavailable"), sent from its own
        node id and naming the message it answers (``reply_to_message_id``): such an error
        is the destination's; every other reply is its source's."""
        if reply.has_error():
            node = self.destinations.get(reply.metadata.reply_to_message_id)
            if node is not None:
                return node
        return int(reply.metadata.src_node_id)


def screen_reply(
    message: Message,
    reference: Reference | ClientReferences | Shapes | None,
    weighted_by_key: str = NUM_EXAMPLES_KEY,
    num_partitions: int | None = None,
    epochs: int | None = None,
    assigned: Mapping[int, int] | None = None,
    senders: Senders | None = None,
    places: Mapping[int, int] | None = None,
) -> ClientUpdate | Failure:
    """The reply as a :class:`ClientUpdate`, or the :class:`Failure` saying why it is dropped
    (the train screen of :mod:`fedlmc.strategies.screening`; with
    :class:`~fedlmc.strategies.screening.ClientReferences`, against the shapes expected of the
    reply's partition); its per-epoch history (lists as long as ``epochs`` when given) and its
    scalar metrics are screened apart: a bad one drops only itself. ``assigned`` (node id ->
    partition id, a simulation's own assignment): the partition the reply must claim, and the
    one a failure is named by; ``senders``: the node an error reply answers for and the
    partition it claimed earlier (:class:`Senders`), which names a failure where nothing was
    assigned. A reply without ``partition-id`` (a plain Flower ClientApp's: ``arrays`` and
    ``num-examples`` only) is its node's assigned partition, else its node's place in
    ``places`` (node id -> index among the nodes asked)."""
    senders = senders or Senders()
    node = senders.node_of(message)
    known = None if assigned is None else assigned.get(node)
    if message.has_error():
        reason = message.error.reason or f"error code {message.error.code}"
        pid = known if known is not None else senders.earlier.get(node)
        pid = pid if pid is not None else _partition_from_reason(reason)
        if int(message.metadata.src_node_id) == node:
            return Failure(node, pid, f"client error: {reason}")
        return Failure(node, pid, f"SuperLink error: {reason}", lost=True)
    if isinstance(reference, dict):  # shapes only (older callers): any dtype of the same kind
        reference = None if not reference else Reference(reference, {})
    content = message.content
    partition_id = known
    try:
        record = single_record(content.array_records, "ArrayRecord")
        metrics = dict(single_record(content.metric_records, "MetricRecord"))
        claimed = metrics.get(PARTITION_KEY, known)
        if claimed is None and places is not None:
            claimed = places.get(node)
        partition_id = check_partition_id(claimed, num_partitions)
        if known is not None and partition_id != known:
            partition_id = known
            raise ScreenError(
                f"claims partition-id {metrics.get(PARTITION_KEY)!r}; the server assigned "
                f"partition {known} to node {node}"
            )
        num_examples = check_count(metrics.get(weighted_by_key), weighted_by_key)
    except ValueError as err:
        return Failure(node, partition_id, f"malformed reply: {err}")
    try:
        if isinstance(reference, ClientReferences):
            reference.check(record, partition_id)
        elif reference is not None and not reference.dtypes:
            sent = {k: declared_shape(a, k) for k, a in record.items()}
            problem = _shape_problem(sent, reference.shapes)
            if problem:
                raise ScreenError(problem)
            check_record(record, reference.shapes)
        else:
            check_train_arrays(record, reference)
        state = record_to_state(record)
        check_weight_values(state)
    except ScreenError as err:
        return Failure(node, partition_id, str(err), sent_bytes(record))
    size = tensor_bytes(record)
    metrics[weighted_by_key] = int(num_examples)
    sent = {key: metrics.pop(key) for key in HISTORY_KEYS.values() if key in metrics}
    problems = tuple(screen_scalar_metrics(metrics))
    update = ClientUpdate(partition_id, node, state, int(num_examples), metrics, size)
    update.metric_problems = problems
    try:
        update.history = screen_history(sent, HISTORY_KEYS, epochs)
    except ScreenError as err:
        update.history_problem = str(err)
    return update


def screen_replies(
    replies: Iterable[Message],
    reference: Reference | ClientReferences | Shapes | None,
    sent_to: Sequence[int] = (),
    weighted_by_key: str = NUM_EXAMPLES_KEY,
    num_partitions: int | None = None,
    epochs: int | None = None,
    assigned: Mapping[int, int] | None = None,
    senders: Senders | None = None,
) -> RoundReport:
    """Survivors sorted by partition id (then node id) and the failures, one per node asked.

    A node the SuperLink reported lost is one failure, its own (:class:`Senders`: the error
    names the message it answers), named by its assigned partition or else the one it claimed
    earlier; nodes in ``sent_to`` with neither a reply nor an error count as failures ("no
    reply before the timeout"); ids must be below ``num_partitions``. With ``assigned`` (a
    simulation: node id -> the partition the server assigned it) a reply must claim its node's
    partition; without it (a deployment) every reply claiming a partition id another node also
    claims is dropped, named by its node id
    (:func:`~fedlmc.strategies.screening.partition_problems`).
    Without a ``reference`` the survivors must agree among themselves on keys and shapes
    (:class:`InconsistentShapesError` otherwise); with
    :class:`~fedlmc.strategies.screening.ClientReferences` each reply is checked against its
    partition's (clients of different widths). ``epochs``: the length the per-epoch histories
    must have (:func:`screen_reply`).
    """
    senders = senders or Senders()
    report = RoundReport()
    replied = set()
    screened = []
    for message in replies:
        replied.add(senders.node_of(message))
        screened.append(
            screen_reply(
                message,
                reference,
                weighted_by_key,
                num_partitions,
                epochs,
                assigned,
                senders,
                places={int(n): index for index, n in enumerate(sorted(sent_to))},
            )
        )
    updates = [u for u in screened if isinstance(u, ClientUpdate)]
    report.failures.extend(f for f in screened if isinstance(f, Failure))
    duplicated = partition_problems([(u.partition_id, u.node_id) for u in updates])
    for index, update in enumerate(updates):
        if index in duplicated:
            failure = Failure(update.node_id, update.partition_id, duplicated[index])
            failure.tensor_bytes = update.tensor_bytes
            report.failures.append(failure)
        else:
            report.survivors.append(update)
    for node in sent_to:
        if int(node) not in replied:
            pid = None if assigned is None else assigned.get(int(node))
            pid = pid if pid is not None else senders.earlier.get(int(node))
            failure = Failure(int(node), pid, "no reply before the timeout", lost=True)
            report.failures.append(failure)
    report.survivors.sort(key=lambda u: (u.partition_id, u.node_id))
    report.failures.sort(key=lambda f: (f.partition_id is None, f.partition_id or 0, f.node_id))
    if not reference:
        check_same_shapes(report.survivors)
    return report


def check_same_shapes(updates: Sequence[ClientUpdate]) -> None:
    """Raise :class:`InconsistentShapesError` naming the first key where two clients differ."""
    if not updates:
        return
    first = {k: tuple(v.shape) for k, v in updates[0].state.items()}
    for update in updates[1:]:
        problem = _shape_problem({k: tuple(v.shape) for k, v in update.state.items()}, first)
        if problem:
            raise InconsistentShapesError(
                f"clients disagree on their arrays: partition {update.partition_id} vs "
                f"partition {updates[0].partition_id}: {problem}"
            )


def check_choice(what: str, value: Any, allowed: Sequence[str]) -> str:
    """``value`` if it is one of ``allowed``, else ``ValueError`` naming it and the choices."""
    if value not in allowed:
        raise ValueError(f"{what} = {value!r}; allowed: {', '.join(allowed)}")
    return value


def check_client_counts(num_clients: int, min_clients: int) -> None:
    """``ValueError`` unless ``1 <= min_clients <= num_clients``."""
    if int(num_clients) < 1:
        raise ValueError(f"num_clients = {num_clients}; allowed: an integer >= 1")
    if not 1 <= int(min_clients) <= int(num_clients):
        raise ValueError(f"min_clients = {min_clients}; allowed: 1 .. num_clients ({num_clients})")


def log_temperature_bound(method: str, temperature: float) -> None:
    """One ``fedlmc warning:`` line in the Flower log when ``temperature``, the round's fitted
    :math:`T` of merge ``method``, is an end of the fit's range
    (:func:`fedlmc.merging.temperature_bound.bound_line`: the sentence ``fedlmc run`` says)."""
    line = bound_line(method, temperature)
    if line:
        log(WARNING, "fedlmc warning: %s", line)


def require_survivors(report: RoundReport, min_clients: int) -> None:
    """Raise :class:`NotEnoughClientsError` when fewer than ``min_clients`` survived."""
    if len(report.survivors) < min_clients:
        raise NotEnoughClientsError(
            f"only {len(report.survivors)} client(s) survived (min-clients = {min_clients}); "
            f"failures: {report.failure_text()}"
        )


def weighted_metric_means(
    updates: Sequence[ClientUpdate], skip: Sequence[str], weights: Sequence[float] | None = None
) -> dict:
    r"""Per metric :math:`\sum_i w_i m_i` with :math:`w_i` = ``weights`` (default: the
    num-examples shares; scalars only)."""
    if weights is None:
        weights = [float(u.num_examples) for u in updates]
    total = math.fsum(weights)
    means: dict[str, float] = {}
    for key in updates[0].metrics if updates else []:
        values = [u.metrics.get(key) for u in updates]
        if key in skip or not all(isinstance(v, int | float) for v in values):
            continue
        means[key] = math.fsum(w / total * float(v) for w, v in zip(weights, values, strict=True))
    return means


def flower_records(result: Result) -> dict[str, Any]:
    """The records of Flower's ``Result`` by field name (``arrays`` and the per-round metric
    records), for the strategies' own result objects, which hold them too."""
    return {
        "arrays": result.arrays,
        "train_metrics_clientapp": result.train_metrics_clientapp,
        "evaluate_metrics_clientapp": result.evaluate_metrics_clientapp,
        "evaluate_metrics_serverapp": result.evaluate_metrics_serverapp,
    }


# ----------------------------------------------------------------------------- nodes


def assigned_partitions(grid: Grid | None) -> dict[int, int] | None:
    """Node id -> the partition id the simulation assigned it, when the grid says
    (``grid.assigned_partitions()``: fedlmc's sweep engine, which sends every node its
    partition); ``None`` in a deployment, where only the replies name partitions."""
    method = getattr(grid, "assigned_partitions", None)
    if not callable(method):
        return None
    return {int(node): int(pid) for node, pid in method().items()}


def wait_for_nodes(
    grid: Grid, expected: int, timeout: float, poll_seconds: float = 0.2
) -> list[int]:
    """Sorted ids of the connected nodes once at least ``expected`` are connected.

    Raises :class:`NodesUnavailableError` after ``timeout`` seconds (Flower's own sampling
    waits forever and, in round 1 of a simulation, may sample before all nodes registered).
    """
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        if len(nodes) >= expected:
            return nodes
        if time.monotonic() >= deadline:
            raise NodesUnavailableError(
                f"only {len(nodes)} of {expected} expected nodes connected within {timeout:g} s; "
                "start more SuperNodes or lower num-clients"
            )
        time.sleep(poll_seconds)


def query_nodes(
    grid: Grid,
    node_ids: Sequence[int],
    action: str,
    content: Callable[[], RecordDict],
    timeout: float,
) -> tuple[dict[int, RecordDict], list[Failure]]:
    """Send a ``query.<action>`` message to each node; replies by node id and the failures, one
    per node that sent no answer (a node the SuperLink reported lost is named by the message
    it was sent, :class:`Senders`). :class:`MissingQueryHandlerError` in one line when no node
    answered and their ClientApp registers no handler for the query (nothing is merged)."""
    messages = [
        Message(content(), dst_node_id=int(n), message_type=f"query.{action}") for n in node_ids
    ]
    replies = grid.send_and_receive(messages, timeout=timeout)
    senders = Senders.of_messages(messages)
    answers: dict[int, RecordDict] = {}
    failures: list[Failure] = []
    missing = None
    for reply in replies:
        node = senders.node_of(reply)
        if reply.has_error():
            reason = reply.error.reason or f"error code {reply.error.code}"
            missing = missing or missing_handler_line(action, reason)
            if int(reply.metadata.src_node_id) == node:
                failures.append(Failure(node, _partition_from_reason(reason), reason))
            else:
                failures.append(Failure(node, None, f"SuperLink error: {reason}", lost=True))
        else:
            answers[node] = reply.content
    for node in node_ids:
        if int(node) not in answers and all(f.node_id != int(node) for f in failures):
            failures.append(Failure(int(node), None, f"no {action} reply before the timeout"))
    if missing and not answers:
        raise MissingQueryHandlerError(missing)
    return answers, failures
