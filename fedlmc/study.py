r"""Comparison of one-shot merge methods on the client models of one federated round.

Given the client state dicts :math:`\theta_1, \dots, \theta_N` of one round (same architecture)
and their merge weights :math:`c_i` (e.g. sample counts, :math:`w_i = c_i / \sum_j c_j`), every
method of :data:`METHODS` is evaluated on the *same* client models and gives one tidy row:

- ``average``: :math:`\bar\theta = \sum_i w_i \theta_i` (no permutation).
- ``weight_matching`` / ``activation_matching``: every client is permuted onto the reference
  client 0 (Git Re-Basin weight matching, or activation matching on the server split's inputs),
  then :math:`\bar\theta = \sum_i w_i \pi_i(\theta_i)` with :math:`\pi_0 = \mathrm{id}`.
- ``merge_many``: MergeMany (each model repeatedly matched to the mean of the others), then the
  weighted mean of the permuted models.
- ``<method>_t``: the same merged model with one softmax temperature fitted on the server split,
  :math:`p(y|x) = \mathrm{softmax}(f(x; \bar\theta) / T)`; :math:`T` never changes the accuracy.
- ``ensemble``: :math:`p(y|x) = \sum_i w_i \, \mathrm{softmax}(f(x; \theta_i))`, the N-forward-pass
  reference a single merged model tries to reach.

The *server split* (``splits.server``) is held out of the clients' pool and never given to any
client: it is the server's own small data set, used to fit temperatures, to provide the inputs of
activation matching and, for BatchNorm models, to re-estimate the merged model's running
statistics (REPAIR-style reset, Jordan et al. 2023). All reported metrics are on the test split.

Barriers. Two clients: the interpolation curve
:math:`\theta(\lambda) = \lambda \theta_1 + (1-\lambda) \pi(\theta_2)` (:math:`\pi` = the method's
alignment, identity for ``average``) on the test split, with :math:`T` refitted on the server split
at every :math:`\lambda`, and :func:`fedlmc.metrics.barriers` of it (``barrier_kind = "curve"``).
More than two clients (or ``diagnostics=False``): :func:`fedlmc.metrics.merge_gap` of the merged
model against the mean of the endpoints (``barrier_kind = "merge_gap"``).

For BatchNorm models every point of the curve (its endpoints included) has its statistics
re-estimated on the server split, while the endpoint columns use each client's own statistics.
With a single client (the others failed) every merge is that client; diagnostics are then NaN.

Every model's logits are predicted once per split and reused (endpoint metrics, ensemble,
temperatures); the base merge of a ``_t`` method is computed once and shared with its raw row.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from fedlmc.align import align_to_reference, merge_many
from fedlmc.calibrate import fit_temperature, has_batchnorm, reset_bn_stats
from fedlmc.diagnostics import lewc_cosine, reciprocal_orthogonality, relu_additivity_error
from fedlmc.evaluation import (
    ensemble_probs,
    metrics_from_logits,
    metrics_from_probs,
    predict_logits,
    resolve_device,
)
from fedlmc.merge import average, load_state, normalised_weights
from fedlmc.metrics import barriers, interpolation_curve, merge_gap
from fedlmc.models import apply_permutation, permutation_spec

if TYPE_CHECKING:
    from fedlmc.data import DataSplits

StateDict = dict[str, Tensor]
Progress = Callable[[str], None] | None

BASE_METHODS = ("average", "weight_matching", "activation_matching", "merge_many")
METHODS = (
    "average",
    "average_t",
    "weight_matching",
    "weight_matching_t",
    "activation_matching",
    "activation_matching_t",
    "merge_many",
    "merge_many_t",
    "ensemble",
)
COLUMNS = (
    "method",
    "num_clients",
    "endpoint_acc_mean",
    "endpoint_acc_min",
    "endpoint_acc_max",
    "endpoint_nll_mean",
    "ensemble_acc",
    "ensemble_nll",
    "accuracy",
    "nll",
    "ece",
    "temperature",
    "nll_raw",
    "ece_raw",
    "nll_calibrated",
    "ece_calibrated",
    "acc_gap",
    "accuracy_barrier",
    "loss_barrier",
    "loss_barrier_calibrated",
    "barrier_kind",
    "lewc_cos_mean",
    "lewc_cos_layers",
    "recip_orth_mean",
    "relu_additivity_mean",
    "merge_seconds",
    "curve",
)
STRING_COLUMNS = ("method", "barrier_kind", "lewc_cos_layers", "curve")
INT_COLUMNS = ("num_clients",)
NAN = float("nan")


def base_method(method: str) -> str:
    """The merge behind ``method``: ``"weight_matching_t"`` -> ``"weight_matching"``."""
    return method[:-2] if method.endswith("_t") else method


def check_methods(methods: Sequence[str]) -> list[str]:
    """``methods`` without duplicates, in order; ``ValueError`` naming an unknown one."""
    if isinstance(methods, str):
        methods = [methods]
    for method in methods:
        if method not in METHODS:
            raise ValueError(f"unknown merge method {method!r}; allowed: {', '.join(METHODS)}")
    return list(dict.fromkeys(methods))


def empty_row(method: str, num_clients: int) -> dict[str, Any]:
    """A row with every column present: NaN floats, empty strings."""
    row: dict[str, Any] = {name: NAN for name in COLUMNS}
    row.update({name: "" for name in STRING_COLUMNS})
    row["method"] = method
    row["num_clients"] = int(num_clients)
    return row


def _say(progress: Progress, message: str) -> None:
    if progress is not None:
        progress(message)


# ----------------------------------------------------------------------------- merging


@dataclass
class Merged:
    """A merged model with what the diagnostics need: the aligned clients and the timing."""

    model: nn.Module
    state: StateDict
    aligned: list[StateDict]
    seconds: float
    bn_reset: bool


def _aligned_states(
    method: str,
    template: nn.Module,
    states: Sequence[StateDict],
    weights: list[float],
    splits: DataSplits,
    seed: int,
    device: torch.device,
) -> tuple[list[StateDict], StateDict | None]:
    """The clients permuted onto a common basis (and MergeMany's merged weights, if it ran)."""
    if method == "average" or len(states) == 1:
        return list(states), None
    spec = permutation_spec(template)
    if method == "merge_many":
        merged, perms = merge_many(spec, list(states), weights=weights, seed=seed)
        return [apply_permutation(spec, p, sd) for p, sd in zip(perms, states, strict=True)], merged
    if method == "weight_matching":
        aligned = align_to_reference(spec, list(states), reference=0, method="weight", seed=seed)
        return aligned, None
    models = [load_state(template, sd).to(device).eval() for sd in states]
    x = splits.server[0]
    aligned = align_to_reference(
        spec, list(states), reference=0, method="activation", models=models, x=x, seed=seed
    )
    return aligned, None


def _merge(
    method: str,
    template: nn.Module,
    states: Sequence[StateDict],
    weights: list[float],
    splits: DataSplits,
    seed: int,
    device: torch.device,
) -> Merged:
    start = time.perf_counter()
    aligned, merged = _aligned_states(method, template, states, weights, splits, seed, device)
    if merged is None:
        merged = average(aligned, weights)
    model = load_state(template, merged).to(device).eval()
    bn_reset = has_batchnorm(model)
    if bn_reset:
        reset_bn_stats(model, splits.server)
        model.eval()
        merged = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    return Merged(model, merged, aligned, seconds, bn_reset)


def merge_clients(
    method: str,
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float] | None,
    splits: DataSplits,
    *,
    seed: int = 0,
    device: str | torch.device | None = None,
) -> tuple[StateDict, dict[str, Any]]:
    r"""Merged weights for one base method (``average``, ``weight_matching``,
    ``activation_matching`` or ``merge_many``; a ``_t`` suffix is accepted and ignored, the
    temperature does not change the weights).

    Multi-client weight/activation matching aligns every client to client 0 and takes the
    weighted mean :math:`\sum_i w_i \pi_i(\theta_i)`; activation matching correlates activations on
    the server split's inputs. BatchNorm models get their running statistics re-estimated on the
    server split after merging (the server split is never given to clients).

    Returns ``(state_dict, info)`` with ``info = {"method", "merge_seconds" (alignment + averaging
    + BN reset), "bn_reset", "aligned"}``; ``aligned`` is the list of clients in the merged basis
    (client 0 unchanged for the reference-based methods).
    """
    if not isinstance(method, str) or base_method(method) not in BASE_METHODS:
        raise ValueError(f"unknown merge method {method!r}; allowed: {', '.join(BASE_METHODS)}")
    _check_states(states)
    w = normalised_weights(weights, len(states))
    merged = _merge(base_method(method), template, states, w, splits, seed, resolve_device(device))
    info = {
        "method": base_method(method),
        "merge_seconds": merged.seconds,
        "bn_reset": merged.bn_reset,
        "aligned": merged.aligned,
    }
    return merged.state, info


def _check_states(states: Sequence[StateDict]) -> None:
    if len(states) == 0:
        raise ValueError("need at least one client state dict, got none")


# ----------------------------------------------------------------------------- predictions


@dataclass
class Predictions:
    """Logits of one model on the test and server splits, with the server-fitted temperature."""

    test: Tensor
    server: Tensor
    temperature: float

    @classmethod
    def of(cls, model: nn.Module, splits: DataSplits, device: torch.device) -> Predictions:
        test = predict_logits(model, splits.test[0], device=device)
        server = predict_logits(model, splits.server[0], device=device)
        return cls(test, server, fit_temperature(server, splits.server[1]))

    def metrics(self, labels: Tensor) -> dict[str, float]:
        """Test ``accuracy``, ``nll_raw``, ``ece_raw``, ``nll_calibrated``, ``ece_calibrated``."""
        raw = metrics_from_logits(self.test, labels)
        cal = metrics_from_logits(self.test, labels, self.temperature)
        return {
            "accuracy": raw["accuracy"],
            "nll_raw": raw["nll"],
            "ece_raw": raw["ece"],
            "nll_calibrated": cal["nll"],
            "ece_calibrated": cal["ece"],
        }


def endpoint_columns(endpoints: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Unweighted mean, min and max test accuracy and mean test NLL of the clients."""
    acc = [e["accuracy"] for e in endpoints]
    return {
        "endpoint_acc_mean": sum(acc) / len(acc),
        "endpoint_acc_min": min(acc),
        "endpoint_acc_max": max(acc),
        "endpoint_nll_mean": sum(e["nll_raw"] for e in endpoints) / len(endpoints),
    }


def _gap_inputs(metrics: Mapping[str, float]) -> dict[str, float]:
    """The keys :func:`fedlmc.metrics.merge_gap` reads."""
    return {
        "accuracy": metrics["accuracy"],
        "nll": metrics["nll_raw"],
        "nll_calibrated": metrics["nll_calibrated"],
    }


# ----------------------------------------------------------------------------- diagnostics


def _finite_mean(values: Sequence[float]) -> float:
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(values) / len(values) if values else NAN


def curve_json(curve) -> str:
    """The interpolation curve as JSON ``{lam, accuracy, nll, nll_calibrated}`` lists."""
    keys = ("lam", "accuracy", "nll", "nll_calibrated")
    return json.dumps({k: [float(v) for v in curve[k]] for k in keys})


def _orthogonality_mean(layers: Sequence[Mapping[str, Any]]) -> float:
    r"""Mean over layers and both directions of :math:`r_{ab}, r_{ba}`, leaving out the first
    Linear/Conv layer: it sees the same input in both models, so its ratios are 1 by construction.
    """
    values = [float(layer[k]) for layer in layers[1:] for k in ("ratio_ab", "ratio_ba")]
    return _finite_mean(values)


def diagnostic_columns(
    template: nn.Module,
    merged: Merged,
    weights: list[float],
    x: Tensor,
    device: torch.device,
) -> dict[str, Any]:
    """LEWC cosine per layer, reciprocal orthogonality and ReLU additivity of clients 0 and 1
    (in the merged basis) on the inputs ``x``."""
    cos = [float(c) for c in lewc_cosine(template, merged.aligned, weights, merged.state, x)]
    model_a = load_state(template, merged.aligned[0]).to(device).eval()
    model_b = load_state(template, merged.aligned[1]).to(device).eval()
    orth = reciprocal_orthogonality(model_a, model_b, x)
    lam = weights[0] / (weights[0] + weights[1]) if weights[0] + weights[1] > 0 else 0.5
    relu = relu_additivity_error(model_a, model_b, x, lam=lam)
    return {
        "lewc_cos_mean": _finite_mean(cos),
        "lewc_cos_layers": json.dumps(cos),
        "recip_orth_mean": _orthogonality_mean(orth),
        "relu_additivity_mean": _finite_mean(relu),
    }


def curve_columns(
    template: nn.Module,
    merged: Merged,
    splits: DataSplits,
    lambdas: int,
    device: torch.device,
) -> dict[str, Any]:
    """Barriers from the curve between client 0 and the aligned client 1 (two clients only)."""
    curve = interpolation_curve(
        template,
        merged.aligned[0],
        merged.aligned[1],
        splits.test,
        lambdas=lambdas,
        calibration=splits.server,
        bn_data=splits.server if merged.bn_reset else None,
        device=device,
    )
    found = barriers(curve)
    return {
        "accuracy_barrier": float(found["accuracy_barrier"]),
        "loss_barrier": float(found["loss_barrier"]),
        "loss_barrier_calibrated": float(found["loss_barrier_calibrated"]),
        "barrier_kind": "curve",
        "curve": curve_json(curve),
    }


def gap_columns(endpoints: Sequence[Mapping[str, float]], merged: Mapping[str, float]) -> dict:
    """Barrier columns from :func:`fedlmc.metrics.merge_gap` (merged vs mean of endpoints)."""
    gap = merge_gap([_gap_inputs(e) for e in endpoints], _gap_inputs(merged))
    return {
        "accuracy_barrier": gap["accuracy_gap"],
        "loss_barrier": gap["loss_gap"],
        "loss_barrier_calibrated": gap["loss_gap_calibrated"],
        "barrier_kind": "merge_gap",
    }


# ----------------------------------------------------------------------------- rows


def _metric_columns(metrics: Mapping[str, float], calibrated: bool, temperature: float) -> dict:
    suffix = "calibrated" if calibrated else "raw"
    return {
        "accuracy": metrics["accuracy"],
        "nll": metrics[f"nll_{suffix}"],
        "ece": metrics[f"ece_{suffix}"],
        "temperature": temperature if calibrated else 1.0,
        "nll_raw": metrics["nll_raw"],
        "ece_raw": metrics["ece_raw"],
        "nll_calibrated": metrics["nll_calibrated"],
        "ece_calibrated": metrics["ece_calibrated"],
    }


@dataclass
class _Cell:
    """Everything shared by the rows of one call: clients' predictions and merge settings."""

    template: nn.Module
    states: list[StateDict]
    weights: list[float]
    splits: DataSplits
    device: torch.device
    seed: int
    lambdas: int
    diagnostics: bool
    diagnostic_x: Tensor
    progress: Progress
    endpoints: list[dict[str, float]]
    ensemble: dict[str, float]
    common: dict[str, Any]


def _prepare(
    template, states, weights, splits, *, device, seed, lambdas, diagnostics, samples, progress
) -> _Cell:
    states = list(states)
    w = normalised_weights(weights, len(states))
    labels = splits.test[1]
    endpoints, logits = [], []
    for i, sd in enumerate(states):
        _say(progress, f"predicting client {i + 1}/{len(states)}")
        pred = Predictions.of(load_state(template, sd).to(device).eval(), splits, device)
        endpoints.append(pred.metrics(labels))
        logits.append(pred.test)
    ens = metrics_from_probs(ensemble_probs(logits, w), labels)
    common = {
        **endpoint_columns(endpoints),
        "ensemble_acc": ens["accuracy"],
        "ensemble_nll": ens["nll"],
    }
    return _Cell(
        template,
        states,
        w,
        splits,
        device,
        seed,
        lambdas,
        diagnostics,
        splits.test[0][:samples],
        progress,
        endpoints,
        ens,
        common,
    )


def _ensemble_row(cell: _Cell) -> dict[str, Any]:
    row = empty_row("ensemble", len(cell.states))
    row.update(cell.common)
    ens = cell.ensemble
    row.update(
        accuracy=ens["accuracy"],
        nll=ens["nll"],
        ece=ens["ece"],
        temperature=1.0,
        nll_raw=ens["nll"],
        ece_raw=ens["ece"],
    )
    row["acc_gap"] = row["endpoint_acc_mean"] - row["accuracy"]
    return row


def _base_columns(cell: _Cell, method: str) -> tuple[dict[str, Any], dict[str, float], float]:
    """Merge once for ``method`` and compute every column its raw and ``_t`` rows share."""
    _say(cell.progress, f"merging: {method}")
    merged = _merge(
        method, cell.template, cell.states, cell.weights, cell.splits, cell.seed, cell.device
    )
    pred = Predictions.of(merged.model, cell.splits, cell.device)
    metrics = pred.metrics(cell.splits.test[1])
    columns: dict[str, Any] = {"merge_seconds": merged.seconds}
    two = len(cell.states) == 2
    if cell.diagnostics and two:
        _say(cell.progress, f"interpolation curve: {method}")
        columns.update(curve_columns(cell.template, merged, cell.splits, cell.lambdas, cell.device))
    else:
        columns.update(gap_columns(cell.endpoints, metrics))
    if cell.diagnostics and len(cell.states) >= 2:
        _say(cell.progress, f"diagnostics: {method}")
        columns.update(
            diagnostic_columns(cell.template, merged, cell.weights, cell.diagnostic_x, cell.device)
        )
    return columns, metrics, pred.temperature


def evaluate_methods(
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float] | None,
    splits: DataSplits,
    methods: Sequence[str] = METHODS,
    *,
    lambdas: int = 25,
    seed: int = 0,
    diagnostics: bool = True,
    diagnostic_samples: int = 512,
    device: str | torch.device | None = None,
    progress: Progress = None,
) -> list[dict[str, Any]]:
    """One row per requested method (columns :data:`COLUMNS`), all on the same client models.

    Each base merge is computed once; its ``_t`` row reuses it with the server-fitted
    temperature. Raw rows have ``temperature = 1``; ``nll_raw``/``nll_calibrated`` (and ECE) are
    filled for both. ``acc_gap = endpoint_acc_mean - accuracy`` (endpoint means are unweighted).
    ``diagnostics=False`` skips the interpolation curve, LEWC, orthogonality and ReLU additivity
    (barriers then come from ``merge_gap``). Diagnostics use the first ``diagnostic_samples``
    test inputs. ``progress`` (optional) receives one-line status messages.
    """
    methods = check_methods(methods)
    _check_states(states)
    if int(lambdas) < 2:
        raise ValueError(f"lambdas must be an integer >= 2, got {lambdas}")
    if int(diagnostic_samples) < 1:
        raise ValueError(f"diagnostic_samples must be >= 1, got {diagnostic_samples}")
    dev = resolve_device(device)
    template = copy.deepcopy(template).to(dev).eval()
    cell = _prepare(
        template,
        states,
        weights,
        splits,
        device=dev,
        seed=seed,
        lambdas=int(lambdas),
        diagnostics=diagnostics,
        samples=int(diagnostic_samples),
        progress=progress,
    )
    shared: dict[str, tuple[dict[str, Any], dict[str, float], float]] = {}
    rows = []
    for method in methods:
        if method == "ensemble":
            rows.append(_ensemble_row(cell))
            continue
        base = base_method(method)
        if base not in shared:
            shared[base] = _base_columns(cell, base)
        columns, metrics, temperature = shared[base]
        row = empty_row(method, len(cell.states))
        row.update(cell.common)
        row.update(_metric_columns(metrics, method.endswith("_t"), temperature))
        row["acc_gap"] = row["endpoint_acc_mean"] - row["accuracy"]
        row.update(columns)
        rows.append(row)
    return rows


def evaluate_model_row(
    method: str,
    model: nn.Module,
    splits: DataSplits,
    *,
    calibrated: bool | None = None,
    num_clients: int = 1,
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """A row with :data:`COLUMNS` for a single model (e.g. FedAvg's final model).

    Test accuracy, NLL and ECE; ``temperature`` is fitted on the server split and used for
    ``nll``/``ece`` when ``calibrated`` (default: ``method`` ends with ``_t``). Endpoint,
    ensemble, barrier and diagnostic columns are NaN.
    """
    if not isinstance(method, str) or not method:
        raise ValueError(f"method must be a non-empty string, got {method!r}")
    calibrated = method.endswith("_t") if calibrated is None else bool(calibrated)
    dev = resolve_device(device)
    pred = Predictions.of(copy.deepcopy(model).to(dev).eval(), splits, dev)
    row = empty_row(method, num_clients)
    row.update(_metric_columns(pred.metrics(splits.test[1]), calibrated, pred.temperature))
    return row
