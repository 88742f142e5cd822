"""Tests of fedlmc.permutation.accumulate: the compiled float64 sums give torch's values."""

from __future__ import annotations

import pytest
import torch

from fedlmc.permutation.accumulate import accumulate, dot64


def _pair(rows: int, cols: int, seed: int, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    total = torch.randn(rows, cols, generator=generator, dtype=torch.float64) * 1e3
    part = torch.randn(rows, cols, generator=generator).to(dtype) * 1e-3
    return total, part


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_accumulate_is_torchs_add_bit_for_bit(dtype):
    total, part = _pair(37, 53, seed=0, dtype=dtype)
    expected = total.clone().add_(part)
    accumulate(total, part)
    assert torch.equal(total, expected)


def test_accumulate_falls_back_to_add_for_other_layouts():
    total, part = _pair(8, 6, seed=1)
    expected = total.clone().add_(part.T.contiguous().T)
    accumulate(total, part.T.contiguous().T)  # a non-contiguous part
    assert torch.equal(total, expected)
    low = torch.zeros(4, 4)  # a float32 total: torch's own add
    accumulate(low, torch.ones(4, 4))
    assert torch.equal(low, torch.ones(4, 4))


@pytest.mark.parametrize("shape", [(64, 33), (1000,), (3, 4, 5), ()])
def test_dot64_is_the_float64_inner_product(shape):
    generator = torch.Generator().manual_seed(2)
    a, b = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    expected = float((a.double() * b.double()).sum())
    assert dot64(a, b) == pytest.approx(expected, rel=1e-13, abs=1e-13)


def test_dot64_accumulates_in_float64():
    """A float32 running sum would drop the 4,096 tiny products added to 1; float64 keeps them."""
    a = torch.ones(1, 4097)
    b = torch.full_like(a, 1e-9)
    b[0, 0] = 1.0
    expected = 1.0 + 4096 * float(torch.tensor(1e-9).double())
    assert dot64(a, b) == pytest.approx(expected, rel=1e-15)
    assert expected - 1.0 > 4e-6


def test_dot64_rejects_different_shapes():
    with pytest.raises(ValueError, match=r"one shape, got \(2, 3\) and \(3, 2\)"):
        dot64(torch.zeros(2, 3), torch.zeros(3, 2))
