r"""The core of hidden-unit permutations: :class:`PermutationSpec`, applying and checking it.

See :mod:`fedlmc.permutation` (the public module, which re-exports everything here) for the
maths. This module imports nothing from the rest of fedlmc but the block structure of
:mod:`fedlmc.permutation.blocks`, so that both the hand-written specs of :mod:`fedlmc.models`
and the graph derivation of :mod:`fedlmc.permutation.tracing` build on it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from fedlmc.permutation.blocks import (
    Blocks,
    block_permutation,
    coordinates,
    random_block_permutation,
)

StateDict = dict[str, Tensor]
Axis = tuple[str, int]


@dataclass(frozen=True)
class PermutationSpec:
    """Which state-dict axes each hidden-unit permutation group acts on.

    :ivar perm_to_axes: group -> ``(state_dict key, axis)`` pairs the group permutes.
    :ivar axes_to_perm: key -> the group on each axis of that tensor (``None`` = not permuted);
        only keys with at least one permuted axis are listed.
    :ivar activation_modules: group -> name (as in ``named_modules()``) of a module whose output
        carries that group's units on dim 1, or on ``activation_dims[group]`` (used by
        activation matching).
    :ivar blocks: group -> its :class:`~fedlmc.permutation.blocks.Blocks` for a block-structured
        group (attention heads: whole blocks move, one block order per family); groups not
        listed take any permutation.
    :ivar activation_dims: group -> the axis of its activation module's output that carries
        the units, where it is not 1 (``-1`` for the features of ``(N, T, D)`` token tensors).
    """

    perm_to_axes: dict[str, list[Axis]]
    axes_to_perm: dict[str, tuple[str | None, ...]]
    activation_modules: dict[str, str]
    blocks: dict[str, Blocks] = field(default_factory=dict)
    activation_dims: dict[str, int] = field(default_factory=dict)

    def coordinates(self) -> list[tuple[str, ...]]:
        """The groups as one matching step solves them: a family of block-structured groups
        together, every other group alone (:func:`fedlmc.permutation.blocks.coordinates`)."""
        return coordinates(self.perm_to_axes, self.blocks)


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
    *,
    blocks: Mapping[str, Blocks] | None = None,
    activation_dims: Mapping[str, int] | None = None,
) -> PermutationSpec:
    """Build a :class:`PermutationSpec`, deriving ``axes_to_perm`` from the tensor ranks.

    Raises ``ValueError`` if a key is missing from ``state_dict``, an axis is out of range, an axis
    is claimed by two groups, the axes of one group have different sizes, or the block
    structure is inconsistent (a block-structured group not of whole blocks, two groups of one
    family with different block counts or sharing a tensor).
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
        blocks=dict(blocks or {}),
        activation_dims=dict(activation_dims or {}),
    )
    _check_blocks(spec, perm_sizes(spec, state_dict))  # perm_sizes: each group has one size
    return spec


def _check_blocks(spec: PermutationSpec, sizes: Mapping[str, int]) -> None:
    """Every block-structured group exists and splits into whole blocks; the groups of one
    family have as many blocks and share no tensor; ``ValueError`` naming the group else."""
    unknown = [g for g in [*spec.blocks, *spec.activation_dims] if g not in spec.perm_to_axes]
    if unknown:
        raise ValueError(f"blocks or activation_dims name group {unknown[0]!r}, not in the spec")
    counts: dict[str, tuple[str, int]] = {}
    keys: dict[str, str] = {}
    for group, block in spec.blocks.items():
        if block.size < 1 or sizes[group] % block.size:
            raise ValueError(
                f"group {group!r} has {sizes[group]} units, not whole blocks of {block.size}"
            )
        first, count = counts.setdefault(block.family, (group, sizes[group] // block.size))
        if count != sizes[group] // block.size:
            raise ValueError(
                f"groups {first!r} and {group!r} of family {block.family!r} have "
                f"{count} and {sizes[group] // block.size} blocks; allowed: the same number"
            )
        for key, _ in spec.perm_to_axes[group]:
            other = keys.setdefault(f"{block.family}/{key}", group)
            if other != group:
                raise ValueError(
                    f"groups {other!r} and {group!r} of family {block.family!r} share tensor "
                    f"{key!r}; allowed: a family's groups on separate tensors"
                )


def restrict_spec(spec: PermutationSpec, groups: Iterable[str]) -> PermutationSpec:
    """The spec of ``groups`` only: the other groups' axes become unpermuted (``None``).

    E.g. to weight-match the groups that have no activation module after activation matching
    the others (apply those permutations first, then match the rest with this spec).
    """
    keep = list(groups)
    unknown = [group for group in keep if group not in spec.perm_to_axes]
    if unknown:
        raise ValueError(
            f"unknown permutation group {unknown[0]!r}; allowed: {sorted(spec.perm_to_axes)}"
        )
    axes_to_perm = {
        key: tuple(group if group in keep else None for group in slots)
        for key, slots in spec.axes_to_perm.items()
    }
    for coordinate in spec.coordinates():
        kept = [group for group in coordinate if group in keep]
        if kept and len(kept) != len(coordinate):
            raise ValueError(
                f"groups {', '.join(map(repr, coordinate))} share one block permutation; "
                f"allowed: all of them or none, got {', '.join(map(repr, kept))}"
            )
    return PermutationSpec(
        perm_to_axes={group: list(spec.perm_to_axes[group]) for group in keep},
        axes_to_perm={key: slots for key, slots in axes_to_perm.items() if any(slots)},
        activation_modules={g: m for g, m in spec.activation_modules.items() if g in keep},
        blocks={g: b for g, b in spec.blocks.items() if g in keep},
        activation_dims={g: d for g, d in spec.activation_dims.items() if g in keep},
    )


def example_args(example_input: Tensor | tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """The forward's positional arguments: ``(x,)`` for a tensor, the tuple itself otherwise."""
    if isinstance(example_input, Tensor):
        return (example_input,)
    if isinstance(example_input, tuple | list) and example_input:
        return tuple(example_input)
    raise ValueError(
        f"example_input must be a tensor or a non-empty tuple of forward arguments, "
        f"got {type(example_input).__name__}"
    )


@contextmanager
def in_eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put every submodule in eval mode; restore each module's own mode afterwards."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training


CHECK_RTOL = 1e-4
CHECK_ATOL = 1e-5
"""Tolerances of :func:`check_spec` (atol is scaled by the outputs' largest magnitude if > 1)."""


def _output_tensors(output: Any) -> list[Tensor]:
    if isinstance(output, Tensor):
        return [output]
    if isinstance(output, Mapping):
        output = list(output.values())
    if isinstance(output, tuple | list):
        return [t for item in output for t in _output_tensors(item)]
    return []


def _max_difference(reference: list[Tensor], outputs: list[Tensor]) -> float | None:
    """Largest elementwise difference if outside tolerance, else None."""
    worst = None
    for ref, out in zip(reference, outputs, strict=True):
        scale = max(1.0, float(ref.abs().max())) if ref.numel() else 1.0
        if not torch.allclose(out, ref, rtol=CHECK_RTOL, atol=CHECK_ATOL * scale):
            diff = float((out - ref).abs().max())
            worst = diff if worst is None else max(worst, diff)
    return worst


def _non_identity_permutations(
    spec: PermutationSpec, state_dict: Mapping[str, Tensor], seed: int
) -> dict[str, Tensor]:
    """Seeded random permutations, each moved off the identity (a cyclic shift) if it is one:
    a block-structured group's units shifted inside each block (the block order, shared by its
    family, is kept)."""
    perms = random_permutations(spec, state_dict, seed)
    for group, perm in perms.items():
        if len(perm) > 1 and torch.equal(perm, torch.arange(len(perm))):
            size = spec.blocks[group].size if group in spec.blocks else len(perm)
            perms[group] = perm.reshape(-1, size).roll(1, dims=1).flatten()
    return perms


def check_spec(
    model: nn.Module,
    spec: PermutationSpec,
    example_input: Tensor | tuple[Tensor, ...],
    *,
    seed: int = 0,
) -> None:
    """Check that ``spec`` is a symmetry of ``model``: permuting its units keeps the outputs.

    One seeded random (non-identity) permutation per group is applied to the state dict with
    :func:`apply_permutation`; the model's outputs on ``example_input`` (eval mode, no grad)
    must equal the original ones to ``rtol=1e-4``, ``atol=1e-5`` (times the outputs' largest
    magnitude if above 1). On failure each group (each family of block-structured groups) is
    tried alone and the ``ValueError`` names the groups that change the outputs on their own.
    """
    from torch.func import functional_call

    args = example_args(example_input)
    state = model.state_dict()
    perms = _non_identity_permutations(spec, state, seed)

    def outputs(perm_subset: Mapping[str, Tensor]) -> list[Tensor]:
        return _output_tensors(
            functional_call(
                model, apply_permutation(spec, perm_subset, state), args, tie_weights=False
            )
        )

    with in_eval_mode(model), torch.no_grad():
        reference = _output_tensors(model(*args))
        if _max_difference(reference, outputs(perms)) is None:
            return
        broken = {}
        for coordinate in spec.coordinates():
            diff = _max_difference(reference, outputs({g: perms[g] for g in coordinate}))
            if diff is not None:
                broken[coordinate[0]] = diff
    if not broken:
        raise ValueError(
            f"permuting all {len(perms)} groups together changes the outputs of "
            f"{type(model).__name__}, although each group alone does not"
        )
    group, diff = next(iter(broken.items()))
    axes = ", ".join(f"{key}[{axis}]" for key, axis in spec.perm_to_axes[group][:4])
    others = f" (also {', '.join(map(repr, list(broken)[1:4]))})" if len(broken) > 1 else ""
    raise ValueError(
        f"permuting group {group!r} (axes {axes}...) changes the outputs of "
        f"{type(model).__name__} by up to {diff:.3g}{others}: the spec is not a symmetry"
    )


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
    """A uniformly random permutation per group, drawn in group order from a seeded generator;
    a block-structured group's uniformly among its structured ones (its family's block order
    drawn at the family's first group)."""
    generator = torch.Generator().manual_seed(seed)
    orders: dict[str, Tensor] = {}
    perms = {}
    for group, n in perm_sizes(spec, state_dict).items():
        block = spec.blocks.get(group)
        if block is None:
            perms[group] = torch.randperm(n, generator=generator)
            continue
        if block.family not in orders:
            orders[block.family] = torch.randperm(n // block.size, generator=generator)
        perms[group] = random_block_permutation(orders[block.family], block.size, generator)
    return perms


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
    _check_block_orders(spec, checked, sizes)
    return checked


def _check_block_orders(
    spec: PermutationSpec, perms: Mapping[str, Tensor], sizes: Mapping[str, int]
) -> None:
    """Each block-structured permutation moves whole blocks, and the groups of one family move
    them alike (a group left out counts as the identity); ``ValueError`` naming the group."""
    orders: dict[str, tuple[str, Tensor]] = {}
    for group, block in spec.blocks.items():
        perm = perms.get(group)
        if perm is None:
            order = torch.arange(sizes[group] // block.size)
        else:
            order = block_permutation(perm.cpu(), block.size)
            if order is None:
                raise ValueError(
                    f"permutation for group {group!r} splits a block of {block.size} units; "
                    "allowed: whole blocks moved, units permuted inside a block"
                )
        first, seen = orders.setdefault(block.family, (group, order))
        if not torch.equal(seen, order):
            raise ValueError(
                f"permutations for groups {first!r} and {group!r} move the blocks of family "
                f"{block.family!r} differently; allowed: one block order per family"
            )


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
