r"""The flatness control ``random_direction``: one endpoint moved by a random step of the
plain average's length.

Is the plain average of two wide models good only because their minima are flat? With
:math:`\bar\theta = w_0 \theta_0 + w_1 \theta_1` the plain average, the step from client 0 to it
is :math:`s = \bar\theta - \theta_0 = w_1 (\theta_1 - \theta_0)`. The control replaces that step
by a random one of the same length:

.. math::

    \theta_{\mathrm{rd}} = \theta_0 + \|s\| \, \frac{g}{\|g\|}, \qquad
    g_k \sim \mathcal N(0, 1) \text{ i.i.d. per entry},

over the *parameters* (weights and biases; BatchNorm running statistics and integer counters are
not parameters: client 0's are kept, and the study re-estimates BatchNorm statistics after every
merge anyway). Norms are over every parameter entry together, computed in float64; :math:`g` is
drawn in float64 on the CPU from a generator seeded by the cell's ``seed``, so the direction is
the same on every device. If the merged model is much worse than the average at the same
distance from client 0, the average is not good merely because the minimum is flat.

Defined for two clients (the step to the average of N clients is
:math:`\sum_{i \ge 1} w_i (\theta_i - \theta_0)`, but the reviewers' control is the two-model
one): the method is registered ``many_clients = False`` and has no path between the clients
(``on_path = False``: its barrier and path columns are NaN; compare its ``merge_gap_*`` with the
plain average's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from fedlmc.columns import Column

if TYPE_CHECKING:
    from torch import Tensor, nn

    StateDict = dict[str, Tensor]

__all__ = ["RANDOM_DIRECTION_COLUMNS", "parameter_keys", "random_step"]

SEED_TAG = 0x5EED_D1
"""Mixed with the cell's seed so the direction's stream differs from the training streams."""

RANDOM_DIRECTION_COLUMNS = (
    Column(
        "random_direction_step_norm",
        "length of the random step the flatness control took from client 0",
        "`random_direction`, `random_direction_t` rows",
        "`||w_1 (theta_1 - theta_0)||`, the L2 norm over every parameter (weights and biases, no "
        "BatchNorm buffers) of the step from client 0 to the plain average; the control moves "
        "client 0 by a Gaussian direction scaled to exactly this length",
    ),
)
"""The column the ``random_direction`` method fills."""


def parameter_keys(template: nn.Module) -> list[str]:
    """The state-dict keys of ``template``'s parameters (weights and biases), in order."""
    return [name for name, _ in template.named_parameters()]


def global_norm(tensors: Sequence[Tensor]) -> float:
    r""":math:`\sqrt{\sum_k \|t_k\|^2}` over ``tensors``, in float64."""
    return float(sum(float(t.double().pow(2).sum()) for t in tensors) ** 0.5)


def gaussian_direction(shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, Tensor]:
    """One i.i.d. standard-normal float64 tensor per key, drawn on the CPU in key order from a
    generator seeded by ``(seed, SEED_TAG)``: the same direction for the same seed anywhere."""
    import numpy as np
    import torch

    mixed = int(np.random.SeedSequence([int(seed), SEED_TAG]).generate_state(1)[0])
    generator = torch.Generator().manual_seed(mixed)
    return {
        key: torch.randn(shape, generator=generator, dtype=torch.float64)
        for key, shape in shapes.items()
    }


def random_step(
    start: StateDict, target: StateDict, keys: Sequence[str], seed: int
) -> tuple[StateDict, float]:
    r"""``start`` moved along a seeded Gaussian direction by exactly
    :math:`\|target - start\|` (over ``keys``; other entries kept from ``start``), and that
    length. A zero step leaves ``start`` unchanged."""
    step = {k: target[k].double() - start[k].double() for k in keys}
    length = global_norm(list(step.values()))
    direction = gaussian_direction({k: tuple(start[k].shape) for k in keys}, seed)
    scale = length / global_norm(list(direction.values())) if length > 0 else 0.0
    moved = dict(start)
    for k in keys:
        delta = (direction[k] * scale).to(start[k].device)
        moved[k] = (start[k].double() + delta).to(start[k].dtype)
    return moved, length
