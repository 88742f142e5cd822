r"""How many descents weight matching runs, and when one of them is provably the best.

Coordinate descent (:mod:`fedlmc.permutation.coordinate_descent`) stops at a local optimum of
:math:`J(\pi) = \sum_w \langle W_a, \pi(W_b) \rangle` that depends on the order in which it
visits the groups. :func:`fedlmc.permutation.weight_matching` therefore runs several descents
where that happens (a spec with a residual stream: :func:`default_restarts`) and keeps the one
with the highest exact :math:`J`. The first descent uses the caller's seed and starts its first
sweep at the residual stream; descent :math:`k \ge 1` uses :func:`restart_seed` and the
published order (every sweep a seeded random permutation of the groups), whose different
orders reach different optima where the stream-first descent reaches the same one from every
seed. The restarts end early once a descent reaches :func:`upper_bound`, the Cauchy-Schwarz
bound no permutation can exceed (reached by the planted permutation of an identical model).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Integral

import numpy as np
from torch import Tensor

from fedlmc.permutation.accumulate import dot64
from fedlmc.permutation.objective import is_scored, residual_stream
from fedlmc.permutation.spec import PermutationSpec

STREAM_RESTARTS = 5
"""Descents of :func:`fedlmc.permutation.weight_matching` by default on a spec with a residual
stream (:func:`fedlmc.permutation.objective.residual_stream`); one on any other spec.

Measured on the clients of ``configs/vit_quick.toml``'s two-client cells (widths 1 and 4,
depths 2 and 4, seeds 0 to 2: 12 pairs of independently trained ViTs;
``benchmarks/vit_restarts.py``): the stream-first descent alone reached the best objective of
5 in 10 of 12 pairs, 5 descents a higher one in 2 (merged accuracy +0.154 and -0.004); 8
descents a higher one in 5 and 16 in 6, with the merged accuracy moving both ways (+0.15 to
-0.12), so more descents buy objective, not accuracy. A ViT descent cost 0.01 to 0.07 s of
CPU there, 5 of them at most 0.33 s (one thread); a planted permutation ends after the first
(:func:`upper_bound`). A stream-free spec (MLP, VGG) keeps one descent: its cost is unchanged
(``benchmarks/weight_matching.py --before-rev``)."""


def default_restarts(spec: PermutationSpec, state_dict: Mapping[str, Tensor]) -> int:
    """:data:`STREAM_RESTARTS` when ``spec`` has a residual stream, else 1 (a plain chain)."""
    return STREAM_RESTARTS if residual_stream(spec, state_dict) is not None else 1


def check_restarts(restarts: int | None, spec: PermutationSpec, sd: Mapping[str, Tensor]) -> int:
    """``restarts``, or :func:`default_restarts` for ``None``; ``ValueError`` unless >= 1."""
    if restarts is None:
        return default_restarts(spec, sd)
    if isinstance(restarts, bool) or not isinstance(restarts, Integral) or restarts < 1:
        raise ValueError(
            f"restarts must be an integer >= 1 (or None: the default), got {restarts!r}"
        )
    return int(restarts)


def restart_seed(seed: int, restart: int) -> int:
    """The seed of descent ``restart``: ``seed`` itself for the first, then one derived from
    ``(seed, restart)``."""
    if restart == 0:
        return int(seed)
    return int(np.random.SeedSequence([int(seed), int(restart)]).generate_state(1)[0])


def upper_bound(
    spec: PermutationSpec, sd_a: Mapping[str, Tensor], sd_b: Mapping[str, Tensor]
) -> float:
    r"""Cauchy-Schwarz bound :math:`J(\pi) \le \sum_w \lVert W_a \rVert \lVert W_b \rVert`
    of every permutation's objective (float64); reached by a planted permutation of a model."""
    total = 0.0
    for key in spec.axes_to_perm:
        if is_scored(key):
            a, b = sd_a[key].detach(), sd_b[key].detach()
            total += math.sqrt(dot64(a, a)) * math.sqrt(dot64(b, b))
    return total


BOUND_TOLERANCE = 1e-9
"""A descent whose exact objective is within this relative distance of :func:`upper_bound` is
optimal: the remaining restarts are skipped."""
