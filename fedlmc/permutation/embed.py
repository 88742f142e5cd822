r"""Embedding a narrow model into a wider one of the same architecture, and slicing it back.

Two models of one architecture at different widths share their permutation spec's groups and
keys; only the sizes of the hidden axes differ. A group :math:`p` has :math:`k_p` units in the
narrow model and :math:`K_p \ge k_p` in the wide one. *Slots* :math:`s_p` are :math:`k_p`
distinct indices into :math:`0..K_p-1`: narrow unit :math:`j` goes to wide unit :math:`s_p(j)`.
The embedding :math:`E_s(\theta)` writes every tensor of :math:`\theta` into a tensor of the wide
shape at those slots, on every axis the spec lists at once (a unit's producing weights and bias,
its norm parameters and running statistics, and every consuming layer's input axis),

.. math:: E_s(\theta)[\ldots, s_p(j), \ldots] = \theta[\ldots, j, \ldots],

and fills the other entries with zero (BatchNorm ``running_var`` with one). An empty slot then
has zero producing weights and bias, so its pre-activation is 0; with BatchNorm its weight and
bias are 0, so its output is 0 whatever the (unit) statistics; and every consumer reads it
through zero input weights. The embedded model computes *exactly* the narrow model's function
(to float32 rounding: the wide sums add exact zeros in another order).

This fails for norms that normalise *across* hidden units: LayerNorm and GroupNorm (``ln``,
``GroupNorm(1, C)`` on convs) compute a mean and variance over the units, and extra zero units
change both, for every input. :func:`embed_state` refuses such models with a one-line error
(:func:`embedding_obstacle`) instead of returning an inexact embedding. BatchNorm, InstanceNorm
and no norm are per unit and embed exactly.

Slots: ``"first"`` (:math:`s_p = 0..k_p-1`, HeteroFL's nested sub-models), ``"random"`` (a seeded
draw of :math:`k_p` of the :math:`K_p` units, in random order) or given explicitly (a mapping
group -> indices, e.g. found by matching, :mod:`fedlmc.merging.widths`). :func:`slice_state` is
the inverse, :math:`S_s(E_s(\theta)) = \theta` exactly; slicing one shared wide initialisation at
the first slots gives HeteroFL's nested sub-model initialisations.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from fedlmc.permutation.model_spec import permutation_spec
from fedlmc.permutation.spec import PermutationSpec, perm_sizes

if TYPE_CHECKING:
    from typing import TypeAlias

    Slots: TypeAlias = str | Mapping[str, Tensor]

StateDict = dict[str, Tensor]

__all__ = [
    "SLOT_CHOICES",
    "EmbeddedState",
    "check_embedding",
    "embed_state",
    "embedding_obstacle",
    "fill_value",
    "resolve_slots",
    "slice_state",
    "widened_groups",
]

SLOT_CHOICES = ("first", "random")
"""Named slot choices; otherwise slots are a mapping group -> indices."""

UNIT_MIXING_NORMS: tuple[type[nn.Module], ...] = tuple(
    getattr(nn, name)
    for name in ("LayerNorm", "GroupNorm", "LocalResponseNorm", "RMSNorm")
    if hasattr(nn, name)
)
"""Norms whose statistics run over the hidden units, so zero units change them (not embeddable)."""


class EmbeddedState(dict):
    """A state dict of the wide shape (a plain ``dict`` to everything else) that remembers which
    entries the embedded client holds.

    ``holders``: key -> bool tensor of the key's shape, ``True`` where the entry came from the
    client (every entry of a key without a hidden axis). ``slots``: group -> the client's slots.
    The HeteroFL combination (:func:`fedlmc.merging.widths.holder_average`) reads ``holders``;
    ``dict(state)`` drops them (the copy then counts as holding every entry).
    """

    def __init__(
        self,
        state: Mapping[str, Tensor],
        holders: Mapping[str, Tensor],
        slots: Mapping[str, Tensor],
    ) -> None:
        super().__init__(state)
        self.holders: dict[str, Tensor] = dict(holders)
        self.slots: dict[str, Tensor] = dict(slots)


def fill_value(key: str) -> float:
    """What an empty slot holds: 1 for BatchNorm's ``running_var`` (a unit variance), else 0."""
    return 1.0 if key.rsplit(".", 1)[-1] == "running_var" else 0.0


def _model_label(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    if isinstance(config, Mapping) and "name" in config:
        norm = f", norm {config['norm']!r}" if "norm" in config else ""
        return f"model {config['name']!r}{norm}"
    return f"model {type(model).__name__}"


def embedding_obstacle(model: nn.Module) -> str | None:
    """Why ``model`` cannot be embedded exactly into a wider copy (``None``: it can).

    The obstacle is a module that normalises across the hidden units (:data:`UNIT_MIXING_NORMS`:
    LayerNorm, GroupNorm, LocalResponseNorm, RMSNorm). Ops that mix units without parameters
    (e.g. a mean over channels inside ``forward``) cannot be seen here; :func:`check_embedding`
    verifies a model numerically.
    """
    for name, module in model.named_modules():
        if isinstance(module, UNIT_MIXING_NORMS):
            return (
                f"cannot embed {_model_label(model)} exactly into a wider model: "
                f"{type(module).__name__} {name!r} normalises over the hidden units, so the "
                "empty (zero) units change its mean and variance; allowed: models whose hidden "
                "units are normalised per unit (norm 'bn' or 'none')"
            )
    return None


def widened_groups(sizes: Mapping[str, int], wide_sizes: Mapping[str, int]) -> list[str]:
    """The groups with fewer units in ``sizes`` than in ``wide_sizes``."""
    return [group for group, k in sizes.items() if k < wide_sizes[group]]


def _check_shapes(
    spec: PermutationSpec, narrow: Mapping[str, Tensor], wide: Mapping[str, Tensor]
) -> tuple[dict[str, int], dict[str, int]]:
    """Same keys; every non-hidden axis of equal size; no group wider in ``narrow``. Returns the
    group sizes ``(narrow, wide)``."""
    extra = sorted(set(narrow) ^ set(wide))
    if extra:
        side = "the narrow" if extra[0] in narrow else "the wide"
        raise ValueError(f"cannot embed: key {extra[0]!r} is only in {side} state dict")
    for key, tensor in narrow.items():
        groups = spec.axes_to_perm.get(key, (None,) * tensor.ndim)
        if tensor.ndim != wide[key].ndim:
            raise ValueError(
                f"cannot embed: parameter {key!r} has {tensor.ndim} axes in the narrow state "
                f"dict, {wide[key].ndim} in the wide one"
            )
        for axis, group in enumerate(groups):
            if group is None and tensor.shape[axis] != wide[key].shape[axis]:
                raise ValueError(
                    f"cannot embed: parameter {key!r} axis {axis} is not a hidden axis and has "
                    f"size {tensor.shape[axis]} in the narrow model, {wide[key].shape[axis]} in "
                    "the wide one; allowed: equal sizes (same inputs and classes)"
                )
    sizes, wide_sizes = perm_sizes(spec, narrow), perm_sizes(spec, wide)
    for group, k in sizes.items():
        if k > wide_sizes[group]:
            raise ValueError(
                f"cannot embed: group {group!r} has {k} units, more than the wide model's "
                f"{wide_sizes[group]}; allowed: a wide model at least as wide as every client"
            )
    return sizes, wide_sizes


def resolve_slots(
    spec: PermutationSpec,
    sizes: Mapping[str, int],
    wide_sizes: Mapping[str, int],
    slots: Slots = "first",
    *,
    seed: int = 0,
) -> dict[str, Tensor]:
    """Slots per group: ``k`` distinct int64 indices into ``0..K-1`` (see the module docstring).

    ``"first"``: ``arange(k)``; ``"random"``: the first ``k`` of a seeded ``randperm(K)``, drawn
    in group order from one generator; a mapping: checked (every group, length ``k``, distinct,
    in range). ``ValueError`` naming the bad group or choice.
    """
    if isinstance(slots, str):
        if slots == "first":
            return {group: torch.arange(k) for group, k in sizes.items()}
        if slots == "random":
            generator = torch.Generator().manual_seed(int(seed))
            return {
                group: torch.randperm(wide_sizes[group], generator=generator)[:k]
                for group, k in sizes.items()
            }
        raise ValueError(
            f"slots {slots!r}; allowed: {', '.join(SLOT_CHOICES)} or a mapping group -> indices"
        )
    unknown = sorted(set(slots) - set(sizes))
    missing = sorted(set(sizes) - set(slots))
    if unknown or missing:
        bad = f"unknown group {unknown[0]!r}" if unknown else f"no slots for group {missing[0]!r}"
        raise ValueError(f"slots: {bad}; allowed groups: {', '.join(sizes)}")
    checked = {}
    for group, k in sizes.items():
        found = torch.as_tensor(slots[group]).long().flatten().cpu()
        K = wide_sizes[group]
        ok = len(found) == k and len(set(found.tolist())) == k
        if not ok or (k and not (0 <= int(found.min()) and int(found.max()) < K)):
            raise ValueError(
                f"slots of group {group!r}: allowed: {k} distinct indices in 0..{K - 1}, got "
                f"{found.tolist()[:8]}{'...' if len(found) > 8 else ''}"
            )
        checked[group] = found
    return checked


def _scatter(
    tensor: Tensor, groups: tuple[str | None, ...], slots: Mapping[str, Tensor], shape: torch.Size
) -> Tensor:
    """``tensor`` written into zeros of ``shape`` at ``slots`` on every grouped axis."""
    out = tensor
    for axis, group in enumerate(groups):
        if group is None:
            continue
        grown = list(out.shape)
        grown[axis] = shape[axis]
        out = out.new_zeros(grown).index_copy_(axis, slots[group].to(out.device), out)
    return out


def _gather(tensor: Tensor, groups: tuple[str | None, ...], slots: Mapping[str, Tensor]) -> Tensor:
    out = tensor
    for axis, group in enumerate(groups):
        if group is not None:
            out = out.index_select(axis, slots[group].to(out.device))
    return out


def embed_state(
    state: Mapping[str, Tensor],
    wide: nn.Module,
    slots: Slots = "first",
    *,
    spec: PermutationSpec | None = None,
    seed: int = 0,
) -> EmbeddedState:
    """``state`` (a narrow model) embedded into the architecture of ``wide`` at ``slots``.

    ``wide`` gives the shapes (its values are not used), the exactness check and, by default, the
    spec (:func:`fedlmc.permutation.permutation_spec`; pass ``spec`` for models that need an
    example input). Returns an :class:`EmbeddedState` (holders and slots attached).
    ``ValueError`` when a key or a non-hidden axis differs, a group is wider than ``wide``'s, the
    slots are bad, or the model cannot be embedded exactly (:func:`embedding_obstacle`, or a
    block-structured group widens: attention heads; only when some group actually widens).
    """
    spec = permutation_spec(wide) if spec is None else spec
    target = wide.state_dict()
    sizes, wide_sizes = _check_shapes(spec, state, target)
    widened = widened_groups(sizes, wide_sizes)
    if widened:
        obstacle = embedding_obstacle(wide)
        if obstacle is not None:
            raise ValueError(obstacle)
    blocked = [group for group in widened if group in spec.blocks]
    if blocked:
        raise ValueError(
            f"cannot embed {_model_label(wide)} into a wider model: group {blocked[0]!r} is "
            "block-structured (attention heads), and slots of single units split its blocks; "
            "allowed: models without block-structured groups"
        )
    chosen = resolve_slots(spec, sizes, wide_sizes, slots, seed=seed)
    embedded, holders = {}, {}
    for key, tensor in state.items():
        groups = spec.axes_to_perm.get(key)
        if groups is None:
            embedded[key] = tensor
            holders[key] = torch.ones(tensor.shape, dtype=torch.bool, device=tensor.device)
            continue
        shape = target[key].shape
        held = _scatter(torch.ones_like(tensor, dtype=torch.bool), groups, chosen, shape)
        values = _scatter(tensor, groups, chosen, shape)
        fill = fill_value(key)
        if fill != 0.0:
            values = torch.where(held, values, torch.full_like(values, fill))
        embedded[key], holders[key] = values, held
    return EmbeddedState(embedded, holders, chosen)


def slice_state(
    state: Mapping[str, Tensor],
    narrow: nn.Module,
    slots: Slots = "first",
    *,
    spec: PermutationSpec | None = None,
    seed: int = 0,
) -> StateDict:
    """The narrow state dict at ``slots`` of the wide ``state``, shaped like ``narrow``'s.

    The inverse of :func:`embed_state` at the same slots: ``slice_state(embed_state(sd, wide, s),
    narrow, s) == sd`` exactly. With ``slots = "first"`` it gives HeteroFL's nested sub-model of
    a shared wide initialisation. ``spec`` defaults to ``narrow``'s. ``ValueError`` as for
    :func:`embed_state` (no exactness check: slicing keeps no function).
    """
    spec = permutation_spec(narrow) if spec is None else spec
    target = narrow.state_dict()
    sizes, wide_sizes = _check_shapes(spec, target, state)
    chosen = resolve_slots(spec, sizes, wide_sizes, slots, seed=seed)
    sliced = {}
    for key, tensor in state.items():
        groups = spec.axes_to_perm.get(key)
        sliced[key] = tensor if groups is None else _gather(tensor, groups, chosen).contiguous()
    return sliced


def check_embedding(
    narrow: nn.Module,
    wide: nn.Module,
    example_input: Tensor | tuple[Tensor, ...],
    slots: Slots = "first",
    *,
    spec: PermutationSpec | None = None,
    seed: int = 0,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> float:
    """Embed ``narrow``'s weights into ``wide``'s architecture and compare the outputs (eval
    mode) on ``example_input``; returns the largest difference, ``ValueError`` if it exceeds
    ``atol + rtol * |reference|``. For models whose exactness :func:`embedding_obstacle` cannot
    see (ops that mix hidden units inside ``forward``)."""
    from torch.func import functional_call

    from fedlmc.permutation.spec import example_args, in_eval_mode

    args = example_args(example_input)
    embedded = embed_state(narrow.state_dict(), wide, slots, spec=spec, seed=seed)
    with in_eval_mode(narrow), in_eval_mode(wide), torch.no_grad():
        reference = narrow(*args)
        output = functional_call(wide, dict(embedded), args, tie_weights=False)
    diff = float((output - reference).abs().max()) if reference.numel() else 0.0
    if not torch.allclose(output, reference, atol=atol, rtol=rtol):
        raise ValueError(
            f"embedding {_model_label(narrow)} into the wider model changes its outputs by up to "
            f"{diff:.3g}: not exactly embeddable"
        )
    return diff
