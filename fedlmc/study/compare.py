r"""Comparison of one-shot merge methods on the client models of one federated round.

Given the client state dicts :math:`\theta_1, \dots, \theta_N` of one round (same architecture)
and their merge weights :math:`c_i` (e.g. sample counts, :math:`w_i = c_i / \sum_j c_j`), every
method of :func:`fedlmc.merging.methods.study_methods` is evaluated on the *same* client models and
gives one tidy row (columns: :mod:`fedlmc.study.rows`). The merge methods are those registered in
:mod:`fedlmc.merging.methods`; the built-in ones:

- ``average``: :math:`\bar\theta = \sum_i w_i \theta_i` (no permutation).
- ``weight_matching`` / ``activation_matching``: every client is permuted onto the reference
  client 0 (Git Re-Basin weight matching, or activation matching on the server split's inputs),
  then :math:`\bar\theta = \sum_i w_i \pi_i(\theta_i)` with :math:`\pi_0 = \mathrm{id}`.
- ``merge_many``: MergeMany (each model repeatedly matched to the mean of the others), then the
  weighted mean of the permuted models.
- ``random_permutation``: the scrambled control, every client but the first randomly permuted.
- ``<method>_t``: the same merged model with one softmax temperature fitted on the server split,
  :math:`p(y|x) = \mathrm{softmax}(f(x; \bar\theta) / T)`; :math:`T` never changes the accuracy.
- ``ensemble``: :math:`p(y|x) = \sum_i w_i \, \mathrm{softmax}(f(x; \theta_i))`, the N-forward-pass
  reference a single merged model tries to reach.

The *server split* (``splits.server``) is held out of the clients' pool and never given to any
client: it is the server's own small data set, used to fit temperatures, to provide the inputs of
activation matching and, for BatchNorm models, to re-estimate the merged model's running
statistics (REPAIR-style reset, Jordan et al. 2023). All reported metrics are on the test split.

Every row has the merge gap (:func:`fedlmc.analysis.paths.merge_gap`: the merged model against the
mean of the endpoints, ``merge_gap_*``). Two clients with diagnostics on also get barriers: the
interpolation curve :math:`\theta(\lambda) = \lambda \theta_1 + (1-\lambda) \pi(\theta_2)`
(:math:`\pi` = the method's alignment, identity for ``average``) on the test split, with
:math:`T` refitted on the server split at every :math:`\lambda`, and
:func:`fedlmc.analysis.paths.barriers` of it: signed at :math:`\lambda = 1/2` (``*_barrier_half``,
the paper's Table 1) and the maximum over the path (``*_barrier_max``). Column definitions:
:mod:`fedlmc.study.rows`.

For BatchNorm models every point of the curve (its endpoints included) has its statistics
re-estimated on the server split, while the endpoint columns use each client's own statistics.
With a single client (the others failed) every merge is that client; diagnostics are then NaN.

Every model's logits are predicted once per split and reused (endpoint metrics, ensemble,
temperatures); the base merge of a ``_t`` method is computed once and shared with its raw row.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from fedlmc.analysis.diagnostics import (
    bias_shares,
    dead_unit_fractions,
    hidden_weight_keys,
    layer_names_of,
    layer_predictions,
    logit_norm_ratio,
    reciprocal_orthogonality,
    relu_additivity_error,
    stable_ranks,
)
from fedlmc.analysis.paths import (
    PathRule,
    barriers,
    interpolation_curve,
    lewc_temperature_path,
    merge_gap,
    path_clients,
)
from fedlmc.averaging import interpolate, load_state, normalised_weights
from fedlmc.evaluation import (
    ensemble_probs,
    metrics_from_logits,
    metrics_from_probs,
    predict_logits,
    resolve_device,
)
from fedlmc.merging.calibrate import fit_temperature
from fedlmc.merging.methods import (
    CALIBRATED_SUFFIX,
    REFERENCE_METHODS,
    base_method,
    merge_method,
    merge_with_info,
    study_methods,
)
from fedlmc.merging.post_merge import ServerData, post_merge
from fedlmc.permutation.chain import lewc_bias_targets, norm_free_chain, residual_reason
from fedlmc.permutation.model_spec import permutation_spec
from fedlmc.permutation.spec import PermutationSpec
from fedlmc.study.rows import (
    PREDICTION_KEYS,
    PREDICTION_MEAN_KEYS,
    curve_json,
    empty_row,
    endpoint_columns,
    finite_mean,
    metric_columns,
)

if TYPE_CHECKING:
    from fedlmc.data.loading import DataSplits

StateDict = dict[str, Tensor]
Progress = Callable[[str], None] | None
QUARTER = 0.25  # the second point of the path where LEWC and LLFC are compared
PAIRWISE_MAX_CLIENTS = 6  # pairwise barrier matrices up to this many clients (N(N-1)/2 paths)


def check_methods(methods: Sequence[str]) -> list[str]:
    """``methods`` without duplicates, in order; ``ValueError`` naming an unknown one."""
    if isinstance(methods, str):
        methods = [methods]
    allowed = study_methods()
    for method in methods:
        if method not in allowed:
            raise ValueError(f"unknown merge method {method!r}; allowed: {', '.join(allowed)}")
    return list(dict.fromkeys(methods))


def default_methods(num_clients: int) -> list[str]:
    """Every study method that accepts ``num_clients`` clients (those registered
    ``many_clients = False``, such as ``random_direction``, only up to two)."""
    return [m for m in study_methods() if _accepts(m, num_clients)]


def _accepts(method: str, num_clients: int) -> bool:
    return method in REFERENCE_METHODS or num_clients <= 2 or merge_method(method).many_clients


def check_client_count(methods: list[str], num_clients: int) -> list[str]:
    """``methods``; ``ValueError`` naming the first one that does not accept ``num_clients``
    clients, before any work."""
    refused = [m for m in methods if not _accepts(m, num_clients)]
    if refused:
        raise ValueError(
            f"merge method {refused[0]!r} with {num_clients} clients: allowed: at most 2 clients"
        )
    return methods


def _say(progress: Progress, message: str) -> None:
    if progress is not None:
        progress(message)


# ----------------------------------------------------------------------------- merging


@dataclass
class Merged:
    """A merged model with what the diagnostics need: the aligned clients, the weights as the
    method combined them (``combined``: before BatchNorm re-estimation or REPAIR), the method's
    path rule between two models (``path``; ``None`` for a method whose merge is on no path
    between them, e.g. ``random_direction``) and the timing."""

    model: nn.Module
    state: StateDict
    aligned: list[StateDict]
    seconds: float
    bn_reset: bool
    repaired: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    combined: StateDict = field(default_factory=dict)
    path: PathRule | None = interpolate


def path_rule(method: str, template: nn.Module, spec: PermutationSpec | None) -> PathRule | None:
    r"""The path :math:`\theta(\lambda)` between two models under ``method``'s combination rule:
    the linear interpolation, or the method's own ``combine`` at weights
    :math:`(\lambda, 1 - \lambda)` (e.g. depth-weighted biases at every :math:`\lambda`);
    ``None`` for a method registered ``on_path = False`` (its barrier columns stay NaN)."""
    entry = merge_method(method)
    if not entry.on_path:
        return None
    if entry.combine is None:
        return interpolate
    spec = spec if spec is not None else permutation_spec(template)
    return lambda sd_a, sd_b, lam: entry.combined(spec, [sd_a, sd_b], [lam, 1.0 - lam])


def _merge(
    method: str,
    template: nn.Module,
    states: Sequence[StateDict],
    weights: list[float],
    splits: DataSplits,
    seed: int,
    device: torch.device,
    spec: PermutationSpec | None = None,
    options: dict[str, Any] | None = None,
) -> Merged:
    """The registered merge of ``method``, then the post-merge pipeline on the server split
    (:func:`fedlmc.merging.post_merge.post_merge`: BatchNorm statistics re-estimated, or, for REPAIR
    methods, every hidden unit repaired)."""
    start = time.perf_counter()
    server_data = splits.server if len(splits.server[1]) else None
    merged, aligned, info = merge_with_info(
        method,
        template,
        states,
        weights,
        server_data=server_data,
        seed=seed,
        device=device,
        spec=spec,
        options=options,
    )
    source = None if server_data is None else ServerData(*server_data)
    finished = post_merge(template, merged, aligned, weights, method, source, device=device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    path = path_rule(method, template, spec)
    return Merged(
        finished.model,
        finished.state,
        aligned,
        seconds,
        finished.bn_reestimated,
        finished.repaired,
        info,
        merged,
        path,
    )


def merge_clients(
    method: str,
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float] | None,
    splits: DataSplits,
    *,
    seed: int = 0,
    device: str | torch.device | None = None,
    spec: PermutationSpec | None = None,
) -> tuple[StateDict, dict[str, Any]]:
    r"""Merged weights for one registered merge method (:mod:`fedlmc.merging.methods`; a ``_t``
    suffix is accepted and ignored, the temperature does not change the weights).

    Multi-client weight/activation matching aligns every client to client 0 and takes the
    weighted mean :math:`\sum_i w_i \pi_i(\theta_i)`; activation matching correlates activations on
    the server split's inputs. BatchNorm models get their running statistics re-estimated on the
    server split after merging (the server split is never given to clients).

    Returns ``(state_dict, info)`` with ``info = {"method", "merge_seconds" (alignment + averaging
    + BN reset), "bn_reset", "aligned"}``; ``aligned`` is the list of clients in the merged basis
    (client 0 unchanged for the reference-based methods).
    """
    merge_method(method)  # ValueError naming the registered methods
    _check_states(states)
    w = normalised_weights(weights, len(states))
    dev = resolve_device(device)
    merged = _merge(base_method(method), template, states, w, splits, seed, dev, spec)
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


def _gap_inputs(metrics: Mapping[str, float]) -> dict[str, float]:
    """The keys :func:`fedlmc.analysis.paths.merge_gap` reads."""
    return {
        "accuracy": metrics["accuracy"],
        "nll": metrics["nll_raw"],
        "nll_calibrated": metrics["nll_calibrated"],
    }


def _half_and_max(curve) -> dict[str, float]:
    """Loss barriers (raw, calibrated) of a curve: signed at lambda = 1/2, and the maximum."""
    found = barriers(curve)
    return {
        "half": float(found["loss_barrier_at_half"]),
        "half_calibrated": float(found["loss_barrier_calibrated_at_half"]),
        "max": float(found["loss_barrier"]),
        "max_calibrated": float(found["loss_barrier_calibrated"]),
    }


def _path_kwargs(merged: Merged, splits: DataSplits) -> dict[str, Any]:
    """What every path of a merge is evaluated with: temperatures refitted on the server split,
    and the merge's own post-processing at every point (BatchNorm statistics re-estimated, or
    every interior point repaired)."""
    return {
        "calibration": splits.server,
        "bn_data": splits.server if merged.bn_reset else None,
        "repair_data": splits.server[0] if merged.repaired else None,
    }


def client_barrier_columns(
    template: nn.Module,
    merged: Merged,
    splits: DataSplits,
    lambdas: int,
    device: torch.device,
) -> dict[str, float]:
    r"""Barriers on each client's path to the merge, :math:`\lambda \pi_i(\theta_i) +
    (1-\lambda)\bar\theta` (post-processed like the merge at every point): mean and worst over
    the clients of :func:`fedlmc.analysis.paths.path_clients` (every client up to 16,
    else that many evenly spaced ones). They measure the shape of the path from a client to the
    merge, not the merge's quality (that is ``merge_gap_*``); columns in
    :mod:`fedlmc.study.rows`."""
    per_client = [
        _half_and_max(
            interpolation_curve(
                template,
                client,
                merged.state,
                splits.test,
                lambdas=lambdas,
                device=device,
                **_path_kwargs(merged, splits),
            )
        )
        for client in (merged.aligned[i] for i in path_clients(len(merged.aligned)))
    ]
    columns = {}
    for key in per_client[0]:
        values = [found[key] for found in per_client]
        columns[f"client_to_merge_path_loss_barrier_{key}_mean"] = sum(values) / len(values)
        columns[f"client_to_merge_path_loss_barrier_{key}_worst"] = max(values)
    return columns


def pairwise_barrier_columns(
    template: nn.Module, merged: Merged, splits: DataSplits, device: torch.device
) -> dict[str, str]:
    """The N x N loss barrier at lambda = 1/2 between the clients in the merge's basis, on the
    method's path rule and post-processed like the merge (raw and calibrated; JSON matrices,
    symmetric, 0 on the diagonal)."""
    count = len(merged.aligned)
    raw = [[0.0] * count for _ in range(count)]
    calibrated = [[0.0] * count for _ in range(count)]
    for i in range(count):
        for j in range(i + 1, count):
            curve = interpolation_curve(
                template,
                merged.aligned[i],
                merged.aligned[j],
                splits.test,
                lambdas=[0.0, 0.5, 1.0],
                device=device,
                path=merged.path,
                **_path_kwargs(merged, splits),
            )
            found = _half_and_max(curve)
            raw[i][j] = raw[j][i] = found["half"]
            calibrated[i][j] = calibrated[j][i] = found["half_calibrated"]
    return {
        "pairwise_loss_barrier_half": json.dumps(raw),
        "pairwise_loss_barrier_half_calibrated": json.dumps(calibrated),
    }


def gap_columns(
    endpoints: Sequence[Mapping[str, float]], merged: Mapping[str, float]
) -> dict[str, float]:
    """``merge_gap_*`` columns: the merged model against the mean of the endpoints
    (:func:`fedlmc.analysis.paths.merge_gap`; metrics dicts as :meth:`Predictions.metrics`
    gives)."""
    gap = merge_gap([_gap_inputs(e) for e in endpoints], _gap_inputs(merged))
    return {
        "merge_gap_accuracy": gap["accuracy_gap"],
        "merge_gap_loss": gap["loss_gap"],
        "merge_gap_loss_calibrated": gap["loss_gap_calibrated"],
    }


# ----------------------------------------------------------------------------- diagnostics


def _orthogonality_mean(layers: Sequence[Mapping[str, Any]]) -> float:
    r"""Mean over layers and both directions of :math:`r_{ab}, r_{ba}`, leaving out the first
    Linear/Conv layer: it sees the same input in both models, so its ratios are 1 by construction.
    """
    values = [float(layer[k]) for layer in layers[1:] for k in ("ratio_ab", "ratio_ba")]
    return finite_mean(values)


def _json_list(values: Sequence[float]) -> str:
    return json.dumps([float(v) for v in values])


LEWC_ONLY = tuple(key for key in PREDICTION_KEYS if key.startswith("lewc_"))
"""Per-layer quantities that exist only where LEWC's depth exponents do (NaN elsewhere)."""


def prediction_columns(
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float],
    merged_state: StateDict,
    x: Tensor,
    layer_names: Sequence[str],
    suffix: str = "",
    lewc_undefined: str = "",
) -> dict[str, Any]:
    """LEWC and LLFC errors, cosines and norm ratios per layer
    (:func:`fedlmc.analysis.diagnostics.layer_predictions`) and their means, with ``suffix`` on
    every column name; without a suffix also ``lewc_temperature_ratio`` (LEWC's predicted norm ratio
    at the logits). Where ``lewc_undefined`` gives a reason (a residual network), the LEWC columns
    are NaN / empty and only LLFC's and the measured ones are filled."""
    layers = layer_predictions(template, states, weights, merged_state, x, layer_names)
    keys = [k for k in PREDICTION_KEYS if not (lewc_undefined and k in LEWC_ONLY)]
    columns: dict[str, Any] = {}
    if not lewc_undefined and not suffix:
        columns["lewc_temperature_ratio"] = layers[-1]["lewc_norm_ratio"]
    for key in keys:
        columns[f"{key}_layers{suffix}"] = _json_list([r[key] for r in layers])
    for key in PREDICTION_MEAN_KEYS:
        if key in keys:
            columns[f"{key}_mean{suffix}"] = finite_mean([r[key] for r in layers])
    return columns


def _quarter_state(merged: Merged) -> StateDict:
    r""":math:`\theta(1/4)` on the method's path between client 0 and the aligned client 1, as
    combined (no BatchNorm re-estimation or REPAIR: the state LEWC describes)."""
    return merged.path(merged.aligned[0], merged.aligned[1], QUARTER)


def lewc_measured_on(merged: Merged) -> str:
    """Which weights the LEWC/LLFC layer columns measure (the combined weights, and what the
    row's evaluated model adds after them)."""
    if merged.bn_reset:
        return "combined weights, before BatchNorm re-estimation"
    if merged.repaired:
        return "combined weights, before REPAIR"
    return "combined weights (the evaluated merge)"


def lewc_undefined_reason(
    template: nn.Module, spec: PermutationSpec | None, x: Tensor, layer_names: Sequence[str]
) -> str:
    """Why LEWC's prediction is undefined for ``template`` ("" where it is defined): its
    Linear/Conv layers are no plain chain (:func:`fedlmc.permutation.chain.residual_reason`), or no
    permutation spec could be found to tell."""
    try:
        spec = spec if spec is not None else permutation_spec(template, x[:2])
    except (ValueError, RuntimeError) as error:
        return f"no permutation spec to find the layers' depths: {error}"
    return residual_reason(spec, template.state_dict(), layer_names)


def bias_mismatch(
    spec: PermutationSpec, merged: Merged, weights: Sequence[float]
) -> list[float] | None:
    r"""Per biased layer of a norm-free plain chain: :math:`\|\bar b_l - \sum_i w_i^{\,l}
    b^{(i)}_l\| / \|\sum_i w_i^{\,l} b^{(i)}_l\|`, how far the merge's bias is from the one LEWC
    needs (0 for ``average_lewc_bias``; the plain average's grows with depth). ``None`` for
    bias-free models and for models other than norm-free chains, where the rule is not LEWC's."""
    try:
        layers = norm_free_chain(spec, merged.combined)
    except ValueError:
        return None
    targets = lewc_bias_targets(layers, merged.aligned, weights)
    if not targets:  # bias-free: nothing to compare
        return None
    return [
        _ratio_of_norms(merged.combined[key] - target, target) for key, target in targets.items()
    ]


def _ratio_of_norms(numerator: Tensor, denominator: Tensor) -> float:
    bottom = float(denominator.double().norm())
    return float(numerator.double().norm()) / bottom if bottom > 0 else float("nan")


def diagnostic_columns(
    template: nn.Module,
    merged: Merged,
    weights: list[float],
    splits: DataSplits,
    x: Tensor,
    device: torch.device,
    layer_names: Sequence[str],
    spec: PermutationSpec | None = None,
    lewc_undefined: str = "",
) -> dict[str, Any]:
    """LEWC and LLFC per layer on the combined weights (at the merge weights and, for two
    clients, at lambda = 1/4; LEWC's columns NaN where ``lewc_undefined``), the logit norm ratio,
    dead units and bias shares of the evaluated merge, and reciprocal orthogonality and ReLU
    additivity of clients 0 and 1 (in the merged basis), all on the inputs ``x``."""
    columns: dict[str, Any] = {
        "lewc_measured_on": lewc_measured_on(merged),
        "lewc_undefined_reason": lewc_undefined,
        **prediction_columns(
            template,
            merged.aligned,
            weights,
            merged.combined,
            x,
            layer_names,
            lewc_undefined=lewc_undefined,
        ),
        "logit_norm_ratio": logit_norm_ratio(template, merged.aligned, merged.state, x, weights),
        "dead_unit_fraction_layers": _json_list(dead_unit_fractions(merged.model, x, layer_names)),
        "bias_share_layers": _json_list(bias_shares(merged.model, x)),
    }
    if not lewc_undefined:
        mismatch = bias_mismatch(spec or permutation_spec(template, x[:2]), merged, weights)
        if mismatch is not None:
            columns["lewc_bias_mismatch_layers"] = _json_list(mismatch)
    if len(merged.aligned) == 2 and merged.path is not None:
        pair = [QUARTER, 1.0 - QUARTER]
        columns.update(
            prediction_columns(
                template,
                merged.aligned,
                pair,
                _quarter_state(merged),
                x,
                layer_names,
                suffix="_quarter",
                lewc_undefined=lewc_undefined,
            )
        )
    model_a = load_state(template, merged.aligned[0]).to(device).eval()
    model_b = load_state(template, merged.aligned[1]).to(device).eval()
    orth = reciprocal_orthogonality(model_a, model_b, x)
    lam = weights[0] / (weights[0] + weights[1]) if weights[0] + weights[1] > 0 else 0.5
    relu = relu_additivity_error(model_a, model_b, x, lam=lam)
    columns.update(
        {
            "recip_orth_mean": _orthogonality_mean(orth),
            "recip_orth_layers": _json_list(
                [(layer["ratio_ab"] + layer["ratio_ba"]) / 2 for layer in orth]
            ),
            "relu_additivity_mean": finite_mean(relu),
            "relu_additivity_layers": _json_list(relu),
        }
    )
    return columns


def stable_rank_columns(states: Sequence[StateDict], head: str) -> dict[str, str]:
    """``stable_rank_layers``: per hidden weight (every weight outside the output module
    ``head``), the mean stable rank over the clients."""
    ranks = [stable_ranks(sd, hidden_weight_keys(sd, head)) for sd in states]
    return {"stable_rank_layers": _json_list([sum(r) / len(r) for r in zip(*ranks, strict=True)])}


def curve_columns(
    template: nn.Module,
    merged: Merged,
    splits: DataSplits,
    lambdas: int,
    device: torch.device,
    lewc_depth: int = 0,
) -> dict[str, Any]:
    """Barriers at lambda = 1/2 (signed) and their maximum over the path between client 0 and
    the aligned client 1 (two clients only), on the method's path rule; the temperature fitted at
    each lambda and, with ``lewc_depth`` L > 0 (where LEWC is defined), LEWC's prediction of it
    (:func:`fedlmc.analysis.paths.lewc_temperature_path`)."""
    curve = interpolation_curve(
        template,
        merged.aligned[0],
        merged.aligned[1],
        splits.test,
        lambdas=lambdas,
        device=device,
        path=merged.path,
        **_path_kwargs(merged, splits),
    )
    found = barriers(curve)
    columns: dict[str, Any] = {
        "curve": curve_json(curve),
        "temperature_path": _json_list(curve["temperature"]),
    }
    if lewc_depth > 0:
        columns["temperature_path_lewc"] = _json_list(lewc_temperature_path(curve, lewc_depth))
    for name in ("accuracy_barrier", "loss_barrier", "loss_barrier_calibrated"):
        head, _, tail = name.partition("_barrier")
        columns[f"{head}_barrier_half{tail}"] = float(found[f"{name}_at_half"])
        columns[f"{head}_barrier_max{tail}"] = float(found[name])
    return columns


# ----------------------------------------------------------------------------- rows


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
    spec: PermutationSpec | None
    layer_names: list[str]
    options: dict[str, Any]
    progress: Progress
    endpoints: list[dict[str, float]]
    references: dict[str, dict[str, Any]]
    top1: dict[str, Tensor]
    common: dict[str, Any]
    lewc_undefined: str = ""


def _weighted_logits(logits: Sequence[Tensor], weights: Sequence[float]) -> Tensor:
    return sum(w * z for w, z in zip(weights, logits, strict=True))


def _reference_rows(
    predictions: Sequence[Predictions], weights: Sequence[float], splits: DataSplits
) -> tuple[dict[str, dict[str, Any]], dict[str, Tensor]]:
    r"""The two ensembles every merge is compared with, as row columns, and their top-1 labels:
    ``ensemble`` :math:`\sum_i w_i\,\mathrm{softmax}(z_i)` (raw) and ``logit_ensemble``
    :math:`\mathrm{softmax}(\sum_i w_i z_i / T)` (the scaled logit ensemble LEWC likens the merge
    to; raw, with its server-fitted :math:`T` in the calibrated columns)."""
    labels = splits.test[1]
    probs = ensemble_probs([p.test for p in predictions], weights)
    prob = metrics_from_probs(probs, labels)
    logit = Predictions(
        _weighted_logits([p.test for p in predictions], weights),
        _weighted_logits([p.server for p in predictions], weights),
        1.0,
    )
    logit.temperature = fit_temperature(logit.server, splits.server[1])
    top1 = {"ensemble": probs.argmax(dim=1), "logit_ensemble": logit.test.argmax(dim=1)}
    rows = {
        "ensemble": {
            "accuracy": prob["accuracy"],
            "nll": prob["nll"],
            "ece": prob["ece"],
            "temperature": 1.0,
            "nll_raw": prob["nll"],
            "ece_raw": prob["ece"],
        },
        "logit_ensemble": {
            **metric_columns(logit.metrics(labels), False, logit.temperature),
            "logit_ensemble_temperature": logit.temperature,
        },
    }
    return rows, top1


AGREEMENT_COLUMNS = {
    "ensemble": "agreement_prob_ensemble",
    "logit_ensemble": "agreement_logit_ensemble",
}


def agreement_columns(top1: Mapping[str, Tensor], predicted: Tensor) -> dict[str, float]:
    """Top-1 agreement on the test split of a model's predicted classes with each ensemble's
    (:data:`AGREEMENT_COLUMNS`): the fraction of test inputs with the same predicted class."""
    return {
        AGREEMENT_COLUMNS[name]: float((predicted == labels).double().mean())
        for name, labels in top1.items()
    }


def _prepare(
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float] | None,
    splits: DataSplits,
    *,
    device: torch.device,
    seed: int,
    lambdas: int,
    diagnostics: bool,
    samples: int,
    spec: PermutationSpec | None,
    layer_names: Sequence[str] | None,
    options: dict[str, Any] | None,
    progress: Progress,
    client_templates: Sequence[nn.Module] | None = None,
) -> _Cell:
    states = list(states)
    w = normalised_weights(weights, len(states))
    labels = splits.test[1]
    x = splits.test[0][:samples]
    names = layer_names_of(template, x.to(device), layer_names) if diagnostics else []
    own = _client_templates(template, client_templates, len(states))
    predictions = []
    for i, sd in enumerate(states):
        _say(progress, f"predicting client {i + 1}/{len(states)}")
        model = load_state(own[i], sd).to(device).eval()
        predictions.append(Predictions.of(model, splits, device))
    endpoints = [p.metrics(labels) for p in predictions]
    references, top1 = _reference_rows(predictions, w, splits)
    temperatures = [p.temperature for p in predictions]
    common = {
        **endpoint_columns(endpoints),
        "endpoint_acc_clients": _json_list([e["accuracy"] for e in endpoints]),
        "ensemble_acc": references["ensemble"]["accuracy"],
        "ensemble_nll": references["ensemble"]["nll"],
        "logit_ensemble_acc": references["logit_ensemble"]["accuracy"],
        "endpoint_temperature_mean": sum(temperatures) / len(temperatures),
        "logit_ensemble_temperature": references["logit_ensemble"]["logit_ensemble_temperature"],
    }
    undefined = ""
    if diagnostics:
        common.update(stable_rank_columns(states, head=names[-1]))
        undefined = lewc_undefined_reason(template, spec, x.to(device), names)
    return _Cell(
        template,
        states,
        w,
        splits,
        device,
        seed,
        lambdas,
        diagnostics,
        x,
        spec,
        names,
        dict(options or {}),
        progress,
        endpoints,
        references,
        top1,
        common,
        undefined,
    )


def _client_templates(
    template: nn.Module, given: Sequence[nn.Module] | None, count: int
) -> list[nn.Module]:
    """The model each client's weights load into: ``given`` (one per client, e.g. each at its own
    width), else ``template`` for every client."""
    if given is None:
        return [template] * count
    if len(given) != count:
        raise ValueError(
            f"client_templates: {len(given)} models for {count} client state dicts; allowed: "
            "one per client"
        )
    return list(given)


def _reference_row(cell: _Cell, method: str) -> dict[str, Any]:
    """The row of the reference ``method`` (``ensemble`` or ``logit_ensemble``)."""
    row = empty_row(method, len(cell.states))
    row.update(cell.common)
    found = cell.references[method]
    row.update(found)
    row["merge_gap_accuracy"] = row["endpoint_acc_mean"] - found["accuracy"]
    row["merge_gap_loss"] = found["nll_raw"] - row["endpoint_nll_mean"]
    if method == "logit_ensemble":
        row["merge_gap_loss_calibrated"] = found["nll_calibrated"] - finite_mean(
            [e["nll_calibrated"] for e in cell.endpoints]
        )
    row.update(agreement_columns(cell.top1, cell.top1[method]))
    return row


@dataclass
class _BaseMerge:
    """One base merge and every column its raw and ``_t`` rows share."""

    merged: Merged
    columns: dict[str, Any]
    metrics: dict[str, float]
    temperature: float


def temperature_columns(cell: _Cell, temperature: float) -> dict[str, float]:
    """The merge's server-fitted :math:`T` over the endpoints' mean :math:`T` and over the
    logit ensemble's :math:`T` (LEWC predicts the latter ratio: ``lewc_temperature_ratio``)."""
    return {
        "merge_temperature": temperature,
        "temperature_ratio_endpoints": temperature / cell.common["endpoint_temperature_mean"],
        "temperature_ratio_logit_ensemble": temperature / cell.common["logit_ensemble_temperature"],
    }


def _base_columns(cell: _Cell, method: str) -> _BaseMerge:
    """Merge once for ``method`` and compute every column its raw and ``_t`` rows share."""
    _say(cell.progress, f"merging: {method}")
    merged = _merge(
        method,
        cell.template,
        cell.states,
        cell.weights,
        cell.splits,
        cell.seed,
        cell.device,
        cell.spec,
        cell.options,
    )
    pred = Predictions.of(merged.model, cell.splits, cell.device)
    metrics = pred.metrics(cell.splits.test[1])
    columns: dict[str, Any] = {"merge_seconds": merged.seconds, **merged.info}
    columns.update(gap_columns(cell.endpoints, metrics))
    columns.update(agreement_columns(cell.top1, pred.test.argmax(dim=1)))
    columns.update(temperature_columns(cell, pred.temperature))
    if cell.diagnostics and len(cell.states) == 2 and merged.path is not None:
        _say(cell.progress, f"interpolation curve: {method}")
        depth = 0 if cell.lewc_undefined else len(cell.layer_names)
        columns.update(
            curve_columns(cell.template, merged, cell.splits, cell.lambdas, cell.device, depth)
        )
    if cell.diagnostics and len(cell.states) > 2:
        _say(cell.progress, f"client barriers: {method}")
        columns.update(
            client_barrier_columns(cell.template, merged, cell.splits, cell.lambdas, cell.device)
        )
        if len(cell.states) <= PAIRWISE_MAX_CLIENTS:
            columns.update(
                pairwise_barrier_columns(cell.template, merged, cell.splits, cell.device)
            )
    if cell.diagnostics and len(cell.states) >= 2:
        _say(cell.progress, f"diagnostics: {method}")
        columns.update(
            diagnostic_columns(
                cell.template,
                merged,
                cell.weights,
                cell.splits,
                cell.diagnostic_x,
                cell.device,
                cell.layer_names,
                cell.spec,
                cell.lewc_undefined,
            )
        )
    return _BaseMerge(merged, columns, metrics, pred.temperature)


@dataclass
class Comparison:
    """The rows of :func:`compare_methods` and each base merge's weights (BN re-estimated)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    merged: dict[str, StateDict] = field(default_factory=dict)


def evaluate_methods(
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float] | None,
    splits: DataSplits,
    methods: Sequence[str] | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """The rows of :func:`compare_methods` (same arguments)."""
    return compare_methods(template, states, weights, splits, methods, **options).rows


def compare_methods(
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float] | None,
    splits: DataSplits,
    methods: Sequence[str] | None = None,
    *,
    lambdas: int = 25,
    seed: int = 0,
    diagnostics: bool = True,
    diagnostic_samples: int = 512,
    device: str | torch.device | None = None,
    spec: PermutationSpec | None = None,
    layer_names: Sequence[str] | None = None,
    method_options: dict[str, Any] | None = None,
    progress: Progress = None,
    client_templates: Sequence[nn.Module] | None = None,
) -> Comparison:
    """One row per requested method (columns :func:`fedlmc.study.rows.row_columns`), all on the same
    client models, and the merged weights of each base merge (``Comparison.merged``).

    ``methods`` defaults to every study method (:func:`fedlmc.merging.methods.study_methods`)
    that accepts this many clients (:func:`default_methods`); a method that does not
    (``random_direction`` with more than two) is refused before any work.
    Each base merge is computed once; its ``_t`` row reuses it with the server-fitted
    temperature. Raw rows have ``temperature = 1``; ``nll_raw``/``nll_calibrated`` (and ECE) are
    filled for both; the ``merge_gap_*`` columns compare with the unweighted mean endpoint.
    ``diagnostics=False`` skips the interpolation curves (barriers), LEWC, orthogonality, ReLU
    additivity and ranks (the merge gap remains). Diagnostics use the first ``diagnostic_samples``
    test inputs. ``spec`` (default: the template's, derived from its graph for models without a
    hand-written one) and ``layer_names`` (default: ``template.layer_names``, else derived from
    the graph) make any traceable model work. ``method_options`` reach every merge method
    (e.g. ``{"auto_tolerance": 0.05}``). ``progress`` (optional) receives one-line status
    messages. ``client_templates`` (one model per client) are the architectures the clients'
    weights load into when they differ from ``template`` (clients of different widths, merged
    at ``template``'s width by a mixed-width merge method); default: ``template`` for every
    client.
    """
    _check_states(states)
    methods = check_client_count(
        check_methods(default_methods(len(states)) if methods is None else methods), len(states)
    )
    if int(lambdas) < 2:
        raise ValueError(f"lambdas must be an integer >= 2, got {lambdas}")
    if int(diagnostic_samples) < 1:
        raise ValueError(f"diagnostic_samples must be >= 1, got {diagnostic_samples}")
    dev = resolve_device(device)
    template = copy.deepcopy(template).to(dev).eval()
    aligning = any(base_method(m) != "average" for m in methods if m not in REFERENCE_METHODS)
    if spec is None and aligning and not hasattr(template, "permutation_spec"):
        # derived once from the graph on two test inputs, shared by every method
        spec = permutation_spec(template, splits.test[0][:2].to(dev))
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
        spec=spec,
        layer_names=layer_names,
        options=method_options,
        progress=progress,
        client_templates=client_templates,
    )
    shared: dict[str, _BaseMerge] = {}
    result = Comparison()
    for method in methods:
        if method in REFERENCE_METHODS:
            result.rows.append(_reference_row(cell, method))
            continue
        base = base_method(method)
        if base not in shared:
            shared[base] = _base_columns(cell, base)
            result.merged[base] = shared[base].merged.state
        found = shared[base]
        row = empty_row(method, len(cell.states))
        row.update(cell.common)
        calibrated = method.endswith(CALIBRATED_SUFFIX)
        row.update(metric_columns(found.metrics, calibrated, found.temperature))
        row.update(found.columns)
        result.rows.append(row)
    return result


def evaluate_model_row(
    method: str,
    model: nn.Module,
    splits: DataSplits,
    *,
    calibrated: bool | None = None,
    num_clients: int = 1,
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """A row with :func:`fedlmc.study.rows.row_columns` for a single model (e.g. FedAvg's final
    model).

    Test accuracy, NLL and ECE; ``temperature`` is fitted on the server split and used for
    ``nll``/``ece`` when ``calibrated`` (default: ``method`` ends with ``_t``). Endpoint,
    ensemble, barrier and diagnostic columns are NaN.
    """
    if not isinstance(method, str) or not method:
        raise ValueError(f"method must be a non-empty string, got {method!r}")
    if calibrated is None:
        calibrated = method.endswith(CALIBRATED_SUFFIX)
    dev = resolve_device(device)
    pred = Predictions.of(copy.deepcopy(model).to(dev).eval(), splits, dev)
    row = empty_row(method, num_clients)
    row.update(metric_columns(pred.metrics(splits.test[1]), calibrated, pred.temperature))
    return row
