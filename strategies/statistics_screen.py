r"""The screen of the clients' statistics (``query.gram``, ``query.fisher``): what a Gram matrix
must be on its own, and each client's scale against the other clients'.

**Positive semi-definite** (:func:`check_gram_spectrum`, in the per-reply screen
:func:`fedlmc.strategies.screening.screen_statistics_reply`). An honest Gram matrix is
:math:`G = X^\top X / m` (:func:`fedlmc.merging.regmean.gram_matrices`): no eigenvalue below 0 but
for the rounding of its float32 entries (at most :math:`\|E\|_F \le 2^{-24}\|G\|_F`, about
:math:`3\cdot 10^{-6}\lambda_{\max}` at 2,048 inputs). A reply is refused when

.. math:: \theta_{\min} < -\tau \max(\mathrm{tr}\,G / n,\ \theta_{\max}),

:math:`\tau` = :data:`GRAM_TOLERANCE`, :math:`\theta_{\min} \ge \lambda_{\min}` and
:math:`\theta_{\max} \le \lambda_{\max}` the extreme Ritz values of :data:`LANCZOS_STEPS` steps of
Lanczos (full reorthogonalisation, float64) from a random start drawn afresh for every reply
(:func:`extreme_eigenvalues`). Since :math:`\theta_{\min} \ge \lambda_{\min}`, an honest Gram
is never refused; a negative eigenvalue is found within those steps when it is far from the
rest of the spectrum relative to its spread (the off-diagonal entries multiplied by -4, an
eigenvalue negated), and exactly at :math:`n \le` :data:`LANCZOS_STEPS` inputs. Lanczos costs
one matrix-vector product a step (:math:`O(n^2)`), where an exact eigendecomposition or a
Cholesky factor (:math:`O(n^3)`) would cost as much as RegMean's own products with the weights
(benchmarks/field_methods.py). What it misses, a small negative eigenvalue hidden in the
spectrum, moves the merge only where the other clients' Grams are about as small, and a
solution that blows up there is the merge's own check
(:func:`fedlmc.merging.regmean.solution_growth`).

**Scale** (:func:`statistics_outliers`, the relative rule of :mod:`fedlmc.strategies.robust`
with the same factor, ``outlier-factor``): per layer, a Gram's scale per sample and input,
:math:`\mathrm{tr}\,G / n` (its inputs' mean square), and its operator norm
:math:`\theta_{\max}`; per parameter tensor, a Fisher diagonal's mean entry. A client whose value
is above the factor times the median over the clients is dropped by name (a Gram scaled by
1e6 would carry RegMean's solve alone; Fisher merging normalises each client's Fisher, so a
scaled Fisher moves it little, but no honest client sends one).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch

from fedlmc.strategies.payload import ScreenError
from fedlmc.strategies.robust import RobustScreen, ratio_outliers

GRAM_TOLERANCE = 1e-4
r""":math:`\tau`: the largest negative eigenvalue accepted, relative to the Gram's scale (30
times the float32 rounding at 2,048 inputs)."""
LANCZOS_STEPS = 24
"""Lanczos steps (matrix-vector products) per Gram matrix."""

Summary = dict[str, dict[str, float]]
"""Per tensor (a layer's Gram, a parameter's Fisher), its scale statistics by name."""


def extreme_eigenvalues(matrix: torch.Tensor, steps: int = LANCZOS_STEPS) -> tuple[float, float]:
    r""":math:`(\theta_{\min}, \theta_{\max})`, the extreme Ritz values of ``steps`` Lanczos steps
    on the symmetric ``matrix`` (float64, full reorthogonalisation, a fresh random start):
    :math:`\lambda_{\min} \le \theta_{\min} \le \theta_{\max} \le \lambda_{\max}`, exact when the
    Krylov space is the whole space (``steps`` >= n, or an invariant subspace reached)."""
    g = matrix.double()
    n = g.shape[0]
    seed = int.from_bytes(os.urandom(8), "little") >> 1
    q = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    basis = torch.empty(n, min(steps, n), dtype=torch.float64)
    alphas, betas = [], []
    size = float(g.abs().max()) if n else 0.0
    for j in range(basis.shape[1]):
        basis[:, j] = q / q.norm()
        w = g @ basis[:, j]
        alphas.append(float(basis[:, j] @ w))
        known = basis[:, : j + 1]
        for _ in range(2):  # full reorthogonalisation, twice (Kahan)
            w -= known @ (known.T @ w)
        beta = float(w.norm())
        if j + 1 == basis.shape[1] or beta <= 1e-12 * max(size, 1e-300) * n:
            break
        betas.append(beta)
        q = w
    m = len(alphas)
    tri = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if m > 1:
        off = torch.tensor(betas[: m - 1], dtype=torch.float64)
        tri += torch.diag(off, 1) + torch.diag(off, -1)
    ritz = torch.linalg.eigvalsh(tri)
    return float(ritz[0]), float(ritz[-1])


def check_gram_spectrum(name: str, gram: torch.Tensor) -> dict[str, float]:
    r"""The Gram matrix ``gram``'s scale (``{"trace": tr G / n, "largest": theta_max}``) once it
    is positive semi-definite within :data:`GRAM_TOLERANCE`; else :class:`ScreenError` naming
    the layer (see the module docstring)."""
    n = gram.shape[0]
    trace = float(torch.diagonal(gram).double().sum()) / max(n, 1)
    smallest, largest = extreme_eigenvalues(gram)
    scale = max(trace, largest)
    if smallest < -GRAM_TOLERANCE * scale:
        raise ScreenError(
            f"{name} is no Gram matrix: an eigenvalue is at most {smallest:.3g}, below "
            f"-{GRAM_TOLERANCE:g} x its scale {scale:.3g}; allowed: positive semi-definite "
            f"(X^T X / m) within -{GRAM_TOLERANCE:g} x max(trace / n, largest eigenvalue)"
        )
    return {"trace": trace, "largest": largest}


def fisher_scale(values: torch.Tensor) -> dict[str, float]:
    """A Fisher diagonal's scale: ``{"mean": its mean entry}`` (float64)."""
    return {"mean": float(values.double().mean()) if values.numel() else 0.0}


STATISTIC_NAMES = {
    "trace": "the Gram scale (trace / inputs) of layer {!r}",
    "largest": "the Gram operator norm of layer {!r}",
    "mean": "the mean Fisher entry of {!r}",
}
"""How a drop reason names each statistic of a :data:`Summary`."""


def statistics_outliers(summaries: Sequence[Summary], screen: RobustScreen) -> dict[int, str]:
    """Index -> reason for every client one of whose statistics (per tensor, by name) is above
    the factor times the median over the clients (the relative rule,
    :func:`fedlmc.strategies.robust.ratio_outliers`); none below its fewest clients."""
    if not summaries or not screen.applies(len(summaries)):
        return {}
    found: dict[int, str] = {}
    for tensor, stats in summaries[0].items():
        for stat in stats:
            values = [_finite(s[tensor][stat]) for s in summaries]
            what = STATISTIC_NAMES[stat].format(tensor)
            for index, reason in ratio_outliers(values, screen.factor, what).items():
                found.setdefault(index, reason)
    return found


def _finite(value: float) -> float:
    return value if math.isfinite(value) else math.inf
