r"""CCA Merge (Horoi, Oikarinen, Bagheri, Yang, Perez, "Harmony in Diversity: Merging Neural
Networks with Canonical Correlation Analysis", ICML 2024): align every model to a reference by
*linear maps* of its hidden units found by CCA of the layers' activations, then average.

For one hidden group (a layer's units) let :math:`X` be the reference model's activations and
:math:`Y` model :math:`i`'s, over the same inputs (conv outputs: every spatial position is a
sample), with covariances :math:`\Sigma_{xx}, \Sigma_{yy}` (centred, population) and
cross-covariance :math:`\Sigma_{xy}`. With a ridge :math:`\gamma` on the auto-covariances,
:math:`A = \Sigma_{xx} + \gamma \bar\sigma^2 I`, :math:`B = \Sigma_{yy} + \gamma \bar\sigma^2 I`
(:math:`\bar\sigma^2` the mean of both diagonals, so the ridge does not depend on the units'
scale) and the SVD :math:`A^{-1/2} \Sigma_{xy} B^{-1/2} = U S V^\top`, the map taking model
:math:`i`'s units to the reference's and its inverse are

.. math:: T = A^{1/2} U V^\top B^{-1/2}, \qquad T^{-1} = B^{1/2} V U^\top A^{-1/2}

(symmetric square roots). Model :math:`i`'s layer :math:`l` (weights :math:`W_l`, bias
:math:`b_l`) in the reference basis is :math:`W'_l = T_l W_l T_{l-1}^{-1}`, :math:`b'_l = T_l b_l`
(:math:`T_0`, :math:`T_L` the identity: the inputs and the logits are shared), and the merge is
:math:`\sum_i w_i \theta'_i` with the reference's :math:`T = I`: the paper's N-model form,
every model mapped to one reference (client 0).

A permutation :math:`Y = P X` gives :math:`T = P^\top` exactly, at any ridge: then
:math:`\Sigma_{xy} = \Sigma_{xx} P^\top` and :math:`B = P A P^\top`, so the whitened
cross-covariance is :math:`A^{-1/2} \Sigma_{xx} A^{-1/2} P^\top`, whose orthogonal polar factor
:math:`U V^\top` is :math:`P^\top` (for a nonsingular :math:`\Sigma_{xx}`), and
:math:`T = A^{1/2} P^\top P A^{-1/2} P^\top = P^\top`. CCA Merge thus contains permutation
alignment. An invertible positive rescaling :math:`Y = D X` gives :math:`T = D^{-1}` exactly at
:math:`\gamma = 0` (then :math:`A^{-1/2} \Sigma_{xy} B^{-1/2}` is itself orthogonal). Both
commute with ReLU, so a model merged with such a copy of itself is recovered. A dead unit (no
variance over the inputs) leaves the map arbitrary on the dead units' span, as in their code;
the ridge keeps the map invertible.

This follows their ``core/matching_functions.py``: ``match_tensors_cca`` (``y_map`` and
``y_unmerge_map``, all models to the first one, ridge ``gamma``), with the covariances of
``core/metric_calculators.py``'s ``CovarianceMetric`` computed once on the unaligned models at
the activations after each hidden layer's nonlinearity, as their graphs place them. Their
``gamma`` is absolute and searched per experiment (``evaluation/cca_hparam_search.py``); here it
is relative to the activations' variance: ``ridge`` (``cca_merge``'s method option
``cca_ridge``, default :data:`fedlmc.merging.baselines.baselines.CCA_RIDGE`).

With :math:`n` samples the centred :math:`\Sigma_{xy}` has rank at most :math:`n - 1`: with
fewer samples than units (400 server digits, 512 units) part of :math:`U` and :math:`V` spans
the null space, where the SVD returns an arbitrary orthonormal basis and :math:`U V^\top` is
not determined by the data; the ridge keeps :math:`A` and :math:`B` invertible but does not
fix that part of the rotation. docs/results.md reports the merge against the ridge and
:math:`n`.

Models: norm-free plain feed-forward chains (:func:`fedlmc.permutation.chain.norm_free_chain`:
the MLP, VGG-11 with ``norm = "none"``, a derived spec of such a chain), whose every hidden
group is written by one layer and read by the next. A linear map does not pass through a
BatchNorm or LayerNorm's per-unit normalisation, nor through a residual sum of differently
mapped groups, so other models are refused before any work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from fedlmc.capture import forward_capture
from fedlmc.permutation.chain import norm_free_chain
from fedlmc.permutation.spec import PermutationSpec

StateDict = dict[str, Tensor]

__all__ = ["apply_linear_maps", "cca_align", "cca_map", "unit_covariance"]


def cca_chain(
    spec: PermutationSpec, state: Mapping[str, Tensor], model: str = "model"
) -> list[tuple[str, str]]:
    """``(layer, group written)`` of the hidden layers of the norm-free chain, input to output
    (the output layer writes no group); ``ValueError`` naming ``model`` and why it is not one."""
    try:
        layers = norm_free_chain(spec, state)
    except ValueError as error:
        raise ValueError(
            f"cca_merge: model {model!r} is not supported; allowed: norm-free plain chains (MLP, "
            f"VGG-11 with norm = 'none'): {str(error).split('; ', 1)[-1]}"
        ) from None
    return [(layer, spec.axes_to_perm[f"{layer}.weight"][0]) for layer in layers[:-1]]


def activations(model: nn.Module, names: Sequence[str], x: Tensor) -> dict[str, Tensor]:
    """Outputs of the modules ``names`` on ``x`` (eval mode, batches of 1024), float64 on the
    CPU."""
    store: dict[str, list[Tensor]] = {name: [] for name in names}

    def hook_of(name: str):
        return lambda _m, _inputs, out: store[name].append(out.detach().double().cpu())

    with forward_capture(model, {name: hook_of(name) for name in names}) as forward:
        for start in range(0, len(x), 1024):
            forward(x[start : start + 1024])
    return {name: torch.cat(chunks) for name, chunks in store.items()}


def _as_samples(activation: Tensor) -> Tensor:
    """``(samples, units)``: a conv output's spatial positions become samples (units on dim 1)."""
    if activation.ndim > 2:
        activation = activation.movedim(1, -1).reshape(-1, activation.shape[1])
    return activation


def unit_covariance(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""Centred population :math:`(\Sigma_{xx}, \Sigma_{yy}, \Sigma_{xy})` of the unit
    activations ``x`` and ``y`` (``(samples, units)``, float64)."""
    x = x - x.mean(0)
    y = y - y.mean(0)
    n = x.shape[0]
    return x.T @ x / n, y.T @ y / n, x.T @ y / n


def _sqrt_and_inverse(matrix: Tensor) -> tuple[Tensor, Tensor]:
    """Symmetric :math:`M^{1/2}` and :math:`M^{-1/2}` of a symmetric positive definite matrix;
    ``ValueError`` for a singular one (possible only at ridge 0)."""
    values, vectors = torch.linalg.eigh(matrix)
    if float(values[0]) <= 1e-12 * max(float(values[-1]), 1e-300):
        raise ValueError(
            "CCA ridge 0 needs nonsingular activation covariances; a layer has units without "
            "variance (dead) or more units than samples: allowed: a ridge > 0 (cca_merge's "
            "default: 0.01)"
        )
    return (vectors * values.sqrt()) @ vectors.T, (vectors * values.rsqrt()) @ vectors.T


def cca_map(reference: Tensor, other: Tensor, ridge: float) -> tuple[Tensor, Tensor]:
    r"""``(T, T^{-1})`` taking ``other``'s units to ``reference``'s (see the module docstring);
    both activations are ``(samples, units)``. ``ValueError`` for a negative ridge or shapes
    that differ."""
    if ridge < 0:
        raise ValueError(f"CCA ridge must be >= 0, got {ridge}")
    if reference.shape != other.shape:
        raise ValueError(
            f"activations of shape {tuple(other.shape)} cannot be matched to "
            f"{tuple(reference.shape)}"
        )
    s_xx, s_yy, s_xy = unit_covariance(reference.double(), other.double())
    units = s_xx.shape[0]
    scale = float(torch.cat([s_xx.diagonal(), s_yy.diagonal()]).mean())
    eye = torch.eye(units, dtype=s_xx.dtype) * ridge * max(scale, 1e-12)
    a_sqrt, a_inv_sqrt = _sqrt_and_inverse(s_xx + eye)
    b_sqrt, b_inv_sqrt = _sqrt_and_inverse(s_yy + eye)
    u, _, vh = torch.linalg.svd(a_inv_sqrt @ s_xy @ b_inv_sqrt)
    rotation = u @ vh
    return a_sqrt @ rotation @ b_inv_sqrt, b_sqrt @ rotation.T @ a_inv_sqrt


def apply_linear_maps(
    state: Mapping[str, Tensor],
    chain: Sequence[tuple[str, str]],
    output_layer: str,
    maps: Mapping[str, tuple[Tensor, Tensor]],
) -> StateDict:
    r""":math:`W'_l = T_l W_l T_{l-1}^{-1}`, :math:`b'_l = T_l b_l` along the chain (hidden
    layers ``chain``, then ``output_layer``), with ``maps[group] = (T, T^{-1})``."""
    out = dict(state)
    previous: str | None = None
    for layer, group in [*chain, (output_layer, None)]:
        key = f"{layer}.weight"
        weight = state[key].double()
        if group is not None:
            weight = torch.einsum("om,m...->o...", maps[group][0], weight)
        if previous is not None:
            weight = torch.einsum("om...,mj->oj...", weight, maps[previous][1])
        out[key] = weight.to(state[key].dtype)
        bias_key = f"{layer}.bias"
        if group is not None and bias_key in state:
            out[bias_key] = (maps[group][0] @ state[bias_key].double()).to(state[bias_key].dtype)
        previous = group
    return out


def cca_align(
    models: Sequence[nn.Module],
    spec: PermutationSpec,
    x: Tensor,
    ridge: float,
    reference: int = 0,
) -> tuple[list[StateDict], list[dict[str, tuple[Tensor, Tensor]]]]:
    r"""Every model's state dict in ``reference``'s basis (the reference itself unchanged) and
    each model's maps ``{group: (T, T^{-1})}`` (empty for the reference), from activations on
    the inputs ``x``. Models must be norm-free plain chains under ``spec``."""
    states = [{k: v.detach() for k, v in m.state_dict().items()} for m in models]
    chain = cca_chain(spec, states[0], type(models[0]).__name__)
    output_layer = norm_free_chain(spec, states[0])[-1]
    names = {group: spec.activation_modules[group] for _, group in chain}
    acts = [activations(m, list(names.values()), x) for m in models]
    aligned, all_maps = [], []
    for index, (state, act) in enumerate(zip(states, acts, strict=True)):
        if index == reference:
            aligned.append(dict(state))
            all_maps.append({})
            continue
        maps = {
            group: cca_map(_as_samples(acts[reference][name]), _as_samples(act[name]), ridge)
            for group, name in names.items()
        }
        aligned.append(apply_linear_maps(state, chain, output_layer, maps))
        all_maps.append(maps)
    return aligned, all_maps
