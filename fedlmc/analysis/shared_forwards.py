r"""Forward passes shared between the measurements of one study: each model evaluated once.

One comparison of merge methods evaluates the same model on the same inputs many times: the
interpolation path of the plain average starts and ends at the two clients the baseline has
already predicted and passes through the merge at :math:`\lambda = 1/2`; every LEWC/LLFC
measurement of a merge captures the clients' layer outputs again, and the reciprocal
orthogonality and ReLU additivity of the same two clients are recomputed for every merge that
leaves them unpermuted. A :class:`ForwardCache` remembers such results for the models it has
seen, identified by their architecture and state (:class:`ModelState`: every parameter and
buffer equal, compared exactly), and hands them back instead of running the model again:

- :meth:`ForwardCache.memo`: any value computed from one or more models and some inputs (a
  model's logits on the test and server splits with its fitted temperature; the pair columns of
  two clients);
- :meth:`ForwardCache.capture`: the outputs or inputs of named modules on a batch ``x``
  (what :func:`fedlmc.analysis.diagnostics.capture` returns). On a miss one pass captures every
  module of the cache's plan (the layers every diagnostic of the study reads), so a model runs
  once over ``x`` however many diagnostics read it.

The values are those of the unshared computation: the same forward passes in the same batches;
captures are kept in the model's own dtype (a copy taken in the hook) and converted to float64
on the way out, as the hook of :func:`~fedlmc.analysis.diagnostics.capture` does. A model changed
in place after it was seen (a tensor's version counter moved) no longer matches. What is kept
is bounded (:data:`BUDGET_BYTES`: the least recently used entries go first; an entry larger
than the budget is computed and not kept). :func:`sharing` makes a cache the one that
:func:`~fedlmc.analysis.diagnostics.capture` consults inside a block (per thread: a
``contextvars`` variable), so the diagnostics' functions keep their signatures.
"""

from __future__ import annotations

import contextvars
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import Tensor, nn

from fedlmc.averaging import load_state
from fedlmc.capture import HookKind, forward_capture

BUDGET_BYTES = 1 << 29
"""What one :class:`ForwardCache` keeps at most (512 MiB): captured activations, memoised values
and the model states that identify them."""

FINGERPRINT_STRIDE = 97
"""Every this-many-th entry of each tensor enters a state's fingerprint (candidates only: a
match is confirmed tensor by tensor)."""

_ACTIVE: contextvars.ContextVar[ForwardCache | None] = contextvars.ContextVar(
    "fedlmc_forward_cache", default=None
)

__all__ = ["BUDGET_BYTES", "ForwardCache", "ModelState", "active_cache", "sharing"]


def _tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in ``value`` (a tensor, or mappings and sequences of them)."""
    if isinstance(value, Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, Mapping):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(v) for v in value)
    if hasattr(value, "__dict__"):
        return sum(_tensor_bytes(v) for v in vars(value).values())
    return 0


class ModelState:
    """A model's architecture (its class and ``repr``) and state (``state_dict``, or the given
    ``state``, e.g. one to be loaded into ``model``), compared exactly: equal when the
    architectures are the same and every tensor has the same name, dtype, shape and values
    (:func:`torch.equal`; NaN never equals). The tensors are held by reference with their
    version counters: one changed in place since no longer matches."""

    def __init__(self, model: nn.Module, state: Mapping[str, Tensor] | None = None) -> None:
        self.kind = (type(model), repr(model), str(_device_of(model)))
        self.tensors = sorted((model.state_dict() if state is None else state).items())
        self.versions = [t._version for _, t in self.tensors]
        self.fingerprint = (self.kind, tuple(_fingerprint(name, t) for name, t in self.tensors))

    @property
    def nbytes(self) -> int:
        return sum(_tensor_bytes(t) for _, t in self.tensors)

    def unchanged(self) -> bool:
        return all(t._version == v for (_, t), v in zip(self.tensors, self.versions, strict=True))

    def equals(self, other: ModelState) -> bool:
        if self.fingerprint != other.fingerprint or not (self.unchanged() and other.unchanged()):
            return False
        return all(
            a is b or torch.equal(a, b)
            for (_, a), (_, b) in zip(self.tensors, other.tensors, strict=True)
        )


def _device_of(model: nn.Module) -> torch.device:
    tensor = next(model.parameters(), None)
    if tensor is None:
        tensor = next(model.buffers(), None)
    return tensor.device if tensor is not None else torch.device("cpu")


def _fingerprint(name: str, t: Tensor) -> Hashable:
    """Name, dtype, shape and the float64 sum of a strided sample of the entries."""
    sample = t.detach().reshape(-1)[::FINGERPRINT_STRIDE]
    total = float(sample.sum(dtype=torch.float64)) if sample.numel() else 0.0
    return name, str(t.dtype), tuple(t.shape), total


class _Entry:
    """One remembered value: its tag, the models and inputs it was computed from, and the
    value (for a capture: module name -> tensor in the model's dtype, per hook kind)."""

    def __init__(self, tag: Hashable, states: list[ModelState], inputs: tuple, value: Any) -> None:
        self.tag, self.states, self.inputs, self.value = tag, states, inputs, value
        self.input_versions = [getattr(x, "_version", None) for x in inputs]

    def matches(self, tag: Hashable, states: Sequence[ModelState], inputs: tuple) -> bool:
        return (
            self.tag == tag
            and len(self.inputs) == len(inputs)
            and all(a is b for a, b in zip(self.inputs, inputs, strict=True))
            and [getattr(x, "_version", None) for x in inputs] == self.input_versions
            and len(self.states) == len(states)
            and all(a.equals(b) for a, b in zip(self.states, states, strict=True))
        )

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.states) + _tensor_bytes(self.value)


class ForwardCache:
    """Results of forward passes on models seen before (see the module docstring).

    ``plan`` maps a hook kind (``"output"``, ``"input"``) to the module names a capture on a
    miss takes besides the requested ones; ``budget`` is the bytes kept at most. ``hits`` and
    ``misses`` count the lookups."""

    def __init__(
        self,
        plan: Mapping[HookKind, Sequence[str]] | None = None,
        budget: int = BUDGET_BYTES,
    ) -> None:
        self.plan = {kind: list(names) for kind, names in (plan or {}).items()}
        self.budget = int(budget)
        self.entries: OrderedDict[int, _Entry] = OrderedDict()
        self._next = 0
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        return sum(entry.nbytes for entry in self.entries.values())

    def _find(self, tag: Hashable, states: Sequence[ModelState], inputs: tuple) -> _Entry | None:
        for number, entry in self.entries.items():
            if entry.matches(tag, states, inputs):
                self.entries.move_to_end(number)
                return entry
        return None

    def _keep(self, entry: _Entry) -> None:
        """Remember ``entry`` (the most recent), then drop the least recently used entries
        until the budget holds; an entry larger than the budget is not remembered."""
        self.entries[self._next] = entry
        self._next += 1
        self._fit()

    def _fit(self) -> None:
        sizes = {number: entry.nbytes for number, entry in self.entries.items()}
        newest = next(reversed(self.entries), None)
        if newest is not None and sizes[newest] > self.budget:
            del self.entries[newest]
            del sizes[newest]
        total = sum(sizes.values())
        for number in list(self.entries):
            if total <= self.budget:
                break
            total -= sizes[number]
            del self.entries[number]

    def memo(
        self,
        tag: Hashable,
        models: Sequence[nn.Module | ModelState],
        inputs: Sequence[Any],
        compute: Callable[[], Any],
    ) -> Any:
        """``compute()`` of ``models`` (or their :class:`ModelState`) on ``inputs`` (compared
        by identity), or the value remembered under ``tag`` for equal models and the same
        inputs."""
        states = [m if isinstance(m, ModelState) else ModelState(m) for m in models]
        found = self._find(tag, states, tuple(inputs))
        if found is not None:
            self.hits += 1
            return found.value
        self.misses += 1
        value = compute()
        self._keep(_Entry(tag, states, tuple(inputs), value))
        return value

    def capture(
        self,
        model: nn.Module,
        names: Sequence[str],
        x: Tensor,
        mode: HookKind,
        batch_size: int,
    ) -> dict[str, Tensor]:
        """The outputs (``mode="output"``) or first inputs (``"input"``) of the named modules on
        ``x`` in batches of ``batch_size``, float64 on the CPU, as
        :func:`fedlmc.analysis.diagnostics.capture` computes them; on a miss one pass takes the
        requested modules and the plan's."""
        return self._capture(ModelState(model), lambda: model, names, x, mode, batch_size)

    def capture_state(
        self,
        template: nn.Module,
        state: Mapping[str, Tensor],
        names: Sequence[str],
        x: Tensor,
        mode: HookKind,
        batch_size: int,
    ) -> dict[str, Tensor]:
        """:meth:`capture` of ``template`` loaded with ``state``
        (:func:`fedlmc.averaging.load_state`), loaded only on a miss."""

        def build() -> nn.Module:
            return load_state(template, state)

        key = ModelState(template, state)
        return self._capture(key, build, names, x, mode, batch_size)

    def _capture(
        self,
        key: ModelState,
        build: Callable[[], nn.Module],
        names: Sequence[str],
        x: Tensor,
        mode: HookKind,
        batch_size: int,
    ) -> dict[str, Tensor]:
        tag = ("capture", batch_size)
        entry = self._find(tag, [key], (x,))
        if entry is None:
            entry = _Entry(tag, [key], (x,), {"output": {}, "input": {}})
        stored = entry.value
        if all(name in stored[mode] for name in names):
            self.hits += 1
            return {name: _as_float64(stored[mode][name]) for name in names}
        self.misses += 1
        model = build()
        modules = dict(model.named_modules())
        wanted = {
            kind: [n for n in self.plan.get(kind, []) if n in modules and n not in stored[kind]]
            for kind in stored
        }
        wanted[mode] = list(dict.fromkeys([*wanted[mode], *names]))  # unknown names: ValueError
        for kind, found in _capture_kinds(model, wanted, x, batch_size).items():
            stored[kind].update(found)
        if not any(e is entry for e in self.entries.values()):
            self._keep(entry)
        else:
            self._fit()
        return {name: _as_float64(stored[mode][name]) for name in names}


def _as_float64(t: Tensor) -> Tensor:
    """A float64 copy of a kept capture (never the kept tensor itself)."""
    return t.clone() if t.dtype == torch.float64 else t.double()


def _capture_kinds(
    model: nn.Module, wanted: Mapping[str, Sequence[str]], x: Tensor, batch_size: int
) -> dict[str, dict[str, Tensor]]:
    """One pass of ``model`` over ``x`` in batches: the outputs and inputs of the ``wanted``
    modules, each copied in the hook (a later in-place operation cannot change it), on the CPU
    in the model's dtype, concatenated over the batch dimension."""
    store: dict[str, dict[str, list[Tensor]]] = {k: {n: [] for n in v} for k, v in wanted.items()}

    def output_hook(name: str) -> Callable:
        return lambda _m, _inputs, out: store["output"][name].append(_copied(out))

    def input_hook(name: str) -> Callable:
        return lambda _m, inputs: store["input"][name].append(_copied(inputs[0]))

    with ExitStack() as stack:
        forward = None
        for kind, make in (("output", output_hook), ("input", input_hook)):
            names = wanted.get(kind, [])
            if names:
                hooks = {n: make(n) for n in names}
                forward = stack.enter_context(forward_capture(model, hooks, kind=kind))
        if forward is not None:
            for i in range(0, len(x), batch_size):
                forward(x[i : i + batch_size])
    return {k: {n: torch.cat(chunks) for n, chunks in v.items()} for k, v in store.items()}


def _copied(t: Tensor) -> Tensor:
    t = t.detach()
    return t.cpu() if t.device.type != "cpu" else t.clone()


def active_cache() -> ForwardCache | None:
    """The cache :func:`sharing` made active in this thread's context (``None``: none)."""
    return _ACTIVE.get()


@contextmanager
def sharing(cache: ForwardCache | None) -> Iterator[ForwardCache | None]:
    """``cache`` is the one :func:`active_cache` returns inside the block (``None``: no
    sharing); the previous one is restored on exit."""
    token = _ACTIVE.set(cache)
    try:
        yield cache
    finally:
        _ACTIVE.reset(token)
