r"""LEWC diagnostics (Ito et al. 2025): layerwise connectivity and its sufficient conditions.

**LEWC.** For models :math:`\theta_i` merged with weights :math:`w_i` (normalised to sum to 1),
Layerwise Exponentially Weighted Connectivity predicts the merged model's layer-:math:`l` output as

.. math:: f_l(x; \textstyle\sum_i w_i \theta_i) \approx \sum_i w_i^{\,l} f_l(x; \theta_i),

(for two models: :math:`\lambda^l f_l(x;\theta_a) + (1-\lambda)^l f_l(x;\theta_b)`), measured by
the cosine similarity of the two sides (:func:`lewc_cosine`) and, since a cosine cannot tell LEWC
from LLFC's :math:`\sum_i w_i f_l(x; \theta_i)` (Zhou et al. 2023) at equal weights, by LEWC's
relative error against LLFC's at its best positive scale (:func:`scaled_error`: LLFC holds only up
to a scale) and the measured against the predicted norm ratio (:func:`layer_predictions`). Raw
cosines of non-negative features are high by construction: the centred and shuffled-input
cosines and the common-mode share (:mod:`fedlmc.analysis.cosines`) say how much of one is
input-specific. The merged logits shrink (:func:`logit_norm_ratios`: against the logit
ensemble, what LEWC predicts, and against the clients' own). The exponent :math:`l` exists for
plain chains only (:mod:`fedlmc.permutation.chain`). Many-client collapse: :func:`bias_shares`,
:func:`dead_unit_fractions`. Sufficient conditions for bias-free ReLU nets: weak additivity of
ReLU (:func:`relu_additivity_error`, per ReLU) and reciprocal orthogonality
:math:`W^{(a)}_l z^{(b)}_{l-1} \approx 0` (:func:`reciprocal_orthogonality`, per Linear/Conv).
Wide, low-rank weights (weight decay) make both hold; :func:`stable_ranks` (per hidden layer),
:func:`stable_rank`, :func:`effective_rank` measure the rank. Per-layer lists are in depth order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlmc.analysis.cosines import MeasuredOutput, common_mode_share, mean_cosine
from fedlmc.analysis.shared_forwards import active_cache
from fedlmc.analysis.spectral import spectral_norm_squared
from fedlmc.averaging import load_state, normalised_weights
from fedlmc.capture import HookKind, forward_capture, linear_layers
from fedlmc.columns import PREDICTION_KEYS
from fedlmc.permutation.model_spec import derive_layer_names


def capture(
    model: nn.Module,
    names: Sequence[str],
    x: Tensor,
    *,
    mode: HookKind = "output",
    batch_size: int = 1024,
) -> dict[str, Tensor]:
    """Outputs (``mode="output"``) or first inputs (``mode="input"``) of the named modules on ``x``.

    Runs ``model`` in eval mode in batches (:func:`fedlmc.capture.forward_capture`); tensors are
    returned on the CPU as float64, concatenated over the batch dimension. Inside
    :func:`fedlmc.analysis.shared_forwards.sharing` the active cache answers for a model it has
    seen (the same values; one pass per model and input batch).
    """
    cache = active_cache()
    if cache is not None:
        return cache.capture(model, names, x, mode, batch_size)
    store: dict[str, list[Tensor]] = {n: [] for n in names}

    def make_hook(name: str) -> Callable:
        if mode == "output":
            return lambda _m, _inputs, out: store[name].append(out.detach().double().cpu())
        return lambda _m, inputs: store[name].append(inputs[0].detach().double().cpu())

    with forward_capture(model, {n: make_hook(n) for n in names}, kind=mode) as forward:
        for i in range(0, len(x), batch_size):
            forward(x[i : i + batch_size])
    return {n: torch.cat(chunks) for n, chunks in store.items()}


def _sample_norms(t: Tensor) -> Tensor:
    """Euclidean norm of each sample (dim 0) with the other dims flattened."""
    return t.flatten(1).norm(dim=1)


def layer_names_of(
    model: nn.Module, x: Tensor, layer_names: Sequence[str] | None = None
) -> list[str]:
    """``layer_names`` if given, else ``model.layer_names``, else the layer outputs derived from
    the model's graph on ``x`` (:func:`fedlmc.permutation.derive_layer_names`)."""
    if layer_names is None:
        layer_names = getattr(model, "layer_names", None)
    if layer_names is None:
        layer_names = derive_layer_names(model, x[:2])
    names = list(layer_names)
    if not names:
        raise ValueError("layer_names is empty; allowed: the names of modules of the model")
    return names


def _merged_and_members(
    template: nn.Module,
    state_dicts: Sequence[Mapping[str, Tensor]],
    merged_state_dict: Mapping[str, Tensor],
    x: Tensor,
    names: Sequence[str],
) -> tuple[dict[str, Tensor], list[dict[str, Tensor]]]:
    """Layer outputs (float64, CPU) of the merged model and of each member: one pass per model."""
    if len(state_dicts) == 0:
        raise ValueError("layer diagnostics need at least one state dict, got none")
    merged = _capture_state(template, merged_state_dict, names, x)
    members = [_capture_state(template, sd, names, x) for sd in state_dicts]
    return merged, members


def _capture_state(
    template: nn.Module, state_dict: Mapping[str, Tensor], names: Sequence[str], x: Tensor
) -> dict[str, Tensor]:
    """:func:`capture` of the layer outputs of ``template`` loaded with ``state_dict``; inside
    :func:`fedlmc.analysis.shared_forwards.sharing` a state seen before is not loaded again."""
    cache = active_cache()
    if cache is not None:
        return cache.capture_state(template, state_dict, names, x, "output", 1024)
    return capture(load_state(template, state_dict), names, x)


def _weighted_sum(weights: Sequence[float], tensors: Sequence[Tensor]) -> Tensor:
    return sum(w * t for w, t in zip(weights, tensors, strict=True))


def lewc_cosine(
    model: nn.Module,
    state_dicts: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float] | None,
    merged_state_dict: Mapping[str, Tensor],
    x: Tensor,
    layer_names: Sequence[str] | None = None,
) -> list[float]:
    r"""Per layer :math:`l = 1..L` of the layer names (:func:`layer_names_of`): cosine of merged
    output and LEWC.

    .. math:: c_l = \frac{1}{n}\sum_n \cos\Big(f_l(x_n; \theta_{\mathrm{merged}}),\;
        \sum_i w_i^{\,l} f_l(x_n; \theta_i)\Big)

    with ``weights`` normalised to sum to 1 (``None``: uniform), outputs flattened per sample and
    the cosine averaged over samples (:func:`~fedlmc.analysis.cosines.mean_cosine`). ``model``
    is a template whose architecture matches the state dicts; it is not modified. Layers are
    evaluated in eval mode.

    A cosine ignores scale: at equal weights it equals the cosine with LLFC's prediction
    :math:`\sum_i w_i f_l(x; \theta_i)`. :func:`layer_predictions` tells the two apart.
    """
    names = layer_names_of(model, x, layer_names)
    w = normalised_weights(weights, len(state_dicts)) if state_dicts else []
    merged, members = _merged_and_members(model, state_dicts, merged_state_dict, x, names)
    cosines = []
    for depth, name in enumerate(names, start=1):
        prediction = _weighted_sum([wi**depth for wi in w], [m[name] for m in members])
        cosines.append(mean_cosine(merged[name], prediction))
    return cosines


def _ratio(numerator: Tensor | float, denominator: Tensor | float) -> float:
    """``numerator / denominator`` as a float; ``nan`` when the denominator is 0."""
    denominator = float(denominator)
    return float(numerator) / denominator if denominator > 0 else math.nan


def scaled_error(measured: Tensor, prediction: Tensor) -> float:
    r"""Scale-free relative error :math:`\min_{c > 0} \|F - c P\| / \|F\|` (Frobenius norms).

    With :math:`\cos = \langle F, P\rangle / (\|F\| \|P\|)` the best positive scale leaves
    :math:`\sqrt{1 - \cos^2}` when :math:`\cos > 0`, and 1 (:math:`c \to 0`) otherwise: the
    error of a prediction that holds up to a positive scale, as LLFC does (Zhou et al. 2023).
    ``nan`` when either side is 0.
    """
    return _scaled_error(measured, float(measured.norm()), prediction, float(prediction.norm()))


def _scaled_error(
    measured: Tensor, norm: float, prediction: Tensor, prediction_norm: float
) -> float:
    """:func:`scaled_error` given both sides' norms."""
    norms = norm * prediction_norm
    if norms <= 0:
        return math.nan
    cos = float((measured * prediction).sum()) / norms
    return math.sqrt(max(0.0, 1.0 - cos * cos)) if cos > 0 else 1.0


def layer_predictions(
    template: nn.Module,
    state_dicts: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float] | None,
    merged_state_dict: Mapping[str, Tensor],
    x: Tensor,
    layer_names: Sequence[str] | None = None,
    lewc: bool = True,
) -> list[dict[str, float | int | str]]:
    r"""Per layer: how well LEWC and LLFC, each as its authors state it, predict the merged
    model's layer output.

    With :math:`F_l = f_l(X; \theta_{\mathrm{merged}})` the merged model's output of layer
    :math:`l` on the whole batch ``x``, the two predictions

    .. math:: P^{\mathrm{LEWC}}_l = \sum_i w_i^{\,l} f_l(X; \theta_i), \qquad
              P^{\mathrm{LLFC}}_l = \sum_i w_i f_l(X; \theta_i)

    (Ito et al. 2025; Zhou et al. 2023) and :math:`\|\cdot\|` the Frobenius norm over the
    whole batch (all samples and all units at once). LEWC predicts the output itself, scale
    included; LLFC predicts it only **up to a positive scale** (its authors measure it by
    cosine). Each row holds

    - ``lewc_error`` :math:`= \|F_l - P^{\mathrm{LEWC}}_l\| / \|F_l\|` (LEWC's claim: scale and
      direction);
    - ``llfc_scaled_error`` :math:`= \min_{c>0} \|F_l - c P^{\mathrm{LLFC}}_l\| / \|F_l\|`
      (LLFC's claim, :func:`scaled_error`); at equal weights :math:`P^{\mathrm{LEWC}}_l` is a
      positive multiple of :math:`P^{\mathrm{LLFC}}_l`, so this is never above ``lewc_error``;
    - ``lewc_cos``, ``llfc_cos``: mean over samples of the cosine with each prediction (equal at
      equal weights; they differ in direction at other weights, e.g. :math:`\lambda = 1/4`);
    - ``lewc_cos_centred``, ``llfc_cos_centred``: the same cosines with both sides centred on
      their mean over the inputs (:func:`~fedlmc.analysis.cosines.centred_cosine`; ``nan`` for a
      constant side), and
      ``lewc_cos_shuffled``, ``llfc_cos_shuffled``: their baseline, the prediction taken at
      another input (:func:`~fedlmc.analysis.cosines.shuffled_cosine`, seed 0);
    - ``common_mode_share``: the share of :math:`F_l`'s energy in its mean over the inputs
      (:func:`~fedlmc.analysis.cosines.common_mode_share`);
    - ``norm_ratio`` :math:`= \|F_l\| / \|P^{\mathrm{LLFC}}_l\|` (the measured shrinkage of the
      merged output relative to the weighted mean of the endpoints' outputs) and
      ``lewc_norm_ratio`` :math:`= \|P^{\mathrm{LEWC}}_l\| / \|P^{\mathrm{LLFC}}_l\|` (the
      shrinkage LEWC predicts; exactly :math:`N^{1-l}` for N models at equal weights). LLFC makes
      no claim about this ratio;

    plus ``layer`` (its name) and ``depth`` :math:`l`. A ratio with a zero denominator is
    ``nan``. ``layer_names`` defaults to ``template.layer_names``; :math:`l` is the 1-based
    position in that list, so pass every layer (a subset changes the exponents). ``weights``
    are normalised to sum to 1 (``None``: uniform). Each model runs once over ``x`` in eval mode;
    ``template`` (same architecture as the state dicts) is not modified. ``lewc=False`` (a
    network whose layers have no single depth, e.g. residual) leaves the LEWC entries ``nan``
    without computing its prediction; every other entry is the same.

    Two models merged from themselves (identical states) make LLFC exact, while LEWC predicts
    :math:`\sum_i w_i^{\,l} f_l`, i.e. ``lewc_norm_ratio`` :math:`= \sum_i w_i^{\,l}` and
    ``lewc_error`` :math:`= |1 - \sum_i w_i^{\,l}|`: LEWC needs reciprocal orthogonality.
    """
    names = layer_names_of(template, x, layer_names)
    w = normalised_weights(weights, len(state_dicts)) if state_dicts else []
    merged, members = _merged_and_members(template, state_dicts, merged_state_dict, x, names)
    rows = []
    for depth, name in enumerate(names, start=1):
        outputs = [m[name] for m in members]
        measured, llfc = MeasuredOutput(merged[name]), _weighted_sum(w, outputs)
        prediction = _weighted_sum([wi**depth for wi in w], outputs) if lewc else None
        llfc_norm = float(llfc.norm())
        values = _llfc_measures(measured, llfc, llfc_norm)
        values |= _lewc_measures(measured, prediction, llfc_norm)
        rows.append({"layer": name, "depth": depth} | {k: values[k] for k in PREDICTION_KEYS})
    return rows


def _llfc_measures(measured: MeasuredOutput, llfc: Tensor, llfc_norm: float) -> dict[str, float]:
    """A row's LLFC measures (``llfc_norm`` = ``float(llfc.norm())``) and those of the measured
    output alone."""
    return {
        "llfc_scaled_error": _scaled_error(measured.t, measured.norm(), llfc, llfc_norm),
        "llfc_cos": measured.cosine(llfc),
        "norm_ratio": _ratio(measured.norm(), llfc_norm),
        "llfc_cos_centred": measured.centred_cosine(llfc),
        "llfc_cos_shuffled": measured.shuffled_cosine(llfc),
        "common_mode_share": common_mode_share(measured.t),
    }


def _lewc_measures(
    measured: MeasuredOutput, lewc: Tensor | None, llfc_norm: float
) -> dict[str, float]:
    """A row's LEWC measures of the prediction ``lewc``; each ``nan`` when it is ``None``."""
    if lewc is None:
        return dict.fromkeys((k for k in PREDICTION_KEYS if k.startswith("lewc_")), math.nan)
    return {
        "lewc_error": _ratio((measured.t - lewc).norm(), measured.norm()),
        "lewc_cos": measured.cosine(lewc),
        "lewc_norm_ratio": _ratio(lewc.norm(), llfc_norm),
        "lewc_cos_centred": measured.centred_cosine(lewc),
        "lewc_cos_shuffled": measured.shuffled_cosine(lewc),
    }


class LogitNormRatios(NamedTuple):
    r"""How the merged model's logits compare in size with the clients'
    (:func:`logit_norm_ratios`), two quantities that must not be read as one.

    ``logit_ensemble``, :math:`\rho_{\mathrm{ens}}`: the merge's logits over the logit ensemble's
    (the weighted mean of the clients' logits, :math:`\bar z = \sum_i w_i z_i`), the quantity
    LEWC predicts: under LEWC the merged logits are :math:`\sum_i w_i^L z_i`, at equal weights
    exactly :math:`N^{1-L}\,\bar z`, so :math:`\rho_{\mathrm{ens}} = N^{1-L}` (the study's
    ``lewc_temperature_ratio`` is the prediction at any weights,
    :math:`\|\sum_i w_i^L z_i\| / \|\bar z\|`). ``client_norms``, :math:`\rho_{\mathrm{cl}}`:
    the merge's mean logit norm over the clients' mean logit norms, the merge against the
    clients' own scale; the clients' logits partly cancel in their mean, so this is the smaller
    of the two (equal when they point the same way)."""

    logit_ensemble: float
    client_norms: float


def logit_norm_ratios(
    template: nn.Module,
    state_dicts: Sequence[Mapping[str, Tensor]],
    merged_state_dict: Mapping[str, Tensor],
    x: Tensor,
    weights: Sequence[float] | None = None,
) -> LogitNormRatios:
    r"""How much the merged model's logits shrink, against the logit ensemble and against the
    clients' own logits (:class:`LogitNormRatios`), from one forward pass per model:

    .. math::
        \rho_{\mathrm{ens}} = \frac{\mathrm{mean}_n \|z(x_n; \theta_{\mathrm{merged}})\|}
        {\mathrm{mean}_n \|\sum_i w_i z(x_n; \theta_i)\|}, \qquad
        \rho_{\mathrm{cl}} = \frac{\mathrm{mean}_n \|z(x_n; \theta_{\mathrm{merged}})\|}
        {\sum_i w_i\, \mathrm{mean}_n \|z(x_n; \theta_i)\|}

    with :math:`z` the model's output (the logits), :math:`\|\cdot\|` the Euclidean norm per
    input and ``weights`` normalised (``None``: uniform). Only the denominators differ: the norm
    of the clients' mean logits, or the mean of their norms; by the triangle inequality
    :math:`\rho_{\mathrm{cl}} \le \rho_{\mathrm{ens}}`, equal when the clients' logits point
    the same way on every input. For two models at :math:`\lambda = 1/2` LEWC predicts logits
    :math:`2^{-L}(z_a + z_b)`, so :math:`\rho_{\mathrm{ens}} = 2^{1-L}` exactly when it holds
    (:math:`N^{1-L}` for :math:`N` equally weighted models), with :math:`L` the depth of the
    classifier. Each is ``nan`` when its denominator is 0.
    """
    w = normalised_weights(weights, len(state_dicts)) if state_dicts else []
    merged, members = _merged_and_members(template, state_dicts, merged_state_dict, x, [""])
    ensemble = _weighted_sum(w, [m[""] for m in members])
    clients = sum(wi * _sample_norms(m[""]).mean() for wi, m in zip(w, members, strict=True))
    return LogitNormRatios(
        logit_ensemble=_ratio(_sample_norms(merged[""]).mean(), _sample_norms(ensemble).mean()),
        client_norms=_ratio(_sample_norms(merged[""]).mean(), clients),
    )


def apply_without_bias(module: nn.Module, z: Tensor) -> Tensor:
    """:math:`W z` for a Linear or Conv module: its weight with its stride/padding, no bias, as
    float64 on the CPU. A Linear computes in float64; a Conv in its weight's own dtype, as the
    layer does (float64 convolutions have no fast CPU kernel: about 8x slower than float32)."""
    if isinstance(module, nn.Linear):
        return F.linear(z, module.weight.detach().double().cpu())
    if module.padding_mode != "zeros":
        raise ValueError(f"padding_mode {module.padding_mode!r} not supported; only 'zeros'")
    weight = module.weight.detach().cpu()
    conv = {nn.Conv1d: F.conv1d, nn.Conv2d: F.conv2d, nn.Conv3d: F.conv3d}[type(module)]
    out = conv(
        z.to(weight.dtype),
        weight,
        None,
        module.stride,
        module.padding,
        module.dilation,
        module.groups,
    )
    return out.double()


@torch.no_grad()
def reciprocal_orthogonality(
    model_a: nn.Module, model_b: nn.Module, x: Tensor
) -> list[dict[str, float | str]]:
    r"""Per Linear/Conv layer: how much each model's weights respond to the other's inputs.

    With :math:`z^{(a)}, z^{(b)}` the layer inputs of the two models on the same ``x`` (forward
    pre-hooks) and :math:`W` the weights without bias,

    .. math:: r_{ab} = \frac{\mathrm{mean}_n \|W_a z^{(b)}_n\|}{\mathrm{mean}_n \|W_a z^{(a)}_n\|},
        \qquad r_{ba} = \frac{\mathrm{mean}_n \|W_b z^{(a)}_n\|}{\mathrm{mean}_n \|W_b z^{(b)}_n\|}

    (ratio of means, so samples with zero activations do not divide by zero). Reciprocal
    orthogonality means :math:`r \approx 0`; identical models give 1. The first layer sees the
    same input in both models, so its ratios are 1. Returns dicts ``layer, ratio_ab, ratio_ba``.
    """
    layers_a, layers_b = linear_layers(model_a), linear_layers(model_b)
    if list(layers_a) != list(layers_b):
        raise ValueError("model_a and model_b must have the same Linear/Conv layers")
    names = list(layers_a)
    z_a = capture(model_a, names, x, mode="input")
    z_b = capture(model_b, names, x, mode="input")
    rows = []
    for name in names:
        za, zb = z_a[name], z_b[name]
        same = torch.equal(za, zb)  # the first layer's input: each norm computed once
        own_a, own_b = _response(layers_a[name], za), _response(layers_b[name], zb)
        ratio_ab = (own_a if same else _response(layers_a[name], zb)) / own_a
        ratio_ba = (own_b if same else _response(layers_b[name], za)) / own_b
        rows.append({"layer": name, "ratio_ab": float(ratio_ab), "ratio_ba": float(ratio_ba)})
    return rows


def _response(module: nn.Module, z: Tensor) -> Tensor:
    r""":math:`\mathrm{mean}_n \|W z_n\|` (:func:`apply_without_bias`), a float64 scalar."""
    return _sample_norms(apply_without_bias(module, z)).mean()


def relu_layers(model: nn.Module) -> list[str]:
    """Names of the ``nn.ReLU`` modules of ``model`` in ``named_modules`` order."""
    return [n for n, m in model.named_modules() if isinstance(m, nn.ReLU)]


@torch.no_grad()
def relu_additivity_error(
    model_a: nn.Module, model_b: nn.Module, x: Tensor, lam: float = 0.5
) -> list[float]:
    r"""Per ReLU module: relative failure of weak additivity on the two models' pre-activations.

    .. math:: e = \frac{\|\mathrm{relu}(\lambda z_a + (1-\lambda) z_b)
        - [\lambda\,\mathrm{relu}(z_a) + (1-\lambda)\,\mathrm{relu}(z_b)]\|}
        {\|\lambda\,\mathrm{relu}(z_a) + (1-\lambda)\,\mathrm{relu}(z_b)\|}

    with :math:`z` the ReLU inputs on ``x`` (forward pre-hooks) and Frobenius norms over the whole
    batch. 0 when :math:`z_a = z_b`; ``nan`` when the denominator is 0.
    """
    names = relu_layers(model_a)
    if names != relu_layers(model_b):
        raise ValueError("model_a and model_b must have the same ReLU modules")
    z_a = capture(model_a, names, x, mode="input")
    z_b = capture(model_b, names, x, mode="input")
    errors = []
    for name in names:
        linear = lam * F.relu(z_a[name]) + (1.0 - lam) * F.relu(z_b[name])
        mixed = F.relu(lam * z_a[name] + (1.0 - lam) * z_b[name])
        denominator = float(linear.norm())
        errors.append(float((mixed - linear).norm()) / denominator if denominator > 0 else math.nan)
    return errors


def singular_values(weight: Tensor) -> Tensor:
    """Singular values (float64) of a weight reshaped to ``(out, -1)``."""
    if weight.ndim < 2:
        raise ValueError(
            f"rank needs a matrix or conv weight (ndim >= 2), got shape {tuple(weight.shape)}"
        )
    return torch.linalg.svdvals(weight.detach().double().cpu().reshape(weight.shape[0], -1))


def stable_rank(weight: Tensor) -> float:
    r"""Stable rank :math:`\|W\|_F^2 / \|W\|_2^2 = \sum_i \sigma_i^2 / \sigma_1^2` (0 for W = 0):
    the Frobenius norm exactly, :math:`\sigma_1^2` by
    :func:`fedlmc.analysis.spectral.spectral_norm_squared` (no full SVD)."""
    top = spectral_norm_squared(weight)
    frobenius = float(weight.detach().double().cpu().pow(2).sum())
    return frobenius / top if top > 0 else 0.0


def effective_rank(weight: Tensor) -> float:
    r"""Effective rank (Roy & Vetterli 2007): :math:`\exp(-\sum_i p_i \log p_i)`.

    :math:`p_i = \sigma_i / \sum_j \sigma_j` are the normalised singular values of ``weight``
    reshaped to ``(out, -1)``.

    Zero singular values contribute 0; the zero matrix has effective rank 0.
    """
    s = singular_values(weight)
    total = float(s.sum())
    if total <= 0:
        return 0.0
    p = s / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def weight_ranks(state_dict: Mapping[str, Tensor]) -> pd.DataFrame:
    """Stable and effective rank of every weight with ``ndim >= 2`` (Linear and Conv weights).

    Columns ``key, shape, stable_rank, effective_rank``; one row per key in state-dict order.
    """
    rows = [
        {
            "key": key,
            "shape": tuple(tensor.shape),
            "stable_rank": stable_rank(tensor),
            "effective_rank": effective_rank(tensor),
        }
        for key, tensor in state_dict.items()
        if tensor.is_floating_point() and tensor.ndim >= 2
    ]
    return pd.DataFrame(rows, columns=["key", "shape", "stable_rank", "effective_rank"])


def hidden_weight_keys(state_dict: Mapping[str, Tensor], head: str = "classifier") -> list[str]:
    """Keys of the float weights with ``ndim >= 2`` outside module ``head``, in state-dict order.

    For the built-in models (whose output layer is the module ``classifier``) these are the hidden
    Linear/Conv weights in depth order (a ResNet block lists conv1, conv2, then its shortcut).
    """
    return [
        key
        for key, tensor in state_dict.items()
        if tensor.is_floating_point() and tensor.ndim >= 2 and not key.startswith(f"{head}.")
    ]


def stable_ranks(
    state_dict: Mapping[str, Tensor], keys: Sequence[str] | None = None
) -> list[float]:
    r""":func:`stable_rank` :math:`\|W\|_F^2 / \|W\|_2^2` of each weight in ``keys``, in order.

    ``keys`` defaults to :func:`hidden_weight_keys` (the hidden layers, in depth order).
    """
    keys = hidden_weight_keys(state_dict) if keys is None else list(keys)
    missing = [key for key in keys if key not in state_dict]
    if missing:
        raise ValueError(f"key {missing[0]!r} not in the state dict; allowed: its weight keys")
    return [stable_rank(state_dict[key]) for key in keys]


@torch.no_grad()
def dead_unit_fractions(
    model: nn.Module, x: Tensor, layer_names: Sequence[str] | None = None
) -> list[float]:
    r"""Per hidden layer output (every layer name but the last, the logits): the fraction of its
    units (dim 1: neurons or channels; ``model.unit_dim`` where the model declares it, -1 for
    the features of a ViT's ``(N, T, D)`` tokens) that are never active,
    :math:`f_{l,u}(x_n) \le 0` for every input :math:`x_n` of ``x`` (and every spatial position
    or token). A merge whose deep layers are dead passes only its biases on: the many-client
    collapse of plain averaging."""
    names = layer_names_of(model, x, layer_names)[:-1]
    outputs = capture(model, names, x)
    dim = getattr(model, "unit_dim", 1)
    fractions = []
    for name in names:
        active = outputs[name].movedim(dim, 0).flatten(1) > 0
        fractions.append(float((~active.any(dim=1)).double().mean()))
    return fractions


@torch.no_grad()
def bias_shares(model: nn.Module, x: Tensor) -> list[float]:
    r"""Per Linear/Conv module (:func:`linear_layers` order): the share of its pre-activation
    :math:`W z + b` that comes from the bias on the inputs ``x``,

    .. math:: s = \frac{\|b\,\mathbf{1}^\top\|}{\|W Z\| + \|b\,\mathbf{1}^\top\|}

    (Frobenius norms over the batch, the bias broadcast to every sample and position or token:
    a Linear's units are its output's last axis, a Conv's its axis 1): 0 without a bias, 1/2
    when bias and signal have equal norms, near 1 when the bias swamps the signal."""
    layers = linear_layers(model)
    biased = any(module.bias is not None for module in layers.values())
    inputs = capture(model, list(layers), x, mode="input") if biased else {}
    shares = []
    for name, module in layers.items():
        if module.bias is None:
            shares.append(0.0)
            continue
        signal = apply_without_bias(module, inputs[name])
        if isinstance(module, nn.Linear):
            shape = (1,) * (signal.ndim - 1) + (-1,)
        else:
            shape = (1, -1) + (1,) * (signal.ndim - 2)
        bias = module.bias.detach().double().cpu().reshape(shape).expand_as(signal)
        shares.append(_ratio(bias.norm(), signal.norm() + bias.norm()))
    return shares
