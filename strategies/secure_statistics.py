r"""Fisher merging and RegMean under Flower's SecAgg+: several sums over the clients in one secure
round, divided or solved on the server.

A merge method registered with ``secure_sums`` (:class:`fedlmc.merging.sum_form.SecureSums`)
is a function of sums over the clients of what each computes alone from its own model and data:
Fisher merging of :math:`\sum_i w_i u_i \theta_i` and :math:`\sum_i w_i u_i`
(:mod:`fedlmc.merging.field.fisher`), RegMean of :math:`\sum_i w_i \theta_i`, :math:`\sum_i w_i
\tilde G_i` and :math:`\sum_i w_i \tilde G_i W_i^\top` per layer
(:mod:`fedlmc.merging.field.regmean`).
:func:`secure_sums_merge` runs one :func:`fedlmc.strategies.secure.secure_round` in which every
client trains, computes its parts (its secure handler,
:mod:`fedlmc.simulations.private.secure_client`) and sends them all, concatenated; the server
splits the unmasked weighted mean by the parts' shapes and merges
(``SecureSums.merge``). The server holds the means only: never one client's weights, Fisher
diagonal or Gram matrix.

**Weight range.** A value the quantisation rounds is off by up to a level of the clipping range
:math:`c` (at least 8 by the clipping rule), while trained weights are far smaller; the Fisher
values are sent scaled by :math:`c/b`, :math:`b` the weight range (:func:`weight_range`: the
smallest power of two at least 8 times the initial model's largest absolute value, at most
:math:`c`; :math:`c` itself when ``secagg-clipping-range`` is set), which each client checks
its weights against (refusing, naming the key and the value, beyond it).

**Quantisation.** A ratio or a solve of sums amplifies the means' quantisation error (an entry
whose Fisher mass is the floor :math:`\varepsilon` divides by it), so these rounds use the finest
quantisation Flower's SecAgg+ takes for :math:`N` clients (:func:`finest_levels`): the sum of
:math:`N` quantised values must stay below the modulus :math:`2^{32}` (Flower's limit) and each
below :math:`2^{31}` (its ``int32`` rounding), so :math:`Q = 2^{\lfloor \log_2(2^{31}/N)
\rfloor}`, at most :math:`2^{30}`: :math:`2^{30}` for 2 clients, :math:`2^{28}` for 8, against
Flower's default :math:`2^{22}` (64 to 256 times finer). Each entry of a mean is then off by at
most :math:`\delta = 3Nc/(QS)` (:meth:`fedlmc.strategies.secure.SecureSettings.error_bound`'s
rule), and ``SecureSums.merge`` turns :math:`\delta` into the merge's bound
(:attr:`SecureSumsResult.error_bound`; Fisher:
:func:`fedlmc.merging.field.fisher.fisher_error_bound`, RegMean:
:func:`fedlmc.merging.field.regmean.regmean_error_bound`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from fedlmc.merging.sum_form import SecureSums
from fedlmc.strategies.secure import (
    SecureResult,
    SecureSettings,
    float_keys,
    secure_round,
)

__all__ = [
    "WEIGHT_HEADROOM",
    "WEIGHT_RANGE_KEY",
    "SecureSumsResult",
    "fine_settings",
    "finest_levels",
    "secure_sums_merge",
    "split_parts",
    "weight_range",
]

MAX_LEVELS = 2**30
"""The largest quantisation range a client's values stay below ``int32`` with."""


WEIGHT_HEADROOM = 8.0
"""The weight range's headroom over the initial model's largest absolute value (trained MLPs
here reach 3 to 7 times it)."""
WEIGHT_RANGE_KEY = "secagg-weight-range"
"""The fit-config entry a secure round of several sums adds: the weight range :math:`b`."""


def weight_range(initial: Mapping[str, torch.Tensor], clipping_range: float, fixed: bool) -> float:
    """:math:`b`: the clipping range when it was ``fixed`` (``secagg-clipping-range`` set), else
    the smallest power of two at least :data:`WEIGHT_HEADROOM` times ``initial``'s largest
    absolute floating-point value, at most the clipping range."""
    if fixed:
        return float(clipping_range)
    largest = max((float(initial[k].abs().max()) for k in float_keys(initial)), default=0.0)
    needed = max(WEIGHT_HEADROOM * largest, 2.0**-20)
    return float(min(clipping_range, 2.0 ** math.ceil(math.log2(needed))))


def finest_levels(num_clients: int) -> int:
    r"""The largest power of two :math:`Q \le 2^{30}` with :math:`N Q \le 2^{31}` (see the
    module docstring)."""
    if num_clients < 1:
        raise ValueError(f"num_clients = {num_clients}: allowed: at least 1")
    return min(MAX_LEVELS, 2 ** (31 - math.ceil(math.log2(num_clients))))


@dataclass
class SecureSumsResult(SecureResult):
    """A merge from several secure means: the round, the merged state and its bound."""

    bound: float = math.nan

    @property
    def error_bound(self) -> float:
        """The rule's bound on a merged value's difference from the clear merge."""
        return self.bound


def split_parts(
    aggregate: Sequence[np.ndarray], shapes: Sequence[Mapping[str, tuple[int, ...]]]
) -> list[dict[str, torch.Tensor]]:
    """The flat list of aggregated arrays cut into the parts of ``shapes`` (in order), float64;
    ``ValueError`` when the counts or a shape differ."""
    expected = sum(len(part) for part in shapes)
    if len(aggregate) != expected:
        raise ValueError(f"got {len(aggregate)} aggregated arrays for {expected} in the parts")
    arrays = iter(aggregate)
    parts = []
    for part in shapes:
        found = {}
        for key, shape in part.items():
            value = torch.as_tensor(np.asarray(next(arrays), dtype=np.float64))
            if tuple(value.shape) != tuple(shape):
                raise ValueError(f"aggregated {key!r} has shape {tuple(value.shape)}, want {shape}")
            found[key] = value
        parts.append(found)
    return parts


def secure_sums_merge(
    grid: Any,
    initial: Mapping[str, torch.Tensor],
    template: torch.nn.Module,
    num_clients: int,
    fit_config: Mapping[str, Any],
    settings: SecureSettings,
    sums: SecureSums,
    options: Mapping[str, Any],
    timeout: float | None = None,
) -> SecureSumsResult:
    """One secure round of a ``secure_sums`` rule: every client trains from ``initial`` and
    answers its parts; the merge (``initial``'s keys, its dtypes; integer buffers kept) from
    the parts' means, with ``options`` (the method options) and the round's ranges."""
    sent = [v.detach().cpu().numpy() for v in initial.values()]
    found = secure_round(grid, sent, num_clients, fit_config, settings, timeout)
    means = split_parts(found.aggregate, sums.part_shapes(template))
    total = sum(settings.share(n) for n in found.num_examples)
    ranges = {
        "clipping_range": settings.clipping_range,
        "weight_range": float(fit_config[WEIGHT_RANGE_KEY]),
        "statistics_range": float(options["statistics_range"]),
        "entry_error": settings.exponent_error_bound(found.num_examples, 0),
        "total_share": total,
    }
    merged64, bound = sums.merge(template, means, {**options, **ranges})
    merged = {k: v.detach().cpu().clone() for k, v in initial.items()}
    for key in float_keys(initial):
        merged[key] = merged64[key].to(initial[key].dtype)
    return SecureSumsResult(**vars(found), merged_state=merged, bound=bound)


def fine_settings(settings: SecureSettings, num_clients: int) -> SecureSettings:
    """``settings`` with the finest quantisation for ``num_clients`` (:func:`finest_levels`)."""
    return replace(settings, quantization_range=finest_levels(num_clients))
