"""The graph walk: one pass over a traced model's nodes in graph order, giving every axis of
every tensor (and of every state-dict tensor) its union-find element.

:class:`GraphWalk` holds the state (union-find, state-dict slots, per-node axes and kinds),
reads node arguments, and dispatches each node to ``_on_<kind>`` (the kind from
:mod:`~fedlmc.permutation.tracing.operations`). It handles inputs, parameters, outputs, shape
metadata and unknown operations itself; the rules of the other kinds are the mixins
:class:`~fedlmc.permutation.tracing.shape_rules.ShapeRules` and
:class:`~fedlmc.permutation.tracing.layer_rules.LayerRules`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, fx, nn

from fedlmc.permutation.spec import Axis
from fedlmc.permutation.tracing.axes import AxisClasses, TensorAxes, Unsupported, _tensors_in
from fedlmc.permutation.tracing.layer_rules import LayerRules
from fedlmc.permutation.tracing.operations import (
    FUNCTION_KINDS,
    METHOD_KINDS,
    MODULE_KINDS,
    MODULE_STATE,
)
from fedlmc.permutation.tracing.recording import _target_name
from fedlmc.permutation.tracing.shape_rules import ShapeRules


class GraphWalk(ShapeRules, LayerRules):
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

    def _single_input(self, node: fx.Node) -> TensorAxes:
        x = self.tensor_arg(node, 0)
        others = [v for v in _tensors_in(self.axes_of(list(node.args[1:]))) if v is not None]
        others += [v for v in _tensors_in(self.axes_of(list(node.kwargs.values())))]
        ignore_others = node.op == "call_method" and node.target in ("to", "type_as")
        if x is None or (any(isinstance(v, TensorAxes) for v in others) and not ignore_others):
            raise Unsupported(f"{self.describe(node)} with these arguments is not supported")
        return x

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


def _aliases(state: dict[str, Tensor]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """key -> canonical key (first key holding the same tensor), canonical -> all its keys."""
    first: dict[int, str] = {}
    canonical, aliases = {}, {}
    for key, tensor in state.items():
        owner = first.setdefault(id(tensor), key)
        canonical[key] = owner
        aliases.setdefault(owner, []).append(key)
    return canonical, aliases


def _consistent(out: Any, value: Any, classes: AxisClasses) -> bool:
    """Whether the axes computed for a node match its real output's shape."""
    if isinstance(out, TensorAxes):
        if not isinstance(value, Tensor) or tuple(value.shape) != out.shape:
            return False
        return all(classes.size[e] == n for e, n in zip(out.elems, out.shape, strict=True))
    if isinstance(out, tuple):
        return isinstance(value, tuple | list) and len(value) == len(out)
    return out is None
