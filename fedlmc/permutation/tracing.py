r"""Derive a :class:`~fedlmc.permutation.PermutationSpec` and LEWC layer names from a model's graph.

The model is traced with ``torch.fx`` symbolic tracing and run once on an example input (eval
mode, no gradient) to learn every tensor's shape. Every axis of every tensor in the graph, and
every axis of every state-dict tensor, is an element of a union-find: two axes are joined when
the same hidden-unit permutation must act on both.

- *Producers* start a new set of units: Linear (output features), Conv (output channels),
  ConvTranspose, Embedding (embedding dimension); their output axis is joined with the weight's
  axis 0 (ConvTranspose: 1) and the bias. Their input axis is joined with the weight's axis 1
  (the *consumer* side).
- *Norms* carry the units and join their per-unit tensors (affine parameters, running
  statistics): BatchNorm, InstanceNorm, LayerNorm/RMSNorm over trailing axes, GroupNorm with one
  group or one group per channel. GroupNorm with ``1 < G < C`` groups computes statistics over
  blocks of channels, which a permutation does not preserve: the group ends there.
- Pointwise activations, dropout, identity, softmax over any axis, pooling, padding and
  upsampling (spatial axes only), reductions, permutes/transposes pass the units through.
  Broadcasting elementwise operations (``+``, ``*``, ``torch.where`` ...) join the axes of their
  operands, so a residual addition ties its two streams into one group.
- Reshapes pass an axis through when it maps onto one axis of the result (flatten of a map
  pooled to ``C x 1 x 1``). A reshape that merges a hidden axis with other axes of size > 1
  (flatten of a ``C x H x W`` map onto a Linear, where each channel owns ``H*W`` consecutive
  inputs) cannot be expressed by one permutation of the next layer's full input axis: the group
  ends there.
- Concatenation along a hidden axis would give the consumer an input axis made of segments,
  one permutation per segment; the spec format maps an axis to one group, so the concatenated
  groups end there. Concatenation along other axes joins the operands' other axes.
- Depthwise convolutions (``groups == in == out channels``) carry the units; other grouped
  convolutions end the group.
- Anything else (attention, matmul, unknown torch.nn modules, unknown functions or methods,
  indexing part of an axis) ends the groups of every tensor it touches, and its output axes are
  not permuted. The model's inputs and outputs are never permuted.

"Ending" a group drops every axis of its union-find class from the spec: the producers' units
are then not permuted at all, which is always correct (only less alignment). A
:class:`SpecDerivationWarning` names the producers and the reason when a hidden group is dropped
for any reason other than touching the model's input or output.

The derived spec is then checked: one seeded random permutation per group must leave the
model's outputs on the example input unchanged (:func:`fedlmc.permutation.check_spec`).
"""

from __future__ import annotations

import operator
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from fedlmc.permutation.spec import (
    Axis,
    PermutationSpec,
    check_spec,
    example_args,
    in_eval_mode,
    spec_from_groups,
)

__all__ = ["SpecDerivationWarning", "derive_layer_names", "derive_spec"]


class SpecDerivationWarning(UserWarning):
    """A hidden group was dropped from a derived spec (its units are not permuted)."""


# ----------------------------------------------------------------------------- axis classes


class AxisClasses:
    """Union-find over axes; each element has a size, and a class may be *poisoned*.

    An element is either an *activation* axis (an axis of a tensor flowing through the graph) or
    a *slot* (an axis of a state-dict tensor). A poisoned class must not be permuted; each poison
    carries a reason, *loud* when it explains a dropped hidden group to the user (unsupported
    operation) and quiet when it is expected (model input and output, spatial axes).
    """

    def __init__(self) -> None:
        self.parent: list[int] = []
        self.size: list[int] = []
        self.activation: list[bool] = []
        self.reasons: dict[int, list[tuple[str, bool]]] = {}
        self.unit: dict[int, str] = {}

    def new(self, size: int, *, activation: bool = True, reason: str | None = None) -> int:
        """A fresh element; poisoned (loudly) when ``reason`` is given."""
        self.parent.append(len(self.parent))
        self.size.append(int(size))
        self.activation.append(activation)
        element = len(self.parent) - 1
        if reason is not None:
            self.poison(element, reason)
        return element

    def fixed(self, size: int, why: str) -> int:
        """A fresh element that is quietly never permuted (input, spatial, size-1 axes)."""
        element = self.new(size)
        self.poison(element, why, loud=False)
        return element

    def find(self, element: int) -> int:
        while self.parent[element] != element:
            self.parent[element] = self.parent[self.parent[element]]
            element = self.parent[element]
        return element

    def union(self, a: int, b: int) -> None:
        """Join the classes of ``a`` and ``b``; axes of different sizes poison both instead."""
        if self.size[a] != self.size[b]:
            why = f"axes of sizes {self.size[a]} and {self.size[b]} met in one operation"
            self.poison(a, why)
            self.poison(b, why)
            return
        self.parent[self.find(a)] = self.find(b)

    def poison(self, element: int, reason: str, loud: bool = True) -> None:
        self.reasons.setdefault(element, []).append((reason, loud))

    def classes(self) -> dict[int, list[int]]:
        """Root -> elements, in creation order (graph order)."""
        members: dict[int, list[int]] = {}
        for element in range(len(self.parent)):
            members.setdefault(self.find(element), []).append(element)
        return members


@dataclass(frozen=True)
class TensorAxes:
    """The union-find element of each axis of one tensor, and the tensor's shape."""

    elems: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def ndim(self) -> int:
        return len(self.elems)


class Unsupported(Exception):
    """Raised inside a handler: treat the node as an unknown operation (with this reason)."""


# ----------------------------------------------------------------------------- op tables


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


# ----------------------------------------------------------------------------- the graph walk


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class _RecordingTracer(fx.Tracer):
    """A default fx tracer that remembers the innermost module being traced when tracing fails."""

    def __init__(self) -> None:
        super().__init__()
        self.failed_in: str | None = None

    def call_module(self, m: nn.Module, forward: Callable, args: tuple, kwargs: dict) -> Any:
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_in is None:
                try:
                    name = self.path_of_module(m)
                except NameError:
                    name = "<unregistered>"
                self.failed_in = f"module {name!r} ({type(m).__name__})"
            raise


def trace(model: nn.Module) -> fx.GraphModule:
    """``torch.fx`` symbolic trace of ``model`` (torch.nn modules are leaves).

    ``ValueError`` naming the innermost module whose forward could not be traced (e.g.
    data-dependent control flow) when tracing fails.
    """
    tracer = _RecordingTracer()
    try:
        graph = tracer.trace(model)
    except Exception as exc:
        where = tracer.failed_in or f"the forward of {type(model).__name__}"
        raise ValueError(
            f"cannot trace {where} with torch.fx symbolic tracing ({_first_line(exc)}); "
            "derive_spec needs a forward without data-dependent control flow, else write a "
            "permutation_spec() method"
        ) from exc
    return fx.GraphModule(tracer.root, graph, type(model).__name__)


def _snapshot(value: Any) -> Any:
    """A detached copy of every tensor in ``value`` (later in-place ops must not change it)."""
    if isinstance(value, Tensor):
        return value.detach().clone()
    if isinstance(value, tuple | list):
        return type(value)(_snapshot(v) for v in value) if not hasattr(value, "_fields") else value
    return value


class _Recorder(fx.Interpreter):
    """Runs the traced graph, keeping a snapshot of every node's output."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[fx.Node, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        try:
            result = super().run_node(n)
        except Exception as exc:
            raise ValueError(
                f"running node {n.name!r} ({n.op} {_target_name(n)}) on the example input "
                f"failed: {_first_line(exc)}"
            ) from exc
        self.values[n] = result if n.op == "get_attr" else _snapshot(result)
        return result


def _target_name(node: fx.Node) -> str:
    """``torch.cat``, ``F.relu``, ``operator.add``, else the function's qualified name."""
    target = node.target
    if isinstance(target, str):
        return target
    name = getattr(target, "__name__", None)
    for prefix, namespace in (("torch", torch), ("F", F), ("operator", operator)):
        if name and getattr(namespace, name, None) is target:
            return f"{prefix}.{name}"
    return getattr(target, "__qualname__", None) or name or repr(target)


def _tensors_in(value: Any) -> Iterator[Any]:
    """Leaves of nested tuples/lists/dicts."""
    if isinstance(value, tuple | list):
        for item in value:
            yield from _tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_in(item)
    else:
        yield value


class GraphWalk:
    """The union-find of one traced model: per-node axes and kinds, producers, state slots."""

    def __init__(self, model: nn.Module, gm: fx.GraphModule, values: dict[fx.Node, Any]) -> None:
        self.model, self.gm, self.values = model, gm, values
        self.modules = dict(gm.named_modules())
        self.state = model.state_dict(keep_vars=True)
        self.canonical, self.aliases = _aliases(self.state)
        self.classes = AxisClasses()
        self.slots: dict[Axis, int] = {}
        self.out: dict[fx.Node, Any] = {}
        self.kind: dict[fx.Node, str] = {}
        for node in gm.graph.nodes:
            self.out[node], self.kind[node] = self._visit(node)

    # -- elements

    def slot(self, key: str, axis: int) -> int:
        """The element of axis ``axis`` of state-dict tensor ``key`` (aliases share one)."""
        key = self.canonical[key]
        if (key, axis) not in self.slots:
            size = self.state[key].shape[axis]
            self.slots[(key, axis)] = self.classes.new(size, activation=False)
        return self.slots[(key, axis)]

    def state_axes(self, key: str) -> TensorAxes:
        tensor = self.state[key]
        elems = tuple(self.slot(key, axis) for axis in range(tensor.ndim))
        return TensorAxes(elems, tuple(tensor.shape))

    def fresh(self, value: Any, why: str, loud: bool) -> Any:
        """New never-permuted elements mirroring ``value`` (a tensor or nested tuple of them)."""
        if isinstance(value, Tensor):
            elems = tuple(self.classes.new(n) for n in value.shape)
            for element in elems:
                self.classes.poison(element, why, loud)
            return TensorAxes(elems, tuple(value.shape))
        if isinstance(value, tuple | list) and not hasattr(value, "_fields"):
            return tuple(self.fresh(v, why, loud) for v in value)
        return None

    def poison_all(self, values: Any, why: str, loud: bool = True) -> None:
        for leaf in _tensors_in(values):
            if isinstance(leaf, TensorAxes):
                for element in leaf.elems:
                    self.classes.poison(element, why, loud)

    def axes_of(self, arg: Any) -> Any:
        """Walk result of a node argument (recursing into lists); literals stay literals."""
        if isinstance(arg, fx.Node):
            return self.out[arg]
        if isinstance(arg, tuple | list):
            return type(arg)(self.axes_of(a) for a in arg)
        if isinstance(arg, dict):
            return {key: self.axes_of(a) for key, a in arg.items()}
        return arg

    def tensor_arg(self, node: fx.Node, index: int, name: str | None = None) -> TensorAxes | None:
        """The axes of argument ``index`` (or keyword ``name``) if it is a tensor, else None."""
        if index < len(node.args):
            arg = node.args[index]
        else:
            arg = node.kwargs.get(name) if name else None
        value = self.axes_of(arg)
        return value if isinstance(value, TensorAxes) else None

    def literal(self, node: fx.Node, index: int, name: str, default: Any) -> Any:
        if index < len(node.args):
            return node.args[index]
        return node.kwargs.get(name, default)

    # -- dispatch

    def describe(self, node: fx.Node) -> str:
        if node.op == "call_module":
            return f"module {node.target!r} ({type(self.modules[node.target]).__name__})"
        if node.op == "call_method":
            return f"method .{node.target}() at node {node.name!r}"
        return f"{_target_name(node)} at node {node.name!r}"

    def _kind(self, node: fx.Node) -> str:
        if node.op in ("placeholder", "get_attr", "output"):
            return node.op
        if node.op == "call_module":
            module = self.modules[node.target]
            kind = MODULE_KINDS.get(type(module), "unknown")
            allowed = MODULE_STATE.get(kind, ())
            if any(key not in allowed for key in module.state_dict()):
                return "unknown"  # e.g. a parametrized module: its state is not what we expect
            return kind
        if node.op == "call_method":
            return METHOD_KINDS.get(node.target, "unknown")
        try:
            return FUNCTION_KINDS.get(node.target, "unknown")
        except TypeError:  # unhashable target
            return "unknown"

    def _visit(self, node: fx.Node) -> tuple[Any, str]:
        value = self.values.get(node)
        kind = self._kind(node)
        try:
            out, label = getattr(self, f"_on_{kind}")(node, value)
            if not _consistent(out, value, self.classes):
                raise Unsupported(f"{self.describe(node)} changes shapes in an unexpected way")
        except Unsupported as why:
            return self._on_unknown(node, value, str(why))
        return out, label

    # -- sources and sinks

    def _on_placeholder(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        return self.fresh(value, "a model input", loud=False), "input"

    def _on_get_attr(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        if isinstance(value, Tensor) and node.target in self.canonical:
            return self.state_axes(node.target), "param"
        return self.fresh(value, f"constant {node.target!r} (not in the state dict)", True), "param"

    def _on_output(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        self.poison_all(self.axes_of(node.args[0]), "a model output", loud=False)
        return None, "output"

    def _on_unknown(self, node: fx.Node, value: Any, why: str | None = None) -> tuple[Any, str]:
        why = why or f"{self.describe(node)} is not supported by derive_spec"
        self.poison_all(self.axes_of(list(node.args) + list(node.kwargs.values())), why)
        if node.op == "call_module":
            prefix = f"{node.target}."
            for key in self.state:
                if key.startswith(prefix):
                    self.poison_all(self.state_axes(key), why)
        return self.fresh(value, why, loud=True), "unknown"

    def _on_meta(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        if isinstance(value, Tensor):
            raise Unsupported(f"{self.describe(node)} returned a tensor")
        return None, "meta"

    def _on_getattr(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        x, name = self.tensor_arg(node, 0), node.args[1]
        if not isinstance(value, Tensor):
            return None, "meta"
        if x is None or name not in ("T", "mT"):
            raise Unsupported(f"attribute {name!r} at node {node.name!r} is not supported")
        order = list(range(x.ndim))[::-1] if name == "T" else _swap(x.ndim, -2, -1)
        return _reorder(x, order), "permute"

    # -- pass-through operations

    def _single_input(self, node: fx.Node) -> TensorAxes:
        x = self.tensor_arg(node, 0)
        others = [v for v in _tensors_in(self.axes_of(list(node.args[1:]))) if v is not None]
        others += [v for v in _tensors_in(self.axes_of(list(node.kwargs.values())))]
        ignore_others = node.op == "call_method" and node.target in ("to", "type_as")
        if x is None or (any(isinstance(v, TensorAxes) for v in others) and not ignore_others):
            raise Unsupported(f"{self.describe(node)} with these arguments is not supported")
        return x

    def _on_activation(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        return self._single_input(node), "activation"

    def _on_trivial(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        return self._single_input(node), "trivial"

    def _on_broadcast(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        """Elementwise with broadcasting: axes aligned from the right are joined."""
        operands = [
            v
            for v in _tensors_in(self.axes_of(list(node.args) + list(node.kwargs.values())))
            if isinstance(v, TensorAxes)
        ]
        if not isinstance(value, Tensor) or not operands:
            raise Unsupported(f"{self.describe(node)} without tensor operands")
        shape = tuple(value.shape)
        elems = []
        for j in range(1, len(shape) + 1):
            joined = []
            for operand in operands:
                if operand.ndim < j or operand.shape[-j] == 1:
                    continue
                if operand.shape[-j] != shape[-j]:
                    raise Unsupported(f"{self.describe(node)} does not broadcast as expected")
                joined.append(operand.elems[-j])
            if not joined or shape[-j] == 1:
                elems.append(self.classes.fixed(shape[-j], "a broadcast axis"))
                continue
            for other in joined[1:]:
                self.classes.union(joined[0], other)
            elems.append(joined[0])
        return TensorAxes(tuple(reversed(elems)), shape), "merge"

    def _spatial(self, x: TensorAxes, value: Any, k: int, node: fx.Node) -> tuple[Any, str]:
        """The last ``k`` axes are spatial (new, never permuted); the others pass through."""
        if not isinstance(value, Tensor) or value.ndim != x.ndim or not 0 < k < x.ndim:
            raise Unsupported(f"{self.describe(node)} is not a spatial operation here")
        if tuple(value.shape[:-k]) != x.shape[:-k]:
            raise Unsupported(f"{self.describe(node)} changes a non-spatial axis")
        spatial = tuple(self.classes.fixed(n, "a spatial axis") for n in value.shape[-k:])
        return TensorAxes(x.elems[:-k] + spatial, tuple(value.shape)), "spatial"

    def _on_spatial_module(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        module = self.modules[node.target]
        x = self._single_input(node)
        if getattr(module, "return_indices", False):
            raise Unsupported(f"{self.describe(node)} returns indices")
        k = SPATIAL_MODULES.get(type(module), x.ndim - 2)
        return self._spatial(x, value, k, node)

    def _on_spatial_function(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        x = self._single_input(node)
        return self._spatial(x, value, SPATIAL_FUNCTIONS.get(node.target, x.ndim - 2), node)

    def _on_pad(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        x = self._single_input(node)
        pad = self.literal(node, 1, "pad", ())
        if not isinstance(pad, tuple | list) or any(not isinstance(p, int) for p in pad):
            raise Unsupported(f"{self.describe(node)} with a non-literal padding")
        return self._spatial(x, value, len(pad) // 2, node)

    def _on_expand(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        """Axes kept at their size pass; broadcast size-1 axes and new leading axes are new."""
        x = self.tensor_arg(node, 0)
        if x is None or not isinstance(value, Tensor) or value.ndim < x.ndim:
            raise Unsupported(f"{self.describe(node)} on a non-tensor")
        shape = tuple(value.shape)
        lead = len(shape) - x.ndim
        elems = [self.classes.fixed(n, "an expanded axis") for n in shape[:lead]]
        for element, old, new in zip(x.elems, x.shape, shape[lead:], strict=True):
            same = old == new
            elems.append(element if same else self.classes.fixed(new, "an expanded axis"))
        return TensorAxes(tuple(elems), shape), "reshape"

    def _on_reshape(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        """Axes mapped one-to-one pass; axes merged or split with others end their groups."""
        x = self.tensor_arg(node, 0)
        if x is None or not isinstance(value, Tensor):
            raise Unsupported(f"{self.describe(node)} on a non-tensor")
        shape = tuple(value.shape)
        runs = _reshape_runs(x.shape, shape)
        if runs is None:
            raise Unsupported(f"{self.describe(node)} reshapes {x.shape} to {shape}")
        elems: list[int | None] = [None] * len(shape)
        why = (
            f"{self.describe(node)} reshapes {x.shape} to {shape}: a hidden axis merged with "
            "(or split into) other axes of size > 1 (e.g. flatten of a CxHxW map) gives each "
            "unit a block of the next layer's inputs, which one permutation of that full axis "
            "cannot express"
        )
        for source, target in runs:
            if len(source) == 1 and len(target) == 1:
                elems[target[0]] = x.elems[source[0]]
                continue
            for axis in source:
                self.classes.poison(x.elems[axis], why)
            for axis in target:
                elems[axis] = self.classes.new(shape[axis], reason=why)
        filled = tuple(
            e if e is not None else self.classes.fixed(shape[i], "a size-1 axis")
            for i, e in enumerate(elems)
        )
        return TensorAxes(filled, shape), "reshape"

    def _on_permute(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        x = self.tensor_arg(node, 0)
        if node.op == "call_function":  # torch.permute(x, dims)
            dims = self.literal(node, 1, "dims", ())
        else:  # x.permute(*dims) or x.permute(dims)
            dims = node.args[1:]
            if len(dims) == 1 and isinstance(dims[0], tuple | list):
                dims = dims[0]
        if x is None or not all(isinstance(d, int) for d in dims) or len(dims) != x.ndim:
            raise Unsupported(f"{self.describe(node)} with dims {dims!r}")
        return _reorder(x, [d % x.ndim for d in dims]), "permute"

    def _on_transpose(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        x = self.tensor_arg(node, 0)
        d0, d1 = self.literal(node, 1, "dim0", None), self.literal(node, 2, "dim1", None)
        if x is None or not isinstance(d0, int) or not isinstance(d1, int):
            raise Unsupported(f"{self.describe(node)} with dims {d0!r}, {d1!r}")
        return _reorder(x, _swap(x.ndim, d0, d1)), "permute"

    def _on_matrix_transpose(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        x = self.tensor_arg(node, 0)
        if x is None:
            raise Unsupported(f"{self.describe(node)} on a non-tensor")
        return (_reorder(x, [1, 0]) if x.ndim == 2 else x), "permute"

    def _on_reduce(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        """A reduction is invariant to permutations of the reduced axes; the others pass."""
        x = self.tensor_arg(node, 0)
        if x is None or not isinstance(value, Tensor):
            raise Unsupported(f"{self.describe(node)} on a non-tensor")
        dims = self.literal(node, 1, "dim", None)
        if isinstance(dims, bool) or dims is None:
            dims = tuple(range(x.ndim))
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        if not all(isinstance(d, int) for d in dims):
            raise Unsupported(f"{self.describe(node)} with dims {dims!r}")
        reduced = {d % x.ndim for d in dims} if x.ndim else set()
        keep = value.ndim == x.ndim and x.ndim > 0
        elems = [
            (self.classes.fixed(1, "a reduced axis") if keep else None)
            if axis in reduced
            else x.elems[axis]
            for axis in range(x.ndim)
        ]
        elems = tuple(e for e in elems if e is not None)
        return TensorAxes(elems, tuple(value.shape)), "reduce"

    def _on_cat(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        """Other axes join; the concatenated axis of the operands ends their groups."""
        parts = self.axes_of(self.literal(node, 0, "tensors", ()))
        dim = self.literal(node, 1, "dim", 0)
        if not isinstance(parts, tuple | list) or not all(isinstance(p, TensorAxes) for p in parts):
            raise Unsupported(f"{self.describe(node)} of non-tensors")
        if len(parts) == 1:
            return parts[0], "trivial"
        ndim = parts[0].ndim
        if not isinstance(dim, int) or any(p.ndim != ndim for p in parts):
            raise Unsupported(f"{self.describe(node)} with dim {dim!r}")
        dim %= ndim
        why = (
            f"{self.describe(node)} concatenates along axis {dim}: the consumer's input axis "
            "would need one permutation per segment, and the spec format gives an axis one group"
        )
        elems = []
        for axis in range(ndim):
            if axis == dim:
                for part in parts:
                    self.classes.poison(part.elems[axis], why)
                elems.append(self.classes.new(value.shape[axis], reason=why))
                continue
            for part in parts[1:]:
                self.classes.union(parts[0].elems[axis], part.elems[axis])
            elems.append(parts[0].elems[axis])
        return TensorAxes(tuple(elems), tuple(value.shape)), "concat"

    def _on_stack(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        parts = self.axes_of(self.literal(node, 0, "tensors", ()))
        dim = self.literal(node, 1, "dim", 0)
        if not isinstance(parts, tuple | list) or not all(isinstance(p, TensorAxes) for p in parts):
            raise Unsupported(f"{self.describe(node)} of non-tensors")
        if not isinstance(dim, int) or any(p.shape != parts[0].shape for p in parts):
            raise Unsupported(f"{self.describe(node)} with dim {dim!r}")
        for part in parts[1:]:
            for a, b in zip(parts[0].elems, part.elems, strict=True):
                self.classes.union(a, b)
        elems = list(parts[0].elems)
        dim %= len(elems) + 1
        elems.insert(dim, self.classes.fixed(len(parts), "a stacking axis"))
        return TensorAxes(tuple(elems), tuple(value.shape)), "concat"

    def _on_getitem(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        container, index = self.axes_of(node.args[0]), node.args[1]
        if isinstance(container, TensorAxes):
            return self._index(node, container, index, value), "index"
        if isinstance(container, tuple | list) and isinstance(index, int):
            return container[index], "trivial"
        if isinstance(value, Tensor):
            raise Unsupported(f"{self.describe(node)} on an unknown container")
        return None, "meta"

    def _index(self, node: fx.Node, x: TensorAxes, index: Any, value: Any) -> TensorAxes:
        """Basic indexing: full slices keep an axis; other slices and ints end its group."""
        items = index if isinstance(index, tuple) else (index,)
        consumed = sum(1 for item in items if item is not None and item is not Ellipsis)
        if sum(item is Ellipsis for item in items) > 1 or consumed > x.ndim:
            raise Unsupported(f"{self.describe(node)} with index {index!r}")
        expanded: list[Any] = []
        for item in items:
            expanded += [slice(None)] * (x.ndim - consumed) if item is Ellipsis else [item]
        if Ellipsis not in items:
            expanded += [slice(None)] * (x.ndim - consumed)
        why = f"{self.describe(node)} selects part of a hidden axis"
        elems, axis = [], 0
        for item in expanded:
            if item is None:
                elems.append(self.classes.fixed(1, "a new axis"))
                continue
            element = x.elems[axis]
            axis += 1
            if isinstance(item, slice) and item == slice(None):
                elems.append(element)
            elif isinstance(item, slice | int) and not isinstance(item, bool):
                self.classes.poison(element, why)
                if isinstance(item, slice):
                    elems.append(self.classes.new(value.shape[len(elems)], reason=why))
            else:
                raise Unsupported(f"{self.describe(node)} with advanced index {item!r}")
        return TensorAxes(tuple(elems), tuple(value.shape))

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


def _aliases(state: dict[str, Tensor]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """key -> canonical key (first key holding the same tensor), canonical -> all its keys."""
    first: dict[int, str] = {}
    canonical, aliases = {}, {}
    for key, tensor in state.items():
        owner = first.setdefault(id(tensor), key)
        canonical[key] = owner
        aliases.setdefault(owner, []).append(key)
    return canonical, aliases


def _swap(ndim: int, d0: int, d1: int) -> list[int]:
    order = list(range(ndim))
    d0, d1 = d0 % ndim, d1 % ndim
    order[d0], order[d1] = order[d1], order[d0]
    return order


def _reorder(x: TensorAxes, order: list[int]) -> TensorAxes:
    return TensorAxes(tuple(x.elems[d] for d in order), tuple(x.shape[d] for d in order))


def _reshape_runs(
    source: tuple[int, ...], target: tuple[int, ...]
) -> list[tuple[list[int], list[int]]] | None:
    """Match the axes of size > 1 of two row-major shapes into runs with equal products.

    ``(2, 8, 1, 1) -> (2, 8)`` gives ``[([0], [0]), ([1], [1])]``; ``(2, 8, 3, 3) -> (2, 72)``
    gives ``[([0], [0]), ([1, 2, 3], [1])]``. None if the shapes do not match.
    """
    src = [i for i, n in enumerate(source) if n != 1]
    dst = [j for j, n in enumerate(target) if n != 1]
    if 0 in source or 0 in target:
        return None
    runs, a, b = [], 0, 0
    while a < len(src) and b < len(dst):
        run_src, run_dst = [src[a]], [dst[b]]
        p_src, p_dst = source[src[a]], target[dst[b]]
        a, b = a + 1, b + 1
        while p_src != p_dst:
            if p_src < p_dst and a < len(src):
                run_src.append(src[a])
                p_src, a = p_src * source[src[a]], a + 1
            elif p_dst < p_src and b < len(dst):
                run_dst.append(dst[b])
                p_dst, b = p_dst * target[dst[b]], b + 1
            else:
                return None
        runs.append((run_src, run_dst))
    return runs if a == len(src) and b == len(dst) else None


def _consistent(out: Any, value: Any, classes: AxisClasses) -> bool:
    """Whether the axes computed for a node match its real output's shape."""
    if isinstance(out, TensorAxes):
        if not isinstance(value, Tensor) or tuple(value.shape) != out.shape:
            return False
        return all(classes.size[e] == n for e, n in zip(out.elems, out.shape, strict=True))
    if isinstance(out, tuple):
        return isinstance(value, tuple | list) and len(value) == len(out)
    return out is None


# ----------------------------------------------------------------------------- analysis


class ModuleOutputs:
    """Which module's output equals a graph node's output (for forward hooks).

    The model is run once with a forward hook on every submodule. A node is named by its own
    module when it is a module call and that module runs once per forward; otherwise by the
    deepest submodule that runs once and returns a tensor equal to the node's output (e.g. a
    residual block whose last ReLU module is reused inside the block). Modules that run more
    than once are never named: a hook would see several tensors.
    """

    def __init__(self, model: nn.Module, args: tuple[Any, ...]) -> None:
        calls: Counter[str] = Counter()
        outputs: dict[str, Tensor] = {}

        def hook_for(name: str) -> Callable:
            def hook(_module: nn.Module, _inputs: Any, output: Any) -> None:
                calls[name] += 1
                if isinstance(output, Tensor):
                    outputs[name] = output.detach().clone()

            return hook

        handles = [
            module.register_forward_hook(hook_for(name))
            for name, module in model.named_modules()
            if name
        ]
        try:
            model(*args)
        finally:
            for handle in handles:
                handle.remove()
        self.once = {name: out for name, out in outputs.items() if calls[name] == 1}
        self.by_shape: dict[tuple[int, ...], list[tuple[str, Tensor]]] = {}
        for name, out in self.once.items():
            self.by_shape.setdefault(tuple(out.shape), []).append((name, out))

    def name_of(self, node: fx.Node, value: Any) -> str | None:
        """The module whose hooked output is ``value`` (the node's output), or None."""
        if not isinstance(value, Tensor):
            return None
        if node.op == "call_module" and node.target in self.once:
            return node.target
        matches = [
            name
            for name, out in self.by_shape.get(tuple(value.shape), [])
            if out.dtype == value.dtype and _same_values(out, value)
        ]
        return max(matches, key=lambda name: name.count(".")) if matches else None


def _same_values(a: Tensor, b: Tensor) -> bool:
    """Equal, or equal up to float rounding (GPU kernels need not be bitwise reproducible)."""
    if torch.equal(a, b):
        return True
    if not a.is_floating_point() or a.numel() == 0:
        return False
    scale = max(1.0, float(b.abs().max()))
    return torch.allclose(a, b, rtol=1e-5, atol=1e-6 * scale)


@dataclass
class Analysis:
    """A traced model: graph, node outputs on the example input, union-find, module outputs."""

    model: nn.Module
    gm: fx.GraphModule
    values: dict[fx.Node, Any]
    walk: GraphWalk
    outputs: ModuleOutputs


def analyse(model: nn.Module, example_input: Tensor | tuple[Tensor, ...]) -> Analysis:
    """Trace ``model``, run the graph on ``example_input`` (eval mode, no grad) and walk it."""
    args = example_args(example_input)
    with in_eval_mode(model), torch.no_grad():
        gm = trace(model)
        recorder = _Recorder(gm)
        recorder.run(*args)
        walk = GraphWalk(model, gm, recorder.values)
        outputs = ModuleOutputs(model, args)
    return Analysis(model, gm, recorder.values, walk, outputs)


def derived_groups(walk: GraphWalk) -> tuple[dict[str, list[Axis]], dict[str, int]]:
    """Group name -> ``(key, axis)`` pairs, and group name -> union-find root.

    A class becomes a group when it holds at least one state-dict axis of size > 1, touches
    the data flow (an activation axis) and is not poisoned. A group is named after its first
    producer (the module whose output units it permutes). Poisoned classes holding a producer's
    units give a :class:`SpecDerivationWarning` unless every reason is expected (input/output).
    """
    classes = walk.classes
    slot_of = {element: key_axis for key_axis, element in walk.slots.items()}
    groups: dict[str, list[Axis]] = {}
    roots: dict[str, int] = {}
    for root, members in classes.classes().items():
        slots = [slot_of[e] for e in members if e in slot_of]
        units = list(dict.fromkeys(classes.unit[e] for e in members if e in classes.unit))
        active = any(classes.activation[e] for e in members)
        if not slots or not active or classes.size[root] < 2:
            continue
        reasons = [reason for e in members for reason in classes.reasons.get(e, [])]
        if reasons:
            loud = list(dict.fromkeys(text for text, is_loud in reasons if is_loud))
            if loud and units:
                more = f" (and {len(loud) - 1} more reasons)" if len(loud) > 1 else ""
                warnings.warn(
                    f"derive_spec: the units of {', '.join(units[:3])} are not permuted "
                    f"(their group is dropped): {loud[0]}{more}",
                    SpecDerivationWarning,
                    stacklevel=3,
                )
            continue
        name = units[0] if units else slots[0][0]
        suffix = 1
        while name in groups:
            suffix += 1
            name = f"{units[0] if units else slots[0][0]}#{suffix}"
        groups[name] = [(alias, axis) for key, axis in slots for alias in walk.aliases[key]]
        roots[name] = root
    return groups, roots


def activation_modules(analysis: Analysis, roots: dict[str, int]) -> dict[str, str]:
    """Group -> a module whose output carries the group's units on dim 1.

    Among the graph nodes whose axis 1 is in the group and that a module's output matches
    (:class:`ModuleOutputs`), the last activation function (ReLU etc.) in graph order is
    preferred, else the last such node of any kind (a norm, a pooling, the producer itself).
    Groups whose units never sit on dim 1 of a module's output (e.g. features on the last axis
    of a ``(N, T, D)`` tensor) get no entry.
    """
    walk = analysis.walk
    wanted = {root: name for name, root in roots.items()}
    best: dict[str, tuple[bool, int, str]] = {}
    for position, node in enumerate(analysis.gm.graph.nodes):
        out = walk.out[node]
        if not isinstance(out, TensorAxes) or out.ndim < 2 or walk.kind[node] in ("param",):
            continue
        group = wanted.get(walk.classes.find(out.elems[1]))
        if group is None:
            continue
        module = analysis.outputs.name_of(node, analysis.values.get(node))
        if module is not None:
            rank = (walk.kind[node] == "activation", position, module)
            best[group] = max(best.get(group, rank), rank)
    return {group: best[group][2] for group in roots if group in best}


def derive_spec(
    model: nn.Module, example_input: Tensor | tuple[Tensor, ...], *, seed: int = 0
) -> PermutationSpec:
    """The permutation spec of ``model``, derived from its ``torch.fx`` graph and checked.

    ``example_input`` is one input batch (a tensor, or a tuple of the forward's positional
    arguments); use random values and a batch of 2 or more, so that no axis of the example
    has size 1 by accident. Groups are named after their first producer module (e.g.
    ``"layer1.0.conv1"``). Before returning, one seeded random permutation per group is applied
    and the outputs on ``example_input`` must be unchanged (:func:`check_spec`).

    ``ValueError`` when the model cannot be traced or run (naming the module or node), or when
    the check fails (naming the group). Groups the derivation cannot permute safely are dropped
    with a :class:`SpecDerivationWarning` (see the module docstring for the rules).
    """
    analysis = analyse(model, example_input)
    groups, roots = derived_groups(analysis.walk)
    modules = activation_modules(analysis, roots)
    spec = spec_from_groups(groups, modules, model.state_dict())
    try:
        check_spec(model, spec, example_input, seed=seed)
    except ValueError as exc:
        raise ValueError(
            f"derive_spec built a wrong spec for {type(model).__name__} ({exc}); an operation "
            "on those units is not understood: write a permutation_spec() method"
        ) from exc
    return spec


# ----------------------------------------------------------------------------- layer names


def _data_edges(analysis: Analysis) -> list[tuple[fx.Node, fx.Node]]:
    """Edges that carry tensors between computing nodes (no parameters, no shape metadata)."""
    walk = analysis.walk
    edges = []
    for node in analysis.gm.graph.nodes:
        if node.op != "output" and walk.out[node] is None:
            continue
        for source in node.all_input_nodes:
            if walk.kind[source] not in ("param", "meta") and walk.out[source] is not None:
                edges.append((source, node))
    return edges


def _reachable(start: set[fx.Node], edges: dict[fx.Node, list[fx.Node]]) -> set[fx.Node]:
    seen, stack = set(start), list(start)
    while stack:
        for nxt in edges.get(stack.pop(), []):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def main_path(analysis: Analysis) -> set[fx.Node]:
    """Nodes on some data path from an input to the output (the output node excluded)."""
    nodes = list(analysis.gm.graph.nodes)
    forward: dict[fx.Node, list[fx.Node]] = {}
    backward: dict[fx.Node, list[fx.Node]] = {}
    for a, b in _data_edges(analysis):
        forward.setdefault(a, []).append(b)
        backward.setdefault(b, []).append(a)
    inputs = {node for node in nodes if node.op == "placeholder"}
    outputs = {node for node in nodes if node.op == "output"}
    return (_reachable(inputs, forward) & _reachable(outputs, backward)) - outputs


def cut_nodes(analysis: Analysis, main: set[fx.Node]) -> list[fx.Node]:
    """Nodes of ``main`` that every input-to-output path passes through, in graph order.

    The graph's node list is a topological order, so a node on the main path is a cut exactly
    when no data edge between main-path nodes jumps over it. Inside a residual block the
    shortcut edge jumps over the branch, so only the block's output (the addition and what
    follows it) is a cut.
    """
    nodes = list(analysis.gm.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    cover = [0] * (len(nodes) + 1)
    for a, b in _data_edges(analysis):
        if a in main and (b in main or b.op == "output"):
            cover[position[a] + 1] += 1
            cover[position[b]] -= 1
    running, cuts = 0, []
    for i, node in enumerate(nodes):
        running += cover[i]
        if node in main and running == 0:
            cuts.append(node)
    return cuts


def _layer_outputs(analysis: Analysis) -> list[fx.Node]:
    """For each layer after the first: the last cut before it, skipping pools and reshapes."""
    kind = analysis.walk.kind
    nodes = list(analysis.gm.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    main = main_path(analysis)
    cuts = cut_nodes(analysis, main)
    layers = [node for node in nodes if node in main and kind[node] in LAYER_KINDS]
    if not layers:
        raise ValueError("derive_layer_names found no Linear/Conv layer between input and output")
    first = position[layers[0]]
    selected: dict[fx.Node, None] = {}
    for layer in layers:
        before = [i for i, cut in enumerate(cuts) if position[cut] < position[layer]]
        if not before or position[cuts[before[-1]]] < first:
            continue
        i = before[-1]
        while kind[cuts[i]] in SHAPE_ONLY_KINDS and i > 0 and position[cuts[i - 1]] >= first:
            i -= 1
        selected[cuts[i]] = None
    return list(selected)


def derive_layer_names(model: nn.Module, example_input: Tensor | tuple[Tensor, ...]) -> list[str]:
    """Names of the modules whose outputs are the layer outputs ``f_1..f_L`` used by LEWC.

    Derived from the graph: the *cut* nodes (every input-to-output path passes through them)
    split the network into layers; for each Linear/Conv layer after the first, the last cut
    before it is the previous layer's output, skipping pooling, flatten and dropout back to
    the activation (a plain network: each hidden ReLU; a residual network: each block's output
    after the addition and its ReLU, not the ReLU inside the block). The last name is the
    module whose output is the model's output (the logits). A hidden output that no module
    called once returns (see :class:`ModuleOutputs`) is skipped with a warning.

    ``ValueError`` if the model cannot be traced or run, has no layer, or its output is not
    one tensor returned by a module.
    """
    analysis = analyse(model, example_input)
    output = next(node for node in analysis.gm.graph.nodes if node.op == "output")
    logits = output.args[0]
    if not isinstance(logits, fx.Node) or not isinstance(analysis.values.get(logits), Tensor):
        raise ValueError(
            f"the output of {type(model).__name__} is not one tensor; LEWC layer names need a "
            "model that returns its logits"
        )
    names = []
    for node in _layer_outputs(analysis):
        name = analysis.outputs.name_of(node, analysis.values[node])
        if name is None:
            warnings.warn(
                f"derive_layer_names: the layer output at node {node.name!r} is not the output "
                "of a module that runs once per forward; it is left out",
                SpecDerivationWarning,
                stacklevel=2,
            )
        elif name not in names:
            names.append(name)
    last = analysis.outputs.name_of(logits, analysis.values[logits])
    if last is None:
        raise ValueError(
            f"the output of {type(model).__name__} (node {logits.name!r}) is not the output of "
            "a module that runs once per forward; LEWC needs the module that returns the logits"
        )
    return names + [last] if last not in names else names
