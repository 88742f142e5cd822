r"""Permutation alignment (Git Re-Basin): weight matching, activation matching, MergeMany.

Two networks :math:`\theta_a, \theta_b` of the same architecture are aligned by permuting the hidden
units of :math:`\theta_b` (``perms: group -> LongTensor``, applied with
:func:`fedlmc.permutation.apply_permutation`: new unit ``i`` of ``b`` is old unit ``perm[i]``).

**Weight matching** maximises :math:`J(\pi) = \sum_w \langle W_a, \pi(W_b) \rangle` by coordinate
descent over the groups: :func:`weight_matching`, the optimised descent of
:mod:`fedlmc.permutation.coordinate_descent`, restarted on a spec with a residual stream (the
best objective kept; every alignment here builds on it). The objective and the shared checks:
:mod:`fedlmc.permutation.objective`; the textbook descent:
:mod:`fedlmc.permutation.reference_matching`. Both descents are importable from here.

**Activation matching** matches units by the correlation of their activations over data,
:math:`C_{ij} = \operatorname{corr}(z^a_i, z^b_j)` (conv outputs: every spatial position is a
sample), one assignment per group.

**MergeMany** (N models) repeatedly matches each model to the weighted mean of the other aligned
models until no permutation changes, then averages the aligned models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from fedlmc.averaging import LeaveOneOutMean, average, check_compatible, normalised_weights
from fedlmc.capture import forward_capture
from fedlmc.permutation.blocks import solve_block_assignment
from fedlmc.permutation.coordinate_descent import weight_matching
from fedlmc.permutation.model_spec import permutation_spec
from fedlmc.permutation.objective import (
    STATISTIC_NAMES,
    Matching,
    Perms,
    StateDict,
    assignment_value,
    check_max_iter,
    check_pair,
    check_start,
    is_scored,
    matching_objective,
    scored_keys,
    solve_max_assignment,
)
from fedlmc.permutation.spec import (
    PermutationSpec,
    apply_permutation,
    identity_permutations,
    restrict_spec,
)

__all__ = [
    "ALIGNMENTS",
    "STATISTIC_NAMES",
    "Matching",
    "activation_matching",
    "align_to_reference",
    "is_scored",
    "matching_objective",
    "merge_many",
    "reference_permutations",
    "scored_keys",
    "weight_matching",
]

ALIGNMENTS: tuple[str, ...] = ("weight", "activation")
"""Allowed ``method`` values of :func:`align_to_reference`."""


@dataclass
class _CrossMoments:
    """Running sums for the correlation of two sets of ``C`` channels (float64)."""

    count: int = 0
    sum_a: Tensor | None = None
    sum_b: Tensor | None = None
    sum_aa: Tensor | None = None
    sum_bb: Tensor | None = None
    sum_ab: Tensor | None = None

    def update(self, a: Tensor, b: Tensor) -> None:
        a, b = a.double(), b.double()
        moments = (a.sum(0), b.sum(0), (a * a).sum(0), (b * b).sum(0), a.T @ b)
        if self.sum_a is None:
            self.sum_a, self.sum_b, self.sum_aa, self.sum_bb, self.sum_ab = moments
        else:
            self.sum_a += moments[0]
            self.sum_b += moments[1]
            self.sum_aa += moments[2]
            self.sum_bb += moments[3]
            self.sum_ab += moments[4]
        self.count += a.shape[0]

    def correlation(self, eps: float = 1e-12) -> Tensor:
        r"""Correlations :math:`C_{ij} = \mathrm{cov}(a_i, b_j) / (s_{a_i} s_{b_j} + \epsilon)`
        with :math:`s` the standard deviations."""
        n = self.count
        mean_a, mean_b = self.sum_a / n, self.sum_b / n
        cov = self.sum_ab / n - torch.outer(mean_a, mean_b)
        std_a = (self.sum_aa / n - mean_a**2).clamp_min(0).sqrt()
        std_b = (self.sum_bb / n - mean_b**2).clamp_min(0).sqrt()
        return cov / (torch.outer(std_a, std_b) + eps)


def _channels_last(output: Tensor, dim: int = 1) -> Tensor:
    """``(N, C, *spatial)`` -> ``(N * prod(spatial), C)`` for the units on ``dim`` (1; -1 for
    ``(N, T, C)`` tokens): each position or token is a sample."""
    return output.detach().movedim(dim, -1).reshape(-1, output.shape[dim])


def _capture(model: nn.Module, spec: PermutationSpec, names: Mapping[str, str], store: dict):
    """:func:`fedlmc.capture.forward_capture` of ``model`` (eval mode) whose hooks write the
    output of module ``names[group]`` into ``store[group]``, units last
    (``spec.activation_dims``)."""
    modules = dict(model.named_modules())
    hooks = {}
    for group, name in names.items():
        if name not in modules:
            raise ValueError(f"activation module {name!r} of group {group!r} not in the model")

        def hook(_module, _inputs, output, group=group):
            store[group] = _channels_last(output, spec.activation_dims.get(group, 1))

        hooks[name] = hook
    return forward_capture(model, hooks)


def activation_matching(
    model_a: nn.Module,
    model_b: nn.Module,
    x: Tensor,
    batch_size: int = 512,
    *,
    spec: PermutationSpec | None = None,
    seed: int = 0,
) -> Matching:
    r"""Permutations of ``model_b``'s units maximising the summed activation correlation.

    For each group the outputs of ``spec.activation_modules[group]`` of both models (eval mode, no
    gradient) are collected over ``x`` (channel dim 1, or ``spec.activation_dims[group]``;
    spatial positions and tokens are samples) and :math:`\max_\pi \sum_i C_{i\pi(i)}` is
    solved with a linear assignment; a family of block-structured groups (attention heads) is
    solved jointly (:func:`fedlmc.permutation.blocks.solve_block_assignment`), when each of its
    groups has an activation module. Training mode of the models is restored afterwards.
    ``spec`` defaults to ``permutation_spec(model_a, x[:2])`` (derived for models without a
    hand-written spec). Groups with no activation module (e.g. a
    derived group no once-called module returns) are then matched by :func:`weight_matching` of
    those groups alone, on ``model_b`` already permuted by the activation-matched groups.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if len(x) == 0:
        raise ValueError("activation matching needs at least one input, got an empty x")
    spec = spec if spec is not None else permutation_spec(model_a, x[:2])
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    check_pair(spec, sd_a, sd_b)
    names = _matched_by_activations(spec)
    moments = {group: _CrossMoments() for group in names}
    store_a: dict[str, Tensor] = {}
    store_b: dict[str, Tensor] = {}
    with (
        _capture(model_a, spec, names, store_a) as forward_a,
        _capture(model_b, spec, names, store_b) as forward_b,
    ):
        for start in range(0, len(x), batch_size):
            batch = x[start : start + batch_size]
            forward_a(batch)
            forward_b(batch)
            for group, stats in moments.items():
                stats.update(store_a[group], store_b[group].to(store_a[group].device))
    perms, total = {}, 0.0
    for groups in spec.coordinates():
        if groups[0] not in names:
            continue
        corrs = [moments[group].correlation() for group in groups]
        if groups[0] in spec.blocks:
            found = solve_block_assignment(corrs, spec.blocks[groups[0]].size)
        else:
            found = [solve_max_assignment(corrs[0])]
        for group, corr, perm in zip(groups, corrs, found, strict=True):
            perms[group] = perm
            total += assignment_value(corr, perm.to(corr.device))
    rest = [g for g in spec.perm_to_axes if g not in names]
    if rest:
        partly = apply_permutation(spec, perms, sd_b)
        perms.update(weight_matching(restrict_spec(spec, rest), sd_a, partly, seed=seed))
    return Matching({g: perms[g] for g in spec.perm_to_axes}, [total])


def _matched_by_activations(spec: PermutationSpec) -> dict[str, str]:
    """Group -> activation module of the groups activation matching matches by correlation:
    those with a module, a family of block-structured groups only when each of them has one
    (else the whole family is weight-matched)."""
    names = {g: m for g, m in spec.activation_modules.items() if g in spec.perm_to_axes}
    whole = [c for c in spec.coordinates() if all(g in names for g in c)]
    return {g: names[g] for c in whole for g in c}


# ----------------------------------------------------------------------------- N models


def align_to_reference(
    spec: PermutationSpec,
    state_dicts: Sequence[Mapping[str, Tensor]],
    reference: int = 0,
    method: str = "weight",
    models: Sequence[nn.Module] | None = None,
    x: Tensor | None = None,
    max_iter: int = 100,
    seed: int = 0,
    *,
    start: str = "identity",
) -> list[StateDict]:
    """Every state dict permuted to match ``state_dicts[reference]`` (returned unchanged).

    ``method="weight"`` uses :func:`weight_matching` (from ``start``); ``"activation"`` uses
    :func:`activation_matching` on ``models`` (one per state dict, holding those weights) and
    inputs ``x``. The permutations themselves: :func:`reference_permutations`.
    """
    perms = reference_permutations(
        spec, state_dicts, reference, method, models, x, max_iter, seed, start=start
    )
    return [
        dict(sd) if index == reference else apply_permutation(spec, p, sd)
        for index, (p, sd) in enumerate(zip(perms, state_dicts, strict=True))
    ]


def reference_permutations(
    spec: PermutationSpec,
    state_dicts: Sequence[Mapping[str, Tensor]],
    reference: int = 0,
    method: str = "weight",
    models: Sequence[nn.Module] | None = None,
    x: Tensor | None = None,
    max_iter: int = 100,
    seed: int = 0,
    *,
    start: str = "identity",
) -> list[Perms]:
    """The permutations :func:`align_to_reference` applies (same arguments): per state dict,
    the one matching it to ``state_dicts[reference]``, and an empty mapping (the identity) for
    the reference itself. ``start``: :func:`weight_matching`'s; ``"forward"`` only with
    ``method="weight"``."""
    if method not in ALIGNMENTS:
        raise ValueError(f"method must be one of {ALIGNMENTS}, got {method!r}")
    check_start(start)
    if start != "identity" and method != "weight":
        raise ValueError(f"start = {start!r} with method {method!r}: allowed: 'identity'")
    if len(state_dicts) == 0:
        raise ValueError("align_to_reference needs at least one state dict, got none")
    if not 0 <= reference < len(state_dicts):
        raise ValueError(f"reference must be in [0, {len(state_dicts) - 1}], got {reference}")
    check_compatible(state_dicts)
    if method == "activation" and (models is None or x is None):
        raise ValueError("method 'activation' needs models and x; got None")
    if method == "activation" and len(models) != len(state_dicts):
        raise ValueError(f"models has {len(models)} entries, expected {len(state_dicts)}")
    found: list[Perms] = []
    for index, sd in enumerate(state_dicts):
        if index == reference:
            found.append({})
        elif method == "weight":
            matched = weight_matching(spec, state_dicts[reference], sd, max_iter, seed, start=start)
            found.append(dict(matched))
        else:
            matched = activation_matching(models[reference], models[index], x, spec=spec, seed=seed)
            found.append(dict(matched))
    return found


def _same_perms(p: Mapping[str, Tensor], q: Mapping[str, Tensor]) -> bool:
    return all(torch.equal(p[g].cpu(), q[g].cpu()) for g in p)


def merge_many(
    spec: PermutationSpec,
    state_dicts: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float] | None = None,
    max_iter: int = 100,
    seed: int = 0,
) -> tuple[StateDict, list[Perms]]:
    r"""MergeMany: align N models to each other, then average them with ``weights``.

    Starting from identity permutations, each model :math:`i` (seeded random order per pass) is
    weight-matched (every descent, restarts included, starting at its current permutation) to
    :math:`\sum_{j \ne i} w_j \pi_j(\theta_j) / \sum_{j \ne i} w_j` (from one running sum,
    :class:`fedlmc.averaging.LeaveOneOutMean`: a pass averages O(N) models, not O(N^2)); passes
    repeat until no permutation changes (at most ``max_iter``). Returns
    :math:`(\sum_i w_i \pi_i(\theta_i),\ [\pi_1, \dots, \pi_N])`.
    """
    max_iter = check_max_iter(max_iter)
    if len(state_dicts) < 2:
        raise ValueError(f"merge_many needs at least 2 state dicts, got {len(state_dicts)}")
    check_compatible(state_dicts)
    w = normalised_weights(weights, len(state_dicts))
    perms = [identity_permutations(spec, sd) for sd in state_dicts]
    aligned = LeaveOneOutMean(state_dicts, w)
    rng = np.random.default_rng(seed)
    for sweep in range(max_iter):
        changed = False
        for i in rng.permutation(len(state_dicts)):
            target = aligned.mean_without(int(i))
            new = weight_matching(
                spec, target, state_dicts[i], max_iter, seed + sweep, init_perms=perms[i]
            )
            if not _same_perms(new, perms[i]):
                perms[i] = dict(new)
                aligned.replace(int(i), apply_permutation(spec, perms[i], state_dicts[i]))
                changed = True
        if not changed:
            break
    return average(aligned.states, w), [dict(p) for p in perms]
