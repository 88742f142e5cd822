"""The union-find of axes behind a derived spec, the axes of one tensor, and the warning and
exception the derivation raises."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


class SpecDerivationWarning(UserWarning):
    """A hidden group was dropped from a derived spec (its units are not permuted)."""


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
