"""The rules of the layers and norms: Linear, Conv and ConvTranspose, Embedding (producers of
units, modules or functional calls), and BatchNorm, InstanceNorm, LayerNorm/RMSNorm, GroupNorm,
PReLU (which carry the units and join their per-unit tensors)."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor, fx

from fedlmc.permutation.tracing.axes import TensorAxes, Unsupported
from fedlmc.permutation.tracing.operations import (
    CONV_FUNCTIONS,
    CONV_MODULES,
    INSTANCE_NORMS,
    NORM_STATE,
)


class LayerRules:
    """``_on_<kind>`` handlers of the layers and norms, mixed into
    :class:`~fedlmc.permutation.tracing.walk.GraphWalk` (whose ``classes``, ``modules``,
    ``state``, ``state_axes``, ``tensor_arg``, ``literal``, ``_single_input`` and ``describe``
    they use)."""

    # -- producers

    def _mark_unit(self, element: int, owner: str) -> None:
        self.classes.unit.setdefault(element, owner)

    def _module_state(self, node: fx.Node, name: str) -> TensorAxes | None:
        key = f"{node.target}.{name}"
        return self.state_axes(key) if key in self.state else None

    def _linear(self, node, x, weight, bias, owner, value) -> tuple[Any, str]:
        """``y = x W^T + b``: x's last axis joins W's axis 1; y's last axis joins W's axis 0."""
        if x is None or weight is None or weight.ndim != 2 or x.shape[-1] != weight.shape[1]:
            raise Unsupported(f"{self.describe(node)} with unexpected operand shapes")
        self.classes.union(x.elems[-1], weight.elems[1])
        units = self.classes.new(weight.shape[0])
        self.classes.union(units, weight.elems[0])
        if bias is not None:
            self.classes.union(units, bias.elems[0])
        self._mark_unit(units, owner)
        return TensorAxes(x.elems[:-1] + (units,), tuple(value.shape)), "linear"

    def _on_linear_module(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        x = self._single_input(node)
        weight, bias = self._module_state(node, "weight"), self._module_state(node, "bias")
        return self._linear(node, x, weight, bias, node.target, value)

    def _on_linear_function(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        weight = self.tensor_arg(node, 1, "weight")
        owner = _owner(node.args[1] if len(node.args) > 1 else node.kwargs.get("weight"))
        return self._linear(
            node, self.tensor_arg(node, 0), weight, self.tensor_arg(node, 2, "bias"), owner, value
        )

    def _conv(self, node, x, weight, bias, groups, k, transposed, owner, value):
        """Channels at axis ``-(k+1)``; groups=1 and depthwise convolutions are supported."""
        if x is None or weight is None or not isinstance(value, Tensor) or value.ndim != x.ndim:
            raise Unsupported(f"{self.describe(node)} with unexpected operand shapes")
        c = x.ndim - k - 1
        fan_in, fan_out = (0, 1) if transposed else (1, 0)
        for axis in range(2, weight.ndim):
            self.classes.poison(weight.elems[axis], "a kernel axis", loud=False)
        units = self.classes.new(value.shape[c])
        channels = x.shape[c]
        depthwise = groups > 1 and groups == channels == value.shape[c] == weight.shape[0]
        if groups == 1:
            self.classes.union(x.elems[c], weight.elems[fan_in])
            self.classes.union(units, weight.elems[fan_out])
            self._mark_unit(units, owner)
        elif depthwise:
            self.classes.union(x.elems[c], units)
            self.classes.union(units, weight.elems[0])
        else:
            why = (
                f"{self.describe(node)} is a grouped convolution (groups={groups}): it mixes "
                "channels in blocks; only groups=1 and depthwise (groups = channels) are supported"
            )
            for element in (x.elems[c], units, *weight.elems[:2]):
                self.classes.poison(element, why)
            self._mark_unit(units, owner)
        if bias is not None:
            self.classes.union(units, bias.elems[0])
        spatial = tuple(self.classes.fixed(n, "a spatial axis") for n in value.shape[c + 1 :])
        return TensorAxes(x.elems[:c] + (units,) + spatial, tuple(value.shape)), "conv"

    def _on_conv_module(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        module = self.modules[node.target]
        k, transposed = CONV_MODULES[type(module)]
        return self._conv(
            node,
            self._single_input(node),
            self._module_state(node, "weight"),
            self._module_state(node, "bias"),
            module.groups,
            k,
            transposed,
            node.target,
            value,
        )

    def _on_conv_function(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        k = CONV_FUNCTIONS[node.target]
        groups = self.literal(node, 6, "groups", 1)
        if not isinstance(groups, int):
            raise Unsupported(f"{self.describe(node)} with non-literal groups")
        owner = _owner(node.args[1] if len(node.args) > 1 else node.kwargs.get("weight"))
        return self._conv(
            node,
            self.tensor_arg(node, 0),
            self.tensor_arg(node, 1, "weight"),
            self.tensor_arg(node, 2, "bias"),
            groups,
            k,
            False,
            owner,
            value,
        )

    def _on_embedding_module(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        ids, weight = self._single_input(node), self._module_state(node, "weight")
        self.classes.poison(weight.elems[0], "the vocabulary axis (indexed by ids)", loud=False)
        units = self.classes.new(weight.shape[1])
        self.classes.union(units, weight.elems[1])
        self._mark_unit(units, node.target)
        return TensorAxes(ids.elems + (units,), tuple(value.shape)), "embedding"

    # -- norms

    def _per_channel(self, node, x, axis, tensors, value) -> tuple[Any, str]:
        """Join axis 0 of each per-unit tensor with axis ``axis`` of ``x``; output = ``x``."""
        if x is None or not -x.ndim <= axis < x.ndim:
            raise Unsupported(f"{self.describe(node)} on a tensor of unexpected rank")
        for tensor in tensors:
            if tensor is None or tensor.ndim == 0:
                continue
            if tensor.ndim != 1 or tensor.shape[0] != x.shape[axis]:
                raise Unsupported(f"{self.describe(node)} with unexpected parameter shapes")
            self.classes.union(x.elems[axis], tensor.elems[0])
        return x, "norm"

    def _on_batch_norm_module(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        tensors = [self._module_state(node, name) for name in NORM_STATE[:4]]
        return self._per_channel(node, self._single_input(node), 1, tensors, value)

    def _on_instance_norm_module(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        x = self._single_input(node)
        k = INSTANCE_NORMS[type(self.modules[node.target])]
        tensors = [self._module_state(node, name) for name in NORM_STATE[:4]]
        return self._per_channel(node, x, x.ndim - k - 1, tensors, value)

    def _on_batch_norm_function(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        names = ("running_mean", "running_var", "weight", "bias")
        tensors = [self.tensor_arg(node, i + 1, name) for i, name in enumerate(names)]
        return self._per_channel(node, self.tensor_arg(node, 0), 1, tensors, value)

    def _layer_norm(self, node, x, k, tensors, value) -> tuple[Any, str]:
        """Statistics over the last ``k`` axes are invariant; affine tensors join those axes."""
        if x is None or not 0 < k <= x.ndim:
            raise Unsupported(f"{self.describe(node)} over {k} axes")
        for tensor in tensors:
            if tensor is None:
                continue
            if tensor.shape != x.shape[-k:]:
                raise Unsupported(f"{self.describe(node)} with unexpected parameter shapes")
            for a, b in zip(x.elems[-k:], tensor.elems, strict=True):
                self.classes.union(a, b)
        return x, "norm"

    def _on_layer_norm_module(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        module = self.modules[node.target]
        tensors = [self._module_state(node, "weight"), self._module_state(node, "bias")]
        shape = module.normalized_shape
        k = 1 if isinstance(shape, int) else len(shape)
        return self._layer_norm(node, self._single_input(node), k, tensors, value)

    def _on_layer_norm_function(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        shape = self.literal(node, 1, "normalized_shape", None)
        if isinstance(shape, int):
            shape = (shape,)
        if not isinstance(shape, tuple | list):
            raise Unsupported(f"{self.describe(node)} with non-literal normalized_shape")
        tensors = [self.tensor_arg(node, 2, "weight")]
        if node.target is F.layer_norm:
            tensors.append(self.tensor_arg(node, 3, "bias"))
        return self._layer_norm(node, self.tensor_arg(node, 0), len(shape), tensors, value)

    def _group_norm(self, node, x, groups, tensors, value) -> tuple[Any, str]:
        """GroupNorm(1, C) and GroupNorm(C, C) carry the channel permutation; others end it."""
        if x is None or x.ndim < 2 or not isinstance(groups, int):
            raise Unsupported(f"{self.describe(node)} on a tensor of unexpected rank")
        if groups not in (1, x.shape[1]):
            self.classes.poison(
                x.elems[1],
                f"{self.describe(node)} normalises blocks of channels (groups={groups}); "
                "only 1 group or one group per channel preserve a channel permutation",
            )
            return x, "norm"
        return self._per_channel(node, x, 1, tensors, value)

    def _on_group_norm_module(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        module = self.modules[node.target]
        tensors = [self._module_state(node, "weight"), self._module_state(node, "bias")]
        return self._group_norm(node, self._single_input(node), module.num_groups, tensors, value)

    def _on_group_norm_function(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        tensors = [self.tensor_arg(node, 2, "weight"), self.tensor_arg(node, 3, "bias")]
        groups = self.literal(node, 1, "num_groups", None)
        return self._group_norm(node, self.tensor_arg(node, 0), groups, tensors, value)

    def _prelu(self, node, x, weight, value) -> tuple[Any, str]:
        if x is None or weight is None:
            raise Unsupported(f"{self.describe(node)} with unexpected operands")
        if weight.shape[0] > 1:
            self._per_channel(node, x, 1, [weight], value)
        return x, "activation"

    def _on_prelu_module(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        weight = self._module_state(node, "weight")
        return self._prelu(node, self._single_input(node), weight, value)

    def _on_prelu_function(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        weight = self.tensor_arg(node, 1, "weight")
        return self._prelu(node, self.tensor_arg(node, 0), weight, value)


def _owner(arg: Any) -> str:
    """Name of the module owning a weight passed to a functional layer (for group names)."""
    if isinstance(arg, fx.Node) and arg.op == "get_attr":
        return arg.target.rsplit(".", 1)[0] if "." in arg.target else arg.target
    return arg.name if isinstance(arg, fx.Node) else "?"
