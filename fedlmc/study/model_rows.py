r"""The rows of one merged model: its raw row and, calibrated, its ``_t`` row; one evaluator.

Every merged model's metric columns come from :func:`metric_row`: the model's test logits
:math:`z` (:class:`~fedlmc.study.context.Predictions`, predicted once), test ``accuracy``,
``nll_raw``/``ece_raw`` of :math:`\mathrm{softmax}(z)` and ``nll_calibrated``/``ece_calibrated``
of :math:`\mathrm{softmax}(z / T)`; the raw row has ``temperature = 1`` and ``nll``/``ece`` =
the raw ones, the ``_t`` row ``temperature = T`` and ``nll``/``ece`` = the calibrated ones
(:func:`fedlmc.study.rows.metric_columns`). :math:`T` never changes the accuracy. The study
(:func:`fedlmc.study.compare_methods`, :math:`T` fitted on the server split) and every mode of
the ServerApp (the clear ``average``/``aligned``, SecAgg+, DP, FedAvg, where :math:`T` is the
strategy's: fitted on the server split or on the clients' held-out data) build their rows with
it; the ServerApp's through :func:`merge_rows`, which adds the clients' endpoint and merge-gap
columns (:func:`endpoint_metrics`) and the flags.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from fedlmc.averaging import load_state
from fedlmc.evaluation import resolve_device
from fedlmc.merging.method_registry import CALIBRATED_SUFFIX
from fedlmc.study.barriers import gap_columns
from fedlmc.study.context import Predictions
from fedlmc.study.flags import flag_columns
from fedlmc.study.rows import empty_row, endpoint_columns, metric_columns

if TYPE_CHECKING:
    from fedlmc.data.loading import DataSplits

StateDict = dict[str, Tensor]

__all__ = ["endpoint_metrics", "merge_rows", "metric_row"]


def metric_row(
    method: str,
    num_clients: int,
    metrics: Mapping[str, float],
    temperature: float,
    *,
    calibrated: bool,
) -> dict[str, Any]:
    """A row of every column (:func:`fedlmc.study.rows.empty_row`) with the metric columns of
    ``metrics`` (:meth:`~fedlmc.study.context.Predictions.metrics`, the calibrated ones at
    ``temperature``); ``calibrated``: the ``_t`` row's ``nll``, ``ece`` and ``temperature``."""
    row = empty_row(method, num_clients)
    row.update(metric_columns(metrics, calibrated, temperature))
    return row


def merge_rows(
    method: str,
    model: nn.Module,
    splits: DataSplits,
    *,
    device: str | torch.device | None = None,
    num_clients: int = 1,
    calibrated: bool = False,
    temperature: float | None = None,
    temperature_server_split: float | None = None,
    endpoints: Sequence[Mapping[str, float]] = (),
) -> list[dict[str, Any]]:
    """The rows of one merged ``model`` named ``method``: the raw row and, when ``calibrated``,
    the ``<method>_t`` row at ``temperature`` (default: :math:`T` fitted on the server split),
    with ``temperature_server_split`` last when given. Both rows: test metrics
    (:func:`metric_row`), the flags (:func:`fedlmc.study.flags.flag_columns`) and, with
    ``endpoints`` (the clients' own metrics, :func:`endpoint_metrics`), the endpoint and
    merge-gap columns (the ``_t`` row's calibrated gap at its ``temperature``); barrier and
    diagnostic columns are NaN. The model is evaluated once, on a copy on ``device``."""
    if not isinstance(method, str) or not method:
        raise ValueError(f"method must be a non-empty string, got {method!r}")
    dev = resolve_device(device)
    pred = Predictions.of(copy.deepcopy(model).to(dev).eval(), splits, dev)
    labels = splits.test[1]
    rows = [metric_row(method, num_clients, pred.metrics(labels), 1.0, calibrated=False)]
    if calibrated:
        at = pred.temperature if temperature is None else float(temperature)
        name = f"{method}{CALIBRATED_SUFFIX}"
        rows.append(metric_row(name, num_clients, pred.metrics(labels, at), at, calibrated=True))
    for row in rows:
        row.update(flag_columns(row, splits.num_classes, len(labels)))
        if endpoints:
            row.update(endpoint_columns(endpoints))
            row.update(gap_columns(endpoints, row))
    if calibrated and temperature_server_split is not None:
        row = rows[-1]  # the _t row
        row["temperature_server_split"] = temperature_server_split
    return rows


def endpoint_metrics(
    templates: Sequence[nn.Module],
    states: Sequence[StateDict],
    splits: DataSplits,
    device: torch.device,
) -> list[dict[str, float]]:
    """Test metrics of the clients' own models, each loaded into its template (its width's)
    (:meth:`fedlmc.study.context.Predictions.metrics`); none without states."""
    if not states or not states[0]:
        return []
    return [
        Predictions.of(load_state(model, sd).to(device).eval(), splits, device).metrics(
            splits.test[1]
        )
        for model, sd in zip(templates, states, strict=True)
    ]
