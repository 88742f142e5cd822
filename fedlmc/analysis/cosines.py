r"""Cosines between a layer's outputs and a prediction of them, and whether they are input-specific.

Outputs are tensors with the samples on dim 0, each sample flattened (units and positions).
:func:`mean_cosine` averages the per-sample cosine. Raw cosines of non-negative (ReLU) features
are high by construction, so three checks say how much of one is input-specific:
:func:`centred_cosine` (both sides minus their mean over the samples), :func:`shuffled_cosine`
(the prediction for another sample) and :func:`common_mode_share` (the share of the energy in the
mean over the samples). :class:`MeasuredOutput` holds what these need of the measured side, so that
it is computed once for several predictions (the same numbers, bit for bit).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

CONSTANT_RTOL = 1e-12
"""A centred sample (or a mean over samples) whose norm is at most this times the largest sample
norm is taken as exactly 0: float64 rounding of a mean leaves ~1e-17, not a direction."""


def mean_cosine(a: Tensor, b: Tensor) -> float:
    r"""Mean over samples of :math:`\langle a_n, b_n\rangle / (\|a_n\| \|b_n\|)`, flattened.

    Samples where either vector is zero have no direction and are left out; ``nan`` if all are.
    """
    a = a.flatten(1).double()
    return _mean_cosine(a, a.norm(dim=1), b)


def _mean_cosine(a: Tensor, a_norms: Tensor, b: Tensor) -> float:
    """:func:`mean_cosine` of the flattened float64 ``a`` whose sample norms are ``a_norms``."""
    b = b.flatten(1).double()
    norms = a_norms * b.norm(dim=1)
    keep = norms > 0
    if not bool(keep.any()):
        return math.nan
    return float(((a * b).sum(dim=1)[keep] / norms[keep]).mean())


def centred(t: Tensor) -> Tensor:
    r""":math:`t_n - \frac{1}{n}\sum_m t_m`: each sample (dim 0) minus the mean over the samples,
    per unit and position, flattened per sample; rounding residues below :data:`CONSTANT_RTOL`
    (relative) are set to 0, so a feature constant over the samples centres to exactly 0."""
    flat = t.flatten(1).double()
    out = flat - flat.mean(dim=0, keepdim=True)
    scale = float(flat.norm(dim=1).max()) if len(flat) else 0.0
    out[out.norm(dim=1) <= CONSTANT_RTOL * scale] = 0.0
    return out


def centred_cosine(a: Tensor, b: Tensor) -> float:
    r""":func:`mean_cosine` of the centred sides, :math:`\cos(a_n - \bar a, b_n - \bar b)`
    averaged over samples (:func:`centred`).

    The input-specific part of the agreement: a shared, input-independent vector (the mean over
    inputs, large for non-negative ReLU features) no longer counts. ``nan`` when either side is
    constant over the samples (it has no centred direction); samples whose centred vector is 0
    are left out.
    """
    return mean_cosine(centred(a), centred(b))


def derangement(n: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """The sample orders :func:`shuffled_cosine` pairs: ``p`` drawn from ``seed`` and
    ``p.roll(-1)`` (no sample meets its own for ``n >= 2``)."""
    p = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return p, p.roll(-1)


def shuffled_cosine(a: Tensor, b: Tensor, seed: int = 0) -> float:
    r"""Baseline of :func:`mean_cosine`: each :math:`a_n` against :math:`b` at another sample.

    With :math:`p` the permutation of the :math:`n` samples drawn from ``seed``, sample
    :math:`a_{p_k}` is paired with :math:`b_{p_{k+1 \bmod n}}` (a derangement: no sample meets
    its own), :math:`\frac{1}{n}\sum_k \cos(a_{p_k}, b_{p_{k+1}})`. A raw cosine near this
    baseline says nothing input-specific: non-negative (ReLU) features share a direction.
    ``nan`` for fewer than two samples."""
    if len(a) < 2:
        return math.nan
    first, second = derangement(len(a), seed)
    return mean_cosine(a[first], b[second])


def common_mode_share(t: Tensor) -> float:
    r"""Share of the energy of ``t`` (samples on dim 0) in its mean over the samples.

    .. math:: s = \frac{n \,\|\bar t\|^2}{\sum_n \|t_n\|^2}, \qquad
        \bar t = \frac{1}{n}\sum_n t_n

    (samples flattened). Since :math:`\sum_n \|t_n\|^2 = n\|\bar t\|^2 + \sum_n \|t_n -
    \bar t\|^2`, :math:`s \in [0, 1]`: 1 for a feature constant over the samples, 0 for
    zero-mean features (a mean below :data:`CONSTANT_RTOL` of the largest sample norm is a
    rounding residue, taken as 0). ``nan`` when ``t`` is 0.
    """
    flat = t.flatten(1).double()
    mean_energy = flat.mean(dim=0).pow(2).sum()
    if len(flat) and float(mean_energy.sqrt()) <= CONSTANT_RTOL * float(flat.norm(dim=1).max()):
        mean_energy = torch.zeros(())
    energy = float(flat.pow(2).sum())
    return float(len(flat) * mean_energy) / energy if energy > 0 else math.nan


class MeasuredOutput:
    """A measured output ``t`` compared with several predictions: what the comparisons need of
    ``t`` alone (its norm, per-sample norms, centred and shuffled samples) is computed once, on
    first use. Each method returns exactly what the function of the same name returns for
    ``(t, prediction)``."""

    def __init__(self, t: Tensor, seed: int = 0) -> None:
        self.t, self.seed = t, seed
        self._parts: dict[str, tuple[Tensor, Tensor]] = {}
        self._norm: float | None = None

    def norm(self) -> float:
        """``float(t.norm())`` (all elements)."""
        if self._norm is None:
            self._norm = float(self.t.norm())
        return self._norm

    def _part(self, kind: str) -> tuple[Tensor, Tensor]:
        """(samples, their norms): ``t`` flattened, centred or in the derangement's first order."""
        if kind not in self._parts:
            if kind == "raw":
                samples = self.t.flatten(1).double()
            elif kind == "centred":
                samples = centred(self.t)
            else:
                samples = self.t[derangement(len(self.t), self.seed)[0]].flatten(1).double()
            self._parts[kind] = samples, samples.norm(dim=1)
        return self._parts[kind]

    def cosine(self, prediction: Tensor) -> float:
        """:func:`mean_cosine` ``(t, prediction)``."""
        return _mean_cosine(*self._part("raw"), prediction)

    def centred_cosine(self, prediction: Tensor) -> float:
        """:func:`centred_cosine` ``(t, prediction)``."""
        return _mean_cosine(*self._part("centred"), centred(prediction))

    def shuffled_cosine(self, prediction: Tensor) -> float:
        """:func:`shuffled_cosine` ``(t, prediction, seed)``."""
        if len(self.t) < 2:
            return math.nan
        second = derangement(len(self.t), self.seed)[1]
        return _mean_cosine(*self._part("shuffled"), prediction[second])
