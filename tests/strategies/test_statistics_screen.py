"""The statistics screen (fedlmc.strategies.statistics_screen): the extreme eigenvalues are exact
below EXACT_BELOW inputs and bracketed by the block Krylov Ritz values above it; a Gram matrix of
real inputs (ReLU features, 300 of them, fewer samples than inputs: singular) passes with its
scale, the same Gram with its off-diagonal entries times -4 or its top direction negated off
the diagonal is refused naming the layer; the relative rule names the client out of scale by
the statistic and tensor, and runs only from three clients."""

from __future__ import annotations

import math

import pytest
import torch

from fedlmc.strategies.payload import ScreenError
from fedlmc.strategies.robust import RobustScreen
from fedlmc.strategies.statistics_screen import (
    EXACT_BELOW,
    check_gram_spectrum,
    extreme_eigenvalues,
    fisher_scale,
    statistics_outliers,
)


def _gram(n: int, samples: int = 200, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, n, generator=generator, dtype=torch.float64).relu()
    return (x.T @ x / samples).float()


def _off_diagonal_times(g: torch.Tensor, factor: float) -> torch.Tensor:
    diagonal = torch.diag(torch.diagonal(g))
    return diagonal + factor * (g - diagonal)


def _top_negated(g: torch.Tensor) -> torch.Tensor:
    values, vectors = torch.linalg.eigh(g.double())
    part = values[-1] * torch.outer(vectors[:, -1], vectors[:, -1])
    return (g.double() - 2 * (part - torch.diag(torch.diagonal(part)))).float()


@pytest.mark.parametrize("n", [EXACT_BELOW - 1, EXACT_BELOW + 44])
def test_the_extreme_eigenvalues_are_bracketed_and_the_largest_found(n):
    g = _gram(n)
    exact = torch.linalg.eigvalsh(g.double())
    smallest, largest = extreme_eigenvalues(g)
    scale = float(exact[-1])
    assert float(exact[0]) - 1e-5 * scale <= smallest <= largest <= scale * (1 + 1e-5)
    assert largest == pytest.approx(scale, rel=1e-4)  # the top eigenvalue stands apart
    if n < EXACT_BELOW:
        assert smallest == pytest.approx(float(exact[0]), abs=1e-9 * scale)


@pytest.mark.parametrize("n", [EXACT_BELOW - 1, EXACT_BELOW + 44])
def test_an_honest_gram_passes_with_its_scale(n):
    g = _gram(n)
    found = check_gram_spectrum("fc", g)
    assert found["trace"] == pytest.approx(float(torch.diagonal(g.double()).mean()), rel=1e-6)
    assert found["largest"] == pytest.approx(float(torch.linalg.eigvalsh(g.double())[-1]), rel=1e-4)


@pytest.mark.parametrize("attack", [lambda g: _off_diagonal_times(g, -4.0), _top_negated])
@pytest.mark.parametrize("n", [EXACT_BELOW - 1, EXACT_BELOW + 44])
def test_an_indefinite_gram_with_its_diagonal_kept_is_refused(attack, n):
    g = attack(_gram(n))
    assert (g - g.T).abs().max() <= 1e-5 * g.abs().max() and (torch.diagonal(g) >= 0).all()
    with pytest.raises(ScreenError, match="'?fc'? is no Gram matrix: an eigenvalue is at most"):
        check_gram_spectrum("fc", g)


def test_the_relative_rule_names_the_client_out_of_scale_by_statistic_and_tensor():
    honest = [{"fc": check_gram_spectrum("fc", _gram(40, seed=s))} for s in range(3)]
    scaled = {"fc": check_gram_spectrum("fc", _gram(40, seed=3) * 1e6)}
    found = statistics_outliers([*honest, scaled], RobustScreen())
    assert list(found) == [3] and "the Gram scale (trace / inputs) of layer 'fc'" in found[3]
    assert statistics_outliers(honest, RobustScreen()) == {}
    assert statistics_outliers([honest[0], scaled], RobustScreen()) == {}  # two: no median


def test_a_fisher_of_1e37_is_named_by_its_mean_entry():
    fishers = [
        {"w": fisher_scale(torch.rand(10, generator=torch.Generator().manual_seed(s)))}
        for s in range(3)
    ]
    fishers.append({"w": fisher_scale(torch.full((10,), 1e37))})
    found = statistics_outliers(fishers, RobustScreen())
    assert list(found) == [3] and "the mean Fisher entry of 'w'" in found[3]
    assert statistics_outliers(fishers, RobustScreen(math.inf)) == {}  # the rule turned off
