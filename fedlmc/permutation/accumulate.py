r"""Float64 sums of float32 data: :math:`C \mathrel{+}= P` in place, and
:math:`\langle a, b \rangle` accumulated in float64.

Weight matching (:mod:`fedlmc.permutation.matching`) adds float32 matrix products to float64
cost matrices when asked to hold them in float64 (``float64_costs=True``; by default they stay
in the products' dtype), and its objective is always a float64 sum of float32 products. On the CPU,
torch's type-promoting ``add_`` (float64 += float32) runs about ten times slower than the same
loop compiled by numba (4,096 x 4,096: about 85 ms against 8 ms on the 2-core benchmark
machine), which made these additions a third of a weight-matching run; the objective went
through float64 copies of both tensors and of their product. The compiled loops give the same
values (every float32 converts exactly to float64; the dot product sums each row, then the
rows). CUDA tensors and other layouts use torch's operations.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from torch import Tensor


@numba.njit(cache=True, nogil=True)
def _add_rows(total: np.ndarray, part: np.ndarray) -> None:
    """``total[i, j] += float64(part[i, j])`` for every entry, row by row."""
    for i in range(total.shape[0]):
        for j in range(total.shape[1]):
            total[i, j] += part[i, j]


def accumulate(total: Tensor, part: Tensor) -> None:
    """``total += part`` in ``total``'s dtype, in place (same values as ``total.add_(part)``).

    The numba loop runs for contiguous CPU tensors of the same 2-D shape, ``total`` float64 and
    ``part`` float32 or float64; anything else (CUDA, other layouts) goes to ``total.add_``.
    """
    fast = (
        total.device.type == "cpu"
        and part.device.type == "cpu"
        and total.dtype == torch.float64
        and part.dtype in (torch.float32, torch.float64)
        and total.dim() == 2
        and total.shape == part.shape
        and total.is_contiguous()
        and part.is_contiguous()
    )
    if not fast:
        total.add_(part)
        return
    _add_rows(total.detach().numpy(), part.detach().numpy())


@numba.njit(cache=True, nogil=True)
def _dot_rows(a: np.ndarray, b: np.ndarray) -> float:
    """:math:`\\sum_i \\sum_j a_{ij} b_{ij}` in float64: each row summed, then the row sums."""
    total = 0.0
    for i in range(a.shape[0]):
        row = 0.0
        for j in range(a.shape[1]):
            row += np.float64(a[i, j]) * np.float64(b[i, j])
        total += row
    return total


def dot64(a: Tensor, b: Tensor) -> float:
    r""":math:`\langle a, b\rangle = \sum a \odot b`, each product and the sum in float64.

    Contiguous CPU float32/float64 tensors of one shape run a compiled loop (no float64 copies);
    others are summed by torch in float64.
    """
    if a.shape != b.shape:
        shapes = f"{tuple(a.shape)} and {tuple(b.shape)}"
        raise ValueError(f"dot64 needs two tensors of one shape, got {shapes}")
    fast = (
        a.device.type == "cpu"
        and b.device.type == "cpu"
        and a.dtype in (torch.float32, torch.float64)
        and b.dtype == a.dtype
        and a.is_contiguous()
        and b.is_contiguous()
        and a.numel() > 0
    )
    if not fast:
        return float((a.double() * b.double()).sum())
    width = a.shape[-1] if a.dim() else 1
    rows_a, rows_b = a.detach().reshape(-1, width), b.detach().reshape(-1, width)
    return float(_dot_rows(rows_a.numpy(), rows_b.numpy()))
