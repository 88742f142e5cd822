"""fedlmc.analysis.spectral: the top singular value without a full SVD, equal to the singular
values' within float64 rounding (Lanczos certified by a Cholesky factor, else the symmetric
eigensolver), and the stable rank built on it."""

from __future__ import annotations

import pytest
import torch

from fedlmc.analysis import spectral
from fedlmc.analysis.diagnostics import stable_rank
from fedlmc.analysis.spectral import spectral_norm_squared


def low_rank(rows: int, cols: int, rank: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, rank, generator=g) @ torch.randn(rank, cols, generator=g)


def gaussian(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


WEIGHTS = {
    "square": gaussian(96, 96, seed=0),
    "wide": gaussian(80, 300, seed=1),
    "tall": gaussian(300, 80, seed=2),
    "small": gaussian(16, 40, seed=3),
    "low rank": low_rank(120, 90, 5, 3),
    "conv": gaussian(72, 8, 3, 3, seed=4),
    "two equal tops": torch.diag(torch.tensor([3.0, 3.0] + [1.0] * 70)),
}


def svd_top(weight: torch.Tensor) -> torch.Tensor:
    return torch.linalg.svdvals(weight.double().reshape(weight.shape[0], -1))


@pytest.mark.parametrize("name", list(WEIGHTS))
def test_the_top_singular_value_equals_the_svds_within_float64_rounding(name):
    weight = WEIGHTS[name]
    s = svd_top(weight)
    assert spectral_norm_squared(weight) == pytest.approx(float(s[0]) ** 2, rel=1e-12)
    expected = float((s**2).sum()) / float(s[0]) ** 2
    assert stable_rank(weight) == pytest.approx(expected, rel=1e-12)


def test_a_lanczos_value_below_the_top_fails_its_certificate(monkeypatch):
    """Lanczos stopped at the second eigenvalue: no Cholesky factor proves it the largest, so
    the eigensolver's value comes back."""
    weight = WEIGHTS["wide"]
    s = svd_top(weight)
    monkeypatch.setattr(spectral, "_lanczos_top", lambda gram: float(s[1]) ** 2)
    assert spectral_norm_squared(weight) == pytest.approx(float(s[0]) ** 2, rel=1e-12)
    monkeypatch.setattr(spectral, "_lanczos_top", lambda gram: None)  # no convergence
    assert spectral_norm_squared(weight) == pytest.approx(float(s[0]) ** 2, rel=1e-12)


def test_the_stable_rank_runs_no_full_svd(monkeypatch):
    def refused(*_args, **_kwargs):
        raise AssertionError("a full SVD")

    monkeypatch.setattr(torch.linalg, "svdvals", refused)
    monkeypatch.setattr(torch.linalg, "svd", refused)
    assert stable_rank(torch.eye(5)) == pytest.approx(5.0)
    assert stable_rank(torch.eye(100)) == pytest.approx(100.0)
    assert stable_rank(torch.zeros(3, 4)) == 0.0 and spectral_norm_squared(torch.zeros(70, 70)) == 0
    with pytest.raises(ValueError, match="ndim >= 2"):
        spectral_norm_squared(torch.ones(3))
