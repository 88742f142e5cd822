r"""The reply screen: what a client may send, checked before anything it sent is used.

A client's reply is untrusted input. Every message type has one screen here; each raises
:class:`ScreenError` with a one-line reason (the caller drops the reply and names the node):

- **train** (:func:`check_train_arrays`, :func:`check_count`): the arrays' keys and shapes equal
  the reference the server sent, or, with clients of different widths, the reference of the
  reply's partition (:class:`ClientReferences`: the shapes of that client's width); a tensor is
  floating where the reference is floating and has
  exactly the reference's dtype where it is an integer or bool buffer (``num_batches_tracked``);
  every array's bytes are exactly one NumPy array of its labelled dtype and shape and the
  reply's bytes within the template's bound, checked before anything is decoded
  (:mod:`fedlmc.strategies.payload`);
  every floating value is finite and at most :data:`MAX_ABS_WEIGHT` in absolute value (trained
  weights are O(1); 1e30-scaled weights overflow the logits); ``num-examples`` an integer-valued
  number >= 1; ``partition-id`` an integer in ``0 .. num_partitions - 1``, the partition the
  server assigned the node where it assigned one (a simulation), and unique among the round's
  replies (:func:`partition_problems`: every reply claiming an id another node also claims
  is dropped by node id, the server cannot tell which is honest).
- **train history** (:func:`screen_history`): the per-epoch lists of
  :data:`fedlmc.strategies.protocol.HISTORY_KEYS`: training loss and accuracy both or neither,
  each a list of numbers (no bools) as long as the round's configured ``epochs`` (at most
  :data:`MAX_HISTORY_EPOCHS` when unknown), every value finite or NaN (no infinity), losses in
  [0, :data:`MAX_LOSS`], accuracies in [0, 1]. The scalar metrics of :data:`SCALAR_METRICS`
  (``train-seconds`` ...) the same way (:func:`screen_scalar_metrics`: a bad value is removed
  and named, the weights stay merged). A bad history drops **only the history** (the weights
  passed their own screen and are merged; the history is a diagnostic): the client's training
  rows are left out, and the reason is logged naming the node and partition.
- **query.temperature** (:func:`screen_temperature_reply`): one ``stats`` record per model asked,
  lists as long as the ``log-t`` values sent, counts integer-valued, >= 1 and equal over the
  points (same data at every T), sums finite, ``nll-sum`` >= 0.
- **query.bn_stats / query.unit_stats** (:func:`screen_moments_reply`): exactly the layers
  expected, sums of the layer's width (each payload checked before it is decoded, as for
  train replies), floating and finite, ``sum_sq`` >= 0, counts >= 1, and a
  non-negative variance :math:`S_2/n - (S_1/n)^2` (up to rounding).
- **query.align** (:func:`screen_align_reply`): one integer index array per permutation group of
  the spec (its payload checked before it is decoded), each a permutation of ``0 .. size - 1``
  of that group (moving whole blocks where the group is block-structured: attention heads), and
  a digest string.
- **query.fisher / query.gram** (:func:`screen_statistics_reply`): exactly the expected tensors
  (the model's parameters, or one square matrix per layer; each payload checked before it is
  decoded), each floating, of the expected shape, finite, and non-negative (a Fisher diagonal)
  or symmetric with a non-negative diagonal and positive semi-definite within a tolerance (a
  Gram matrix, :mod:`fedlmc.strategies.statistics_screen`); a digest string. The replies' scales
  are then compared with each other (the relative rule, the same module).

**Weight bound** (:class:`WeightBound`, :func:`bounded_shares`). A client's weight in the merge
is its share of the claimed counts, :math:`s_i = n_i / \sum_j n_j`, capped at :math:`c_i` with
the excess redistributed over the others in proportion to their claims (water-filling):

- in a simulation the server knows every partition's size :math:`m_i`: :math:`c_i = m_i /
  \sum_j m_j` over the replies used, so a client's weight is at most its true share whatever
  it claims (an honest round is unchanged);
- in a deployment :math:`c_i = \max(s_{\max}, 1/N)` for the ``N`` replies used
  (``max-client-share``, default 0.5): no client can carry more than that share of the merge.

The same rule bounds the counts in query replies: a temperature reply's sums (``count``,
``nll-sum``, ``grad-sum``, ``hess-sum``) and a moments reply's per-layer sums are multiplied by
:math:`f_i = s_i' / s_i \le 1` (:math:`s_i'` the bounded share), which keeps the client's
per-sample mean and bounds its weight; honest rounds in a simulation have :math:`f_i = 1` (sums
exact). A client within the bounds can still bias the result by at most its share.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from torch import Tensor

from fedlmc.permutation.spec import PermutationSpec, checked_permutations
from fedlmc.strategies.payload import (
    ScreenError,
    check_record,
    declared_dtype,
    declared_shape,
    decode,
)
from fedlmc.strategies.statistics_screen import Summary, check_gram_spectrum, fisher_scale

MAX_HISTORY_EPOCHS = 100_000
"""Longest per-epoch history accepted when the round's epochs are not known."""
MAX_ABS_WEIGHT = 1e6
"""Largest absolute value a floating tensor of a train reply may hold."""
MAX_LOSS = 1e6
"""Largest training loss (nats) a reply's history or ``train-loss`` may hold (as large as the
largest weight; a finite 1e308 is no loss a model trained)."""
MAX_SECONDS = 1e7
"""Largest ``train-seconds`` / ``load-seconds`` a reply may report (about 116 days)."""
SCALAR_METRICS = {
    "train-loss": (0.0, MAX_LOSS),
    "train-accuracy": (0.0, 1.0),
    "train-seconds": (0.0, MAX_SECONDS),
    "load-seconds": (0.0, MAX_SECONDS),
}
"""The train reply's scalar metrics the server uses, with their allowed closed ranges (finite,
no NaN: :func:`screen_scalar_metrics`)."""
DEFAULT_MAX_SHARE = 0.5
"""Default largest share of one client in a deployment (``max-client-share``)."""
VARIANCE_TOLERANCE = 1e-6


# ----------------------------------------------------------------------------- numbers


def check_count(value: Any, what: str) -> float:
    """``value`` as a float if it is an integer-valued, finite number >= 1 (no bools)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScreenError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 1 or float(value) != math.floor(value):
        raise ScreenError(f"{what} must be an integer >= 1, got {value!r}")
    return float(value)


def check_partition_id(value: Any, num_partitions: int | None) -> int:
    """``value`` as an int if it is an integer (or integer-valued float) in range."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScreenError(f"partition-id must be an integer, got {value!r}")
    if value < 0 or (num_partitions is not None and value >= num_partitions):
        top = "" if num_partitions is None else f" .. {num_partitions - 1}"
        raise ScreenError(f"partition-id = {value}; allowed: 0{top}")
    return value


def partition_problems(claims: Sequence[tuple[int, int]]) -> dict[int, str]:
    """Index -> reason for every ``(partition id, node id)`` claim whose partition id another
    node also claims: every claimant is dropped, each named by its node with the others (the
    server cannot tell which is honest; keeping the first to arrive handed a partition to an
    impersonator that answered first and dropped the honest client)."""
    nodes: dict[int, list[int]] = {}
    for pid, node in claims:
        nodes.setdefault(pid, [])
        if node not in nodes[pid]:
            nodes[pid].append(node)
    problems: dict[int, str] = {}
    for index, (pid, node) in enumerate(claims):
        others = [str(n) for n in nodes[pid] if n != node]
        if others:
            problems[index] = (
                f"claims partition-id {pid}, which node {', '.join(others)} also claims (the "
                "server cannot tell which is honest: every claimant is dropped)"
            )
    return problems


# ----------------------------------------------------------------------------- train


@dataclass(frozen=True)
class Reference:
    """What the server sent: every array's shape and dtype (numpy names)."""

    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]

    @classmethod
    def of_record(cls, record: ArrayRecord) -> Reference | None:
        """The reference of ``record`` (``None`` for an empty record: no reference)."""
        if not len(record):
            return None
        shapes = {k: tuple(int(d) for d in a.shape) for k, a in record.items()}
        return cls(shapes, {k: str(np.dtype(a.dtype)) for k, a in record.items()})


@dataclass(frozen=True)
class ClientReferences:
    """What the server expects from each client when the clients differ (e.g. in width): per
    partition id a :class:`Reference` and a label naming what it is (``"width 0.5"``)."""

    references: Mapping[int, Reference]
    labels: Mapping[int, str]

    @classmethod
    def of_states(
        cls, states: Mapping[int, Mapping[str, Tensor]], labels: Mapping[int, str] | None = None
    ) -> ClientReferences:
        """Per partition id, the reference of a state dict of the architecture that client
        trains (e.g. a model built at its width; the values are not used)."""
        references = {
            int(pid): Reference(
                {k: tuple(int(d) for d in v.shape) for k, v in state.items()},
                {k: str(v.detach().cpu().numpy().dtype) for k, v in state.items()},
            )
            for pid, state in states.items()
        }
        return cls(references, dict(labels or {}))

    def of(self, partition_id: int) -> Reference:
        """The reference of ``partition_id``'s client; :class:`ScreenError` when it has none."""
        if partition_id not in self.references:
            known = sorted(self.references)
            raise ScreenError(
                f"partition-id = {partition_id}: no expected arrays for it; allowed: "
                f"{', '.join(str(p) for p in known)}"
            )
        return self.references[partition_id]

    def check(self, record: ArrayRecord, partition_id: int) -> None:
        """:func:`check_train_arrays` against ``partition_id``'s reference, the reason naming
        what the client should have sent (its label)."""
        try:
            check_train_arrays(record, self.of(partition_id))
        except ScreenError as err:
            label = self.labels.get(partition_id, "")
            where = f" ({label} for partition {partition_id})" if label else ""
            raise ScreenError(f"{err}{where}") from None


def _dtype_allowed(sent: np.dtype, expected: np.dtype) -> bool:
    if np.issubdtype(expected, np.floating):
        return bool(np.issubdtype(sent, np.floating))
    return sent == expected


def check_train_arrays(record: ArrayRecord, reference: Reference | None) -> None:
    """Keys, shapes and dtypes against ``reference``, then every array's payload
    (:func:`fedlmc.strategies.payload.check_record`: its bytes against its labels and the
    reply's total against the template's bound), before anything is decoded (module
    docstring); without a reference, only each payload against its own labels."""
    if reference is None:
        check_record(record)
        return
    if set(record.keys()) != set(reference.shapes):
        key = sorted(set(record.keys()) ^ set(reference.shapes))[0]
        raise ScreenError(f"wrong arrays: key {key!r} is missing or unexpected")
    for key, shape in reference.shapes.items():
        sent_shape = declared_shape(record[key], key)
        if sent_shape != shape:
            raise ScreenError(f"wrong shape: {key!r} has {sent_shape}, expected {shape}")
        sent, expected = declared_dtype(record[key], key), np.dtype(reference.dtypes[key])
        if not _dtype_allowed(sent, expected):
            kind = "a floating dtype" if np.issubdtype(expected, np.floating) else str(expected)
            raise ScreenError(f"wrong dtype: {key!r} is {sent}, expected {kind}")
    check_record(record, reference.shapes)


def check_weight_values(state: Mapping[str, Tensor], bound: float = MAX_ABS_WEIGHT) -> None:
    """Every floating tensor finite and at most ``bound`` in absolute value."""
    for key, tensor in state.items():
        if not tensor.is_floating_point() or tensor.numel() == 0:
            continue
        if not bool(torch.isfinite(tensor).all()):
            raise ScreenError(f"non-finite weights in {key!r}")
        largest = float(tensor.abs().max())
        if largest > bound:
            raise ScreenError(f"weights in {key!r} reach {largest:.3g}; allowed: |w| <= {bound:g}")


# ----------------------------------------------------------------------------- train history


def _history_list(values: Any, key: str, length: int | None) -> list[float]:
    if not isinstance(values, list) or not values:
        raise ScreenError(f"{key!r} must be a non-empty list of numbers, got {values!r:.60}")
    if length is not None and len(values) != length:
        raise ScreenError(f"{key!r} has {len(values)} values; allowed: {length} (the epochs)")
    if len(values) > MAX_HISTORY_EPOCHS:
        raise ScreenError(f"{key!r} has {len(values)} values; allowed: <= {MAX_HISTORY_EPOCHS}")
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        raise ScreenError(f"{key!r} must hold numbers only")
    if any(math.isinf(v) for v in values):
        raise ScreenError(f"infinite value in {key!r}; allowed: finite numbers or NaN")
    return [float(v) for v in values]


def screen_history(
    metrics: Mapping[str, Any], keys: Mapping[str, str], epochs: int | None
) -> dict[str, list[float]] | None:
    """The per-epoch history of a train reply's metrics (``keys``: field -> metric key, the
    ``train_loss`` and ``train_accuracy`` fields required together, others optional), or
    ``None`` when the reply sends none; raises :class:`ScreenError` (module docstring)."""
    present = {name: key for name, key in keys.items() if key in metrics}
    if not present:
        return None
    missing = [keys[n] for n in ("train_loss", "train_accuracy") if n not in present]
    if missing:
        raise ScreenError(f"history without {missing[0]!r}")
    history = {name: _history_list(metrics[key], key, epochs) for name, key in present.items()}
    lengths = {len(v) for v in history.values()}
    if len(lengths) > 1:
        raise ScreenError(f"history lists of different lengths {sorted(lengths)}")
    for name, values in history.items():
        low, high = (0.0, 1.0) if "accuracy" in name else (0.0, MAX_LOSS)
        if any(not low <= v <= high for v in values if not math.isnan(v)):
            raise ScreenError(f"{keys[name]!r} outside [{low:g}, {high:g}]")
    return history


def screen_scalar_metrics(metrics: dict[str, Any]) -> list[str]:
    """Remove from ``metrics`` every :data:`SCALAR_METRICS` value that is not a finite number in
    its range (no bools, no NaN); one reason per removed key (the client stays merged: its
    weights passed their own screen)."""
    problems = []
    for key, (low, high) in SCALAR_METRICS.items():
        if key not in metrics:
            continue
        value = metrics[key]
        number = not isinstance(value, bool) and isinstance(value, int | float)
        if not number or not math.isfinite(value) or not low <= value <= high:
            del metrics[key]
            shown = f"{value:.3g}" if number else f"{type(value).__name__}"
            problems.append(f"{key} = {shown}; allowed: a number in [{low:g}, {high:g}]")
    return problems


# ----------------------------------------------------------------------------- the weight bound


def bounded_shares(counts: Sequence[float], caps: Sequence[float]) -> list[float]:
    r"""Shares :math:`n_i / \sum n` with client ``i``'s share capped at ``caps[i]`` and the
    excess redistributed over the uncapped clients in proportion to their counts."""
    n = [float(c) for c in counts]
    if not n:
        return []
    if sum(caps) < 1 - 1e-12:
        raise ValueError(f"caps {list(caps)} sum to less than 1: no bounded shares exist")
    fixed: set[int] = set()
    while True:
        free = [i for i in range(len(n)) if i not in fixed]
        rest = 1.0 - sum(caps[i] for i in fixed)
        total = math.fsum(n[i] for i in free)
        tentative = {i: rest * n[i] / total for i in free} if total > 0 else {}
        over = {i for i, share in tentative.items() if share > caps[i] * (1 + 1e-12)}
        if not over:
            break
        fixed |= over
    shares = [caps[i] if i in fixed else tentative.get(i, 0.0) for i in range(len(n))]
    total = math.fsum(shares)
    return [s / total for s in shares]


@dataclass(frozen=True)
class WeightBound:
    """The documented bound on a client's weight (module docstring).

    ``sizes`` (simulation): per kind of count (``"train"`` for training examples and training
    data statistics, ``"calibration"`` for temperature replies), partition id -> the size the
    server knows; ``max_share`` is used otherwise (deployment).
    """

    max_share: float = DEFAULT_MAX_SHARE
    sizes: Mapping[str, Mapping[int, int]] | None = None

    def __post_init__(self) -> None:
        if not 0 < self.max_share <= 1:
            raise ValueError(f"max_client_share = {self.max_share!r}; allowed: 0 < share <= 1")

    def caps(self, partition_ids: Sequence[int], kind: str) -> list[float]:
        """Each client's largest share among ``partition_ids``."""
        known = (self.sizes or {}).get(kind)
        if known and all(p in known for p in partition_ids):
            total = sum(known[p] for p in partition_ids)
            if total > 0:
                return [known[p] / total for p in partition_ids]
        share = max(self.max_share, 1.0 / max(len(partition_ids), 1))
        return [share] * len(partition_ids)

    def shares(self, partition_ids: Sequence[int], counts: Sequence[float], kind: str):
        """The bounded shares of the claimed ``counts`` (:func:`bounded_shares`)."""
        return bounded_shares(counts, self.caps(partition_ids, kind))

    def factors(self, partition_ids: Sequence[int], counts: Sequence[float], kind: str):
        r""":math:`f_i = s'_i / s_i` (<= 1 up to rounding): what each client's sums are
        multiplied by."""
        total = math.fsum(float(c) for c in counts)
        shares = self.shares(partition_ids, counts, kind)
        return [s * total / float(c) for s, c in zip(shares, counts, strict=True)]


UNBOUNDED = WeightBound(max_share=1.0)
"""No bound (shares as claimed): in-process studies on trusted models."""


# ----------------------------------------------------------------------------- query replies


def _one(records: Mapping[str, Any], kind: str) -> Any:
    if len(records) != 1:
        raise ScreenError(f"expected exactly one {kind}, got {len(records)}")
    return next(iter(records.values()))


def _number_list(record: Mapping[str, Any], key: str, length: int) -> list[float]:
    values = record.get(key)
    values = [values] if isinstance(values, int | float) else values
    if not isinstance(values, list) or len(values) != length:
        raise ScreenError(f"{key!r} must be a list of {length} numbers, got {values!r:.80}")
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in values):
        raise ScreenError(f"{key!r} must hold numbers only")
    if not all(math.isfinite(v) for v in values):
        raise ScreenError(f"non-finite value in {key!r}")
    return [float(v) for v in values]


def screen_temperature_reply(
    content: RecordDict, record_names: Sequence[str], points: int
) -> dict[str, tuple[float, list[tuple[float, float, float]]]]:
    """Per stats record (``record_names``: ``["stats"]`` or ``["stats-0", ...]``): the count and
    per point ``(nll-sum, grad-sum, hess-sum)``; raises :class:`ScreenError`."""
    records = content.metric_records
    if set(records) != set(record_names):
        raise ScreenError(f"expected records {sorted(record_names)}, got {sorted(records)}")
    decoded = {}
    for name in record_names:
        record = records[name]
        counts = [check_count(c, "count") for c in _number_list(record, "count", points)]
        if len(set(counts)) > 1:
            raise ScreenError(f"counts differ between the log-t points of {name!r}")
        nll = _number_list(record, "nll-sum", points)
        if min(nll) < 0:
            raise ScreenError(f"negative nll-sum in {name!r}")
        grad = _number_list(record, "grad-sum", points)
        hess = _number_list(record, "hess-sum", points)
        decoded[name] = (counts[0], list(zip(nll, grad, hess, strict=True)))
    if len({count for count, _ in decoded.values()}) > 1:
        raise ScreenError("counts differ between the models of one temperature reply")
    return decoded


def screen_moments_reply(content: RecordDict, widths: Mapping[str, int]) -> None:
    """A ``query.bn_stats`` / ``query.unit_stats`` reply about the layers of ``widths``
    (layer -> units); raises :class:`ScreenError`."""
    arrays = _one(content.array_records, "ArrayRecord")
    counts = _one(content.metric_records, "MetricRecord")
    expected = {f"{layer}/{part}" for layer in widths for part in ("sum", "sum_sq")}
    if set(arrays) != expected:
        key = sorted(set(arrays) ^ expected)[0]
        raise ScreenError(f"wrong statistics: key {key!r} is missing or unexpected")
    for layer, width in widths.items():
        count = check_count(counts.get(f"{layer}/count"), f"{layer}/count")
        moments = []
        for part in ("sum", "sum_sq"):
            array = arrays[f"{layer}/{part}"]
            if not np.issubdtype(declared_dtype(array, f"{layer}/{part}"), np.floating):
                raise ScreenError(f"{layer}/{part} must be floating, got {array.dtype}")
            values = np.asarray(decode(array, f"{layer}/{part}", (width,)), dtype=np.float64)
            if not np.isfinite(values).all():
                raise ScreenError(f"non-finite values in {layer}/{part}")
            moments.append(values)
        mean, second = moments[0] / count, moments[1] / count
        if (moments[1] < 0).any() or (
            second - mean**2 < -VARIANCE_TOLERANCE * (1 + np.abs(second))
        ).any():
            raise ScreenError(f"{layer}: sums of squares below the squared sums (no variance)")


def screen_align_reply(
    content: RecordDict, group_sizes: Mapping[str, int], spec: PermutationSpec | None = None
) -> None:
    """A ``query.align`` reply for the spec's groups (group -> units), and, given the ``spec``,
    its block-structured groups (attention heads) moved as whole blocks, one block order per
    family (:func:`fedlmc.permutation.checked_permutations`); raises :class:`ScreenError`."""
    arrays = _one(content.array_records, "ArrayRecord")
    digest = _one(content.config_records, "ConfigRecord").get("state-digest")
    if not isinstance(digest, str):
        raise ScreenError("no state-digest string in the reply")
    expected = {f"perm/{g}" for g in group_sizes}
    if set(arrays) != expected:
        key = sorted(set(arrays) ^ expected)[0]
        raise ScreenError(f"wrong permutations: key {key!r} is missing or unexpected")
    for group, size in group_sizes.items():
        array = arrays[f"perm/{group}"]
        if not np.issubdtype(declared_dtype(array, f"perm/{group}"), np.integer):
            raise ScreenError(f"permutation of {group!r} must be integers, got {array.dtype}")
        values = np.asarray(decode(array, f"perm/{group}", (size,)))
        if not np.array_equal(np.sort(values), np.arange(size)):
            raise ScreenError(f"permutation of {group!r} is not one of 0 .. {size - 1}")
    if spec is not None and spec.blocks:
        perms = {g: torch.from_numpy(np.asarray(arrays[f"perm/{g}"].numpy())) for g in spec.blocks}
        try:
            checked_permutations(spec, perms, group_sizes)
        except ValueError as error:
            raise ScreenError(str(error)) from None


def screen_statistics_reply(
    content: RecordDict, shapes: Mapping[str, tuple[int, ...]], kind: str
) -> Summary:
    """A ``query.fisher`` (``kind = "fisher"``) or ``query.gram`` (``"gram"``) reply holding the
    tensors of ``shapes`` (name -> shape), a Gram matrix positive semi-definite
    (:func:`fedlmc.strategies.statistics_screen.check_gram_spectrum`); raises
    :class:`ScreenError`. Returns each tensor's scale, for the comparison with the other clients'
    (:func:`fedlmc.strategies.statistics_screen.statistics_outliers`)."""
    summary: Summary = {}
    arrays = _one(content.array_records, "ArrayRecord")
    digest = _one(content.config_records, "ConfigRecord").get("state-digest")
    if not isinstance(digest, str):
        raise ScreenError("no state-digest string in the reply")
    expected = {f"stat/{name}" for name in shapes}
    if set(arrays) != expected:
        key = sorted(set(arrays) ^ expected)[0]
        raise ScreenError(f"wrong statistics: key {key!r} is missing or unexpected")
    for name, shape in shapes.items():
        array, key = arrays[f"stat/{name}"], f"stat/{name}"
        if not np.issubdtype(declared_dtype(array, key), np.floating):
            raise ScreenError(f"{name} must be floating, got {array.dtype}")
        if tuple(array.shape) != tuple(shape):
            raise ScreenError(f"{name} has shape {tuple(array.shape)}, want {tuple(shape)}")
        sent = decode(array, key, tuple(shape))
        values = np.asarray(sent, dtype=np.float64)
        if not np.isfinite(values).all():
            raise ScreenError(f"non-finite values in {name}")
        if kind == "fisher" and (values < 0).any():
            raise ScreenError(f"negative Fisher entries in {name}")
        scale = 1 + np.abs(values).max(initial=0.0)
        if kind == "gram" and (
            np.abs(values - values.T).max(initial=0.0) > VARIANCE_TOLERANCE * scale
            or (np.diagonal(values) < 0).any()
        ):
            raise ScreenError(f"{name} is no Gram matrix (not symmetric, or a negative diagonal)")
        if kind == "gram":  # the spectrum in the precision sent (float32: half the traffic)
            own = np.asarray(sent, np.float32) if sent.dtype.itemsize <= 4 else values
            summary[name] = check_gram_spectrum(name, torch.from_numpy(own))
        else:
            summary[name] = fisher_scale(torch.from_numpy(values))
    return summary
