r"""The robust screen: each client's reply against the other clients' (poisoned but well-formed).

The per-reply screen (:mod:`fedlmc.strategies.screening`) refuses what no honest client can send;
this one refuses what is far outside what the *other* clients sent. A one-shot merge is decided by
one reply per client, so a client sending a well-formed but poisoned model (weights scaled by 100,
every weight 9.9e5, BatchNorm statistics shifted to 1e4, ...) must be refused on its own reply.

**Relative rule** (:class:`RobustScreen`, factor :math:`k`, run-config ``outlier-factor``,
default :data:`DEFAULT_OUTLIER_FACTOR`). For a statistic :math:`x_i \ge 0` of every client
:math:`i` and its median :math:`m = \mathrm{median}_j x_j` over the clients of the round, client
:math:`i` is dropped when

.. math:: x_i > k\,m .

Only values far *above* the median are refused: an honest client with a small partition trains
few steps and its BatchNorm running statistics stay near their start (in the calibration runs
such a client's norm fell to 0.07 of the median), and a client sending weights shrunk towards 0
moves the merge by at most its share towards 0.

The statistics:

- **train replies** (:func:`weight_outliers`): per floating tensor, the norm per output row
  :math:`\lVert W \rVert / \sqrt{\text{rows}}` (the RMS for a vector; with Kaiming's
  initialisation it does not depend on the width, so clients of different widths compare);
  BatchNorm running statistics are tensors of the state, so they are screened with the weights.
  And the direction: the cosine between the client's weights (every floating tensor, concatenated)
  and the coordinate-wise median of all clients' must be at least :data:`MIN_COSINE` (a negated
  model under a shared initialisation; independently initialised honest clients all have a
  positive cosine with the median they are part of; clients of different widths have no
  coordinate-wise median, so only their norms are compared);
- **moments replies** (``query.bn_stats``, ``query.unit_stats``, :func:`moments_outliers`): per
  layer, the RMS over units of the per-unit root mean square :math:`\sqrt{S_2/n}` (a mean shifted
  to 1e4 gives 1e4);
- **temperature replies** (:func:`nll_outliers`): the per-sample NLL at each :math:`\log T` asked
  may not exceed :math:`k (m + \log K)` (:math:`K` classes; no lower limit: an NLL near 0 is
  honest at small :math:`T`).

The median of two values is their mean and cannot tell which of two clients is the attacker, so
the relative rule runs only with at least :data:`MIN_CLIENTS` (3) clients, and it protects only
while fewer than half of them are poisoned (else the median is the attackers'). A client within
the factor still moves the merge by its share (at most :math:`k` times an honest norm).

**Exact bounds** (:func:`check_temperature_bounds`, any number of clients). With :math:`a = z/T`,
:math:`p = \mathrm{softmax}(a)` and :math:`\ell = \mathrm{lse}(a) - a_y`, the derivative in
:math:`u = \log T` is :math:`\ell_u = a_y - E_p[a] = H(p) - \ell` with :math:`0 \le H(p) \le \log
K`, and :math:`\ell_{uu} = \mathrm{Var}_p(a) - \ell_u`. So every honest reply satisfies

.. math:: -\textstyle\sum\ell \;\le\; \sum\ell_u \;\le\; n\log K - \sum\ell,
          \qquad \sum\ell_{uu} + \sum\ell_u \ge 0,

and a gradient sum of 1e300 cannot pass whatever the other clients sent.

**The client check** (:func:`copy_outliers`, :func:`accuracy_outliers`; ``client_check``,
run-config ``client-check``), before the merge. *Copies* (any number of clients): a client whose
floating weights are within a relative distance :data:`COPY_TOLERANCE` of an earlier client's
(partition order),

.. math:: \lVert \theta_i - \theta_j \rVert \le \tau \lVert \theta_j \rVert, \qquad j < i,

sent a copy (a free rider: bit-identical, or rounded) and is dropped, the first kept (a copy
adds no model, only a second weight for one). Honest clients train from their own seeds on
their own data and are far apart; a free rider who adds noise above :math:`\tau` is not
caught. *Server split* (3 or more clients, where the server holds data): client :math:`i`'s own
accuracy :math:`a_i` on the server split (:math:`n` examples, :math:`K` classes) against chance
and against the others'. With :math:`m = \mathrm{median}_j a_j`, :math:`\mathrm{MAD} =
\mathrm{median}_j |a_j - m|` and the chance floor

.. math:: f = \frac{1}{K} - \zeta \sqrt{\frac{(1/K)(1 - 1/K)}{n}}

(a random guess scores :math:`1/K` in expectation whatever the classes' shares; :math:`\zeta`
= :data:`ACCURACY_ERRORS` standard errors below it), client :math:`i` is dropped when

.. math:: a_i < \min\bigl(f,\; m - \max(\delta, \kappa\,\mathrm{MAD})\bigr),

:math:`\delta` = :data:`ACCURACY_MARGIN`, :math:`\kappa` = :data:`ACCURACY_SPREAD`. A model
further below a random guess than sampling explains is systematically wrong: a label flipper
(trained honestly on permuted labels) scores near 0 on the true labels, a negated output layer
picks the least likely class. An honest client scores about chance or more, however far below
the others (2 epochs: 0.117 beside a median of 0.465; with 3 clients the MAD is often 0), so
the second term alone (the rule before issue 53) dropped honest clients; beside a median 0.2
above the floor no honest client of ``benchmarks/screen_false_drops.py`` scored below 0.100.
The second term keeps a federation whose median is itself near chance from dropping anyone
(there an honest client scored 0.048). With
fewer than :math:`\zeta^2 (K - 1)` server examples (81 for 10 classes) the floor is below 0 and
no client is dropped by accuracy. Like the relative rule it protects only while fewer than half
are poisoned, and it sees only accuracy: a client above the floor is merged whatever it sent
(a partial label flipper that keeps some accuracy, scaled weights that keep the argmax, a
backdoor). With clients whose data differ by design (Dirichlet, pathological, shard
partitions) the run config's ``client-check = "auto"`` checks copies only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

DEFAULT_OUTLIER_FACTOR = 10.0
"""Default ``outlier-factor``: a statistic more than 10 times the median over the clients drops
the client (honest clients stayed within 4.2 in the calibration runs, docs/reliability.md)."""
MIN_CLIENTS = 3
"""Fewest clients the relative rule needs (the median of two cannot tell which one is wrong)."""
MIN_COSINE = 0.0
"""Smallest cosine between a client's weights and the coordinate-wise median of all clients'."""
ROUNDING = 1e-6
"""Relative slack of the exact temperature bounds (float64 sums over many samples)."""


CLIENT_CHECKS = ("server-split", "copies", "off")
"""The client checks (module docstring): copies and the server-split accuracy, copies only,
none."""
COPY_TOLERANCE = 1e-6
r"""Relative distance :math:`\tau` below which a client's weights are a copy of another's."""
ACCURACY_MARGIN = 0.2
r"""Least drop :math:`\delta` below the median server-split accuracy that names a client."""
ACCURACY_SPREAD = 3.0
r""":math:`\kappa`: the drop must also exceed this many median absolute deviations."""
ACCURACY_ERRORS = 3.0
r""":math:`\zeta`: how many standard errors of a random guess's accuracy the chance floor lies
below :math:`1/K`."""


FACTOR_OFF = "to turn this check off: outlier-factor = 1e300"
"""What every reason of the relative rule ends with: the run-config setting that turns it off."""
COPIES_OFF = 'to turn this check off: client-check = "off"'
"""What the copy check's reason ends with (``client_check = "off"`` in
``StrategyOptions``)."""
ACCURACY_OFF = 'to turn this check off: client-check = "copies"'
"""What the accuracy check's reason ends with (``client_check = "copies"`` in
``StrategyOptions``)."""


class OutlierError(ValueError):
    """A statistic is outside the relative rule (the message is the reason)."""


@dataclass(frozen=True)
class RobustScreen:
    """The relative rule's factor (``math.inf`` turns the relative rule off; the exact
    temperature bounds stay)."""

    factor: float = DEFAULT_OUTLIER_FACTOR

    def __post_init__(self) -> None:
        if isinstance(self.factor, bool) or not self.factor > 1:
            raise ValueError(f"outlier_factor = {self.factor!r}; allowed: a number > 1 (or inf)")

    def applies(self, clients: int) -> bool:
        """Whether the relative rule runs on ``clients`` replies."""
        return math.isfinite(self.factor) and clients >= MIN_CLIENTS


OFF = RobustScreen(math.inf)
"""No relative rule (in-process studies on trusted models)."""


def ratio_outliers(values: Sequence[float], factor: float, what: str) -> dict[int, str]:
    r"""Index -> reason for every ``values[i]`` above ``factor`` times their median (module
    docstring); none below :data:`MIN_CLIENTS`."""
    if len(values) < MIN_CLIENTS or not math.isfinite(factor):
        return {}
    centre = float(torch.tensor(values, dtype=torch.float64).median())
    found = {}
    for index, value in enumerate(values):
        if value > factor * centre:
            ratio = value / centre if centre > 0 else math.inf
            found[index] = (
                f"{what} is {value:.3g}, {ratio:.3g} x the median over clients ({centre:.3g}); "
                f"allowed: at most {factor:g} x the median ({FACTOR_OFF})"
            )
    return found


def row_norm(tensor: Tensor) -> float:
    r""":math:`\lVert W\rVert / \sqrt{\text{rows}}` in float64 (the RMS of a vector)."""
    rows = tensor.shape[0] if tensor.ndim >= 2 else tensor.numel()
    return float(tensor.detach().double().norm()) / math.sqrt(max(rows, 1))


def floating_keys(states: Sequence[Mapping[str, Tensor]]) -> list[str]:
    """The keys of non-empty tensors that are floating in every state (first state's order)."""
    first = states[0]
    return [
        key
        for key, tensor in first.items()
        if tensor.is_floating_point()
        and tensor.numel() > 0
        and all(key in state and state[key].is_floating_point() for state in states)
    ]


def median_cosines(states: Sequence[Mapping[str, Tensor]], keys: Sequence[str]) -> list[float]:
    """Per client, the cosine of its weights (``keys`` of equal shape in every state,
    concatenated) with the coordinate-wise median of all clients' weights."""
    dots = [0.0] * len(states)
    norms = [0.0] * len(states)
    centre_norm = 0.0
    for key in keys:
        stacked = torch.stack([s[key].detach().double().reshape(-1) for s in states])
        centre = stacked.median(dim=0).values
        centre_norm += float(centre @ centre)
        for index, row in enumerate(stacked):
            dots[index] += float(row @ centre)
            norms[index] += float(row @ row)
    scale = [math.sqrt(n * centre_norm) for n in norms]
    return [d / s if s > 0 else 1.0 for d, s in zip(dots, scale, strict=True)]


def weight_outliers(states: Sequence[Mapping[str, Tensor]], screen: RobustScreen) -> dict[int, str]:
    """Index -> reason for every state whose per-tensor row norm is above the factor times the
    median, or whose direction opposes the clients' coordinate-wise median (module docstring)."""
    if not states or not screen.applies(len(states)):
        return {}
    keys = floating_keys(states)
    found: dict[int, str] = {}
    for key in keys:
        norms = [row_norm(state[key]) for state in states]
        for index, reason in ratio_outliers(norms, screen.factor, f"the norm of {key!r}").items():
            found.setdefault(index, reason)
    same_shape = all(len({tuple(s[k].shape) for s in states}) == 1 for k in keys)
    if keys and same_shape:  # clients of different widths: no coordinate-wise median
        for index, cosine in enumerate(median_cosines(states, keys)):
            if cosine < MIN_COSINE:
                found.setdefault(
                    index,
                    f"its weights point away from the clients' coordinate-wise median "
                    f"(cosine {cosine:.3g}; allowed: >= {MIN_COSINE:g})",
                )
    return found


def moments_outliers(
    per_client: Sequence[Mapping[str, Any]], screen: RobustScreen
) -> dict[int, str]:
    r"""Index -> reason for every client whose per-layer RMS of :math:`\sqrt{S_2/n}` is above
    the factor times the median (``per_client[i][layer]`` has ``sum_sq`` and ``count``)."""
    if not per_client or not screen.applies(len(per_client)):
        return {}
    found: dict[int, str] = {}
    for layer in per_client[0]:
        rms = []
        for client in per_client:
            stats = client[layer]
            second = torch.as_tensor(stats.sum_sq, dtype=torch.float64) / float(stats.count)
            rms.append(float(second.clamp(min=0).mean().sqrt()))
        what = f"the root mean square of layer {layer!r}"
        for index, reason in ratio_outliers(rms, screen.factor, what).items():
            found.setdefault(index, reason)
    return found


def nll_outliers(
    per_client: Sequence[Sequence[Sequence[Any]]], screen: RobustScreen, num_classes: int
) -> dict[int, str]:
    r"""Index -> reason for every client whose per-sample NLL at some point exceeds
    :math:`k (m + \log K)` (``per_client[c][model][point]``: TemperatureStats)."""
    if not per_client or not screen.applies(len(per_client)):
        return {}
    floor = math.log(max(num_classes, 2))
    found: dict[int, str] = {}
    for model in range(len(per_client[0])):
        for point in range(len(per_client[0][model])):
            nll = [c[model][point].nll_sum / c[model][point].count for c in per_client]
            centre = float(torch.tensor(nll, dtype=torch.float64).median())
            limit = screen.factor * (centre + floor)
            for index, value in enumerate(nll):
                if value > limit and index not in found:
                    found[index] = (
                        f"NLL per sample {value:.3g} (median over clients {centre:.3g}); allowed: "
                        f"<= {screen.factor:g} x (median + log {num_classes}) ({FACTOR_OFF})"
                    )
    return found


def check_temperature_bounds(
    count: float, nll: float, grad: float, hess: float, num_classes: int | None
) -> None:
    r"""Raise :class:`OutlierError` unless :math:`-\sum\ell \le \sum\ell_u \le n\log K -
    \sum\ell` and :math:`\sum\ell_{uu} + \sum\ell_u \ge 0` (module docstring; the upper
    bound only when ``num_classes`` is known)."""
    slack = ROUNDING * (abs(nll) + count * math.log(max(num_classes or 2, 2))) + 1e-9
    if grad < -nll - slack:
        raise OutlierError(
            f"grad-sum {grad:.3g} below -nll-sum ({-nll:.3g}); allowed: -nll-sum <= grad-sum"
        )
    if num_classes is not None and grad > count * math.log(num_classes) - nll + slack:
        top = count * math.log(num_classes) - nll
        raise OutlierError(
            f"grad-sum {grad:.3g} above count x log {num_classes} - nll-sum ({top:.3g}); "
            "allowed: grad-sum <= count x log K - nll-sum"
        )
    if hess + grad < -slack:
        raise OutlierError(
            f"hess-sum {hess:.3g} below -grad-sum ({-grad:.3g}); allowed: hess-sum >= -grad-sum"
        )


def num_classes_of(template: nn.Module) -> int | None:
    """The classes of ``template``'s output: ``model.config["num_classes"]`` for fedlmc's
    models, else the ``out_features`` of its last ``nn.Linear`` (``None`` without one)."""
    config = getattr(template, "config", None)
    if isinstance(config, Mapping) and isinstance(config.get("num_classes"), int):
        return int(config["num_classes"])
    last = [m for m in template.modules() if isinstance(m, nn.Linear)]
    return int(last[-1].out_features) if last else None


def copy_outliers(
    states: Sequence[Mapping[str, Tensor]],
    labels: Sequence[str],
    tolerance: float = COPY_TOLERANCE,
) -> dict[int, str]:
    r"""Index -> reason for every state within relative distance ``tolerance`` of an earlier
    one of the same keys and shapes (module docstring; ``labels[j]`` names state ``j``)."""
    found: dict[int, str] = {}
    for i in range(1, len(states)):
        for j in range(i):
            if j in found or not _same_arrays(states[i], states[j]):
                continue
            gap, size = _distance_and_norm(states[i], states[j])
            if gap <= tolerance * size:
                found[i] = (
                    f"its weights are a copy of {labels[j]}'s (relative distance "
                    f"{gap / size if size else 0.0:.3g}; allowed: > {tolerance:g}; "
                    f"{COPIES_OFF})"
                )
                break
    return found


def _same_arrays(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> bool:
    return a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)


def _distance_and_norm(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> tuple[float, float]:
    r""":math:`\lVert a - b \rVert` and :math:`\lVert b \rVert` over the floating tensors
    (float64)."""
    gap = size = 0.0
    for key, tensor in b.items():
        if tensor.is_floating_point():
            other = a[key].detach().double()
            gap += float((other - tensor.detach().double()).square().sum())
            size += float(tensor.detach().double().square().sum())
    return math.sqrt(gap), math.sqrt(size)


def chance_floor(num_classes: int, examples: int, errors: float = ACCURACY_ERRORS) -> float:
    r"""The chance floor :math:`f = 1/K - \zeta \sqrt{(1/K)(1 - 1/K)/n}` (module docstring):
    ``errors`` standard errors below a random guess's accuracy on ``examples`` examples."""
    if num_classes < 2 or examples < 1:
        raise ValueError(
            f"chance floor of {num_classes} classes on {examples} examples; allowed: at least "
            "2 classes and 1 example"
        )
    chance = 1.0 / num_classes
    return chance - errors * math.sqrt(chance * (1.0 - chance) / examples)


def accuracy_outliers(
    accuracies: Sequence[float],
    floor: float,
    margin: float = ACCURACY_MARGIN,
    spread: float = ACCURACY_SPREAD,
) -> dict[int, str]:
    r"""Index -> reason for every accuracy below :math:`\min(f, m - \max(\delta, \kappa\,
    \mathrm{MAD}))` (module docstring; ``floor`` :math:`f`: :func:`chance_floor`); none below
    :data:`MIN_CLIENTS`."""
    if len(accuracies) < MIN_CLIENTS:
        return {}
    values = torch.tensor(accuracies, dtype=torch.float64)
    centre = float(values.quantile(0.5))
    deviation = float((values - centre).abs().quantile(0.5))
    below_others = centre - max(margin, spread * deviation)
    threshold = min(floor, below_others)
    return {
        index: (
            f"its accuracy on the server split is {value:.3g}, below chance (floor "
            f"{floor:.3g}) and below the median over clients ({centre:.3g}) by more than "
            f"max({margin:g}, {spread:g} x MAD {deviation:.3g}); allowed: >= {threshold:.3g} "
            f"({ACCURACY_OFF})"
        )
        for index, value in enumerate(accuracies)
        if value < threshold
    }
