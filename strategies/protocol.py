"""The client/server protocol: how weights, metrics and query answers travel as Flower records.

Both sides import this module: the ClientApp encodes, the strategies decode. Message types:

- ``train`` (Flower's): ``RecordDict({"arrays": ArrayRecord, "config": ConfigRecord})`` in; the
  reply carries one ArrayRecord (the trained weights) and one MetricRecord with at least
  ``num-examples`` and ``partition-id`` (:data:`NUM_EXAMPLES_KEY`, :data:`PARTITION_KEY`).
- ``query.temperature`` (:data:`TEMPERATURE_QUERY`): the merged weights and a ``log-t`` list in;
  per value, the client's sample count and summed NLL, dNLL/du, d2NLL/du2
  (:func:`temperature_stats_to_content`).
- ``query.bn_stats`` (:data:`BN_QUERY`): the merged weights in; per BatchNorm layer, sums, sums of
  squares and counts of its inputs (:func:`bn_stats_to_content`).

A failed client replies with a Flower ``Error`` whose code is :data:`ERROR_TRAIN_FAILED` or
:data:`ERROR_QUERY_FAILED` and whose reason starts with ``partition-id=P:``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from torch import Tensor

from fedlmc.calibrate import BNStats, TemperatureStats

StateDict = dict[str, Tensor]
Shapes = dict[str, tuple[int, ...]]

PARTITION_KEY = "partition-id"
NUM_PARTITIONS_KEY = "num-partitions"
NUM_EXAMPLES_KEY = "num-examples"
ERROR_TRAIN_FAILED = 1001
ERROR_QUERY_FAILED = 1002
TEMPERATURE_QUERY = "temperature"
BN_QUERY = "bn_stats"


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
