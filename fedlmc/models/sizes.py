r"""The built-in architectures' layouts and parameter counts, computed without building a model
(no torch import: configuration front ends check a run's memory from them).

A layer with base size :math:`b` has :math:`\max(1, \operatorname{round}(b w))` units at width
:math:`w` (:func:`scaled`). Per layer, for fan-in :math:`f`, :math:`u` units and bias
:math:`\beta \in \{0, 1\}`:

.. math::

    P_\text{dense} = f u + \beta u, \quad P_\text{conv k x k} = k^2 f u + \beta u,
    \quad P_\text{norm} = 2 u \text{ (bn, ln)}, 0 \text{ (none)}.

Each ``*_parameters`` function is called like the model's builder,
``(width, num_classes, in_shape, norm, **options)``, and returns ``sum(p.numel() for p in
model.parameters())`` of the model the builder makes (a test holds them equal for every
registered built-in model).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

__all__ = [
    "RESNET20_BLOCKS",
    "RESNET20_STAGES",
    "VGG11_LAYOUT",
    "ViTLayout",
    "mlp_parameters",
    "resnet20_parameters",
    "scaled",
    "vgg11_parameters",
    "VIT_NORMS",
    "vit_layout",
    "vit_parameters",
]

VGG11_LAYOUT = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
RESNET20_STAGES = (16, 32, 64)
RESNET20_BLOCKS = 3


def scaled(base: int, width: float) -> int:
    """Units of a layer with base size ``base`` at ``width``: ``max(1, round(base * width))``."""
    return max(1, round(base * width))


def dense_parameters(fan_in: int, units: int, bias: bool) -> int:
    r"""A ``Linear(fan_in, units)``: :math:`f u + \beta u`."""
    return fan_in * units + units * int(bias)


def conv_parameters(fan_in: int, units: int, kernel: int, bias: bool) -> int:
    r"""A ``Conv2d(fan_in, units, kernel)``: :math:`k^2 f u + \beta u`."""
    return kernel * kernel * fan_in * units + units * int(bias)


def norm_parameters(norm: str, units: int) -> int:
    """BatchNorm / GroupNorm(1, C) / LayerNorm: a scale and a shift per unit; ``none``: 0."""
    return 2 * units if norm in ("bn", "ln") else 0


def mlp_parameters(
    width: float,
    num_classes: int,
    in_shape: Sequence[int],
    norm: str,
    *,
    depth: int,
    base_hidden: int,
    bias: bool,
) -> int:
    """:class:`fedlmc.models.MLP`: ``depth`` dense blocks of ``scaled(base_hidden, width)``
    units after flattening ``in_shape`` (the first on the input, ``depth - 1`` alike on the
    units: counted by multiplication, no list of ``depth`` entries), then a linear head."""
    units = scaled(base_hidden, width)
    first = dense_parameters(math.prod(in_shape), units, bias) + norm_parameters(norm, units)
    block = dense_parameters(units, units, bias) + norm_parameters(norm, units)
    return first + (depth - 1) * block + dense_parameters(units, num_classes, bias)


def vgg11_parameters(
    width: float, num_classes: int, in_shape: Sequence[int], norm: str, *, bias: bool
) -> int:
    """:class:`fedlmc.models.VGG11`: the 3x3 conv blocks of :data:`VGG11_LAYOUT` (pooling has
    no weights), then a linear head on the pooled channels."""
    total, channels = 0, in_shape[0]
    for entry in VGG11_LAYOUT:
        if entry == "M":
            continue
        units = scaled(int(entry), width)
        total += conv_parameters(channels, units, 3, bias) + norm_parameters(norm, units)
        channels = units
    return total + dense_parameters(channels, num_classes, bias)


def resnet20_parameters(
    width: float, num_classes: int, in_shape: Sequence[int], norm: str, *, bias: bool
) -> int:
    """:class:`fedlmc.models.ResNet20`: a 3x3 stem, :data:`RESNET20_BLOCKS` basic blocks per
    stage of :data:`RESNET20_STAGES` (two 3x3 convs, and a 1x1 projection shortcut where the
    channel count or stride changes), then a linear head."""

    def conv_block(fan_in: int, units: int, kernel: int) -> int:
        return conv_parameters(fan_in, units, kernel, bias) + norm_parameters(norm, units)

    fan_in = scaled(RESNET20_STAGES[0], width)
    total = conv_block(in_shape[0], fan_in, 3)
    for stage, base in enumerate(RESNET20_STAGES):
        units = scaled(base, width)
        for block in range(RESNET20_BLOCKS):
            projection = (stage > 0 and block == 0) or fan_in != units
            total += conv_block(fan_in, units, 3) + conv_block(units, units, 3)
            total += conv_block(fan_in, units, 1) if projection else 0
            fan_in = units
    return total + dense_parameters(fan_in, num_classes, bias)


class ViTLayout(NamedTuple):
    """The sizes of a :class:`fedlmc.models.vit.ViT`: heads, dims per head, embedding dim
    (``heads * head_dim``), MLP hidden units, tokens (patches + the class token)."""

    heads: int
    head_dim: int
    dim: int
    hidden: int
    tokens: int


VIT_NORMS = ("ln", "none")
"""The norms a ViT takes: LayerNorm, or none (an identity in place of every LayerNorm)."""


def vit_layout(
    width: float,
    in_shape: Sequence[int],
    heads: int,
    head_dim: int,
    grow_heads: bool,
    mlp_ratio: int,
    patch: int,
) -> ViTLayout:
    """The ViT's sizes at ``width``: ``scaled(heads, width)`` heads of ``head_dim`` dims
    (``grow_heads``), else ``heads`` heads of ``scaled(head_dim, width)`` dims; ``ValueError``
    for a ``patch`` that does not divide the image."""
    _, height, width_px = in_shape
    if height % patch or width_px % patch:
        raise ValueError(
            f"patch = {patch} does not divide the {height}x{width_px} image; allowed: a "
            "divisor of both sides"
        )
    if grow_heads:
        heads = scaled(heads, width)
    else:
        head_dim = scaled(head_dim, width)
    dim = heads * head_dim
    tokens = (height // patch) * (width_px // patch) + 1
    return ViTLayout(heads, head_dim, dim, mlp_ratio * dim, tokens)


def vit_parameters(
    width: float,
    num_classes: int,
    in_shape: Sequence[int],
    norm: str,
    *,
    depth: int,
    heads: int,
    head_dim: int,
    grow_heads: bool,
    mlp_ratio: int,
    patch: int,
    bias: bool,
) -> int:
    """:class:`fedlmc.models.vit.ViT`: a ``patch x patch`` conv patch embedding, the class
    token and position embedding, ``depth`` blocks (two norms, q/k/v/out projections, a
    two-layer MLP), a final norm and a linear head (:func:`vit_layout` has the sizes)."""
    layout = vit_layout(width, in_shape, heads, head_dim, grow_heads, mlp_ratio, patch)
    dim, hidden = layout.dim, layout.hidden
    embed = conv_parameters(in_shape[0], dim, patch, bias) + dim + layout.tokens * dim
    block = 2 * norm_parameters(norm, dim) + 4 * dense_parameters(dim, dim, bias)
    block += dense_parameters(dim, hidden, bias) + dense_parameters(hidden, dim, bias)
    head = norm_parameters(norm, dim) + dense_parameters(dim, num_classes, bias)
    return embed + depth * block + head
