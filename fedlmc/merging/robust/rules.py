r"""Robust aggregation rules as one-shot merge methods: coordinate-wise median, trimmed mean,
Krum and multi-Krum, the rules Flower ships for FedAvg rounds (``FedMedian``,
``FedTrimmedAvg``, ``Krum``, ``MultiKrum``), applied once to the clients' trained models.

For clients :math:`\theta_1, \dots, \theta_N` of one architecture, in one basis (they start from
a shared initialisation, as FedAvg's rounds do; with independent initialisations the rules mix
unrelated units like the plain average does), each rule is computed per floating tensor in
float64 and cast back:

- ``median`` (Flower's ``aggregate_median``): per coordinate :math:`c`,
  :math:`\bar\theta[c] = \mathrm{median}_i\, \theta_i[c]` (for even :math:`N` the mean of the
  two middle values, as ``np.median``). The weights are ignored (Flower's rule is unweighted).
- ``trimmed_mean`` (``aggregate_trimmed_avg``, option ``trim_fraction`` :math:`\beta \in [0,
  0.5)`, default :data:`TRIM_FRACTION`, Flower's ``FedTrimmedAvg(beta=0.2)``): per coordinate,
  the :math:`N` values sorted, :math:`k = \lfloor \beta N \rfloor` dropped at each end and the
  rest averaged, :math:`\bar\theta[c] = \frac{1}{N - 2k} \sum_{r=k+1}^{N-k} \theta_{(r)}[c]`.
  Unweighted. With :math:`\beta = 0.2` nothing is trimmed below 5 clients (:math:`k = 0`: the
  unweighted mean).
- ``krum`` (``aggregate_krum``, Blanchard et al., NeurIPS 2017; option ``krum_byzantine``
  :math:`f`, default :data:`KRUM_BYZANTINE`, Flower's): with :math:`d_{ij} = \lVert \theta_i -
  \theta_j \rVert^2` over every floating tensor, client :math:`i`'s score is the sum of its
  :math:`N - f - 2` smallest :math:`d_{ij}` (:math:`j \ne i`), and the merge is the client of
  the lowest score, :math:`\bar\theta = \theta_{i^*}`, :math:`i^* = \arg\min_i s_i`.
- ``multi_krum`` (option ``krum_select`` :math:`m`, default :data:`KRUM_SELECT`, Flower's
  ``MultiKrum``): the :math:`m` clients of the lowest scores, averaged at their weights
  renormalised, :math:`\bar\theta = \sum_{i \in S} w_i \theta_i / \sum_{i \in S} w_i` (Flower
  weights them by their examples). With :math:`m = 1` it is ``krum``.

Krum needs :math:`N \ge 2f + 3` clients (:math:`N - f - 2 > f`: an honest client's nearest
neighbours outnumber the attackers) and :math:`1 \le m \le N - f`; :func:`check_krum` refuses
anything else in one line. Each method's one refusal asks the same before any work, at the
method options (its ``min_clients``, a function of ``krum_byzantine`` and ``krum_select``): the
run config's check with ``min-clients`` clients (:mod:`fedlmc.simulations.config`) and
``merge_states``. Integer and bool tensors (BatchNorm's
``num_batches_tracked``) take the elementwise maximum over the clients the rule uses, as the
plain average does; Flower's Krum also counts them in its distances, these rules do not (a
count of batches is no weight). ``krum`` and ``multi_krum`` report which clients they kept
(:data:`KRUM_COLUMNS`).

Every rule needs each model in the clear (``server_sees = "each model"``): none runs under
secure aggregation. The study evaluates each with ``on_path = False`` (the merge is no point on a
path between the clients: barrier columns NaN, compared by their ``merge_gap_*`` columns;
:mod:`fedlmc.study.builtin_evaluations`).

This module imports no torch at import time (the registry imports it to register
the methods); each method imports what it needs when it runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fedlmc.columns import Column
from fedlmc.merging.merge_job import Alignment, MergeJob
from fedlmc.merging.method_registry import builtin_method

if TYPE_CHECKING:
    from torch import Tensor

    StateDict = dict[str, Tensor]

__all__ = [
    "KRUM_BYZANTINE",
    "KRUM_COLUMNS",
    "KRUM_SELECT",
    "TRIM_FRACTION",
    "check_krum",
    "check_trim_fraction",
    "coordinate_median",
    "krum_scores",
    "krum_selection",
    "trimmed_mean",
]

TRIM_FRACTION = 0.2
"""Default ``trim_fraction`` (Flower's ``FedTrimmedAvg`` ``beta``)."""
KRUM_BYZANTINE = 0
"""Default ``krum_byzantine`` :math:`f` (Flower's ``Krum`` ``num_malicious_nodes``)."""
KRUM_SELECT = 1
"""Default ``krum_select`` :math:`m` (Flower's ``MultiKrum`` ``num_nodes_to_select``)."""

KRUM_COLUMNS = (
    Column(
        "krum_selected",
        "clients Krum kept",
        "`krum`, `multi_krum` rows (and `_t`)",
        "JSON list of the kept clients' indices in partition order (0 = the lowest partition id "
        "that survived the screen), lowest score first; the others are left out of the merge",
        kind="JSON",
    ),
)
"""The column ``krum`` and ``multi_krum`` fill."""


def check_trim_fraction(fraction: Any) -> float:
    """``fraction`` as a float if it is a number in ``[0, 0.5)``; ``ValueError`` otherwise."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise ValueError(f"trim_fraction = {fraction!r}; allowed: a number in [0, 0.5)")
    if not 0.0 <= float(fraction) < 0.5:
        raise ValueError(f"trim_fraction = {fraction!r}; allowed: a number in [0, 0.5)")
    return float(fraction)


def check_krum(clients: int, byzantine: int, select: int = 1) -> None:
    r"""``ValueError`` in one line unless :math:`f \ge 0`, :math:`N \ge 2f + 3` and
    :math:`1 \le m \le N - f` (``clients`` :math:`N`, ``byzantine`` :math:`f`, ``select``
    :math:`m`; module docstring)."""
    _check_krum_options(byzantine, select)
    if clients < 2 * byzantine + 3:
        raise ValueError(
            f"Krum with krum_byzantine = {byzantine} needs at least 2f + 3 = "
            f"{2 * byzantine + 3} clients; got {clients}"
        )
    if select > clients - byzantine:
        raise ValueError(
            f"krum_select = {select} with {clients} clients and krum_byzantine = {byzantine}; "
            f"allowed: 1 .. {clients - byzantine} (N - f)"
        )


def _check_krum_options(byzantine: Any, select: Any) -> None:
    for name, value, low in (("krum_byzantine", byzantine, 0), ("krum_select", select, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} = {value!r}; allowed: an integer >= {low}")


def _krum_min_clients(options: Mapping[str, Any]) -> tuple[int, str]:
    r"""The fewest clients Krum accepts at its ``options``, :math:`2f + 3`, and why (its
    ``min_clients``, :data:`fedlmc.merging.method_registry.MinClients`)."""
    byzantine = options.get("krum_byzantine", KRUM_BYZANTINE)
    _check_krum_options(byzantine, 1)
    return 2 * byzantine + 3, f" (2 x krum_byzantine + 3, krum_byzantine = {byzantine})"


def _multi_krum_min_clients(options: Mapping[str, Any]) -> tuple[int, str]:
    r"""The fewest clients multi-Krum accepts at its ``options``: :math:`2f + 3`, and at least
    :math:`m + f` (:math:`m \le N - f`), and why."""
    byzantine = options.get("krum_byzantine", KRUM_BYZANTINE)
    select = options.get("krum_select", KRUM_SELECT)
    _check_krum_options(byzantine, select)
    if select + byzantine <= 2 * byzantine + 3:
        return _krum_min_clients(options)
    why = f"krum_select = {select}, krum_byzantine = {byzantine}"
    return select + byzantine, f" (krum_select + krum_byzantine, {why})"


def _floating_keys(state: Mapping[str, Tensor]) -> list[str]:
    return [k for k, v in state.items() if v.is_floating_point()]


def _per_key(
    states: Sequence[Mapping[str, Tensor]], rule, keep: Sequence[int] | None = None
) -> StateDict:
    """``rule(stacked float64 values, (N, ...))`` for every floating key, cast back; the
    elementwise maximum over the clients of ``keep`` (default: all) for the other keys."""
    import torch

    used = list(range(len(states))) if keep is None else list(keep)
    merged: StateDict = {}
    for key, ref in states[0].items():
        if ref.is_floating_point():
            stacked = torch.stack([s[key].detach().to(torch.float64) for s in states])
            merged[key] = rule(stacked).to(ref.dtype)
        else:
            merged[key] = torch.stack([states[i][key].detach() for i in used]).amax(dim=0)
    return merged


def coordinate_median(states: Sequence[Mapping[str, Tensor]]) -> StateDict:
    r"""Per coordinate the median over the clients (module docstring; even :math:`N`: the mean
    of the two middle values)."""

    def median(stacked: Tensor) -> Tensor:
        ordered = stacked.sort(dim=0).values
        n = ordered.shape[0]
        return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2

    return _per_key(states, median)


def trimmed_mean(states: Sequence[Mapping[str, Tensor]], fraction: float) -> StateDict:
    r"""Per coordinate the mean of the values left after dropping the
    :math:`\lfloor \beta N \rfloor` lowest and highest (module docstring)."""
    beta = check_trim_fraction(fraction)
    cut = int(beta * len(states))

    def trim(stacked: Tensor) -> Tensor:
        ordered = stacked.sort(dim=0).values
        return ordered[cut : ordered.shape[0] - cut].mean(dim=0)

    return _per_key(states, trim)


def squared_distances(states: Sequence[Mapping[str, Tensor]]) -> list[list[float]]:
    r""":math:`d_{ij} = \lVert \theta_i - \theta_j \rVert^2` over the floating tensors, in
    float64 (each pair's difference taken exactly, no Gram-matrix cancellation)."""
    import torch

    n = len(states)
    distances = [[0.0] * n for _ in range(n)]
    for key in _floating_keys(states[0]):
        flat = [s[key].detach().to(torch.float64).reshape(-1) for s in states]
        for i in range(n):
            for j in range(i + 1, n):
                d = float((flat[i] - flat[j]).square().sum())
                distances[i][j] += d
                distances[j][i] += d
    return distances


def krum_scores(states: Sequence[Mapping[str, Tensor]], byzantine: int) -> list[float]:
    r"""Each client's Krum score: the sum of its :math:`N - f - 2` smallest squared distances
    to the other clients (module docstring)."""
    check_krum(len(states), byzantine)
    distances = squared_distances(states)
    nearest = len(states) - byzantine - 2
    return [
        math.fsum(sorted(d for j, d in enumerate(row) if j != i)[:nearest])
        for i, row in enumerate(distances)
    ]


def krum_selection(
    states: Sequence[Mapping[str, Tensor]], byzantine: int, select: int
) -> list[int]:
    """The ``select`` clients of the lowest Krum scores, lowest first (ties: the lower index)."""
    check_krum(len(states), byzantine, select)
    scores = krum_scores(states, byzantine)
    return sorted(range(len(states)), key=lambda i: (scores[i], i))[:select]


def _krum_alignment(job: MergeJob, select: int) -> Alignment:
    from fedlmc.averaging import average

    byzantine = job.options.get("krum_byzantine", KRUM_BYZANTINE)
    kept = krum_selection(job.states, byzantine, select)
    merged = average([job.states[i] for i in kept], [job.weights[i] for i in kept])
    return Alignment(list(job.states), merged, {"krum_selected": json.dumps(kept)})


@builtin_method(
    "median",
    description="coordinate-wise median of the clients (Flower's FedMedian rule, once; unweighted)",
)
def median_merge(job: MergeJob) -> Alignment:
    r""":math:`\bar\theta[c] = \mathrm{median}_i\, \theta_i[c]` (:func:`coordinate_median`)."""
    return Alignment(list(job.states), coordinate_median(job.states))


@builtin_method(
    "trimmed_mean",
    description="coordinate-wise mean after trimming floor(trim-fraction x N) clients at each "
    "end (Flower's FedTrimmedAvg rule, once; unweighted)",
)
def trimmed_mean_merge(job: MergeJob) -> Alignment:
    """The trimmed mean at ``job.options["trim_fraction"]`` (default :data:`TRIM_FRACTION`)."""
    fraction = job.options.get("trim_fraction", TRIM_FRACTION)
    return Alignment(list(job.states), trimmed_mean(job.states, fraction))


@builtin_method(
    "krum",
    min_clients=_krum_min_clients,
    description="Krum: the one client closest to its N - f - 2 nearest others (Flower's Krum "
    "rule, once; needs N >= 2f + 3)",
)
def krum_merge(job: MergeJob) -> Alignment:
    """The client of the lowest Krum score (:func:`krum_selection` with :math:`m = 1`)."""
    return _krum_alignment(job, 1)


@builtin_method(
    "multi_krum",
    min_clients=_multi_krum_min_clients,
    description="multi-Krum: the weighted average of the krum-select clients of the lowest "
    "Krum scores (Flower's MultiKrum rule, once)",
)
def multi_krum_merge(job: MergeJob) -> Alignment:
    """The ``krum_select`` clients of the lowest scores, averaged at their weights."""
    return _krum_alignment(job, job.options.get("krum_select", KRUM_SELECT))
