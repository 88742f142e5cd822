r"""The largest singular value of a weight without a full SVD: what the stable rank needs.

:math:`\sigma_1^2 = \|W\|_2^2` is the largest eigenvalue :math:`\lambda_1` of the smaller Gram
matrix :math:`G` (:math:`W W^\top` or :math:`W^\top W`, float64). Lanczos (ARPACK's ``eigsh``
from a seeded random start, to machine precision) gives a Ritz value :math:`\theta`, a Rayleigh
quotient of :math:`G`, so :math:`\theta \le \lambda_1`; a Cholesky factorisation of
:math:`(1 + \epsilon)\,\theta I - G` with :math:`\epsilon` = :data:`CERTIFY_RTOL` then proves
:math:`\lambda_1 \le (1 + \epsilon)\,\theta` (it exists only for a positive definite matrix;
its rounding is a few units of float64 relative to :math:`\lambda_1`, far below
:math:`\epsilon`). With both, :math:`\theta` is :math:`\lambda_1` to :math:`10^{-11}` relative;
without the certificate (Lanczos stopped at a smaller eigenvalue, or did not converge) the
symmetric eigensolver's :math:`\lambda_1` is returned. The six hidden weights of the quick
sweep's 1,024-unit cell took 0.54 s of CPU this way, 0.84 s with the eigensolver alone and
1.80 s with ``svdvals`` (one thread, a loaded machine), agreeing with ``svdvals`` to
:math:`2 \cdot 10^{-15}` relative.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

CERTIFY_RTOL = 1e-11
"""The relative margin the Cholesky certificate proves :math:`\\lambda_1` within."""

LANCZOS_MIN = 64
"""Gram matrices smaller than this go straight to the symmetric eigensolver (cheap there)."""

__all__ = ["CERTIFY_RTOL", "LANCZOS_MIN", "spectral_norm_squared"]


def spectral_norm_squared(weight: Tensor) -> float:
    r""":math:`\sigma_1^2 = \|W\|_2^2` of ``weight`` reshaped to ``(out, -1)`` (see the module
    docstring); 0 for an empty or zero weight."""
    if weight.ndim < 2:
        raise ValueError(
            f"rank needs a matrix or conv weight (ndim >= 2), got shape {tuple(weight.shape)}"
        )
    w = weight.detach().double().cpu().reshape(weight.shape[0], -1)
    if w.numel() == 0:
        return 0.0
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    if len(gram) >= LANCZOS_MIN:
        top = _lanczos_top(gram)
        if top is not None and top > 0 and _certified(gram, top * (1.0 + CERTIFY_RTOL)):
            return top
    return max(0.0, float(torch.linalg.eigvalsh(gram)[-1]))


def _lanczos_top(gram: Tensor) -> float | None:
    """ARPACK's largest Ritz value of ``gram`` (``None`` if it did not converge)."""
    from scipy.sparse.linalg import ArpackError, ArpackNoConvergence, eigsh

    start = np.random.default_rng(0).standard_normal(len(gram))
    try:
        found = eigsh(gram.numpy(), k=1, which="LA", tol=0, v0=start, return_eigenvectors=False)
    except (ArpackNoConvergence, ArpackError):
        return None
    return float(found[0])


def _certified(gram: Tensor, bound: float) -> bool:
    """Whether ``bound * I - gram`` has a Cholesky factor: every eigenvalue is below ``bound``."""
    shifted = -gram
    shifted.diagonal().add_(bound)
    return int(torch.linalg.cholesky_ex(shifted).info) == 0
