"""The rules of the operations that keep, move or join the units of their input: activations,
dropout, broadcasting elementwise operations, pooling, padding and upsampling, expand, reshapes,
permutes and transposes, reductions, concatenation and stacking, and indexing."""

from __future__ import annotations

from typing import Any

from torch import Tensor, fx

from fedlmc.permutation.tracing.axes import TensorAxes, Unsupported, _tensors_in
from fedlmc.permutation.tracing.operations import SPATIAL_FUNCTIONS, SPATIAL_MODULES


class ShapeRules:
    """``_on_<kind>`` handlers of the shape operations, mixed into
    :class:`~fedlmc.permutation.tracing.walk.GraphWalk` (whose ``classes``, ``modules``,
    ``axes_of``, ``tensor_arg``, ``literal``, ``_single_input`` and ``describe`` they use)."""

    def _on_getattr(self, node: fx.Node, value: Any) -> tuple[Any, str]:
        x, name = self.tensor_arg(node, 0), node.args[1]
        if not isinstance(value, Tensor):
            return None, "meta"
        if x is None or name not in ("T", "mT"):
            raise Unsupported(f"attribute {name!r} at node {node.name!r} is not supported")
        order = list(range(x.ndim))[::-1] if name == "T" else _swap(x.ndim, -2, -1)
        return _reorder(x, order), "permute"

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
