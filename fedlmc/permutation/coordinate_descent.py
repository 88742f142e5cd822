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
:math:`J` (gains below a relative 1e-5 are recomputed exactly in float64 first; a group on
two axes of one tensor, whose :math:`A_p` is only :math:`J`'s linearisation, is judged on
:math:`J` itself and re-solved after it moves); the descent
stops after a sweep without gain (at most ``max_iter`` sweeps). The block-structured groups of
one family (attention heads: :mod:`fedlmc.permutation.blocks`) are one step of the descent:
their matrices are built as above and their joint optimum, one block order for all of them,
is found exactly by :func:`fedlmc.permutation.blocks.solve_block_assignment` (no warm start).

Restarts (:mod:`fedlmc.permutation.restarts`): the descent ends at a local optimum that
depends on the order. On a spec with a residual stream :func:`weight_matching` runs
:data:`fedlmc.permutation.restarts.STREAM_RESTARTS` descents by default and keeps the one with
the highest exact :math:`J`: the first as above (stream first), the others with every sweep in
a seeded random order (the published order). A plain chain (MLP, VGG) keeps one descent.

The forward start (``start="forward"``; the merge method ``weight_matching_forward``): the
descent starts from one pass over the groups in the spec's order (inputs first for fedlmc's
models), each group solved on the part of :math:`A_p` that the groups already visited decide,

.. math:: \tilde A_p = \sum_{(w, \text{axis}) \ni p:\ \text{every other group of } w
    \text{ visited}} W_a^{(p)} \big(W_b^{(p)}\big|_{\text{other perms}}\big)^\top,

and its optimum taken as it is: in an MLP the first hidden layer is matched on its incoming
weights (and bias) alone, each next layer on its incoming weights with the previous layer's
permutation applied, the last also on the classifier's weights: OT fusion's layer-wise pass
(Singh and Jaggi, 2020) in weight matching's objective. The descent then runs as above from
there (random order, gains kept). Unvisited groups are left out of :math:`\tilde A_p`, not held
at the identity, whose alignment is arbitrary. The partial matrices are not wasted: a term left
out is added whole when the descent first needs the group's matrix.

Cost of one sweep: :math:`A_p` depends only on the permutations of the groups that share a tensor
with ``p`` (its *neighbours*), so a group is re-solved only when a neighbour changed since it was
last solved; terms with no other permuted axis (biases, norm parameters) are summed once; when
a neighbour moved few units, :math:`A_p` gets a low-rank update instead of a rebuild
(:mod:`fedlmc.permutation.cost_matrices`);
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
from functools import partial

import numpy as np
import torch
from torch import Tensor

from fedlmc.permutation.assignment import WarmStart, solve_assignment
from fedlmc.permutation.blocks import Blocks, solve_block_assignment
from fedlmc.permutation.cost_matrices import CostMatrices
from fedlmc.permutation.objective import (
    Matching,
    assignment_value,
    check_max_iter,
    check_pair,
    check_start,
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
    start: str = "identity",
    float64_costs: bool = False,
) -> Matching:
    r"""Permutations of ``sd_b``'s units maximising :math:`\sum_w \langle W_a, \pi(W_b)\rangle`.

    ``restarts`` coordinate descents (see the module docstring), the one with the highest
    exact objective kept (the first on ties): descent 0 with ``seed``, from ``init_perms``
    (omitted groups: identity) with its first sweep led by the residual stream, or, with
    ``start="forward"``, from the forward start's pass; descent ``k`` with
    :func:`fedlmc.permutation.restarts.restart_seed` ``(seed, k)`` from ``init_perms`` and
    every sweep in seeded random order; each independent of the others. ``None`` (default):
    :func:`fedlmc.permutation.restarts.default_restarts`, several descents on a spec with a
    residual stream (a ViT, a ResNet), one on a plain chain (MLP, VGG). The restarts stop early
    when a descent reaches :func:`fedlmc.permutation.restarts.upper_bound` (no permutation can
    do better: a planted permutation of the same model). Within a descent, consecutive groups
    of the order that share no tensor are solved concurrently (the solver releases the GIL; the
    result is the sequential one).
    ``float64_costs`` holds the cost matrices in float64 instead of the products' dtype (twice
    the memory; small gains are checked in float64 either way). Returns a :class:`Matching`
    whose ``objectives`` are :math:`J` after each sweep of the kept descent (non-decreasing
    from the first sweep on: the value after it plus the gains of the kept assignments; when
    the kept descent is the forward start's, its first value is :math:`J` after the pass)
    and whose ``descents`` are the exact (float64) final :math:`J` of every descent run, in
    order.
    """
    max_iter = check_max_iter(max_iter)
    check_start(start, init_perms)
    if not spec.perm_to_axes:  # nothing to permute (e.g. a derived spec that kept no group)
        check_pair(spec, sd_a, sd_b)
        check_restarts(restarts, spec, sd_a)
        value = matching_objective(spec, sd_a, sd_b, {})
        return Matching({}, [value], [value])
    count = check_restarts(restarts, spec, sd_a)
    matcher = CostMatrices(spec, sd_a, sd_b, float64_costs)
    first = identity_permutations(spec, sd_a)
    if init_perms is not None:
        try:
            first.update(checked_permutations(spec, init_perms, matcher.sizes))
        except ValueError as error:
            raise ValueError(f"init_perms: {error}") from None
    first = {g: first[g].to(matcher.device) for g in spec.perm_to_axes}
    forward = start == "forward"
    bound = upper_bound(spec, sd_a, sd_b) if count > 1 else float("inf")
    best, finals = None, []
    for restart in range(count):
        lead = ("forward" if forward else "stream") if restart == 0 else "random"
        perms, objectives = _descent(
            spec, sd_a, sd_b, matcher, first, restart_seed(seed, restart), max_iter, lead
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
    matcher: CostMatrices,
    start: Mapping[str, Tensor],
    seed: int,
    max_iter: int,
    lead: str = "stream",
) -> tuple[dict[str, Tensor], list[float]]:
    """One coordinate descent from ``start`` in the order ``seed`` draws; its first sweep is
    the forward start's pass (``lead`` ``"forward"``), led by the residual stream
    (``"stream"``) or random (``"random"``; the module docstring). Returns the permutations and
    :math:`J` after each sweep. ``matcher``'s cached matrices are dropped first, so the descent
    is the same whatever ran before it."""
    matcher.reset()
    forward = lead == "forward"
    exact = partial(matching_objective, spec, sd_a, sd_b)
    objective = 0.0 if forward else exact(start)
    rng = np.random.default_rng(seed)
    coordinates = spec.coordinates()
    first = residual_stream(spec, sd_a) if lead == "stream" else None  # first in sweep 0
    workers = min(len(spec.perm_to_axes), os.cpu_count() or 1)
    objectives: list[float] = []
    with ThreadPoolExecutor(workers) if workers > 1 else nullcontext() as pool:
        descent = _Descent(spec, matcher, start, pool, exact)
        if forward:
            descent.unvisited.update(spec.perm_to_axes)
        for sweep in range(max_iter):
            order = sweep_order(coordinates, rng, first if sweep == 0 else None)
            if forward and sweep == 0:  # the forward pass: the spec's order, inputs first
                descent.sweep(coordinates, objective)
                objective, improved = exact(descent.perms), True
            else:
                objective, improved = descent.sweep(order, objective)
            objectives.append(objective)
            if not improved:
                break
    return descent.perms, objectives


class _Descent:
    """The state of one coordinate descent between its sweeps: the permutations, which
    coordinates are stale, the solver's warm starts, and the groups the forward pass has not
    visited yet (``unvisited``: left out of the partial matrices, :meth:`CostMatrices.matrix`)."""

    def __init__(
        self,
        spec: PermutationSpec,
        matcher: CostMatrices,
        start: Mapping[str, Tensor],
        pool: ThreadPoolExecutor | None,
        objective: Callable[[Mapping[str, Tensor]], float],
    ):
        self.spec, self.matcher, self.pool, self.objective = spec, matcher, pool, objective
        self.perms = dict(start)
        coordinates = spec.coordinates()
        self.touching, self.neighbours = _coordinate_neighbours(coordinates, matcher.neighbours)
        for coordinate in coordinates:  # a self-dependent group's A_p changes when it moves
            self.touching[coordinate] |= set(coordinate) & matcher.self_dependent
        self.version = dict.fromkeys(self.perms, 0)  # bumped whenever a permutation changes
        self.solved_at: dict[Coordinate, dict[str, int] | None] = dict.fromkeys(coordinates)
        self.warm = {g: WarmStart(np.zeros(len(p)), p.cpu().numpy()) for g, p in start.items()}
        self.unvisited: set[str] = set()

    def stale(self, coordinate: Coordinate) -> bool:
        """Whether a neighbour changed since the last solve (else its A_p are unchanged)."""
        seen = {q: self.version[q] for q in self.touching[coordinate]}
        if self.solved_at[coordinate] == seen:
            return False
        self.solved_at[coordinate] = seen
        return True

    def gain(self, group: str, cost: Tensor, candidate: Tensor) -> float:
        """:math:`J`'s change if ``group`` took ``candidate`` (small ones exact, float64)."""
        current = self.perms[group]
        if torch.equal(candidate, current):
            return 0.0
        old, new = assignment_value(cost, current), assignment_value(cost, candidate)
        if new - old > GAIN_TOLERANCE * max(abs(old), abs(new)):
            return new - old
        return self.matcher.exact_gain(group, self.perms, current, candidate)

    def exact_gain(self, moves: Sequence[tuple[str, Tensor, Tensor]]) -> float:
        """:math:`J`'s change if every group of ``moves`` took its candidate, from :math:`J`
        itself (for self-dependent groups, whose :math:`A_p` is only a linearisation)."""
        trial = {**self.perms, **{group: candidate for group, _, candidate in moves}}
        return self.objective(trial) - self.objective(self.perms)

    def keep(self, moves: Sequence[tuple[str, Tensor, Tensor]]) -> None:
        """Take each ``(group, cost, candidate)``'s candidate."""
        for group, _, candidate in moves:
            if not torch.equal(candidate, self.perms[group]):
                self.perms[group] = candidate
                self.version[group] += 1

    def sweep(self, order: Sequence[Coordinate], objective: float) -> tuple[float, bool]:
        """Solve the stale coordinates of ``order``, keeping each assignment that raises
        :math:`J` (in the forward pass: each partial optimum); returns ``objective`` plus the
        kept gains and whether any was kept."""
        improved = False
        for run in _independent_runs(order, self.neighbours, self.stale):
            hidden = frozenset(self.unvisited.difference(*run))
            matrix = partial(self.matcher.matrix, perms=self.perms, hidden=hidden)
            found = _solve_run(run, matrix, self.warm, self.spec.blocks, self.pool)
            for coordinate, solved in zip(run, found, strict=True):
                moves = [(g, cost, c.to(self.matcher.device)) for g, cost, c in solved]
                if self.unvisited:  # a partial matrix's optimum is taken as the start
                    self.keep(moves)
                    if self.touching[coordinate] & hidden:  # solve it again on its whole A_p
                        self.solved_at[coordinate] = None
                    continue
                if set(coordinate) & self.matcher.self_dependent:  # A_p is a linearisation
                    gain = self.exact_gain(moves)
                else:
                    gain = sum(self.gain(g, cost, candidate) for g, cost, candidate in moves)
                if gain > 0:
                    self.keep(moves)
                    objective += gain
                    improved = True
            self.unvisited.difference_update(*run)
        return objective, improved
