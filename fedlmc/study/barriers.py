r"""The columns measured on paths: the merge gap, barriers on interpolation paths.

- :func:`gap_columns`: the merged model against the mean of the endpoints
  (:func:`fedlmc.analysis.paths.merge_gap`, ``merge_gap_*``), every row.
- :func:`curve_columns` (two clients): the path
  :math:`\theta(\lambda) = \lambda \theta_1 + (1-\lambda) \pi(\theta_2)` on the method's path
  rule, its barriers signed at :math:`\lambda = 1/2` (``*_barrier_half``, the paper's Table 1)
  and their maximum over the path (``*_barrier_max``), the temperature refitted at each
  :math:`\lambda` and LEWC's prediction of it.
- :func:`client_barrier_columns` (more clients): barriers on each client's path to the merge.
- :func:`pairwise_barrier_columns` (more clients, up to a few): the N x N barrier at
  :math:`\lambda = 1/2` between the clients in the merge's basis.

Every path is evaluated on the test split with the temperature refitted on the server split at
every point and post-processed like the merge (BatchNorm statistics re-estimated, or every
interior point repaired). Column definitions: :mod:`fedlmc.study.rows`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn

from fedlmc.analysis.paths import (
    barriers,
    interpolation_curve,
    lewc_temperature_path,
    logit_point_metrics,
    merge_gap,
    path_clients,
)
from fedlmc.study.context import StudyContext
from fedlmc.study.merge import Merged
from fedlmc.study.rows import curve_json, json_list

__all__ = [
    "client_barrier_columns",
    "curve_columns",
    "gap_columns",
    "pairwise_barrier_columns",
    "path_kwargs",
]


def gap_columns(
    endpoints: Sequence[Mapping[str, float]], merged: Mapping[str, float]
) -> dict[str, float]:
    """``merge_gap_*`` columns: the merged model against the mean of the endpoints
    (:func:`fedlmc.analysis.paths.merge_gap`; metrics dicts as
    :meth:`fedlmc.study.context.Predictions.metrics` gives)."""
    gap = merge_gap([_gap_inputs(e) for e in endpoints], _gap_inputs(merged))
    return {
        "merge_gap_accuracy": gap["accuracy_gap"],
        "merge_gap_loss": gap["loss_gap"],
        "merge_gap_loss_calibrated": gap["loss_gap_calibrated"],
    }


def _gap_inputs(metrics: Mapping[str, float]) -> dict[str, float]:
    """The keys :func:`fedlmc.analysis.paths.merge_gap` reads."""
    return {
        "accuracy": metrics["accuracy"],
        "nll": metrics["nll_raw"],
        "nll_calibrated": metrics["nll_calibrated"],
    }


def path_kwargs(context: StudyContext, merged: Merged) -> dict[str, Any]:
    """What every path of a merge is evaluated with: temperatures refitted on the server split,
    and the merge's own post-processing at every point (BatchNorm statistics re-estimated, or
    every interior point repaired)."""
    server = context.splits.server
    return {
        "calibration": server,
        "bn_data": server if merged.bn_reset else None,
        "repair_data": server[0] if merged.repaired else None,
    }


def _curve(context: StudyContext, merged: Merged, sd_a, sd_b, lambdas, path=None):
    """The interpolation curve from ``sd_b`` to ``sd_a`` on the test split (see the module
    docstring), on ``path`` (default: the linear interpolation)."""
    return interpolation_curve(
        context.template,
        sd_a,
        sd_b,
        context.splits.test,
        lambdas=lambdas,
        device=context.device,
        path=path,
        point=_shared_point(context),
        **path_kwargs(context, merged),
    )


def _shared_point(context: StudyContext) -> Callable[[nn.Module], dict[str, float]] | None:
    """With the context's ``forwards`` cache, a path point's metrics from
    :meth:`~fedlmc.study.context.StudyContext.predict`: a model the study evaluated already (an
    endpoint, the merge, another method's path through the same points) is not run again.
    ``None`` without the cache (:func:`fedlmc.analysis.paths.point_metrics`). The path's
    calibration split is the server split, which ``predict`` fits its temperature on."""
    if context.forwards is None:
        return None
    labels = context.splits.test[1]

    def point(model: nn.Module) -> dict[str, float]:
        found = context.predict(model)
        return logit_point_metrics(found.test, labels, found.temperature)

    return point


def _half_and_max(curve) -> dict[str, float]:
    """Loss barriers (raw, calibrated) of a curve: signed at lambda = 1/2, and the maximum."""
    found = barriers(curve)
    return {
        "half": float(found["loss_barrier_at_half"]),
        "half_calibrated": float(found["loss_barrier_calibrated_at_half"]),
        "max": float(found["loss_barrier"]),
        "max_calibrated": float(found["loss_barrier_calibrated"]),
    }


def curve_columns(context: StudyContext, merged: Merged, lewc_depth: int = 0) -> dict[str, Any]:
    """Barriers at lambda = 1/2 (signed) and their maximum over the path between client 0 and
    the aligned client 1 (two clients only), on the method's path rule; the temperature fitted at
    each lambda and, with ``lewc_depth`` L > 0 (where LEWC is defined), LEWC's prediction of it
    (:func:`fedlmc.analysis.paths.lewc_temperature_path`)."""
    a, b = merged.aligned[0], merged.aligned[1]
    curve = _curve(context, merged, a, b, context.lambdas, merged.path)
    found = barriers(curve)
    columns: dict[str, Any] = {
        "curve": curve_json(curve),
        "temperature_path": json_list(curve["temperature"]),
    }
    if lewc_depth > 0:
        columns["temperature_path_lewc"] = json_list(lewc_temperature_path(curve, lewc_depth))
    for name in ("accuracy_barrier", "loss_barrier", "loss_barrier_calibrated"):
        head, _, tail = name.partition("_barrier")
        columns[f"{head}_barrier_half{tail}"] = float(found[f"{name}_at_half"])
        columns[f"{head}_barrier_max{tail}"] = float(found[name])
    return columns


def client_barrier_columns(context: StudyContext, merged: Merged) -> dict[str, float]:
    r"""Barriers on each client's path to the merge, :math:`\lambda \pi_i(\theta_i) +
    (1-\lambda)\bar\theta` (post-processed like the merge at every point): mean and worst over
    the clients of :func:`fedlmc.analysis.paths.path_clients` (every client up to 16,
    else that many evenly spaced ones). They measure the shape of the path from a client to the
    merge, not the merge's quality (that is ``merge_gap_*``); columns in
    :mod:`fedlmc.study.rows`."""
    clients = (merged.aligned[i] for i in path_clients(len(merged.aligned)))
    per_client = [
        _half_and_max(_curve(context, merged, client, merged.state, context.lambdas))
        for client in clients
    ]
    columns = {}
    for key in per_client[0]:
        values = [found[key] for found in per_client]
        columns[f"client_to_merge_path_loss_barrier_{key}_mean"] = sum(values) / len(values)
        columns[f"client_to_merge_path_loss_barrier_{key}_worst"] = max(values)
    return columns


def pairwise_barrier_columns(context: StudyContext, merged: Merged) -> dict[str, str]:
    """The N x N loss barrier at lambda = 1/2 between the clients in the merge's basis, on the
    method's path rule and post-processed like the merge (raw and calibrated; JSON matrices,
    symmetric, 0 on the diagonal)."""
    count = len(merged.aligned)
    raw = [[0.0] * count for _ in range(count)]
    calibrated = [[0.0] * count for _ in range(count)]
    for i in range(count):
        for j in range(i + 1, count):
            a, b = merged.aligned[i], merged.aligned[j]
            found = _half_and_max(_curve(context, merged, a, b, [0.0, 0.5, 1.0], merged.path))
            raw[i][j] = raw[j][i] = found["half"]
            calibrated[i][j] = calibrated[j][i] = found["half_calibrated"]
    return {
        "pairwise_loss_barrier_half": json.dumps(raw),
        "pairwise_loss_barrier_half_calibrated": json.dumps(calibrated),
    }
