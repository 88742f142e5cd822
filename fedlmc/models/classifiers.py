"""Width-scalable classifiers: an MLP, VGG-11 and ResNet-20 with BatchNorm, LayerNorm or no norm.

``build_model(name, width, ...)`` scales every hidden size by ``width``: a layer with base size
``b`` gets ``max(1, round(b * width))`` units (MLP ``base_hidden=128``, VGG-11 64/128/256/512,
ResNet-20 16/32/64). Every ReLU is its own module, so forward hooks see each activation.

Each model carries

- ``model.layer_names``: the modules whose outputs are the layer outputs ``f_1..f_L`` (hidden
  ReLUs / block outputs in depth order, then ``classifier``, whose output is the logits);
- ``model.config``: a flat dict ``{name, width, num_classes, in_shape, norm, <options>}`` with the
  defaults filled in, so ``build_model(**model.config)`` rebuilds the same architecture;
- ``model.permutation_spec()``: its :class:`~fedlmc.permutation.PermutationSpec`, derived by
  walking its own submodules.

Options are passed as keywords (``build_model("mlp", depth=2)``) or, equivalently, as one mapping
``options={"depth": 2}``. Which models exist, their default norm and their options are registered
in :mod:`fedlmc.models.registry` (``register_model``); :func:`build_model` reads them from there.
"""

from __future__ import annotations

import math
import numbers
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from fedlmc.models.registry import NORMS, model_entry, model_names, register_model
from fedlmc.models.sizes import RESNET20_BLOCKS, RESNET20_STAGES, VGG11_LAYOUT, scaled
from fedlmc.permutation.model_spec import permutation_spec
from fedlmc.permutation.spec import (
    Axis,
    PermutationSpec,
    apply_permutation,
    fan_in_axes,
    spec_from_groups,
    unit_axes,
)

__all__ = [
    "NORMS",
    "MLP",
    "VGG11",
    "ResNet20",
    "PermutationSpec",
    "apply_permutation",
    "build_model",
    "model_names",
    "permutation_spec",
    "register_model",
    "scaled",
]


def norm_layer(norm: str, units: int, conv: bool) -> nn.Module:
    """``bn``: BatchNorm; ``ln``: GroupNorm(1, C) (conv) / LayerNorm (dense); ``none``: Identity."""
    if norm == "bn":
        return nn.BatchNorm2d(units) if conv else nn.BatchNorm1d(units)
    if norm == "ln":
        return nn.GroupNorm(1, units) if conv else nn.LayerNorm(units)
    return nn.Identity()


class DenseBlock(nn.Module):
    """``relu(norm(linear(x)))``."""

    def __init__(self, fan_in: int, units: int, norm: str, bias: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(fan_in, units, bias=bias)
        self.norm = norm_layer(norm, units, conv=False)
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.norm(self.linear(x)))


class ConvBlock(nn.Module):
    """``relu(norm(conv3x3(x)))``."""

    def __init__(self, fan_in: int, units: int, norm: str, bias: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(fan_in, units, 3, padding=1, bias=bias)
        self.norm = norm_layer(norm, units, conv=True)
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.norm(self.conv(x)))


class MLP(nn.Module):
    """Flatten, ``depth`` dense blocks of ``scaled(base_hidden, width)`` units, a linear head."""

    def __init__(
        self,
        width: float,
        num_classes: int,
        in_shape: tuple[int, int, int],
        norm: str,
        depth: int,
        base_hidden: int,
        bias: bool,
    ) -> None:
        super().__init__()
        units = scaled(base_hidden, width)
        self.flatten = nn.Flatten()
        fan_ins = [math.prod(in_shape)] + [units] * (depth - 1)
        self.hidden = nn.ModuleList(DenseBlock(f, units, norm, bias) for f in fan_ins)
        self.classifier = nn.Linear(units, num_classes, bias=bias)
        self.layer_names = [f"hidden.{i}.relu" for i in range(depth)] + ["classifier"]

    def forward(self, x: Tensor) -> Tensor:
        x = self.flatten(x)
        for block in self.hidden:
            x = block(x)
        return self.classifier(x)

    def permutation_spec(self) -> PermutationSpec:
        """Group ``hidden.i``: hidden layer i's linear rows and norm, the next layer's columns."""
        groups: dict[str, list[Axis]] = {}
        consumers = [f"hidden.{i + 1}.linear" for i in range(len(self.hidden) - 1)] + ["classifier"]
        for i, block in enumerate(self.hidden):
            prefix = f"hidden.{i}"
            groups[prefix] = (
                unit_axes(f"{prefix}.linear", block.linear)
                + unit_axes(f"{prefix}.norm", block.norm)
                + fan_in_axes(consumers[i])
            )
        activations = {group: f"{group}.relu" for group in groups}
        return spec_from_groups(groups, activations, self.state_dict())


class VGG11(nn.Module):
    """VGG-11 conv stack (64,M,128,M,256,256,M,512,512,M,512,512,M scaled), GAP, a linear head.

    A 2x2 max-pool is skipped when the feature map is already smaller than 2x2, so 28x28 and
    32x32 inputs (and smaller) work; global average pooling then feeds the classifier.
    """

    def __init__(
        self,
        width: float,
        num_classes: int,
        in_shape: tuple[int, int, int],
        norm: str,
        bias: bool,
    ) -> None:
        super().__init__()
        channels, height, width_px = in_shape
        layers: OrderedDict[str, nn.Module] = OrderedDict()
        for entry in VGG11_LAYOUT:
            if entry == "M":
                if min(height, width_px) >= 2:
                    layers[f"pool{sum(n.startswith('pool') for n in layers) + 1}"] = nn.MaxPool2d(2)
                    height, width_px = height // 2, width_px // 2
                continue
            units = scaled(int(entry), width)
            layers[f"block{sum(n.startswith('block') for n in layers) + 1}"] = ConvBlock(
                channels, units, norm, bias
            )
            channels = units
        self.features = nn.Sequential(layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.classifier = nn.Linear(channels, num_classes, bias=bias)
        self.block_names = [f"features.{n}" for n in layers if n.startswith("block")]
        self.layer_names = [f"{name}.relu" for name in self.block_names] + ["classifier"]

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.flatten(self.pool(self.features(x))))

    def permutation_spec(self) -> PermutationSpec:
        """Group ``features.blockK``: block K's conv output and norm, the next conv's input."""
        modules = dict(self.named_modules())
        groups: dict[str, list[Axis]] = {}
        consumers = [f"{name}.conv" for name in self.block_names[1:]] + ["classifier"]
        for name, consumer in zip(self.block_names, consumers, strict=True):
            groups[name] = (
                unit_axes(f"{name}.conv", modules[f"{name}.conv"])
                + unit_axes(f"{name}.norm", modules[f"{name}.norm"])
                + fan_in_axes(consumer)
            )
        activations = {group: f"{group}.relu" for group in groups}
        return spec_from_groups(groups, activations, self.state_dict())


class BasicBlock(nn.Module):
    """``relu2(norm2(conv2(relu1(norm1(conv1(x))))) + shortcut(x))``.

    ``shortcut`` is a 1x1 conv + norm when the stride or channel count changes, else identity.
    """

    def __init__(self, fan_in: int, units: int, stride: int, norm: str, bias: bool) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(fan_in, units, 3, stride=stride, padding=1, bias=bias)
        self.norm1 = norm_layer(norm, units, conv=True)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(units, units, 3, padding=1, bias=bias)
        self.norm2 = norm_layer(norm, units, conv=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or fan_in != units:
            self.shortcut = nn.Sequential(
                OrderedDict(
                    conv=nn.Conv2d(fan_in, units, 1, stride=stride, bias=bias),
                    norm=norm_layer(norm, units, conv=True),
                )
            )
        self.relu2 = nn.ReLU()

    @property
    def has_projection(self) -> bool:
        """Whether the shortcut is a 1x1 conv (so the block starts a new residual stream)."""
        return not isinstance(self.shortcut, nn.Identity)

    def forward(self, x: Tensor) -> Tensor:
        inner = self.relu1(self.norm1(self.conv1(x)))
        return self.relu2(self.norm2(self.conv2(inner)) + self.shortcut(x))


class ResNet20(nn.Module):
    """ResNet-20: 3x3 stem, 3 stages x 3 basic blocks (16/32/64 channels scaled), GAP, linear."""

    def __init__(
        self,
        width: float,
        num_classes: int,
        in_shape: tuple[int, int, int],
        norm: str,
        bias: bool,
    ) -> None:
        super().__init__()
        stem_units = scaled(RESNET20_STAGES[0], width)
        self.stem = ConvBlock(in_shape[0], stem_units, norm, bias)
        fan_in = stem_units
        self.stage_names = [f"stage{s + 1}" for s in range(len(RESNET20_STAGES))]
        for s, (name, base) in enumerate(zip(self.stage_names, RESNET20_STAGES, strict=True)):
            units = scaled(base, width)
            blocks = []
            for b in range(RESNET20_BLOCKS):
                stride = 2 if s > 0 and b == 0 else 1
                blocks.append(BasicBlock(fan_in, units, stride, norm, bias))
                fan_in = units
            setattr(self, name, nn.Sequential(*blocks))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.flatten = nn.Flatten()
        self.classifier = nn.Linear(fan_in, num_classes, bias=bias)
        self.block_names = [
            f"{name}.{b}" for name in self.stage_names for b in range(RESNET20_BLOCKS)
        ]
        self.layer_names = ["stem.relu"] + [f"{b}.relu2" for b in self.block_names] + ["classifier"]

    def forward(self, x: Tensor) -> Tensor:
        x = self.stem(x)
        for name in self.stage_names:
            x = getattr(self, name)(x)
        return self.classifier(self.flatten(self.pool(x)))

    def permutation_spec(self) -> PermutationSpec:
        """Residual streams share one group; each block's inner channels are their own group.

        Group ``stageS`` is the residual stream of stage S: the stem output (stage 1), every
        block's conv2/norm2 output, the projection shortcut's conv/norm output, and the inputs of
        the convs (conv1, shortcut conv) or classifier that read the stream. Group
        ``stageS.B.inner`` is block B's conv1/norm1 output and conv2 input.
        """
        modules = dict(self.named_modules())
        groups: dict[str, list[Axis]] = {}
        activations: dict[str, str] = {}
        stream = self.stage_names[0]
        groups[stream] = unit_axes("stem.conv", self.stem.conv) + unit_axes(
            "stem.norm", self.stem.norm
        )
        for name in self.block_names:
            block: BasicBlock = modules[name]
            groups[stream] += fan_in_axes(f"{name}.conv1")
            if block.has_projection:
                groups[stream] += fan_in_axes(f"{name}.shortcut.conv")
                stream = name.split(".")[0]
                if stream in groups:
                    raise ValueError(f"stage {stream!r} has two projection shortcuts")
                groups[stream] = unit_axes(f"{name}.shortcut.conv", block.shortcut.conv)
                groups[stream] += unit_axes(f"{name}.shortcut.norm", block.shortcut.norm)
            inner = f"{name}.inner"
            groups[inner] = (
                unit_axes(f"{name}.conv1", block.conv1)
                + unit_axes(f"{name}.norm1", block.norm1)
                + fan_in_axes(f"{name}.conv2")
            )
            activations[inner] = f"{name}.relu1"
            groups[stream] += unit_axes(f"{name}.conv2", block.conv2)
            groups[stream] += unit_axes(f"{name}.norm2", block.norm2)
            activations[stream] = f"{name}.relu2"
        groups[stream] += fan_in_axes("classifier")
        return spec_from_groups(groups, activations, self.state_dict())


def _is_int(value: Any) -> bool:
    """A Python or NumPy integer, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_width(width: Any) -> float:
    real = isinstance(width, numbers.Real) and not isinstance(width, bool)
    if not real or not math.isfinite(width):
        raise ValueError(f"width {width!r} must be a finite number > 0")
    if width <= 0:
        raise ValueError(f"width {width!r} must be > 0")
    return float(width)


def _check_positive_int(what: str, value: Any) -> int:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{what} {value!r} must be an integer >= 1")
    return int(value)


def _check_in_shape(in_shape: Any) -> tuple[int, int, int]:
    shape = tuple(in_shape) if isinstance(in_shape, Sequence) else None
    if shape is None or len(shape) != 3 or not all(_is_int(n) and n >= 1 for n in shape):
        raise ValueError(f"in_shape {in_shape!r} must be (channels, height, width) of ints >= 1")
    return tuple(int(n) for n in shape)


def build_model(
    name: str,
    width: float = 1.0,
    num_classes: int = 10,
    in_shape: Sequence[int] = (1, 28, 28),
    norm: str | None = None,
    **options: Any,
) -> nn.Module:
    """Build the registered model ``name`` at ``width`` with ``norm`` in {bn, ln, none}.

    Built-in models (:mod:`fedlmc.models.registry`): mlp (options ``depth=3`` hidden layers,
    ``base_hidden=128``, ``bias=True``), vgg11 (``bias=True``), resnet20 (``bias=False``), vit
    (:mod:`fedlmc.models.vit`; norms ``ln``, ``none``); ``bias`` applies to every conv/linear
    layer. ``norm`` defaults to the model's registered default (``none`` for the MLP, ``bn``
    for the conv nets, ``ln`` for the ViT). ``ValueError`` on bad input.
    """
    entry = model_entry(name)
    width = _check_width(width)
    num_classes = _check_positive_int("num_classes", num_classes)
    in_shape = _check_in_shape(in_shape)
    norm = entry.default_norm if norm is None else norm
    if norm not in entry.norms:
        allowed = ", ".join(entry.norms)
        raise ValueError(f"unknown norm {norm!r} for model {name!r}; allowed: {allowed}")
    nested = options.pop("options", None) or {}
    resolved = entry.resolve_options({**nested, **options})
    model = entry.build_function()(width, num_classes, in_shape, norm, **resolved)
    model.config = {
        "name": name,
        "width": width,
        "num_classes": num_classes,
        "in_shape": in_shape,
        "norm": norm,
        **resolved,
    }
    return model
