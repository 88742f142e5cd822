r"""RESCALE (Qu and Horvath, "Vanishing Feature: Diagnosing Model Merging and Beyond", CPAL 2025,
arXiv 2402.05966): the post-merge normalisation that restores only the *scale* of the merged
model's hidden units.

Merging differently initialised models makes the input-dependent part of the features vanish as
it propagates ("vanishing feature"); REPAIR (:mod:`fedlmc.merging.repair`) fixes both the mean
and the std of every unit; VF argue that the std (the feature's scale) is the part that
matters. For every hidden unit :math:`c` of every rescaled layer, with :math:`z_c` its
pre-activation over data, :math:`\sigma_i` endpoint :math:`i`'s std (population, over the data;
conv outputs: every spatial position is a sample) and :math:`\sigma_m` the merged model's,

.. math:: \sigma_t = \sum_i w_i \sigma_i, \qquad s_c = \sigma_t / \sigma_m, \qquad
    W'_c = s_c W_c, \quad b'_c = s_c b_c,

so :math:`z'_c = s_c z_c`: the std becomes :math:`\sigma_t`, the mean is scaled with it (no
shift, unlike REPAIR's :math:`b'_c = s_c (b_c - \mu_m) + \mu_t`).

This follows their ``source/utils/connect.py``: ``repair(..., variant='rescale')`` wraps every
hidden conv in a ``RescaleLayer`` whose ``BatchScale2d`` divides the output by its std over data
and multiplies it by ``goal_std = sum(alpha * std)``; no mean is subtracted and the classifier is
not rescaled. Choices made here, as in :mod:`fedlmc.merging.repair` (whose statistics and
layers it reuses): the layers are every Linear/Conv but the output layer
(:func:`fedlmc.merging.repair.repair_layers`), corrected in depth order, each measured after the
earlier ones were corrected (their code measures all layers in one train-mode pass, which also
sees the corrected inputs); constant units (:math:`\sigma_m \le 10^{-6}` of their root mean
square) keep :math:`s_c = 1`. The factor is folded into the layer's weights, so the merged model
keeps its architecture. BatchNorm models are refused: re-estimating their running statistics
already sets every unit's scale (VF's ``reset_bn_stats`` after RESCALE does the same).

:func:`rescale` returns the rescaled model and the mean factor per layer: factors above 1 say
how much the merge had shrunk the features.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from fedlmc.averaging import normalised_weights
from fedlmc.merging.calibrate import has_batchnorm
from fedlmc.merging.repair import (
    CONSTANT_UNIT_TOLERANCE,
    UnitStats,
    checked_layers,
    repair_targets,
    unit_statistics,
)

__all__ = ["rescale", "rescale_units"]


@torch.no_grad()
def rescale_units(module: nn.Module, measured: UnitStats, target_std: Tensor) -> Tensor:
    r"""In place: :math:`W'_c = s_c W_c`, :math:`b'_c = s_c b_c` with
    :math:`s_c = \sigma_t / \sigma_m` per output unit (1 for a constant unit); returns
    :math:`s` (float64, CPU)."""
    weight = module.weight
    if measured.sum.numel() != weight.shape[0] or target_std.numel() != weight.shape[0]:
        raise ValueError(
            f"statistics of {measured.sum.numel()} units for a layer with {weight.shape[0]} units"
        )
    sigma_m = measured.std
    varying = sigma_m > CONSTANT_UNIT_TOLERANCE * measured.rms
    scale = torch.where(varying, target_std / torch.where(varying, sigma_m, 1.0), 1.0)
    weight.mul_(scale.to(weight).reshape((-1,) + (1,) * (weight.ndim - 1)))
    bias = getattr(module, "bias", None)
    if bias is not None:
        bias.mul_(scale.to(bias))
    return scale


def rescale(
    merged_model: nn.Module,
    endpoint_models: Sequence[nn.Module],
    weights: Sequence[float] | None,
    x: Tensor,
    layers: Sequence[str] | None = None,
) -> tuple[nn.Module, list[float]]:
    r"""RESCALE on inputs ``x``: a rescaled copy of ``merged_model`` and, per rescaled layer (in
    depth order), the mean of its factors :math:`s_c`.

    The targets :math:`\sigma_t = \sum_i w_i \sigma_i` come from ``endpoint_models`` (the
    clients in the merged basis; ``weights`` normalised, ``None``: uniform). ``ValueError`` for a
    BatchNorm model or no endpoint; ``merged_model`` and the endpoints are not modified.
    """
    if has_batchnorm(merged_model):
        raise ValueError(
            "model has BatchNorm layers; re-estimating their running statistics already sets "
            "every unit's scale: use fedlmc.merging.calibrate.reset_bn_stats"
        )
    if len(endpoint_models) == 0:
        raise ValueError("rescale needs at least one endpoint model, got none")
    names = checked_layers(merged_model, layers)
    w = normalised_weights(weights, len(endpoint_models))
    targets = repair_targets([unit_statistics(m, x, names) for m in endpoint_models], w)
    rescaled = copy.deepcopy(merged_model)
    modules = dict(rescaled.named_modules())
    means = []
    for name in names:
        measured = unit_statistics(rescaled, x, [name])[name]
        means.append(float(rescale_units(modules[name], measured, targets[name].std).mean()))
    return rescaled, means
