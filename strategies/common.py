"""Framework glue shared by the fedlmc strategies: screening client replies and talking to nodes.

A one-shot merge must not be poisoned by one bad client. :func:`screen_replies` turns the raw
reply messages of a training round into

- the surviving :class:`ClientUpdate` objects, sorted by the ``partition-id`` each client reports
  (node ids are random and replies arrive in arrival order, so this is the only stable order), and
- one :class:`Failure` per dropped reply: error replies, malformed replies (not exactly one
  ArrayRecord and one MetricRecord with ``num-examples`` and ``partition-id``), arrays whose keys or
  shapes differ from the reference the server sent, non-finite arrays, and nodes that did not
  answer before the timeout.

Nothing here does science: the merging itself is in :mod:`fedlmc.merge` / :mod:`fedlmc.align`.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from torch import Tensor

from fedlmc.calibrate import BNStats, TemperatureStats

StateDict = dict[str, Tensor]
Shapes = dict[str, tuple[int, ...]]

PARTITION_KEY = "partition-id"
NUM_EXAMPLES_KEY = "num-examples"
ERROR_TRAIN_FAILED = 1001
ERROR_QUERY_FAILED = 1002
_PARTITION_IN_REASON = re.compile(r"partition-id=(\d+)")


class NodesUnavailableError(RuntimeError):
    """Fewer nodes than expected connected before the waiting timeout."""


class NotEnoughClientsError(RuntimeError):
    """Fewer clients than ``min_clients`` survived a round."""


class InconsistentShapesError(ValueError):
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


@dataclass
class Failure:
    """A reply (or a missing reply) that was dropped, and why."""

    node_id: int
    partition_id: int | None
    reason: str
    tensor_bytes: int = 0

    def describe(self) -> str:
        who = f"partition {self.partition_id}" if self.partition_id is not None else "unknown"
        return f"node {self.node_id} ({who}): {self.reason}"


@dataclass
class RoundReport:
    """What happened to the replies of one round: survivors (sorted) and failures."""

    survivors: list[ClientUpdate] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

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
        return "; ".join(f.describe() for f in self.failures) or "none"


# ----------------------------------------------------------------------------- records


def state_to_record(state: Mapping[str, Tensor]) -> ArrayRecord:
    """A torch state dict as an ArrayRecord (tensors copied to the CPU)."""
    return ArrayRecord({k: v.detach().cpu() for k, v in state.items()})


def record_to_state(record: ArrayRecord) -> StateDict:
    """An ArrayRecord as a torch state dict (CPU tensors owning their memory)."""
    return {k: torch.from_numpy(np.array(a.numpy(), copy=True)) for k, a in record.items()}


def record_shapes(record: ArrayRecord) -> Shapes:
    """Shape of every array of ``record``."""
    return {k: tuple(int(d) for d in a.shape) for k, a in record.items()}


def tensor_bytes(record: ArrayRecord) -> int:
    """Bytes of the tensors in ``record`` (elements x item size, without serialisation headers)."""
    return sum(
        int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize for a in record.values()
    )


def single_record(records: Mapping[str, Any], kind: str) -> Any:
    """The only record of a RecordDict view; ``ValueError`` if there are none or several."""
    if len(records) != 1:
        raise ValueError(f"expected exactly one {kind}, got {len(records)}")
    return next(iter(records.values()))


# ----------------------------------------------------------------------------- screening


def _shape_problem(shapes: Shapes, reference: Shapes) -> str | None:
    if set(shapes) != set(reference):
        key = sorted(set(shapes) ^ set(reference))[0]
        return f"wrong arrays: key {key!r} is missing or unexpected"
    for key, shape in reference.items():
        if shapes[key] != shape:
            return f"wrong shape: {key!r} has {shapes[key]}, expected {shape}"
    return None


def _finite_problem(state: Mapping[str, Tensor]) -> str | None:
    for key, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return f"non-finite weights in {key!r}"
    return None


def _partition_from_reason(reason: str | None) -> int | None:
    found = _PARTITION_IN_REASON.search(reason or "")
    return int(found.group(1)) if found else None


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return value


def screen_reply(
    message: Message, reference: Shapes | None, weighted_by_key: str = NUM_EXAMPLES_KEY
) -> ClientUpdate | Failure:
    """The reply as a :class:`ClientUpdate`, or the :class:`Failure` saying why it is dropped."""
    node = int(message.metadata.src_node_id)
    if message.has_error():
        reason = message.error.reason or f"error code {message.error.code}"
        return Failure(node, _partition_from_reason(reason), f"client error: {reason}")
    content = message.content
    try:
        record = single_record(content.array_records, "ArrayRecord")
        metrics = dict(single_record(content.metric_records, "MetricRecord"))
        partition_id = _as_int(metrics.get(PARTITION_KEY), PARTITION_KEY)
        num_examples = metrics.get(weighted_by_key)
        if not isinstance(num_examples, int | float) or not num_examples > 0:
            raise ValueError(f"{weighted_by_key} must be a positive number, got {num_examples!r}")
    except ValueError as err:
        return Failure(node, None, f"malformed reply: {err}")
    size = tensor_bytes(record)
    if reference:
        problem = _shape_problem(record_shapes(record), reference)
        if problem:
            return Failure(node, partition_id, problem, size)
    state = record_to_state(record)
    problem = _finite_problem(state)
    if problem:
        return Failure(node, partition_id, problem, size)
    return ClientUpdate(partition_id, node, state, num_examples, metrics, size)


def screen_replies(
    replies: Iterable[Message],
    reference: Shapes | None,
    sent_to: Sequence[int] = (),
    weighted_by_key: str = NUM_EXAMPLES_KEY,
) -> RoundReport:
    """Survivors sorted by partition id (then node id) and the failures, one per bad reply.

    Nodes in ``sent_to`` that sent no reply count as failures ("no reply before the timeout").
    Without a ``reference`` the survivors must agree among themselves on keys and shapes
    (:class:`InconsistentShapesError` otherwise).
    """
    report = RoundReport()
    replied = set()
    for message in replies:
        replied.add(int(message.metadata.src_node_id))
        outcome = screen_reply(message, reference, weighted_by_key)
        target = report.failures if isinstance(outcome, Failure) else report.survivors
        target.append(outcome)
    for node in sent_to:
        if int(node) not in replied:
            report.failures.append(Failure(int(node), None, "no reply before the timeout"))
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


def check_client_counts(num_clients: int, min_clients: int) -> None:
    """``ValueError`` unless ``1 <= min_clients <= num_clients``."""
    if int(num_clients) < 1:
        raise ValueError(f"num_clients = {num_clients}; allowed: an integer >= 1")
    if not 1 <= int(min_clients) <= int(num_clients):
        raise ValueError(f"min_clients = {min_clients}; allowed: 1 .. num_clients ({num_clients})")


def require_survivors(report: RoundReport, min_clients: int) -> None:
    """Raise :class:`NotEnoughClientsError` when fewer than ``min_clients`` survived."""
    if len(report.survivors) < min_clients:
        raise NotEnoughClientsError(
            f"only {len(report.survivors)} client(s) survived (min-clients = {min_clients}); "
            f"failures: {report.failure_text()}"
        )


def weighted_metric_means(updates: Sequence[ClientUpdate], skip: Sequence[str]) -> dict:
    r"""Per metric :math:`\sum_i w_i m_i` with :math:`w_i` = num-examples share (scalars only)."""
    total = sum(u.num_examples for u in updates)
    means: dict[str, float] = {}
    for key in updates[0].metrics if updates else []:
        values = [u.metrics.get(key) for u in updates]
        if key in skip or not all(isinstance(v, int | float) for v in values):
            continue
        means[key] = math.fsum(
            u.num_examples / total * float(v) for u, v in zip(updates, values, strict=True)
        )
    return means


# ----------------------------------------------------------------------------- nodes


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
    """Send a ``query.<action>`` message to each node; replies by node id and the failures."""
    messages = [
        Message(content(), dst_node_id=int(n), message_type=f"query.{action}") for n in node_ids
    ]
    replies = grid.send_and_receive(messages, timeout=timeout)
    answers: dict[int, RecordDict] = {}
    failures: list[Failure] = []
    for reply in replies:
        node = int(reply.metadata.src_node_id)
        if reply.has_error():
            reason = reply.error.reason or f"error code {reply.error.code}"
            failures.append(Failure(node, _partition_from_reason(reason), reason))
        else:
            answers[node] = reply.content
    for node in node_ids:
        if int(node) not in answers and all(f.node_id != int(node) for f in failures):
            failures.append(Failure(int(node), None, f"no {action} reply before the timeout"))
    return answers, failures


def query_content(arrays: ArrayRecord, config: Mapping[str, Any]) -> RecordDict:
    """A query payload: model arrays under ``"arrays"``, a ConfigRecord under ``"config"``."""
    return RecordDict({"arrays": arrays, "config": ConfigRecord(dict(config))})


def metric_record(values: Mapping[str, Any]) -> MetricRecord:
    """A MetricRecord of plain Python ints/floats (numpy/torch scalars and bools converted)."""
    clean: dict[str, int | float] = {}
    for key, value in values.items():
        if isinstance(value, bool):
            clean[key] = int(value)
        elif isinstance(value, int | np.integer):
            clean[key] = int(value)
        else:
            clean[key] = float(value)
    return MetricRecord(clean)


# ----------------------------------------------------------------------------- query payloads


def temperature_stats_to_content(
    stats: Sequence[TemperatureStats], extra: Mapping[str, int]
) -> RecordDict:
    """A ``query.temperature`` reply: per requested log T, lists ``count``, ``nll-sum``,
    ``grad-sum``, ``hess-sum`` (the same order as the ``log-t`` list of the query)."""
    record = MetricRecord({k: int(v) for k, v in extra.items()})
    record["count"] = [int(st.count) for st in stats]
    record["nll-sum"] = [float(st.nll_sum) for st in stats]
    record["grad-sum"] = [float(st.grad_sum) for st in stats]
    record["hess-sum"] = [float(st.hess_sum) for st in stats]
    return RecordDict({"stats": record})


def temperature_stats_from_content(content: RecordDict) -> list[TemperatureStats]:
    """Decode a ``query.temperature`` reply (inverse of :func:`temperature_stats_to_content`)."""
    m = single_record(content.metric_records, "MetricRecord")
    columns = [m["count"], m["nll-sum"], m["grad-sum"], m["hess-sum"]]
    return [
        TemperatureStats(int(c), float(n), float(g), float(h))
        for c, n, g, h in zip(*columns, strict=True)
    ]


def bn_stats_to_content(stats: Mapping[str, BNStats], extra: Mapping[str, int]) -> RecordDict:
    """A ``query.bn_stats`` reply: arrays ``<layer>/sum``, ``<layer>/sum_sq`` (float64) and
    metrics ``<layer>/count``."""
    arrays = ArrayRecord()
    counts: dict[str, int] = {k: int(v) for k, v in extra.items()}
    for name, st in stats.items():
        arrays[f"{name}/sum"] = Array(st.sum.double().cpu().numpy())
        arrays[f"{name}/sum_sq"] = Array(st.sum_sq.double().cpu().numpy())
        counts[f"{name}/count"] = int(st.count)
    return RecordDict({"bn": arrays, "counts": MetricRecord(counts)})


def bn_stats_from_content(content: RecordDict) -> dict[str, BNStats]:
    """Decode a ``query.bn_stats`` reply (inverse of :func:`bn_stats_to_content`)."""
    arrays = single_record(content.array_records, "ArrayRecord")
    counts = single_record(content.metric_records, "MetricRecord")
    layers = sorted({key.rsplit("/", 1)[0] for key in arrays})
    return {
        name: BNStats(
            sum=torch.from_numpy(arrays[f"{name}/sum"].numpy().copy()).double(),
            sum_sq=torch.from_numpy(arrays[f"{name}/sum_sq"].numpy().copy()).double(),
            count=int(counts[f"{name}/count"]),
        )
        for name in layers
    }
