r"""Block-structured permutation groups: whole blocks move together, units move within a block.

Some symmetries are not any permutation of a group's units. The heads of multi-head attention
are one: the ``H * d`` query/key dimensions of a layer can be reordered only by moving whole
heads (blocks of ``d`` contiguous dimensions) and permuting the dimensions inside each head,
and the value/output dimensions must move their heads *the same way* as the query/key ones
(head :math:`h`'s queries, keys and values stay together). A group declared with
:class:`Blocks` ``(family, size)`` has units in contiguous blocks of ``size``; its permutation,
still one index vector of length ``n = B * size`` (so applying it is unchanged), must be of the
form

.. math:: \pi(b\,s + i) = \sigma(b)\,s + \tau_b(i), \qquad 0 \le b < B,\ 0 \le i < s,

with :math:`\sigma` a permutation of the :math:`B` blocks, shared by every group of the
``family``, and :math:`\tau_b` a permutation of each block's units, one per group and block
(:func:`block_permutation` reads :math:`\sigma` back). Groups of one family must not share a
tensor (their objectives then add up, below).

**Assignment.** Weight and activation matching maximise :math:`\sum_c \sum_u C_c[u, \pi_c(u)]`
over the family's groups :math:`c` (one matrix :math:`C_c` each). For a fixed :math:`\sigma` the
:math:`\tau` of each group and block are independent linear assignments of the
:math:`s \times s` block :math:`C_c[b, \sigma(b)]`, so with

.. math:: V[b, g] = \sum_c \max_\tau \sum_i C_c[b s + i,\; g s + \tau(i)]

the best :math:`\sigma` is the linear assignment maximising :math:`\sum_b V[b, \sigma(b)]`
(:func:`solve_block_assignment`): the exact optimum over the structured permutations, from
:math:`B^2` small assignments per group and one :math:`B \times B` one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor

__all__ = [
    "Blocks",
    "block_permutation",
    "coordinates",
    "random_block_permutation",
    "solve_block_assignment",
]


@dataclass(frozen=True)
class Blocks:
    """A group's block structure: units in contiguous blocks of ``size``, whose order is the
    permutation shared by every group of ``family`` (e.g. one attention layer's heads)."""

    family: str
    size: int


def block_permutation(perm: Tensor, size: int) -> Tensor | None:
    r""":math:`\sigma` of a block-structured ``perm`` (:math:`\pi(b s + i) = \sigma(b) s +
    \tau_b(i)`), or ``None`` when ``perm`` splits a block."""
    if size < 1 or len(perm) % size:
        return None
    blocks = perm.reshape(-1, size).div(size, rounding_mode="floor")
    sigma = blocks[:, 0]
    if not torch.equal(blocks, sigma[:, None].expand_as(blocks)):
        return None
    return sigma


def random_block_permutation(sigma: Tensor, size: int, generator: torch.Generator) -> Tensor:
    r"""The permutation with blocks moved by ``sigma`` and a uniformly random :math:`\tau_b`
    inside each block (drawn block by block from ``generator``)."""
    inner = [torch.randperm(size, generator=generator) for _ in range(len(sigma))]
    return torch.cat([sigma[b] * size + tau for b, tau in enumerate(inner)]).long()


def coordinates(groups: Iterable[str], blocks: Mapping[str, Blocks]) -> list[tuple[str, ...]]:
    """The groups bundled into what one coordinate-descent step solves: each family's groups
    together (at the position of its first group), every other group alone."""
    found: dict[str, list[str]] = {}
    for group in groups:
        key = f"family:{blocks[group].family}" if group in blocks else group
        found.setdefault(key, []).append(group)
    return [tuple(members) for members in found.values()]


def _max_assignment(matrix: np.ndarray) -> tuple[np.ndarray, float]:
    """Columns of the assignment maximising ``sum_i matrix[i, col[i]]``, and that sum."""
    rows, cols = linear_sum_assignment(matrix, maximize=True)
    return cols, float(matrix[rows, cols].sum())


def solve_block_assignment(costs: Sequence[Tensor], size: int) -> list[Tensor]:
    r"""Block-structured permutations, one per matrix of ``costs`` (``n x n``, ``n`` a multiple
    of ``size``), sharing one block permutation :math:`\sigma`, that maximise
    :math:`\sum_c \sum_u C_c[u, \pi_c(u)]` exactly (the module docstring)."""
    arrays = [cost.detach().double().cpu().numpy() for cost in costs]
    n = arrays[0].shape[0]
    if size < 1 or n % size or any(a.shape != (n, n) for a in arrays):
        shapes = [a.shape for a in arrays]
        raise ValueError(
            f"block assignment of size {size} needs n x n matrices, n % size == 0; got {shapes}"
        )
    count = n // size
    value = np.zeros((count, count))
    inner: dict[tuple[int, int, int], np.ndarray] = {}
    for c, array in enumerate(arrays):
        tiles = array.reshape(count, size, count, size)
        for b in range(count):
            for g in range(count):
                inner[c, b, g], score = _max_assignment(tiles[b, :, g, :])
                value[b, g] += score
    sigma, _ = _max_assignment(value)
    return [
        torch.from_numpy(
            np.concatenate([sigma[b] * size + inner[c, b, sigma[b]] for b in range(count)])
        ).long()
        for c in range(len(arrays))
    ]
