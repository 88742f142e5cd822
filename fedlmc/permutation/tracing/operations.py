"""The operations the graph walk understands: module types, functions and tensor methods, each
mapped to the kind of its handler (``GraphWalk._on_<kind>``), and the kinds LEWC's layer names
look for."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _torch_nn(names: str) -> tuple[type, ...]:
    """The torch.nn classes named in the whitespace-separated ``names`` that exist here."""
    return tuple(getattr(nn, name) for name in names.split() if hasattr(nn, name))


def _functions(names: str, module: Any = F) -> tuple[Callable, ...]:
    """The functions of ``module`` named in the whitespace-separated ``names`` that exist here."""
    return tuple(getattr(module, name) for name in names.split() if hasattr(module, name))


def _per_dimension(kinds: str, module: Any) -> dict[Any, int]:
    """``{module.<kind><k>d: k}`` for k = 1, 2, 3 (the number of spatial axes)."""
    return {
        getattr(module, f"{kind}{k}d"): k
        for kind in kinds.split()
        for k in (1, 2, 3)
        if hasattr(module, f"{kind}{k}d")
    }


ACTIVATION_MODULES = _torch_nn(
    """ReLU ReLU6 LeakyReLU ELU SELU CELU GELU SiLU Mish Sigmoid Tanh Hardtanh Hardswish
    Hardsigmoid Softplus Softsign Tanhshrink Softshrink Hardshrink Threshold LogSigmoid Softmax
    LogSoftmax Softmin Softmax2d"""
)
TRIVIAL_MODULES = _torch_nn(
    "Identity Dropout Dropout1d Dropout2d Dropout3d AlphaDropout FeatureAlphaDropout"
)
SPATIAL_MODULES = _per_dimension(
    """MaxPool AvgPool AdaptiveAvgPool AdaptiveMaxPool LPPool ZeroPad ConstantPad ReflectionPad
    ReplicationPad CircularPad""",
    nn,
)
UPSAMPLE_MODULES = _torch_nn("Upsample UpsamplingNearest2d UpsamplingBilinear2d")
CONV_MODULES: dict[type, tuple[int, bool]] = {
    **{cls: (k, False) for cls, k in _per_dimension("Conv", nn).items()},
    **{cls: (k, True) for cls, k in _per_dimension("ConvTranspose", nn).items()},
}
BATCH_NORMS = _torch_nn("BatchNorm1d BatchNorm2d BatchNorm3d SyncBatchNorm")
INSTANCE_NORMS = _per_dimension("InstanceNorm", nn)
NORM_STATE = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")

MODULE_KINDS: dict[type, str] = {
    nn.Linear: "linear_module",
    nn.Embedding: "embedding_module",
    nn.LayerNorm: "layer_norm_module",
    nn.GroupNorm: "group_norm_module",
    nn.PReLU: "prelu_module",
    nn.Flatten: "reshape",
    nn.Unflatten: "reshape",
    **dict.fromkeys(CONV_MODULES, "conv_module"),
    **dict.fromkeys(BATCH_NORMS, "batch_norm_module"),
    **dict.fromkeys(INSTANCE_NORMS, "instance_norm_module"),
    **dict.fromkeys(_torch_nn("RMSNorm"), "layer_norm_module"),
    **dict.fromkeys(ACTIVATION_MODULES, "activation"),
    **dict.fromkeys(TRIVIAL_MODULES, "trivial"),
    **dict.fromkeys((*SPATIAL_MODULES, *UPSAMPLE_MODULES), "spatial_module"),
}
"""Module type (exact, not subclasses) -> handler kind; any other module is unknown."""

MODULE_STATE: dict[str, tuple[str, ...]] = {
    "linear_module": ("weight", "bias"),
    "conv_module": ("weight", "bias"),
    "embedding_module": ("weight",),
    "layer_norm_module": ("weight", "bias"),
    "group_norm_module": ("weight", "bias"),
    "prelu_module": ("weight",),
    "batch_norm_module": NORM_STATE,
    "instance_norm_module": NORM_STATE,
}
"""The state-dict entries a module may own for its handler to know every one of them."""

COMPARISONS = "eq ne lt le gt ge"
ACTIVATION_FUNCTIONS = (
    _functions(
        """relu relu_ relu6 elu elu_ selu celu gelu silu mish leaky_relu leaky_relu_ hardtanh
        hardtanh_ hardswish hardsigmoid softplus softsign tanhshrink softshrink hardshrink
        threshold logsigmoid sigmoid tanh softmax log_softmax softmin normalize"""
    )
    + _functions(
        """relu relu_ sigmoid tanh exp log abs neg sqrt rsqrt square sin cos softmax
        log_softmax erf""",
        torch,
    )
    + (operator.neg, operator.abs)
)
TRIVIAL_FUNCTIONS = _functions(
    "dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout"
) + _functions("dropout clone detach zeros_like ones_like empty_like full_like", torch)
BROADCAST_FUNCTIONS = (
    _functions("add sub mul truediv pow iadd isub imul itruediv and_ or_ xor invert", operator)
    + _functions(COMPARISONS, operator)
    + _functions(
        """add sub subtract mul multiply div divide true_divide maximum minimum where pow clamp
        clip logical_and logical_or logical_not""",
        torch,
    )
    + _functions(COMPARISONS, torch)
)
SPATIAL_FUNCTIONS = _per_dimension(
    "max_pool avg_pool adaptive_avg_pool adaptive_max_pool lp_pool", F
)
CONV_FUNCTIONS = _per_dimension("conv", torch)
REDUCTIONS = "mean sum amax amin std var logsumexp"

FUNCTION_KINDS: dict[Callable, str] = {
    F.linear: "linear_function",
    F.batch_norm: "batch_norm_function",
    F.instance_norm: "batch_norm_function",
    F.layer_norm: "layer_norm_function",
    F.group_norm: "group_norm_function",
    F.prelu: "prelu_function",
    F.interpolate: "spatial_function",
    F.pad: "pad",
    torch.permute: "permute",
    torch.t: "matrix_transpose",
    torch.stack: "stack",
    operator.getitem: "getitem",
    getattr: "getattr",
    len: "meta",
    **dict.fromkeys(_functions("rms_norm"), "layer_norm_function"),
    **dict.fromkeys(_functions("flatten reshape squeeze unsqueeze unflatten", torch), "reshape"),
    **dict.fromkeys(_functions("transpose swapaxes swapdims", torch), "transpose"),
    **dict.fromkeys(_functions("cat concat concatenate", torch), "cat"),
    **dict.fromkeys(_functions(REDUCTIONS, torch), "reduce"),
    **dict.fromkeys(CONV_FUNCTIONS, "conv_function"),
    **dict.fromkeys(SPATIAL_FUNCTIONS, "spatial_function"),
    **dict.fromkeys(ACTIVATION_FUNCTIONS, "activation"),
    **dict.fromkeys(TRIVIAL_FUNCTIONS, "trivial"),
    **dict.fromkeys(BROADCAST_FUNCTIONS, "broadcast"),
}
"""Function (``call_function`` target) -> handler kind; any other function is unknown."""

METHOD_KINDS: dict[str, str] = {
    **dict.fromkeys(
        """relu relu_ sigmoid sigmoid_ tanh tanh_ exp log abs neg sqrt rsqrt square softmax
        log_softmax""".split(),
        "activation",
    ),
    **dict.fromkeys(
        "contiguous clone detach float double half bfloat16 to type_as cpu cuda".split(),
        "trivial",
    ),
    **dict.fromkeys(
        f"""add add_ sub sub_ mul mul_ div div_ pow clamp clamp_ clip maximum minimum masked_fill
        masked_fill_ {COMPARISONS}""".split(),
        "broadcast",
    ),
    **dict.fromkeys(
        "view reshape flatten squeeze unsqueeze unflatten view_as reshape_as".split(), "reshape"
    ),
    **dict.fromkeys(REDUCTIONS.split(), "reduce"),
    **dict.fromkeys("size dim numel nelement ndimension get_device".split(), "meta"),
    **dict.fromkeys("transpose swapaxes swapdims".split(), "transpose"),
    **dict.fromkeys("expand expand_as".split(), "expand"),
    "permute": "permute",
    "t": "matrix_transpose",
}
"""Tensor method (``call_method`` target) -> handler kind; any other method is unknown."""

LAYER_KINDS = ("linear", "conv", "embedding")
"""Node kinds that compute a layer (the units LEWC counts)."""
SHAPE_ONLY_KINDS = ("trivial", "spatial", "reshape", "permute", "reduce", "index")
"""Node kinds that only move, pool or select units (skipped when locating a layer output)."""
