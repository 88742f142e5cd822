r"""The screen of the clients' statistics (``query.gram``, ``query.fisher``): what a Gram matrix
must be on its own, and each client's scale against the other clients'.

**Positive semi-definite** (:func:`check_gram_spectrum`, in the per-reply screen
:func:`fedlmc.strategies.screening.screen_statistics_reply`). An honest Gram matrix is
:math:`G = X^\top X / m` (:func:`fedlmc.merging.field.regmean.gram_matrices`): no eigenvalue below 0
but for the rounding of its float32 entries (at most :math:`\|E\|_F \le 2^{-24}\|G\|_F`, about
:math:`3\cdot 10^{-6}\lambda_{\max}` at 2,048 inputs). A reply is refused when

.. math:: \theta_{\min} < -\tau \max(\mathrm{tr}\,G / n,\ \theta_{\max}),

:math:`\tau` = :data:`GRAM_TOLERANCE`, :math:`\theta_{\min}` and :math:`\theta_{\max}` the
extreme eigenvalues (:func:`extreme_eigenvalues`): exact below :data:`EXACT_BELOW` inputs, else
the extreme Ritz values of a block Krylov space (:data:`KRYLOV_STEPS` products of the Gram, in
the float32 it was sent in, with :data:`KRYLOV_BLOCK` vectors drawn afresh for every reply), with
:math:`\lambda_{\min} \le \theta_{\min}` and :math:`\theta_{\max} \le \lambda_{\max}` up to
rounding. So an honest Gram is never refused; a negative eigenvalue is found within those
products when it is far from the rest of the spectrum relative to its spread (the off-diagonal
entries multiplied by -4, the top direction negated: docs/reliability.md). The Krylov space
costs :data:`KRYLOV_STEPS` + 1 passes over the matrix (:math:`O(n^2)` each), where an exact
eigendecomposition or a Cholesky factor (:math:`O(n^3)`) of every client's Gram would cost as
much as RegMean's own products with the weights (benchmarks/field_methods.py). What it misses, a
small negative eigenvalue hidden in the spectrum, moves the merge only where the other clients'
Grams are about as small, and a solution that blows up there is refused by the merge's own check
(:func:`fedlmc.merging.field.regmean.solution_growth`).

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
KRYLOV_STEPS = 3
"""Blocks of the Krylov space (a spectrum costs one more pass over the matrix)."""
KRYLOV_BLOCK = 8
"""Vectors per block: a Krylov space of 24 dimensions."""
EXACT_BELOW = 256
"""Below this many inputs a Gram's extreme eigenvalues are computed exactly
(``torch.linalg.eigvalsh``: cheaper there than the Krylov space)."""

Summary = dict[str, dict[str, float]]
"""Per tensor (a layer's Gram, a parameter's Fisher), its scale statistics by name."""


def extreme_eigenvalues(matrix: torch.Tensor) -> tuple[float, float]:
    r""":math:`(\theta_{\min}, \theta_{\max})` of the symmetric ``matrix``: its extreme
    eigenvalues below :data:`EXACT_BELOW` rows (float64), else the extreme Ritz values of the
    block Krylov space :math:`[V, GV, \dots, G^{s-1}V]` (:math:`s` = :data:`KRYLOV_STEPS`,
    :math:`V` :data:`KRYLOV_BLOCK` random vectors; each block orthonormalised and multiplied in
    the matrix's own precision, float32 as the clients send it, the space's orthonormal basis
    :math:`Q` by one QR in float64): the eigenvalues of :math:`Q^\top G Q`, with
    :math:`\lambda_{\min} \le \theta_{\min} \le \theta_{\max} \le \lambda_{\max}` up to
    that rounding (about :math:`10^{-6}\lambda_{\max}`, far inside :data:`GRAM_TOLERANCE`)."""
    n = matrix.shape[0]
    if n < EXACT_BELOW:
        values = torch.linalg.eigvalsh(matrix.double())
        return (float(values[0]), float(values[-1])) if n else (0.0, 0.0)
    g = matrix if matrix.dtype in (torch.float32, torch.float64) else matrix.double()
    seed = int.from_bytes(os.urandom(8), "little") >> 1
    generator = torch.Generator().manual_seed(seed)
    v = torch.randn(n, KRYLOV_BLOCK, dtype=g.dtype, generator=generator)
    blocks = []
    for _ in range(KRYLOV_STEPS):
        v = torch.linalg.qr(v)[0]
        blocks.append(v)
        v = g @ v
    q = torch.linalg.qr(torch.cat(blocks, dim=1).double())[0]
    t = q.T @ (g @ q.to(g.dtype)).double()
    ritz = torch.linalg.eigvalsh((t + t.T) / 2)
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
