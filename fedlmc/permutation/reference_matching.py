r"""The textbook weight matching of Git Re-Basin (Ainsworth et al. 2023, Algorithm 1), readable.

With every permutation but group :math:`p`'s fixed, the matching objective
:math:`J(\pi) = \sum_w \langle W_a, \pi(W_b) \rangle` is linear in :math:`p`'s permutation
matrix :math:`P_p`: :math:`J = \operatorname{tr}(P_p^\top A_p) + \text{const}` with

.. math::
    A_p = \sum_{(w, \text{axis}) \ni p} W_a^{(p)} \,
          \big(\pi_{\neg p}(W_b)^{(p)}\big)^\top,

:math:`W^{(p)}` being ``W`` with the ``p`` axis first and the other axes flattened, and
:math:`\pi_{\neg p}` every other group's permutation applied. The best :math:`P_p` is the
maximising linear assignment of :math:`A_p`. One sweep visits every group in a random order and
solves its assignment; the descent stops after a sweep in which no group improved :math:`J`.
One departure from the published order, shared with :func:`fedlmc.permutation.weight_matching`:
the first sweep starts at the residual stream when the spec has one
(:func:`fedlmc.permutation.objective.residual_stream`).

A family of block-structured groups (attention heads, :mod:`fedlmc.permutation.blocks`) is
one step, its groups' joint optimum solved exactly. This is the algorithm as the authors'
``weight_matching`` (github.com/samuela/git-re-basin) writes it, on the same
:class:`~fedlmc.permutation.spec.PermutationSpec` and with the two conventions of
:func:`fedlmc.permutation.weight_matching`: BatchNorm running statistics are permuted but not
scored (:func:`fedlmc.permutation.objective.is_scored`), and a group's new
assignment is kept only when it raises :math:`J` (ties keep the current permutation; for a
group on two axes of one tensor, :func:`fedlmc.permutation.objective.self_dependent_groups`,
:math:`J` itself is compared, not its linearisation :math:`A_p`). It rebuilds every
:math:`A_p` from scratch and solves with scipy: the baseline the optimised descent
(:mod:`fedlmc.permutation.coordinate_descent`) is tested and benchmarked against; use
that one for real models. It runs one descent: ``weight_matching``'s restarts (several
descents on a spec with a residual stream, the best kept) are not part of it, so it equals
``weight_matching(..., restarts=1)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from fedlmc.permutation.blocks import solve_block_assignment
from fedlmc.permutation.objective import (
    Matching,
    check_max_iter,
    check_pair,
    check_start,
    is_scored,
    residual_stream,
    self_dependent_groups,
    sweep_order,
)
from fedlmc.permutation.objective import matching_objective as objective
from fedlmc.permutation.spec import PermutationSpec

__all__ = ["reference_weight_matching"]


def _others_applied(
    spec: PermutationSpec, perms: Mapping[str, Tensor], key: str, w_b: Tensor, axis: int
) -> Tensor:
    r""":math:`\pi_{\neg p}(W_b)`: ``w_b`` with every group's permutation but on ``axis``."""
    for other_axis, group in enumerate(spec.axes_to_perm[key]):
        if group is not None and other_axis != axis:
            w_b = w_b.index_select(other_axis, perms[group])
    return w_b


def cost_matrix(
    spec: PermutationSpec,
    group: str,
    sd_a: Mapping[str, Tensor],
    sd_b: Mapping[str, Tensor],
    perms: Mapping[str, Tensor],
    dtype: torch.dtype = torch.float64,
    hidden: Set[str] = frozenset(),
) -> Tensor:
    r""":math:`A_p` of ``group``, summed over its scored ``(key, axis)`` pairs in ``dtype``,
    without the pairs whose tensor carries a group of ``hidden`` on another axis (the forward
    start's partial matrices)."""
    n = len(perms[group])
    cost = torch.zeros(n, n, dtype=dtype)
    for key, axis in spec.perm_to_axes[group]:
        carried = [g for other, g in enumerate(spec.axes_to_perm[key]) if other != axis]
        if not is_scored(key) or any(g in hidden for g in carried):
            continue
        w_a = sd_a[key].movedim(axis, 0).reshape(n, -1).to(dtype)
        w_b = _others_applied(spec, perms, key, sd_b[key], axis)
        cost += w_a @ w_b.movedim(axis, 0).reshape(n, -1).to(dtype).T
    return cost


def reference_weight_matching(
    spec: PermutationSpec,
    sd_a: Mapping[str, Tensor],
    sd_b: Mapping[str, Tensor],
    max_iter: int = 100,
    seed: int = 0,
    *,
    start: str = "identity",
    dtype: torch.dtype = torch.float64,
) -> Matching:
    r"""Permutations of ``sd_b``'s units maximising :math:`J`, by the textbook coordinate descent.

    Groups are visited in the order ``numpy.random.default_rng(seed).permutation`` draws each
    sweep, the first sweep's led by the residual stream if any (:func:`sweep_order`, as
    :func:`fedlmc.permutation.weight_matching` does, so both take the same path); at
    most ``max_iter`` sweeps. ``start``: as :func:`fedlmc.permutation.weight_matching`'s
    (``"identity"``, or ``"forward"``: the forward start); the forward start's pass
    visits the groups in the spec's order, each solved on the pairs whose other groups it
    has already visited, and takes each optimum as it is. ``dtype``: of the cost matrices
    (float64 by default; the benchmark also times float32, what a user porting the published
    code would write). CPU tensors. Returns a :class:`~fedlmc.permutation.objective.Matching`
    whose ``objectives`` are :math:`J` after each sweep.
    """
    max_iter = check_max_iter(max_iter)
    sizes = check_pair(spec, sd_a, sd_b)
    check_start(start)
    perms = {group: torch.arange(n) for group, n in sizes.items()}
    coordinates = spec.coordinates()
    rng = np.random.default_rng(seed)
    stream = residual_stream(spec, sd_a)
    forward = start == "forward"
    quadratic = self_dependent_groups(spec)
    objectives = []
    for sweep in range(max_iter):
        improved = False
        order = sweep_order(coordinates, rng, stream if sweep == 0 and not forward else None)
        unvisited = set(sizes) if sweep == 0 and forward else set()
        for groups in coordinates if unvisited else order:
            unvisited.difference_update(groups)
            costs = [
                cost_matrix(spec, group, sd_a, sd_b, perms, dtype, unvisited) for group in groups
            ]
            best = _best_assignment(spec, groups, costs)
            rows = torch.arange(len(best[0]))
            new = sum(cost[rows, cols].sum() for cost, cols in zip(costs, best, strict=True))
            old = sum(cost[rows, perms[g]].sum() for cost, g in zip(costs, groups, strict=True))
            if quadratic & set(groups):  # A_p is J's linearisation: compare J itself
                trial = {**perms, **dict(zip(groups, best, strict=True))}
                new, old = objective(spec, sd_a, sd_b, trial), objective(spec, sd_a, sd_b, perms)
            if new > old or (sweep == 0 and forward):
                perms.update(zip(groups, best, strict=True))
                improved = True
        objectives.append(objective(spec, sd_a, sd_b, perms))
        if not improved:
            break
    return Matching(perms, objectives)


def _best_assignment(
    spec: PermutationSpec, groups: tuple[str, ...], costs: list[Tensor]
) -> list[Tensor]:
    """The maximising assignment of one group's matrix (scipy), or the joint block-structured
    one of a family's (:func:`fedlmc.permutation.blocks.solve_block_assignment`)."""
    if groups[0] not in spec.blocks:
        return [torch.from_numpy(linear_sum_assignment(costs[0].numpy(), maximize=True)[1])]
    return solve_block_assignment(costs, spec.blocks[groups[0]].size)
