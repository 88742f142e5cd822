r"""What an alignment did: the permutation groups it aligned and the hidden units it moved.

A merge method that permutes the clients' hidden units before combining them (weight matching,
activation matching, MergeMany, the random-permutation control, the mixed-width matching)
reports, in its row, two numbers computed from the permutations it applied
(:func:`alignment_info`):

- ``aligned_groups`` :math:`= |\mathcal{P}|`, the number of groups :math:`p` of the model's
  permutation spec (each a set of interchangeable hidden units) the alignment searched over;
- ``aligned_units_moved`` :math:`= \sum_i \sum_{p \in \mathcal{P}} |\{j : \pi_{ip}(j) \ne j\}|`,
  with :math:`\pi_{ip}` client :math:`i`'s permutation of group :math:`p` (new unit :math:`j`
  is old unit :math:`\pi_{ip}(j)`; the identity for a reference client); for a client embedded
  into a wider server model at slots :math:`s_{ip}`, its units :math:`j` with
  :math:`s_{ip}(j) \ne j`. A permutation and its inverse move the same units, so the count does
  not depend on the direction.

``aligned_groups = 0`` means the spec has no group (a model whose every hidden layer ends its
group, e.g. ``GroupNorm(4, C)`` after each convolution: see :mod:`fedlmc.permutation.tracing`):
nothing was permuted and the merge is the one the method makes without alignment (the plain
average). :func:`nothing_aligned_lines` turns such rows into the line ``fedlmc run`` prints and
``report.md`` shows. ``aligned_units_moved = 0`` with groups > 0 means every permutation found
was the identity (a model matched with itself).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fedlmc.columns import Column

if TYPE_CHECKING:
    from torch import Tensor

    from fedlmc.permutation.spec import PermutationSpec

__all__ = [
    "ALIGNMENT_COLUMNS",
    "NOTHING_ALIGNED_DOC",
    "alignment_info",
    "nothing_aligned_lines",
    "units_moved",
]

NOTHING_ALIGNED_DOC = "docs/own_model.md#when-alignment-aligns-nothing"
"""Where the docs say what to do when an alignment aligned nothing."""

ALIGNMENT_COLUMNS = (
    Column(
        "aligned_groups",
        "permutation groups the alignment aligned",
        "rows of the methods whose merge permutes hidden units (`auto`: when it kept weight "
        "matching)",
        "the number of groups of the model's permutation spec (each a set of interchangeable "
        "hidden units) the method's permutations act on; 0: the spec has no group, nothing was "
        "permuted and the merge equals the method's merge without alignment (the plain "
        "average); `fedlmc run` and `report.md` flag it",
    ),
    Column(
        "aligned_units_moved",
        "hidden units the alignment moved, summed over clients and groups",
        "rows of the methods whose merge permutes hidden units (`auto`: when it kept weight "
        "matching)",
        "`sum_i sum_p #{j : pi_ip(j) != j}`: over every merged client `i` (the identity for a "
        "reference client, such as client 0 of weight matching; MergeMany permutes every client) "
        "and every group `p`, the positions its permutation `pi_ip` does not fix; for a client "
        "embedded into a wider server model, its units placed at a slot other than their own "
        "index. 0 with `aligned_groups > 0`: every permutation found was the identity",
    ),
)
"""The columns every permuting merge method declares and fills with :func:`alignment_info`."""


def units_moved(perm: Tensor) -> int:
    """Positions ``j`` with ``perm[j] != j`` (a permutation of ``0..n-1``, or a narrow client's
    slots ``0..k-1 -> 0..K-1``)."""
    import torch

    return int((perm != torch.arange(len(perm), device=perm.device)).sum())


def alignment_info(
    spec: PermutationSpec, permutations: Sequence[Mapping[str, Tensor]]
) -> dict[str, int]:
    """``aligned_groups`` and ``aligned_units_moved`` (module docstring) of the clients'
    ``permutations`` (group -> permutation or slots, one mapping per merged client; a group
    missing from a mapping is that client's identity)."""
    moved = sum(units_moved(perm) for perms in permutations for perm in perms.values())
    return {"aligned_groups": len(spec.perm_to_axes), "aligned_units_moved": moved}


def _base(method: str) -> str:
    return method[:-2] if method.endswith("_t") else method


def nothing_aligned_lines(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per method whose rows have ``aligned_groups == 0``: it aligned nothing, its
    merge is the unpermuted one. With a ``cell_id`` per row, the line counts the cells."""
    empty: dict[str, set[Any]] = {}
    cells: dict[str, set[Any]] = {}
    for row in rows:
        groups = row.get("aligned_groups")
        if not isinstance(groups, numbers.Real) or math.isnan(groups):
            continue
        method = _base(str(row.get("method", "")))
        cells.setdefault(method, set()).add(row.get("cell_id"))
        if groups == 0:
            empty.setdefault(method, set()).add(row.get("cell_id"))
    lines = []
    for method, found in empty.items():
        where = "" if found == {None} else f" in {len(found)} of {len(cells[method])} cell(s)"
        lines.append(
            f"{method} aligned 0 permutation groups{where}: nothing was permuted, so its rows "
            "equal the merge without alignment (the plain average); the model's permutation "
            f"spec has no group, see {NOTHING_ALIGNED_DOC}"
        )
    return lines
