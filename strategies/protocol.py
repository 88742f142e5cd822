"""The client/server protocol: how weights, metrics and query answers travel as Flower records.

Both sides import this module: the ClientApp encodes, the strategies decode.

Keys a strategy adds to a message. The fedlmc strategies put into their messages' ConfigRecord
only the caller's ``train_config`` (a ServerApp's own keys, passed through untouched) and the
keys below, set from the strategy's own arguments (:class:`fedlmc.strategies.StrategyOptions`,
the merge method); a ClientApp reads these, never the run config, to decide what to hold out
and what to keep. A client that does not know a key may ignore it (a plain Flower ClientApp
that trains and replies with ``arrays`` and ``num-examples`` works with the strategies whose
features need no query round: :data:`PROTOCOL_KEYS`).

| key | carried by | meaning |
|---|---|---|
| ``server-round`` (:data:`SERVER_ROUND_KEY`) | ``train`` | the round (1, 2, ...) |
| ``holdout-share`` (:data:`HOLDOUT_SHARE_KEY`) | ``train`` and every query after it | the \
share of its partition the client holds out from training (stratified, the same split in every \
message) and answers ``query.temperature`` on; absent: 0 (in-sample calibration) |
| ``keep-model`` (:data:`KEEP_MODEL_KEY`) | ``train`` and every query after it | keep the \
trained weights for later queries about them: ``one-query`` (dropped after the first, one \
merge) or ``several-queries`` (a study's several methods); absent: keep nothing |
| ``log-t`` | ``query.temperature`` | the values of ``log T`` to evaluate |
| ``layers`` | ``query.unit_stats``, ``query.gram`` | the layers asked about |

What a client must answer, by feature (a feature the strategy does not use sends none of its
queries):

- every strategy: ``train``, replying with one ArrayRecord and a MetricRecord holding
  ``num-examples`` (``partition-id`` too where partitions are screened by id);
- federated temperature (``calibration = "federated"``): ``query.temperature`` on the
  ``holdout-share`` held out at training (``auto`` under federated calibration asks it too,
  about several models in one message);
- BatchNorm statistics (``calibration = "federated"`` and a model with BatchNorm):
  ``query.bn_stats``; REPAIR methods under federated calibration: ``query.unit_stats``;
- activation matching on the clients (``activation_federated``): keep the model when
  ``keep-model`` says so, answer ``query.align``; Fisher merging / RegMean on the clients:
  the same with ``query.fisher`` / ``query.gram``.

With ``calibration = "server"`` or ``"none"`` and a merge method that runs on the server
(``average``, ``weight_matching``, ``activation_matching``, ...) no query round runs.

Message types:

- ``train`` (Flower's): ``RecordDict({"arrays": ArrayRecord, "config": ConfigRecord})`` in; the
  reply carries one ArrayRecord (the trained weights) and one MetricRecord with at least
  ``num-examples`` and ``partition-id`` (:data:`NUM_EXAMPLES_KEY`, :data:`PARTITION_KEY`), and,
  from fedlmc's ClientApp, the per-epoch training history as float lists in the same record
  (:data:`HISTORY_KEYS`, :func:`history_metrics`: 8 bytes per epoch and list).
- ``query.temperature`` (:data:`TEMPERATURE_QUERY`): the merged weights and a ``log-t`` list in;
  per value, the client's sample count and summed NLL, dNLL/du, d2NLL/du2
  (:func:`temperature_stats_to_content`). Several models may travel in one query
  (``model-0``, ``model-1``, ... :func:`models_query_content`); the reply then holds one
  ``stats-<k>`` record per model (:func:`temperature_stats_by_model`).
- ``query.bn_stats`` (:data:`BN_QUERY`): the merged weights in; per BatchNorm layer, sums, sums of
  squares and counts of its inputs (:func:`bn_stats_to_content`).
- ``query.unit_stats`` (:data:`UNIT_STATS_QUERY`, REPAIR): a model and a ``layers`` list in; per
  layer, per-unit sums, sums of squares and the count of its outputs
  (:func:`unit_stats_to_content`).
- ``query.align`` (:data:`ALIGN_QUERY`, client-side activation matching): the reference model in;
  the permutations of the client's own trained model (int32 index arrays, one per group) and the
  SHA-256 digest of the weights they apply to (:func:`permutations_to_content`).
- ``query.fisher`` (:data:`FISHER_QUERY`, Fisher merging) and ``query.gram`` (:data:`GRAM_QUERY`,
  RegMean, with a ``layers`` list): nothing but the config in; the diagonal Fisher of the
  client's own trained model (one float array per parameter) or the Gram matrices of the
  layers' inputs (one ``in x in`` float array per layer), the digest of the weights they were
  computed on and the sample count (:func:`statistics_to_content`).

Sizes: :func:`tensor_bytes` counts a record's tensors; :func:`payload_bytes` a whole reply (its
tensors plus 8 bytes per metric number), which is what the strategies count for query replies.

A failed client replies with a Flower ``Error`` whose code is :data:`ERROR_TRAIN_FAILED` or
:data:`ERROR_QUERY_FAILED` and whose reason starts with ``partition-id=P:``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

if TYPE_CHECKING:  # torch and the statistics' types are imported where a function needs them:
    # every ClientApp process imports this module, and a message that needs no tensor (a
    # SecAgg+ key exchange) then starts without torch
    from torch import Tensor

    from fedlmc.merging.calibrate import BNStats, TemperatureStats
    from fedlmc.merging.repair import UnitStats

StateDict = dict[str, "Tensor"]
Shapes = dict[str, tuple[int, ...]]

PARTITION_RECORD = "partition"
"""The ConfigRecord the sweep engine adds to every message of a cell (its ``partition-id`` and
``num-partitions``); the ClientApp prefers it to its node config."""
PARTITION_KEY = "partition-id"
SERVER_ROUND_KEY = "server-round"
HOLDOUT_SHARE_KEY = "holdout-share"
"""The share of its partition a client holds out from training for federated calibration."""
KEEP_MODEL_KEY = "keep-model"
"""The client keeps its trained weights for later queries about them (:data:`KEEP_CHOICES`)."""
KEEP_ONE_QUERY = "one-query"
KEEP_SEVERAL_QUERIES = "several-queries"
KEEP_CHOICES = (KEEP_ONE_QUERY, KEEP_SEVERAL_QUERIES)
"""The values of :data:`KEEP_MODEL_KEY`: dropped after the first query that reads the model (one
merge), or kept (bounded) for a study whose several methods query it."""
PROTOCOL_KEYS = frozenset({SERVER_ROUND_KEY, HOLDOUT_SHARE_KEY, KEEP_MODEL_KEY})
"""Every key a fedlmc strategy adds to a train message's ConfigRecord (the module docstring)."""
QUERY_KEYS = frozenset({"log-t", "layers"})
"""The keys a query adds to the train config it carries."""
NUM_PARTITIONS_KEY = "num-partitions"
NUM_EXAMPLES_KEY = "num-examples"
ERROR_TRAIN_FAILED = 1001
ERROR_QUERY_FAILED = 1002
TEMPERATURE_QUERY = "temperature"
BN_QUERY = "bn_stats"
UNIT_STATS_QUERY = "unit_stats"
ALIGN_QUERY = "align"
FISHER_QUERY = "fisher"
GRAM_QUERY = "gram"
DIGEST_KEY = "state-digest"
MODEL_PREFIX = "model-"
HISTORY_KEYS = {
    "train_loss": "epoch-train-loss",
    "train_accuracy": "epoch-train-accuracy",
    "calibration_loss": "epoch-calibration-loss",
}
"""Per-epoch history field -> its list-valued key in a train reply's MetricRecord: mean training
loss and accuracy of each epoch (required together), and the mean loss on the client's held-out
calibration share after each epoch (only when the client holds one out)."""


def holdout_share(config: Mapping[str, Any]) -> float:
    """The share a message's config tells the client to hold out (:data:`HOLDOUT_SHARE_KEY`; 0
    when absent); ``ValueError`` naming a value outside ``[0, 1)``."""
    share = config.get(HOLDOUT_SHARE_KEY, 0.0)
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share < 1:
        raise ValueError(f"{HOLDOUT_SHARE_KEY} = {share!r}; allowed: a number in [0, 1)")
    return float(share)


def keep_model(config: Mapping[str, Any]) -> str | None:
    """What a message's config tells the client to do with its trained weights
    (:data:`KEEP_MODEL_KEY`: one of :data:`KEEP_CHOICES`; ``None`` when absent: keep nothing);
    ``ValueError`` naming any other value."""
    keep = config.get(KEEP_MODEL_KEY)
    if keep is not None and keep not in KEEP_CHOICES:
        raise ValueError(f"{KEEP_MODEL_KEY} = {keep!r}; allowed: {', '.join(KEEP_CHOICES)}")
    return keep


def state_to_record(state: Mapping[str, Tensor]) -> ArrayRecord:
    """A torch state dict as an ArrayRecord (tensors copied to the CPU)."""
    return ArrayRecord({k: v.detach().cpu() for k, v in state.items()})


def record_to_state(record: ArrayRecord) -> StateDict:
    """An ArrayRecord as a torch state dict (CPU tensors owning their memory)."""
    import torch

    return {k: torch.from_numpy(np.array(a.numpy(), copy=True)) for k, a in record.items()}


def tensor_bytes(record: ArrayRecord) -> int:
    """Bytes of the tensors in ``record`` (elements x item size, without serialisation headers)."""
    return sum(
        int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize for a in record.values()
    )


def payload_bytes(content: RecordDict) -> int:
    """Bytes of a message's content: its tensors (:func:`tensor_bytes`) plus 8 bytes per metric
    number (a list counts each element); config records are not counted."""
    metric_numbers = sum(
        len(v) if isinstance(v, list) else 1
        for record in content.metric_records.values()
        for v in record.values()
    )
    return sum(tensor_bytes(r) for r in content.array_records.values()) + 8 * metric_numbers


def state_digest(state: Mapping[str, Tensor]) -> str:
    """SHA-256 over the keys, dtypes, shapes and bytes of a state dict (sorted by key): both sides
    of ``query.align`` check that a permutation is applied to the weights it was computed on."""
    digest = hashlib.sha256()
    for key in sorted(state):
        array = np.ascontiguousarray(state[key].detach().cpu().numpy())
        digest.update(f"{key}|{array.dtype}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def single_record(records: Mapping[str, Any], kind: str) -> Any:
    """The only record of a RecordDict view; ``ValueError`` if there are none or several."""
    if len(records) != 1:
        raise ValueError(f"expected exactly one {kind}, got {len(records)}")
    return next(iter(records.values()))


def query_content(arrays: ArrayRecord, config: Mapping[str, Any]) -> RecordDict:
    """A query payload: model arrays under ``"arrays"``, a ConfigRecord under ``"config"``."""
    return RecordDict({"arrays": arrays, "config": ConfigRecord(dict(config))})


def models_query_content(models: Sequence[ArrayRecord], config: Mapping[str, Any]) -> RecordDict:
    """A query about several models: ``model-0``, ``model-1``, ... and a ConfigRecord."""
    records: dict[str, Any] = {f"{MODEL_PREFIX}{k}": arrays for k, arrays in enumerate(models)}
    return RecordDict({**records, "config": ConfigRecord(dict(config))})


def query_models(content: RecordDict) -> list[ArrayRecord]:
    """The models a query is about, in order: ``model-0``, ``model-1``, ... or its one record."""
    records = content.array_records
    numbered = sorted(
        (int(key[len(MODEL_PREFIX) :]), record)
        for key, record in records.items()
        if key.startswith(MODEL_PREFIX)
    )
    if numbered:
        return [record for _, record in numbered]
    return [next(iter(records.values()))]


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


def history_metrics(
    train_loss: Sequence[float],
    train_accuracy: Sequence[float],
    calibration_loss: Sequence[float] = (),
) -> dict[str, list[float]]:
    """The per-epoch history of a train reply as MetricRecord list values (:data:`HISTORY_KEYS`);
    ``calibration_loss`` is left out when empty (no held-out share)."""
    values = {"train_loss": train_loss, "train_accuracy": train_accuracy}
    if len(calibration_loss):
        values["calibration_loss"] = calibration_loss
    return {HISTORY_KEYS[name]: [float(v) for v in seq] for name, seq in values.items()}


# ----------------------------------------------------------------------------- query payloads


def _temperature_record(stats: Sequence[TemperatureStats], extra: Mapping[str, int]):
    record = MetricRecord({k: int(v) for k, v in extra.items()})
    record["count"] = [int(st.count) for st in stats]
    record["nll-sum"] = [float(st.nll_sum) for st in stats]
    record["grad-sum"] = [float(st.grad_sum) for st in stats]
    record["hess-sum"] = [float(st.hess_sum) for st in stats]
    return record


def _temperature_stats(record: MetricRecord) -> list[TemperatureStats]:
    from fedlmc.merging.calibrate import TemperatureStats

    columns = [record["count"], record["nll-sum"], record["grad-sum"], record["hess-sum"]]
    return [
        TemperatureStats(int(c), float(n), float(g), float(h))
        for c, n, g, h in zip(*columns, strict=True)
    ]


def temperature_stats_to_content(
    stats: Sequence[TemperatureStats] | Sequence[Sequence[TemperatureStats]],
    extra: Mapping[str, int],
    *,
    per_model: bool = False,
) -> RecordDict:
    """A ``query.temperature`` reply: per requested log T, lists ``count``, ``nll-sum``,
    ``grad-sum``, ``hess-sum`` (the same order as the ``log-t`` list of the query), in a record
    ``stats``; with ``per_model``, ``stats`` is one such list per model, in records
    ``stats-0``, ``stats-1``, ..."""
    if not per_model:
        return RecordDict({"stats": _temperature_record(stats, extra)})
    return RecordDict(
        {f"stats-{k}": _temperature_record(model, extra) for k, model in enumerate(stats)}
    )


def temperature_stats_from_content(content: RecordDict) -> list[TemperatureStats]:
    """Decode a one-model ``query.temperature`` reply (inverse of
    :func:`temperature_stats_to_content`)."""
    return _temperature_stats(single_record(content.metric_records, "MetricRecord"))


def temperature_stats_by_model(content: RecordDict) -> list[list[TemperatureStats]]:
    """Decode a ``query.temperature`` reply about one or several models: per model, the
    statistics at each requested log T."""
    records = content.metric_records
    if "stats" in records:
        return [_temperature_stats(records["stats"])]
    numbered = sorted((int(key.split("-", 1)[1]), record) for key, record in records.items())
    return [_temperature_stats(record) for _, record in numbered]


def moments_to_content(
    stats: Mapping[str, BNStats | UnitStats], extra: Mapping[str, int]
) -> RecordDict:
    """A moments reply (``query.bn_stats``, ``query.unit_stats``): arrays ``<layer>/sum``,
    ``<layer>/sum_sq`` (float64) and metrics ``<layer>/count``."""
    arrays = ArrayRecord()
    counts: dict[str, int] = {k: int(v) for k, v in extra.items()}
    for name, st in stats.items():
        arrays[f"{name}/sum"] = Array(st.sum.double().cpu().numpy())
        arrays[f"{name}/sum_sq"] = Array(st.sum_sq.double().cpu().numpy())
        counts[f"{name}/count"] = int(st.count)
    return RecordDict({"moments": arrays, "counts": MetricRecord(counts)})


def moments_from_content(content: RecordDict, kind: Callable[..., Any]) -> dict[str, Any]:
    """Decode a moments reply into ``kind(sum=, sum_sq=, count=)`` per layer (inverse of
    :func:`moments_to_content`)."""
    import torch

    arrays = single_record(content.array_records, "ArrayRecord")
    counts = single_record(content.metric_records, "MetricRecord")
    layers = sorted({key.rsplit("/", 1)[0] for key in arrays})
    return {
        name: kind(
            sum=torch.from_numpy(arrays[f"{name}/sum"].numpy().copy()).double(),
            sum_sq=torch.from_numpy(arrays[f"{name}/sum_sq"].numpy().copy()).double(),
            count=int(counts[f"{name}/count"]),
        )
        for name in layers
    }


def bn_stats_to_content(stats: Mapping[str, BNStats], extra: Mapping[str, int]) -> RecordDict:
    """A ``query.bn_stats`` reply (:func:`moments_to_content`)."""
    return moments_to_content(stats, extra)


def bn_stats_from_content(content: RecordDict) -> dict[str, BNStats]:
    """Decode a ``query.bn_stats`` reply (inverse of :func:`bn_stats_to_content`)."""
    from fedlmc.merging.calibrate import BNStats

    return moments_from_content(content, BNStats)


def unit_stats_to_content(stats: Mapping[str, UnitStats], extra: Mapping[str, int]) -> RecordDict:
    """A ``query.unit_stats`` reply (:func:`moments_to_content`)."""
    return moments_to_content(stats, extra)


def unit_stats_from_content(content: RecordDict) -> dict[str, UnitStats]:
    """Decode a ``query.unit_stats`` reply (inverse of :func:`unit_stats_to_content`)."""
    from fedlmc.merging.repair import UnitStats

    return moments_from_content(content, UnitStats)


def permutations_to_content(
    perms: Mapping[str, Tensor], digest: str, extra: Mapping[str, int]
) -> RecordDict:
    """A ``query.align`` reply: one int32 index array per group (``perm/<group>``), the digest of
    the weights they permute and ``extra`` metrics."""
    arrays = ArrayRecord(
        {f"perm/{g}": Array(p.detach().cpu().numpy().astype(np.int32)) for g, p in perms.items()}
    )
    return RecordDict(
        {
            "perms": arrays,
            "digest": ConfigRecord({DIGEST_KEY: digest}),
            "metrics": metric_record(extra),
        }
    )


def permutations_from_content(content: RecordDict) -> tuple[dict[str, Tensor], str]:
    """Decode a ``query.align`` reply: ``({group: int64 indices}, digest)``."""
    import torch

    arrays = single_record(content.array_records, "ArrayRecord")
    digest = single_record(content.config_records, "ConfigRecord")[DIGEST_KEY]
    perms = {
        key.split("/", 1)[1]: torch.from_numpy(a.numpy().astype(np.int64))
        for key, a in arrays.items()
    }
    return perms, str(digest)


def statistics_to_content(
    tensors: Mapping[str, Tensor], digest: str, extra: Mapping[str, int]
) -> RecordDict:
    """A ``query.fisher`` / ``query.gram`` reply: the tensors (``stat/<name>``, float32), the
    digest of the weights they were computed on and ``extra`` metrics."""
    arrays = ArrayRecord(
        {f"stat/{k}": Array(v.detach().cpu().float().numpy()) for k, v in tensors.items()}
    )
    return RecordDict(
        {
            "statistics": arrays,
            "digest": ConfigRecord({DIGEST_KEY: digest}),
            "metrics": metric_record(extra),
        }
    )


def statistics_from_content(content: RecordDict) -> tuple[dict[str, Tensor], str]:
    """Decode a ``query.fisher`` / ``query.gram`` reply: ``({name: float32 tensor}, digest)``."""
    import torch

    arrays = single_record(content.array_records, "ArrayRecord")
    digest = single_record(content.config_records, "ConfigRecord")[DIGEST_KEY]
    tensors = {
        key.split("/", 1)[1]: torch.from_numpy(np.array(a.numpy(), copy=True))
        for key, a in arrays.items()
    }
    return tensors, str(digest)
