"""fedlmc.analysis.diagnostics.spectral_norm_squared: the top singular value without a full SVD,
equal to the singular values' within float64 rounding, and the stable rank built on it."""

from __future__ import annotations

import pytest
import torch

from fedlmc.analysis.diagnostics import spectral_norm_squared, stable_rank


def low_rank(rows: int, cols: int, rank: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, rank, generator=g) @ torch.randn(rank, cols, generator=g)


WEIGHTS = {
    "square": torch.randn(64, 64, generator=torch.Generator().manual_seed(0)),
    "wide": torch.randn(16, 200, generator=torch.Generator().manual_seed(1)),
    "tall": torch.randn(200, 16, generator=torch.Generator().manual_seed(2)),
    "low rank": low_rank(120, 90, 5, 3),
    "conv": torch.randn(8, 4, 3, 3, generator=torch.Generator().manual_seed(4)),
    "two equal tops": torch.diag(torch.tensor([3.0, 3.0, 1.0, 0.5])),
}


@pytest.mark.parametrize("name", list(WEIGHTS))
def test_the_top_singular_value_equals_the_svds_within_float64_rounding(name):
    weight = WEIGHTS[name]
    s = torch.linalg.svdvals(weight.double().reshape(weight.shape[0], -1))
    assert spectral_norm_squared(weight) == pytest.approx(float(s[0]) ** 2, rel=1e-12)
    expected = float((s**2).sum()) / float(s[0]) ** 2
    assert stable_rank(weight) == pytest.approx(expected, rel=1e-12)


def test_the_stable_rank_runs_no_full_svd(monkeypatch):
    def refused(*_args, **_kwargs):
        raise AssertionError("a full SVD")

    monkeypatch.setattr(torch.linalg, "svdvals", refused)
    monkeypatch.setattr(torch.linalg, "svd", refused)
    assert stable_rank(torch.eye(5)) == pytest.approx(5.0)
    assert stable_rank(torch.zeros(3, 4)) == 0.0 and spectral_norm_squared(torch.zeros(3, 4)) == 0.0
    with pytest.raises(ValueError, match="ndim >= 2"):
        spectral_norm_squared(torch.ones(3))
