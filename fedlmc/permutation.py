r"""Hidden-unit permutations of networks (the symmetry Git Re-Basin aligns).

A ReLU network computes the same function after its hidden units are reordered, provided every
tensor that touches those units is reordered consistently. A :class:`PermutationSpec` lists, for
each permutation group ``p`` (one set of interchangeable hidden units), the ``(key, axis)`` pairs
of the state dict that carry those units. Applying permutations ``{p: \pi_p}`` means

.. math:: W'[\ldots, i, \ldots] = W[\ldots, \pi_p(i), \ldots]

on every listed axis, i.e. ``W.index_select(axis, perm)``: new unit ``i`` is old unit ``perm[i]``.
For a dense layer ``h = relu(W_1 x + b_1)``, ``y = W_2 h`` this is ``W_1' = P W_1``,
``b_1' = P b_1``, ``W_2' = W_2 P^T`` and ``y`` is unchanged. Input and output axes are never
permuted. Keys without a permuted axis (``num_batches_tracked``, the classifier bias) are copied.

Specs are derived from the built model: each built-in model has a ``permutation_spec()`` method
that walks its own submodules with :func:`unit_axes` / :func:`fan_in_axes`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn

StateDict = dict[str, Tensor]
Axis = tuple[str, int]


@dataclass(frozen=True)
class PermutationSpec:
    """Which state-dict axes each hidden-unit permutation group acts on.

    Attributes:
        perm_to_axes: group -> ``(state_dict key, axis)`` pairs the group permutes.
        axes_to_perm: key -> the group on each axis of that tensor (``None`` = not permuted);
            only keys with at least one permuted axis are listed.
        activation_modules: group -> name (as in ``named_modules()``) of a module whose output
            carries that group's units on dim 1 (used by activation matching).
    """

    perm_to_axes: dict[str, list[Axis]]
    axes_to_perm: dict[str, tuple[str | None, ...]]
    activation_modules: dict[str, str]

    @property
    def groups(self) -> list[str]:
        """Group names in the order they were declared (input to output)."""
        return list(self.perm_to_axes)


def unit_axes(prefix: str, module: nn.Module) -> list[Axis]:
    """Axis 0 of every tensor ``module`` owns directly (weight, bias, running stats, affine).

    These are the axes that carry the module's *output* units for Linear/Conv (weight, bias) and
    the per-unit parameters/buffers of BatchNorm, GroupNorm and LayerNorm. 0-dim buffers such as
    ``num_batches_tracked`` are skipped; modules without tensors (Identity) give nothing.
    """
    return [
        (f"{prefix}.{name}", 0)
        for name, tensor in module.state_dict().items()
        if "." not in name and tensor.ndim > 0
    ]


def fan_in_axes(prefix: str) -> list[Axis]:
    """Axis 1 of the weight of the Linear/Conv at ``prefix``: the axis of its *input* units."""
    return [(f"{prefix}.weight", 1)]


def spec_from_groups(
    perm_to_axes: Mapping[str, Iterable[Axis]],
    activation_modules: Mapping[str, str],
    state_dict: Mapping[str, Tensor],
) -> PermutationSpec:
    """Build a :class:`PermutationSpec`, deriving ``axes_to_perm`` from the tensor ranks.

    Raises ``ValueError`` if a key is missing from ``state_dict``, an axis is out of range, an axis
    is claimed by two groups, or the axes of one group have different sizes.
    """
    groups = {group: list(axes) for group, axes in perm_to_axes.items()}
    axes_to_perm: dict[str, list[str | None]] = {}
    for group, axes in groups.items():
        for key, axis in axes:
            if key not in state_dict:
                raise ValueError(f"spec group {group!r} lists key {key!r} not in the state dict")
            ndim = state_dict[key].ndim
            if not 0 <= axis < ndim:
                raise ValueError(f"spec group {group!r}: axis {axis} of {key!r} (ndim {ndim})")
            slots = axes_to_perm.setdefault(key, [None] * ndim)
            if slots[axis] is not None:
                raise ValueError(f"axis {axis} of {key!r} claimed by {slots[axis]!r} and {group!r}")
            slots[axis] = group
    spec = PermutationSpec(
        perm_to_axes=groups,
        axes_to_perm={key: tuple(slots) for key, slots in axes_to_perm.items()},
        activation_modules=dict(activation_modules),
    )
    perm_sizes(spec, state_dict)  # validates that each group has one size
    return spec


def permutation_spec(model: nn.Module) -> PermutationSpec:
    """The permutation spec of a built-in model (``mlp``, ``vgg11``, ``resnet20``)."""
    builder = getattr(model, "permutation_spec", None)
    if not callable(builder):
        raise ValueError(
            f"model {type(model).__name__!r} has no permutation spec; "
            "allowed: models from fedlmc.models.build_model"
        )
    return builder()


def perm_sizes(spec: PermutationSpec, state_dict: Mapping[str, Tensor]) -> dict[str, int]:
    """Number of units in each group, read from ``state_dict``; ``ValueError`` if inconsistent."""
    sizes: dict[str, int] = {}
    for group, axes in spec.perm_to_axes.items():
        missing = [key for key, _ in axes if key not in state_dict]
        if missing:
            raise ValueError(f"state dict lacks {missing[0]!r} listed by group {group!r}")
        found = {(key, axis): state_dict[key].shape[axis] for key, axis in axes}
        if len(set(found.values())) != 1:
            raise ValueError(f"group {group!r} has axes of different sizes (or none): {found}")
        sizes[group] = next(iter(found.values()))
    return sizes


def identity_permutations(
    spec: PermutationSpec, state_dict: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """``arange(n)`` for every group."""
    return {group: torch.arange(n) for group, n in perm_sizes(spec, state_dict).items()}


def random_permutations(
    spec: PermutationSpec, state_dict: Mapping[str, Tensor], seed: int = 0
) -> dict[str, Tensor]:
    """A uniformly random permutation per group, drawn in group order from a seeded generator."""
    generator = torch.Generator().manual_seed(seed)
    return {
        group: torch.randperm(n, generator=generator)
        for group, n in perm_sizes(spec, state_dict).items()
    }


def invert_permutation(perm: Tensor) -> Tensor:
    """The inverse permutation: ``inv[perm[i]] = i``, so ``perm[inv] = inv[perm] = arange``."""
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(len(perm), dtype=perm.dtype, device=perm.device)
    return inverse


def checked_permutations(
    spec: PermutationSpec, perms: Mapping[str, Tensor], sizes: Mapping[str, int]
) -> dict[str, Tensor]:
    """Validate names, lengths and permutation-ness of ``perms``; return them as int64."""
    unknown = sorted(set(perms) - set(spec.perm_to_axes))
    if unknown:
        raise ValueError(f"unknown permutation group {unknown[0]!r}; allowed: {sorted(sizes)}")
    checked = {}
    for group, perm in perms.items():
        perm = torch.as_tensor(perm).long().flatten()
        if len(perm) != sizes[group]:
            raise ValueError(
                f"permutation for group {group!r} has length {len(perm)}; expected {sizes[group]}"
            )
        expected = torch.arange(len(perm), device=perm.device)
        if not torch.equal(torch.sort(perm).values, expected):
            raise ValueError(f"permutation for group {group!r} is not a permutation of 0..n-1")
        checked[group] = perm
    return checked


def apply_permutation(
    spec: PermutationSpec, perms: Mapping[str, Tensor], state_dict: Mapping[str, Tensor]
) -> StateDict:
    """Permute ``state_dict``: ``index_select(axis, perms[group])`` on every listed axis.

    Groups missing from ``perms`` are left as they are (identity). Returns a new dict; the input
    tensors are not modified (unpermuted tensors are shared). ``ValueError`` on unknown group
    names or on a permutation of the wrong length.
    """
    perms = checked_permutations(spec, perms, perm_sizes(spec, state_dict))
    permuted = dict(state_dict)
    for key, groups in spec.axes_to_perm.items():
        tensor = state_dict[key]
        for axis, group in enumerate(groups):
            if group is not None and group in perms:
                tensor = tensor.index_select(axis, perms[group].to(tensor.device))
        permuted[key] = tensor
    return permuted
