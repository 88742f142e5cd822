r"""Plain feed-forward chains: the depth of each layer, where LEWC's exponents are defined.

LEWC (Ito et al. 2025) predicts the merged layer-:math:`l` output
:math:`\sum_i w_i^{\,l} f_l(x; \theta_i)`, with :math:`l` the position of the layer in a chain
:math:`f_l = \sigma(W_l f_{l-1} + b_l)`. The exponent exists only where every layer reads the
output of exactly one earlier layer: in a residual block the output
:math:`\sigma(W_2 \sigma(W_1 x) + x)` mixes a term of depth :math:`l + 2` with one of depth
:math:`l`, and no single :math:`w_i^{\,l}` scales it.

:func:`chain_layers` reads the chain from a permutation spec: the Linear/Conv weights ordered so
that each one's input group is the previous one's output group, from the model's input
(no group) to its output (no group); ``None`` when the weights do not form one such chain.

For a chain, LEWC also says how the biases must combine. Under the merge
:math:`\bar W_l = \sum_i w_i W^{(i)}_l` of models with reciprocally orthogonal layers, the
weighted input of layer :math:`l` is :math:`\sum_i w_i^{\,l} W^{(i)}_l f^{(i)}_{l-1}`, so the
bias that keeps every layer an exponentially weighted sum of the endpoints' is

.. math:: \bar b_l = \sum_i w_i^{\,l} b^{(i)}_l,

not the plain average :math:`\sum_i w_i b^{(i)}_l`, which dominates the shrunken signal in deep
layers (:func:`depth_weighted_bias_average`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from fedlmc.averaging import average, normalised_weights
from fedlmc.permutation.spec import PermutationSpec

StateDict = dict[str, Tensor]

__all__ = [
    "chain_layers",
    "depth_weighted_bias_average",
    "lewc_bias_targets",
    "norm_free_chain",
    "outside_chain_key",
    "residual_reason",
]


def _weight_keys(state: Mapping[str, Tensor]) -> list[str]:
    """The Linear/Conv weights: floating ``*.weight`` tensors with at least 2 dims."""
    return [
        key
        for key, value in state.items()
        if key.endswith(".weight") and value.is_floating_point() and value.ndim >= 2
    ]


def chain_layers(spec: PermutationSpec, state: Mapping[str, Tensor]) -> list[str] | None:
    """The modules (prefixes of their ``.weight`` keys) of the plain chain, input to output;
    ``None`` when the Linear/Conv weights of ``state`` do not form one chain under ``spec``.

    Weight ``k`` reads group :math:`g_{k-1}` (its axis 1) and writes :math:`g_k` (axis 0), with
    :math:`g_0` and :math:`g_L` unpermuted (the input and the logits); every hidden group is
    written by exactly one weight and read by exactly one.
    """
    by_input: dict[str | None, list[str]] = {}
    outputs: dict[str, str | None] = {}
    for key in _weight_keys(state):
        groups = spec.axes_to_perm.get(key, (None,) * state[key].ndim)
        by_input.setdefault(groups[1], []).append(key)
        outputs[key] = groups[0]
    written = [g for g in outputs.values() if g is not None]
    if len(set(written)) != len(written) or any(len(keys) != 1 for keys in by_input.values()):
        return None
    order: list[str] = []
    group: str | None = None
    for _ in range(len(outputs)):
        if group not in by_input:
            return None
        order.append(by_input[group][0])
        group = outputs[order[-1]]
        if group is None:
            break
    if len(order) != len(outputs) or group is not None:
        return None
    return [key.removesuffix(".weight") for key in order]


def residual_reason(
    spec: PermutationSpec, state: Mapping[str, Tensor], layer_names: Sequence[str]
) -> str:
    """Why LEWC's depth exponents are undefined for this model ("" where they are defined):
    its weights are no plain chain (a residual network), or the chain's length differs from the
    number of layer outputs the diagnostics measure."""
    layers = chain_layers(spec, state)
    if layers is None:
        return "no single depth exponent: the Linear/Conv layers are not one plain chain (residual)"
    if len(layers) != len(layer_names):
        return (
            f"the chain has {len(layers)} Linear/Conv layers but {len(layer_names)} layer "
            "outputs are measured"
        )
    return ""


def norm_free_chain(spec: PermutationSpec, state: Mapping[str, Tensor]) -> list[str]:
    """:func:`chain_layers`, or ``ValueError`` naming why the model is no norm-free plain chain
    (the only models where the depth-weighted bias rule is LEWC's prediction)."""
    layers = chain_layers(spec, state)
    if layers is None:
        raise ValueError(
            "depth-weighted biases need a plain feed-forward chain (MLP, VGG without BatchNorm, "
            "a derived spec of a chain); this model's layers are not one chain (residual?)"
        )
    other = outside_chain_key(layers, state)
    if other is not None:
        raise ValueError(
            f"depth-weighted biases need a norm-free chain; state key {other!r} is not a "
            "Linear/Conv weight or bias of the chain (norm = 'none' allowed only)"
        )
    return layers


def outside_chain_key(layers: Sequence[str], state: Mapping[str, Tensor]) -> str | None:
    """The first key of ``state`` that is no weight or bias of the chain ``layers`` (a norm
    layer's parameter or running statistic), or ``None`` for a norm-free chain."""
    own = {f"{layer}.{name}" for layer in layers for name in ("weight", "bias")}
    return next((key for key in state if key not in own), None)


def lewc_bias_targets(
    layers: Sequence[str], states: Sequence[Mapping[str, Tensor]], weights: Sequence[float]
) -> dict[str, Tensor]:
    r"""Per bias key of the chain ``layers`` (depth :math:`l` = 1-based position), LEWC's bias
    :math:`\sum_i w_i^{\,l} b^{(i)}_l` with ``weights`` normalised to sum to 1."""
    w = normalised_weights(weights, len(states))
    targets = {}
    for depth, layer in enumerate(layers, start=1):
        key = f"{layer}.bias"
        if key in states[0]:
            targets[key] = sum(
                (wi**depth) * sd[key].to(torch.float64) for wi, sd in zip(w, states, strict=True)
            ).to(states[0][key].dtype)
    return targets


def depth_weighted_bias_average(
    layers: Sequence[str], states: Sequence[Mapping[str, Tensor]], weights: Sequence[float]
) -> StateDict:
    r"""The plain weighted average :math:`\sum_i w_i \theta_i`, but each bias of the chain
    ``layers`` combined as :math:`\sum_i w_i^{\,l} b^{(i)}_l` (:func:`lewc_bias_targets`).

    A single model at weight 1 is returned unchanged; bias-free chains give the plain average.
    """
    merged = average(states, normalised_weights(weights, len(states)))
    merged.update(lewc_bias_targets(layers, states, weights))
    return merged
