r"""Task-vector merges: Task Arithmetic, TIES-Merging and DARE, relative to the clients' common
starting model :math:`\theta_0` (the server's initialisation when ``init = "shared"``).

Client :math:`i`'s task vector is :math:`\tau_i = \theta_i - \theta_0`, over every
floating-point entry; :math:`w_i` are the clients' normalised weights and :math:`N` their number,
so :math:`N w_i = 1` at equal counts (the papers' unweighted sums).

- **Task Arithmetic** (Ilharco et al., "Editing Models with Task Arithmetic", ICLR 2023):
  :math:`\theta = \theta_0 + \lambda \sum_i N w_i \tau_i` (:func:`task_arithmetic`). The paper
  picks :math:`\lambda` on held-out data; the default (``ta-scaling``, 0.3) is FusionBench's
  (``scaling_factor``). :math:`\lambda = 1/N` is the plain average.
- **TIES-Merging** (Yadav et al., NeurIPS 2023; :func:`ties_merge`): (1) *trim*: keep the
  share :math:`k` (``ties-density``, the paper's 20%) of largest entries of :math:`|\tau_i|`,
  ranked over all its entries together (as their code flattens each task vector), the rest 0;
  (2) *elect*: per entry the sign :math:`\gamma = \mathrm{sgn}(\sum_i N w_i \hat\tau_i)` (the
  sign of the larger total mass); (3) *disjoint merge*: the weighted mean of the trimmed
  entries of that sign, :math:`\tau_m = \sum_{i \in A} w_i \hat\tau_i / \sum_{i \in A} w_i`,
  :math:`A = \{i : \mathrm{sgn}\,\hat\tau_i = \gamma, \hat\tau_i \ne 0\}` (0 when :math:`A` is
  empty); :math:`\theta = \theta_0 + \lambda \tau_m` with the paper's :math:`\lambda = 1`
  (``ties-scaling``).
- **DARE** (Yu et al., "Language Models are Super Mario", ICML 2024; :func:`dare_merge`): each
  entry of :math:`\tau_i` dropped with probability :math:`p` (a Bernoulli mask seeded by the
  merge's seed and the client's index), the survivors rescaled by :math:`1/(1-p)`, then Task
  Arithmetic of the dropped vectors (DARE's usual companion). Default :math:`p = 0.5`
  (``dare-drop``), FusionBench's ``sparsity_ratio`` for DARE with Task Arithmetic (the paper
  shows rates up to 0.9 and 0.99 on fine-tuned language models).

Integer buffers (``num_batches_tracked``) are taken as the plain average takes them (their
maximum). Independently initialised clients have no common :math:`\theta_0`: these merges need
one given (``needs_base``: refused before any work without one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

StateDict = dict[str, Tensor]

__all__ = [
    "dare_merge",
    "task_arithmetic",
    "task_vectors",
    "ties_merge",
    "trimmed",
]


def task_vectors(states: Sequence[Mapping[str, Tensor]], base: Mapping[str, Tensor]):
    r""":math:`\tau_i = \theta_i - \theta_0` per floating-point key (float64); ``ValueError``
    naming a key the base lacks or holds in another shape."""
    vectors = []
    for sd in states:
        tau = {}
        for key, value in sd.items():
            if not value.is_floating_point():
                continue
            if key not in base or tuple(base[key].shape) != tuple(value.shape):
                raise ValueError(f"base model: key {key!r} is missing or has another shape")
            tau[key] = value.double() - base[key].double()
        vectors.append(tau)
    return vectors


def _from_base(
    states: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    base: Mapping[str, Tensor],
    step: Mapping[str, Tensor],
) -> StateDict:
    r""":math:`\theta_0 + \text{step}` in each key's dtype; the other keys as the average."""
    from fedlmc.averaging import average

    merged = average(states, weights)
    for key, delta in step.items():
        merged[key] = (base[key].double() + delta).to(states[0][key].dtype)
    return merged


def _scaled_sum(vectors, weights: Sequence[float], scaling: float) -> dict[str, Tensor]:
    r""":math:`\lambda \sum_i N w_i \tau_i`."""
    n = len(vectors)
    pairs = list(zip(weights, vectors, strict=True))
    return {k: scaling * sum(n * w * tau[k] for w, tau in pairs) for k in vectors[0]}


def task_arithmetic(
    states: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    base: Mapping[str, Tensor],
    scaling: float,
) -> StateDict:
    r""":math:`\theta_0 + \lambda \sum_i N w_i \tau_i` (``weights`` normalised here)."""
    from fedlmc.averaging import normalised_weights

    w = normalised_weights(weights, len(states))
    vectors = task_vectors(states, base)
    return _from_base(states, w, base, _scaled_sum(vectors, w, scaling))


def trimmed(tau: Mapping[str, Tensor], density: float) -> dict[str, Tensor]:
    """``tau`` with all but its ``density`` largest-magnitude entries (ranked over every key
    together; at least one) set to 0; entries tied at the threshold are kept."""
    if not 0 < density <= 1:
        raise ValueError(f"ties density = {density}: allowed: 0 < density <= 1")
    flat = torch.cat([v.abs().reshape(-1) for v in tau.values()])
    keep = max(1, int(round(density * flat.numel())))
    threshold = torch.topk(flat, keep).values[-1]
    return {k: torch.where(v.abs() >= threshold, v, torch.zeros_like(v)) for k, v in tau.items()}


def ties_merge(
    states: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    base: Mapping[str, Tensor],
    density: float,
    scaling: float,
) -> StateDict:
    r"""TIES-Merging: trim, elect the sign, disjoint weighted mean, :math:`\theta_0 + \lambda
    \tau_m` (see the module docstring)."""
    from fedlmc.averaging import normalised_weights

    w = normalised_weights(weights, len(states))
    kept = [trimmed(tau, density) for tau in task_vectors(states, base)]
    step = {}
    for key in kept[0]:
        stacked = torch.stack([tau[key] for tau in kept])
        weight = torch.tensor(w, dtype=torch.float64).reshape(-1, *[1] * (stacked.dim() - 1))
        elected = torch.sign((weight * stacked).sum(dim=0))
        agrees = (torch.sign(stacked) == elected) & (stacked != 0)
        mass = (weight * agrees).sum(dim=0)
        total = (weight * stacked * agrees).sum(dim=0)
        step[key] = scaling * torch.where(mass > 0, total / mass.clamp_min(1e-300), 0.0)
    return _from_base(states, w, base, step)


def dare_merge(
    states: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    base: Mapping[str, Tensor],
    drop: float,
    scaling: float,
    seed: int = 0,
) -> StateDict:
    r"""DARE then Task Arithmetic: each client's :math:`\tau_i` with every entry kept with
    probability :math:`1 - p` (mask seeded by ``(seed, i)``) and rescaled by :math:`1/(1-p)`,
    then :math:`\theta_0 + \lambda \sum_i N w_i \tilde\tau_i`."""
    import numpy as np

    from fedlmc.averaging import normalised_weights

    if not 0 <= drop < 1:
        raise ValueError(f"dare drop = {drop}: allowed: 0 <= drop < 1")
    w = normalised_weights(weights, len(states))
    dropped = []
    for index, tau in enumerate(task_vectors(states, base)):
        entropy = int(np.random.SeedSequence([int(seed), index]).generate_state(1)[0])
        generator = torch.Generator().manual_seed(entropy)
        dropped.append(
            {
                k: v
                * (torch.rand(v.shape, generator=generator, dtype=torch.float64) >= drop)
                / (1.0 - drop)
                for k, v in tau.items()
            }
        )
    return _from_base(states, w, base, _scaled_sum(dropped, w, scaling))
