r"""Weight matching (Git Re-Basin, Ainsworth et al. 2023), the optimised coordinate descent.

Weight matching maximises the matching objective

.. math:: J(\pi) = \sum_{w} \langle W_a,\; \pi(W_b) \rangle

over the parameters ``w`` the spec permutes, by coordinate descent over the groups (Ainsworth et
al., 2023). BatchNorm running statistics (``running_mean``, ``running_var``; see
:func:`fedlmc.permutation.objective.is_scored`) are data statistics, not parameters: they are
permuted along with their units but never enter :math:`J`. Coordinate descent: for group
:math:`p`, with every other permutation fixed, :math:`J` is linear in the permutation matrix
:math:`P_p`, :math:`J = \operatorname{tr}(P_p^\top A_p) + \text{const}` with

.. math::
    A_p = \sum_{(w, \text{axis}) \ni p} W_a^{(p)} \,
          \big(W_b^{(p)}\big|_{\text{other perms}}\big)^\top,

where :math:`W^{(p)}` is ``W`` with the ``p`` axis moved first and the rest flattened. The best
:math:`P_p` is a linear assignment (maximising), solved exactly by
:func:`fedlmc.permutation.assignment.solve_assignment` warm-started from the prices and assignment
of the group's previous solve (the matrix changes little from one sweep to the next).
Groups are visited in a seeded random order, except that the first sweep starts at the
residual stream when the spec has one (:func:`fedlmc.permutation.objective.residual_stream`: a
ViT's embedding dimension; without it a trained depth-4 ViT's planted permutation was missed from
some seeds, the per-block groups locked onto wrong assignments around an identity stream; MLPs
and VGGs have no stream and keep the random order); a new assignment is kept only if it raises
:math:`J` (gains below a relative 1e-5 are recomputed exactly in float64 first); the descent
stops after a sweep without gain (at most ``max_iter`` sweeps). The block-structured groups of
one family (attention heads: :mod:`fedlmc.permutation.blocks`) are one step of the descent:
their matrices are built as above and their joint optimum, one block order for all of them,
is found exactly by :func:`fedlmc.permutation.blocks.solve_block_assignment` (no warm start).

Restarts (:mod:`fedlmc.permutation.restarts`): the descent ends at a local optimum that
depends on the order. On a spec with a residual stream :func:`weight_matching` runs
:data:`fedlmc.permutation.restarts.STREAM_RESTARTS` descents by default and keeps the one with
the highest exact :math:`J`: the first as above (stream first), the others with every sweep in
a seeded random order (the published order). A plain chain (MLP, VGG) keeps one descent.

Cost of one sweep: :math:`A_p` depends only on the permutations of the groups that share a tensor
with ``p`` (its *neighbours*), so a group is re-solved only when a neighbour changed since it was
last solved; terms with no other permuted axis (biases, norm parameters) are summed once; when
a neighbour moved few units, :math:`A_p` gets a low-rank update instead of a rebuild;
consecutive groups of the order that are not neighbours are solved in parallel threads (same
result as one after the other), each while the next one's matrix is built. Cost matrices stay on
the tensors' device, in the products' dtype (float32 for float32 models: half the memory and
traffic of float64, and on the benchmark's 3 x 2,048 and 3 x 4,096 MLPs the same permutations as
float64 matrices); only the assignment runs on the CPU.

The textbook descent, every matrix rebuilt and solved in turn, is
:func:`fedlmc.permutation.reference_matching.reference_weight_matching`: one descent, the same
permutations as ``weight_matching(..., restarts=1)`` on the same inputs (a test checks it), at a
fraction of the speed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch import Tensor

from fedlmc.permutation.accumulate import accumulate
from fedlmc.permutation.assignment import WarmStart, solve_assignment
from fedlmc.permutation.blocks import Blocks, solve_block_assignment
from fedlmc.permutation.objective import (
    Matching,
    assignment_value,
    check_max_iter,
    check_pair,
    is_scored,
    matching_objective,
    residual_stream,
    sweep_order,
)
from fedlmc.permutation.restarts import (
    BOUND_TOLERANCE,
    check_restarts,
    restart_seed,
    upper_bound,
)
from fedlmc.permutation.spec import PermutationSpec, checked_permutations, identity_permutations


def _flat(tensor: Tensor, axis: int) -> Tensor:
    """``tensor`` with ``axis`` moved first and the other axes flattened: shape ``(n, -1)``."""
    return tensor.movedim(axis, 0).reshape(tensor.shape[axis], -1)


# ----------------------------------------------------------------------------- objective


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


class _WeightMatcher:
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

    def _rebuild(self, group: str, perms: Mapping[str, Tensor]) -> Tensor:
        cost = self.cost[group]
        const = self.const[group]
        cost = const.to(self.cost_dtype, copy=True) if cost is None else cost.copy_(const)
        for term in self.terms[group]:
            self._add_product(cost, term, term.a, self._permuted_b(term, perms))
            term.seen = {g: perms[g] for _, g in term.others}
        return cost

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

    def matrix(self, group: str, perms: Mapping[str, Tensor]) -> Tensor:
        r""":math:`A_p` (n x n, :attr:`cost_dtype`) for the current permutations of the other
        groups."""
        cost = self.cost[group]
        changes = (
            {id(t): self._moved(t, perms) for t in self.terms[group]} if cost is not None else {}
        )
        small = cost is not None and all(
            t.q_first and len(moved) <= FULL_REBUILD_FRACTION * len(new)
            for t in self.terms[group]
            for _, new, moved in changes[id(t)]
        )
        if not small:
            cost = self._rebuild(group, perms)
        else:
            for term in self.terms[group]:
                for _, new, moved in changes[id(term)]:
                    self._update(cost, term, new, moved)
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


def _solve_warm(cost: Tensor, warm: WarmStart) -> tuple[Tensor, WarmStart]:
    """Maximising assignment of ``cost`` warm-started from ``warm``; returns the next warm start.

    A float32 matrix is solved as it is (no float64 copy; the solver's sums are float64)."""
    cols, warm = solve_assignment(cost.detach().cpu().numpy(), maximize=True, warm=warm)
    return torch.from_numpy(cols), warm


GAIN_TOLERANCE = 1e-5
"""A gain below this fraction of the group's value is re-checked exactly (float64) before it is
kept, so rounding in the float32 products and matrices can never lower the objective (their
relative error is orders of magnitude below it)."""


Coordinate = tuple[str, ...]
"""The groups one descent step solves together: one group, or a family of block-structured
groups (:meth:`fedlmc.permutation.spec.PermutationSpec.coordinates`)."""


def _independent_runs(
    order: Sequence[Coordinate], neighbours: Mapping[Coordinate, set[Coordinate]], stale
) -> Iterator[list[Coordinate]]:
    """Split ``order`` into runs of consecutive stale coordinates that share no tensor.

    Coordinates that share no tensor have independent cost matrices, so solving a run at once
    gives exactly the sequential result. ``stale(coordinate)`` says whether it needs a solve; it
    is asked only once every earlier neighbour of the coordinate has been settled.
    """
    run: list[Coordinate] = []
    for coordinate in order:
        if any(coordinate in neighbours[c] or c in neighbours[coordinate] for c in run):
            yield run
            run = []
        if stale(coordinate):
            run.append(coordinate)
    if run:
        yield run


def _coordinate_neighbours(
    coordinates: Sequence[Coordinate], neighbours: Mapping[str, set[str]]
) -> tuple[dict[Coordinate, set[str]], dict[Coordinate, set[Coordinate]]]:
    """Per coordinate, the groups outside it that share a tensor with one of its groups (whose
    changes make its matrices stale), and the coordinates those groups belong to."""
    touching = {c: set().union(*(neighbours[g] for g in c)) - set(c) for c in coordinates}
    owner = {group: c for c in coordinates for group in c}
    return touching, {c: {owner[g] for g in touching[c]} for c in coordinates}


def _solve_plain(
    groups: Sequence[str],
    matrix: Callable[[str], Tensor],
    warm: dict[str, WarmStart],
    pool: ThreadPoolExecutor | None,
) -> list[tuple[Tensor, Tensor]]:
    """``(cost, columns)`` of each group: :func:`_solve_warm` of ``matrix(group)``; ``warm``
    gets each group's next warm start.

    With a pool the matrices are built one after the other and each is solved in a thread while
    the next is built (the matrix products use the cores the solver leaves; the groups of a run
    share no tensor, so the result is the sequential one).
    """
    if pool is None or len(groups) < 2:
        solved = []
        for group in groups:
            cost = matrix(group)
            columns, warm[group] = _solve_warm(cost, warm[group])
            solved.append((cost, columns))
        return solved
    costs, futures = [], []
    for group in groups:
        costs.append(matrix(group))
        futures.append(pool.submit(_solve_warm, costs[-1], warm[group]))
    solved = []
    for group, cost, future in zip(groups, costs, futures, strict=True):
        columns, warm[group] = future.result()
        solved.append((cost, columns))
    return solved


def _solve_run(
    run: Sequence[Coordinate],
    matrix: Callable[[str], Tensor],
    warm: dict[str, WarmStart],
    blocks: Mapping[str, Blocks],
    pool: ThreadPoolExecutor | None,
) -> list[list[tuple[str, Tensor, Tensor]]]:
    """Per coordinate of ``run``, ``(group, cost, columns)`` of each of its groups: a plain
    group by :func:`_solve_plain`, a family of block-structured groups by the exact
    :func:`fedlmc.permutation.blocks.solve_block_assignment` of its groups' matrices."""
    plain = [c[0] for c in run if c[0] not in blocks]
    solved = dict(zip(plain, _solve_plain(plain, matrix, warm, pool), strict=True))
    found = []
    for coordinate in run:
        if coordinate[0] in solved:
            found.append([(coordinate[0], *solved[coordinate[0]])])
            continue
        costs = [matrix(group) for group in coordinate]
        columns = solve_block_assignment(costs, blocks[coordinate[0]].size)
        found.append(list(zip(coordinate, costs, columns, strict=True)))
    return found


def weight_matching(
    spec: PermutationSpec,
    sd_a: Mapping[str, Tensor],
    sd_b: Mapping[str, Tensor],
    max_iter: int = 100,
    seed: int = 0,
    *,
    restarts: int | None = None,
    init_perms: Mapping[str, Tensor] | None = None,
    float64_costs: bool = False,
) -> Matching:
    r"""Permutations of ``sd_b``'s units maximising :math:`\sum_w \langle W_a, \pi(W_b)\rangle`.

    ``restarts`` coordinate descents (see the module docstring), the one with the highest
    exact objective kept (the first on ties): descent 0 with ``seed``, its first sweep led by
    the residual stream; descent ``k`` with
    :func:`fedlmc.permutation.restarts.restart_seed` ``(seed, k)`` and every sweep in seeded
    random order; each from ``init_perms`` (omitted groups: identity), independent of the
    others. ``None`` (default): :func:`fedlmc.permutation.restarts.default_restarts`, several
    descents on a spec with a residual stream (a ViT, a ResNet), one on a plain chain (MLP,
    VGG: the descent unchanged). The restarts stop early when a descent reaches
    :func:`fedlmc.permutation.restarts.upper_bound` (no permutation can do better: a planted
    permutation of the same model). Within a descent, consecutive groups of the order that
    share no tensor are solved concurrently (the solver releases the GIL; the result is the
    sequential one).
    ``float64_costs`` holds the cost matrices in float64 instead of the products' dtype (twice
    the memory; small gains are checked in float64 either way). Returns a :class:`Matching`
    whose ``objectives`` are :math:`J` after each sweep of the kept descent (non-decreasing: the
    value at the start plus the gains of the kept assignments) and whose ``descents`` are the
    exact (float64) final :math:`J` of every descent run, in order.
    """
    max_iter = check_max_iter(max_iter)
    if not spec.perm_to_axes:  # nothing to permute (e.g. a derived spec that kept no group)
        check_pair(spec, sd_a, sd_b)
        check_restarts(restarts, spec, sd_a)
        value = matching_objective(spec, sd_a, sd_b, {})
        return Matching({}, [value], [value])
    count = check_restarts(restarts, spec, sd_a)
    matcher = _WeightMatcher(spec, sd_a, sd_b, float64_costs)
    start = identity_permutations(spec, sd_a)
    if init_perms is not None:
        try:
            start.update(checked_permutations(spec, init_perms, matcher.sizes))
        except ValueError as error:
            raise ValueError(f"init_perms: {error}") from None
    start = {g: start[g].to(matcher.device) for g in spec.perm_to_axes}
    bound = upper_bound(spec, sd_a, sd_b) if count > 1 else float("inf")
    best, finals = None, []
    for restart in range(count):
        perms, objectives = _descent(
            spec, sd_a, sd_b, matcher, start, restart_seed(seed, restart), max_iter, restart == 0
        )
        finals.append(matching_objective(spec, sd_a, sd_b, perms))  # exact, to compare
        if best is None or finals[-1] > finals[best[0]]:
            best = (restart, perms, objectives)
        if finals[best[0]] >= bound * (1 - BOUND_TOLERANCE):  # optimal: no restart can beat it
            break
    _, perms, objectives = best
    return Matching({g: p.cpu() for g, p in perms.items()}, objectives, finals)


def _descent(
    spec: PermutationSpec,
    sd_a: Mapping[str, Tensor],
    sd_b: Mapping[str, Tensor],
    matcher: _WeightMatcher,
    start: Mapping[str, Tensor],
    seed: int,
    max_iter: int,
    stream_first: bool = True,
) -> tuple[dict[str, Tensor], list[float]]:
    """One coordinate descent from ``start`` in the order ``seed`` draws, its first sweep led
    by the residual stream when ``stream_first`` (the module docstring); returns the
    permutations and :math:`J` after each sweep. ``matcher``'s cached matrices are dropped
    first, so the descent is the same whatever ran before it."""
    matcher.reset()
    groups = list(spec.perm_to_axes)
    perms = dict(start)
    objective = matching_objective(spec, sd_a, sd_b, perms)
    rng = np.random.default_rng(seed)
    coordinates = spec.coordinates()
    first = residual_stream(spec, sd_a) if stream_first else None  # first in the first sweep
    touching, neighbours = _coordinate_neighbours(coordinates, matcher.neighbours)
    version = dict.fromkeys(groups, 0)  # bumped whenever a group's permutation changes
    solved_at: dict[Coordinate, dict[str, int] | None] = dict.fromkeys(coordinates, None)
    warm = {g: WarmStart(np.zeros(len(p)), perms[g].cpu().numpy()) for g, p in perms.items()}

    def stale(coordinate: Coordinate) -> bool:
        """Whether a neighbour changed since the last solve (else its A_p are unchanged)."""
        seen = {q: version[q] for q in touching[coordinate]}
        if solved_at[coordinate] == seen:
            return False
        solved_at[coordinate] = seen
        return True

    def gain_of(group: str, cost: Tensor, candidate: Tensor) -> float:
        if torch.equal(candidate, perms[group]):
            return 0.0
        old, new = assignment_value(cost, perms[group]), assignment_value(cost, candidate)
        if new - old > GAIN_TOLERANCE * max(abs(old), abs(new)):
            return new - old
        return matcher.exact_gain(group, perms, perms[group], candidate)

    matrix = partial(matcher.matrix, perms=perms)  # A_p for the current permutations
    workers = min(len(groups), os.cpu_count() or 1)
    objectives: list[float] = []
    with ThreadPoolExecutor(workers) if workers > 1 else nullcontext() as pool:
        for sweep in range(max_iter):
            improved = False
            order = sweep_order(coordinates, rng, first if sweep == 0 else None)
            for run in _independent_runs(order, neighbours, stale):
                for solved in _solve_run(run, matrix, warm, spec.blocks, pool):
                    moves = [(g, cost, c.to(matcher.device)) for g, cost, c in solved]
                    gain = sum(gain_of(g, cost, candidate) for g, cost, candidate in moves)
                    if gain > 0:
                        for group, _, candidate in moves:
                            if not torch.equal(candidate, perms[group]):
                                perms[group] = candidate
                                version[group] += 1
                        objective += gain
                        improved = True
            objectives.append(objective)
            if not improved:
                break
    return perms, objectives


# ----------------------------------------------------------------------------- activation matching
