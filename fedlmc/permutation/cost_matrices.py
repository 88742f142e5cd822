r"""The cost matrices of weight matching's coordinate descent, kept up to date incrementally.

For group :math:`p`, with every other permutation fixed, the matching objective is
:math:`J = \operatorname{tr}(P_p^\top A_p) + \text{const}` with

.. math::
    A_p = \sum_{(w, \text{axis}) \ni p} W_a^{(p)} \,
          \big(W_b^{(p)}\big|_{\text{other perms}}\big)^\top

(:mod:`fedlmc.permutation.coordinate_descent`). :class:`CostMatrices` holds one :math:`A_p` per
group and brings it up to date for the current permutations at the least cost: terms with no
other permuted axis are summed once, a neighbour that moved few units gives a low-rank update,
a term left out of a partial matrix (the forward start) is added whole when it is first needed.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

import torch
from torch import Tensor

from fedlmc.permutation.accumulate import accumulate
from fedlmc.permutation.objective import check_pair, is_scored, self_dependent_groups
from fedlmc.permutation.spec import PermutationSpec

__all__ = ["FULL_REBUILD_FRACTION", "CostMatrices"]


def _flat(tensor: Tensor, axis: int) -> Tensor:
    """``tensor`` with ``axis`` moved first and the other axes flattened: shape ``(n, -1)``."""
    return tensor.movedim(axis, 0).reshape(tensor.shape[axis], -1)


@dataclass
class _Term:
    r"""One ``(key, axis)`` of a group whose tensor has other permuted axes.

    With one other permuted axis (group ``q``, the usual case) ``a``/``b`` hold :math:`W_a`,
    :math:`W_b` laid out ``(m, R, n)``: ``q``'s ``m`` units first, the group's ``n`` units last,
    so that moving units of ``q`` selects whole rows. Otherwise (``q_first`` false) they hold the
    tensors with the group's axis first. ``others`` lists the other permuted axes of the
    group-first layout as ``(axis, group)``; ``seen`` holds the permutations of those groups that
    the maintained cost matrix currently reflects.
    """

    a: Tensor
    b: Tensor
    others: tuple[tuple[int, str], ...]
    seen: dict[str, Tensor]
    q_first: bool


def _is_hidden(term: _Term, hidden: Set[str]) -> bool:
    """Whether ``term`` involves a group of ``hidden`` (left out of a partial matrix)."""
    return any(group in hidden for _, group in term.others)


def _moved_axis(axis: int, first: int) -> int:
    """Position of original ``axis`` after ``movedim(first, 0)``."""
    if axis == first:
        return 0
    return axis + 1 if axis < first else axis


def _q_first(tensor: Tensor, axis: int) -> Tensor:
    """A group-first tensor ``(n, ..., m, ...)`` laid out ``(m, R, n)`` (``m`` on ``axis``)."""
    moved = tensor.movedim(axis, 0).movedim(1, -1).contiguous()
    return moved.reshape(moved.shape[0], -1, moved.shape[-1])


FULL_REBUILD_FRACTION = 0.75
"""Rebuild a cost matrix from scratch when more than this fraction of a neighbour's units moved
(an update moving ``k`` of ``n`` units costs about ``k / n`` of a rebuild)."""


class CostMatrices:
    r"""The cost matrices :math:`A_p` of weight matching, kept up to date incrementally.

    :math:`A_p = \sum_{\text{const}} W_a^{(p)} W_b^{(p)\top} + \sum_{\text{terms}} W_a^{(p)}
    \pi_q(W_b)^{(p)\top}`. The first part never changes. When the permutation of a neighbour
    ``q`` moves the units in the set ``S``, only the columns of :math:`\pi_q(W_b)^{(p)}` that belong
    to ``S`` change, so the update is the low-rank product
    :math:`W_a^{(p)}[:, S]\,(\pi_q^{new}(W_b) - \pi_q^{old}(W_b))[:, S]^\top`. Products are
    computed in the tensors' dtype (at least float32) on the tensors' device; the matrices are
    held in that dtype (updates fused into the product) or, with ``float64_costs``, in float64
    (each product added in float64).
    """

    def __init__(
        self,
        spec: PermutationSpec,
        sd_a: Mapping[str, Tensor],
        sd_b: Mapping[str, Tensor],
        float64_costs: bool = False,
    ):
        sizes = check_pair(spec, sd_a, sd_b)
        first = sd_a[next(iter(spec.axes_to_perm))]
        self.device = first.device
        self.dtype = torch.promote_types(first.dtype, torch.float32)
        self.cost_dtype = torch.float64 if float64_costs else self.dtype
        self.sizes = sizes
        self.terms: dict[str, list[_Term]] = {}
        self.const: dict[str, Tensor] = {}
        self.fixed: dict[str, list[tuple[Tensor, Tensor]]] = {}
        self.cost: dict[str, Tensor | None] = {}
        self.neighbours: dict[str, set[str]] = {}
        self.self_dependent = self_dependent_groups(spec)
        """Groups on two axes of one scored tensor: :math:`A_p` holds only the linearisation
        of :math:`J` at their current permutation
        (:func:`fedlmc.permutation.objective.self_dependent_groups`)."""
        self.scratch: dict[tuple[int, torch.dtype], Tensor] = {}
        for group, axes in spec.perm_to_axes.items():
            self._add_group(spec, group, axes, sd_a, sd_b)

    def reset(self) -> None:
        """Forget every cached matrix (the next :meth:`matrix` of each group rebuilds it)."""
        self.cost = dict.fromkeys(self.cost, None)

    def _tensor(self, sd: Mapping[str, Tensor], key: str) -> Tensor:
        return sd[key].detach().to(device=self.device, dtype=self.dtype)

    def _add_group(self, spec, group, axes, sd_a, sd_b) -> None:
        n = self.sizes[group]
        const = torch.zeros(n, n, device=self.device, dtype=self.dtype)
        terms, fixed, neighbours = [], [], set()
        for key, axis in axes:
            if not is_scored(key):
                continue
            w_a, w_b = self._tensor(sd_a, key), self._tensor(sd_b, key)
            others = tuple(
                (_moved_axis(ax, axis), g)
                for ax, g in enumerate(spec.axes_to_perm[key])
                if g is not None and ax != axis
            )
            if not others:
                a, b = _flat(w_a, axis), _flat(w_b, axis)
                const.addmm_(a, b.T)
                fixed.append((a, b))
                continue
            neighbours.update(g for _, g in others)
            a, b = w_a.movedim(axis, 0), w_b.movedim(axis, 0)
            if len(others) == 1:
                q_axis = others[0][0]
                terms.append(_Term(_q_first(a, q_axis), _q_first(b, q_axis), others, {}, True))
            else:
                terms.append(_Term(a.contiguous(), b.contiguous(), others, {}, False))
        self.const[group], self.terms[group], self.cost[group] = const, terms, None
        self.fixed[group] = fixed
        self.neighbours[group] = neighbours - {group}

    @staticmethod
    def _permuted_b(term: _Term, perms: Mapping[str, Tensor], b: Tensor | None = None) -> Tensor:
        """``term.b`` (or ``b``, laid out alike) with the other groups' current permutations
        applied (same layout)."""
        b = term.b if b is None else b
        if term.q_first:
            return b.index_select(0, perms[term.others[0][1]])
        for axis, group in term.others:
            b = b.index_select(axis, perms[group])
        return b

    def _buffer(self, n: int, dtype: torch.dtype) -> Tensor:
        """A reused n x n scratch matrix (a fresh one per product costs more than the product
        itself when the update is small: every new page is faulted in)."""
        key = (n, dtype)
        if key not in self.scratch:
            self.scratch[key] = torch.empty(n, n, device=self.device, dtype=dtype)
        return self.scratch[key]

    def _add_product(self, cost: Tensor, term: _Term, a: Tensor, b: Tensor) -> None:
        r"""``cost += ``:math:`W_a^{(p)} W_b^{(p)\top}` of two tensors in ``term``'s layout."""
        n = cost.shape[0]
        if term.q_first:
            x, y = a.reshape(-1, n).T, b.reshape(-1, n)
        else:
            x, y = a.reshape(n, -1), b.reshape(n, -1).T
        if cost.dtype == x.dtype:
            cost.addmm_(x, y)
        else:
            accumulate(cost, torch.mm(x, y, out=self._buffer(n, self.dtype)))  # in float64

    def _rebuild(self, group: str, perms: Mapping[str, Tensor], hidden: Set[str]) -> Tensor:
        cost = self.cost[group]
        const = self.const[group]
        cost = const.to(self.cost_dtype, copy=True) if cost is None else cost.copy_(const)
        for term in self.terms[group]:
            term.seen = {}
            if not _is_hidden(term, hidden):
                self._add_term(cost, term, perms)
        return cost

    def _add_term(self, cost: Tensor, term: _Term, perms: Mapping[str, Tensor]) -> None:
        """Add ``term``'s whole product (the other groups' current permutations applied)."""
        self._add_product(cost, term, term.a, self._permuted_b(term, perms))
        term.seen = {g: perms[g] for _, g in term.others}

    def _moved(self, term: _Term, perms: Mapping[str, Tensor]) -> list[tuple[int, Tensor, Tensor]]:
        """``(axis, new perm, positions that moved)`` for each neighbour changed since synced."""
        changes = []
        for axis, group in term.others:
            old, new = term.seen[group], perms[group]
            if old is not new:
                changes.append((axis, new, (old != new).nonzero().flatten()))
        return changes

    def _update(self, cost: Tensor, term: _Term, new: Tensor, moved: Tensor) -> None:
        """Low-rank update of ``cost`` for the (single) neighbour moving ``moved`` units."""
        group = term.others[0][1]
        old = term.seen[group]
        a = term.a.index_select(0, moved)
        delta = term.b.index_select(0, new[moved]) - term.b.index_select(0, old[moved])
        self._add_product(cost, term, a, delta)
        term.seen[group] = new

    @staticmethod
    def _updatable(term: _Term, changes: list | None, hidden: Set[str]) -> bool:
        """Whether the cached matrix can take ``term`` without a rebuild: absent (``changes``
        None: it stays absent or is added whole), or present, not to be hidden, and each moved
        neighbour's change small enough for a low-rank update."""
        if changes is None:
            return True
        return not _is_hidden(term, hidden) and all(
            term.q_first and len(moved) <= FULL_REBUILD_FRACTION * len(new)
            for _, new, moved in changes
        )

    def matrix(
        self, group: str, perms: Mapping[str, Tensor], hidden: Set[str] = frozenset()
    ) -> Tensor:
        r""":math:`A_p` (n x n, :attr:`cost_dtype`) for the current permutations of the other
        groups, without the terms that involve a group of ``hidden`` (the forward start's
        partial matrices, :mod:`fedlmc.permutation.coordinate_descent`). The cached matrix is
        updated where it can be: a term it lacks is added whole, a present term gets low-rank
        updates."""
        cost, terms = self.cost[group], self.terms[group]
        changes = {} if cost is None else {id(t): self._moved(t, perms) for t in terms if t.seen}
        if cost is None or not all(self._updatable(t, changes.get(id(t)), hidden) for t in terms):
            cost = self._rebuild(group, perms, hidden)
        else:
            for term in terms:
                if id(term) in changes:
                    for _, new, moved in changes[id(term)]:
                        self._update(cost, term, new, moved)
                elif not _is_hidden(term, hidden):
                    self._add_term(cost, term, perms)
        self.cost[group] = cost
        return cost

    def exact_gain(
        self, group: str, perms: Mapping[str, Tensor], old: Tensor, new: Tensor
    ) -> float:
        r"""Float64 :math:`J(\ldots, \pi_p^{new}, \ldots) - J(\ldots, \pi_p^{old}, \ldots)`.

        Only the ``k`` units whose assignment changed contribute (the others add exact zeros),
        so the sum runs over those slices alone: :math:`\sum_{u: new_u \ne old_u} \langle
        W_a[u], \pi(W_b)[new_u] - \pi(W_b)[old_u] \rangle`, a ``k / n`` share of the tensors.
        """
        changed = (new != old).nonzero().flatten()
        if changed.numel() == 0:
            return 0.0
        to_new, to_old = new.index_select(0, changed), old.index_select(0, changed)
        gain = torch.zeros((), dtype=torch.float64, device=self.device)
        pairs = [(a, b, 0, None) for a, b in self.fixed[group]]
        pairs += [(t.a, t.b, 2 if t.q_first else 0, t) for t in self.terms[group]]
        for a, b, unit_axis, term in pairs:
            b_new, b_old = b.index_select(unit_axis, to_new), b.index_select(unit_axis, to_old)
            if term is not None:  # the other groups' permutations, on the k slices only
                b_new, b_old = (
                    self._permuted_b(term, perms, b_new),
                    self._permuted_b(term, perms, b_old),
                )
            a = a.index_select(unit_axis, changed).double()
            gain += (a * (b_new.double() - b_old.double())).sum()
        return float(gain)
