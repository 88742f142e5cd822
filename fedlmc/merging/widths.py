r"""Merging clients of different widths into one server-width model.

Client :math:`i` trains the architecture at its own width: group :math:`p` has :math:`k_{ip}`
hidden units; the server model (the merge's ``template``) has :math:`K_p \ge \max_i k_{ip}`.
Every method first embeds each client into the server's shapes at slots :math:`s_i`
(:func:`fedlmc.permutation.embed.embed_state`: the embedded client :math:`E_{s_i}(\theta_i)`
computes exactly client :math:`i`'s function, zero elsewhere), then combines the embedded
clients. The three rules (registered in :mod:`fedlmc.merging.method_registry`):

- **embed_average**: slots :math:`s_i = 0..k_{ip}-1` (the first units, HeteroFL's nesting) and
  the plain weighted average :math:`\bar\theta = \sum_i w_i E_{s_i}(\theta_i)`. An entry held by
  a subset of the clients is shrunk towards zero by the others' weight.
- **embed_weight_matching**: the widest client :math:`r` (most parameters, the first on ties)
  is embedded at the first slots; every other client's units are matched onto its units, one
  *rectangular* assignment per group: :math:`k_{ip}` of the :math:`K_p` reference units, chosen by
  coordinate descent over the groups on

  .. math:: J(s) = \sum_w \langle W_r,\; E_s(W_i) \rangle ,

  the weight-matching objective of :mod:`fedlmc.permutation.matching` between the reference and
  the embedded client. Maximising it over slots is the same problem as maximising it over
  permutations of the *square* embedded client :math:`E_{0..k-1}(\theta_i)` (its :math:`K-k`
  empty units are zero and score zero wherever they go), so the square weight matching is run
  on the embedded client and the slots are where its real units land. Then the plain weighted
  average of the embedded, matched clients.
- **heterofl**: first slots and HeteroFL's aggregation rule (Diao et al., 2021): every entry is
  averaged only over the clients that hold it,

  .. math:: \bar\theta[e] = \frac{\sum_{i:\, e \in H_i} w_i\, E_{s_i}(\theta_i)[e]}
                                 {\sum_{i:\, e \in H_i} w_i},

  with :math:`H_i` the entries client :math:`i` holds (``EmbeddedState.holders``). An entry
  whose holders' weights sum to zero (held by nobody, when the server is wider than every
  client, or only by clients of weight 0) takes the empty-slot value: 0, and 1 for BatchNorm's
  ``running_var`` (:func:`fedlmc.permutation.embed.fill_value`).

Client weights: by samples as every merge (the caller's ``weights``), or by width with
:func:`width_weights`, :math:`w_i \propto` the number of floating-point entries of client
:math:`i`'s state dict (its parameters and BatchNorm statistics), optionally times its samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from fedlmc.permutation.embed import EmbeddedState, embed_state, fill_value
from fedlmc.permutation.spec import PermutationSpec, invert_permutation

StateDict = dict[str, Tensor]

__all__ = [
    "WEIGHTINGS",
    "embed_clients",
    "holder_average",
    "match_to_widest",
    "parameter_count",
    "widest_client",
    "width_weights",
]

WEIGHTINGS = ("samples", "width", "samples_width")
"""Client weightings of :func:`width_weights`."""


def parameter_count(state: Mapping[str, Tensor]) -> int:
    """Number of floating-point entries of ``state`` (parameters and BatchNorm statistics)."""
    return sum(t.numel() for t in state.values() if t.is_floating_point())


def widest_client(states: Sequence[Mapping[str, Tensor]]) -> int:
    """Index of the client with the most floating-point entries (the first one on ties)."""
    counts = [parameter_count(sd) for sd in states]
    return counts.index(max(counts))


def width_weights(
    states: Sequence[Mapping[str, Tensor]],
    samples: Sequence[float] | None = None,
    by: str = "width",
) -> list[float]:
    r"""Unnormalised client weights: ``samples`` (:math:`n_i`), ``width``
    (:math:`P_i`, :func:`parameter_count`) or ``samples_width`` (:math:`n_i P_i`).

    ``ValueError`` on an unknown ``by`` or missing/mismatched ``samples`` where needed."""
    if by not in WEIGHTINGS:
        raise ValueError(f"client weighting {by!r}; allowed: {', '.join(WEIGHTINGS)}")
    counts = [float(parameter_count(sd)) for sd in states]
    if by == "width":
        return counts
    if samples is None or len(samples) != len(states):
        got = "none" if samples is None else f"{len(samples)}"
        raise ValueError(f"client weighting {by!r} needs one sample count per client, got {got}")
    if by == "samples":
        return [float(n) for n in samples]
    return [float(n) * p for n, p in zip(samples, counts, strict=True)]


def embed_clients(
    template: nn.Module,
    states: Sequence[Mapping[str, Tensor]],
    spec: PermutationSpec,
    slots: str = "first",
    *,
    seed: int = 0,
) -> list[EmbeddedState]:
    """Every client embedded into ``template``'s shapes at ``slots`` (``"first"`` or
    ``"random"``, client ``i`` seeded by ``seed + i``); ``ValueError`` naming the client."""
    embedded = []
    for index, sd in enumerate(states):
        try:
            embedded.append(embed_state(sd, template, slots, spec=spec, seed=seed + index))
        except ValueError as error:
            raise ValueError(f"client {index}: {error}") from None
    return embedded


def match_to_widest(
    template: nn.Module,
    states: Sequence[Mapping[str, Tensor]],
    spec: PermutationSpec,
    *,
    reference: int | None = None,
    seed: int = 0,
    max_iter: int = 100,
) -> tuple[list[EmbeddedState], list[float]]:
    r"""Every client embedded at the slots that weight-match it onto the reference client
    (default :func:`widest_client`, itself embedded at the first slots); see the module docstring.

    Returns the embedded clients (``slots`` attached) and per client the matching objective
    :math:`J` after the descent (the reference's own :math:`\langle W_r, W_r\rangle`)."""
    from fedlmc.permutation.matching import matching_objective, weight_matching

    first = embed_clients(template, states, spec, "first")
    ref = widest_client(states) if reference is None else reference
    matched, objectives = [], []
    for index, (sd, start) in enumerate(zip(states, first, strict=True)):
        if index == ref:
            matched.append(start)
            objectives.append(matching_objective(spec, first[ref], start))
            continue
        found = weight_matching(spec, first[ref], dict(start), max_iter=max_iter, seed=seed)
        # new unit i is old unit perm[i]; narrow unit j sat at old slot j, so it is now at
        # inverse[j]
        slots = {g: invert_permutation(p)[: len(start.slots[g])] for g, p in found.items()}
        matched.append(embed_state(sd, template, slots, spec=spec))
        objectives.append(found.objectives[-1])
    return matched, objectives


def holder_average(
    spec: PermutationSpec | None,
    states: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
) -> StateDict:
    r"""HeteroFL's rule: every entry averaged over the clients holding it (module docstring).

    ``states`` are :class:`~fedlmc.permutation.embed.EmbeddedState` (a plain dict holds every
    entry). Float tensors are accumulated in float64 and cast back; integer tensors
    (``num_batches_tracked``) take the maximum. ``spec`` is unused (the registry's ``combine``
    signature)."""
    from fedlmc.averaging import check_compatible, normalised_weights

    check_compatible(states)
    w = normalised_weights(weights, len(states))
    merged: StateDict = {}
    for key, ref in states[0].items():
        if not ref.is_floating_point():
            merged[key] = torch.stack([sd[key] for sd in states]).amax(0)
            continue
        total = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        mass = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        for wi, sd in zip(w, states, strict=True):
            held = _held(sd, key).to(ref.device, torch.float64)
            total += wi * held * sd[key].detach().to(ref.device, torch.float64)
            mass += wi * held
        value = torch.where(mass > 0, total / mass.clamp_min(1e-300), fill_value(key))
        merged[key] = value.to(ref.dtype)
    return merged


def _held(state: Mapping[str, Tensor], key: str) -> Tensor:
    holders = getattr(state, "holders", None)
    if holders is None:
        return torch.ones(state[key].shape, dtype=torch.bool)
    return holders[key]
