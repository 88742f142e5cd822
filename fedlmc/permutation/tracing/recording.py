"""Tracing and recording: the ``torch.fx`` trace of a model (errors name the failing module),
the run of the traced graph that keeps every node's output, and :class:`ModuleOutputs` (which
module's forward hook sees a node's output)."""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn


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
