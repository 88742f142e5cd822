r"""The post-merge pipeline, written once: BatchNorm re-estimation, REPAIR, temperature.

A merge method (:mod:`fedlmc.merging.method_registry`) turns the clients :math:`\theta_i` and their
weights :math:`w_i` into merged weights :math:`\bar\theta` and the clients in the merged basis
:math:`\pi_i(\theta_i)`. Three data-dependent steps then finish the merged model, in this order:

1. **BatchNorm re-estimation** (:func:`fedlmc.merging.calibrate.apply_bn_statistics`): every
   BatchNorm layer's running mean and variance are set from the per-channel sums of its inputs over
   the data, the merged model running in train mode (Jordan et al. 2023: averaging breaks the
   running statistics; for BatchNorm models this reset *is* REPAIR).
2. **REPAIR** (:func:`fedlmc.merging.repair.repair_with_statistics`): every hidden unit of a model
   without BatchNorm is rescaled so that its pre-activation mean and std match the weighted
   mean of the endpoints' (:math:`\mu_t = \sum_i w_i \mu_i`, :math:`\sigma_t = \sum_i w_i
   \sigma_i`).
3. **Temperature** (:func:`calibrate`): one softmax temperature :math:`T` minimising the NLL
   of :math:`\mathrm{softmax}(f(x; \bar\theta) / T)` on the calibration data; it never changes
   the accuracy. A :math:`T` at an end of the fit's range is said
   (:mod:`fedlmc.merging.temperature_bound`).

:func:`post_merge` runs steps 1 and 2 and :func:`calibrate` step 3. The study
(:func:`fedlmc.study.compare_methods`) and the strategies (:mod:`fedlmc.strategies.one_shot`) both
call them; what differs is only where the statistics come from, a
:class:`StatisticsSource`:

- :class:`ServerData`: the server's own held-out split, tensors in memory (the study; the
  strategies with ``calibration = "server"``, and for BatchNorm with ``"none"``);
- the clients' query rounds (:class:`fedlmc.strategies.queries.ClientRounds`, ``calibration =
  "federated"``): each client returns sums over its own data (``query.bn_stats``,
  ``query.unit_stats``, ``query.temperature``) and the server adds them; the sums are exact,
  so the result equals the centralised one on the union of the clients' data.

**The guards** (decided here, once):

- BatchNorm statistics are re-estimated when the model has a BatchNorm layer that tracks
  running statistics and the merge method does not opt out (``reestimate_bn``; a method whose
  combination rule is not a weighted mean of the statistics, such as ``average_lewc_bias``,
  does). Without a statistics source the running statistics are kept, with a warning: only a
  strategy with ``calibration = "none"`` and no server data gets there.
- REPAIR runs when the method asks for it (``repair``), the model has **no** BatchNorm and
  there are at least two endpoints. For a BatchNorm model REPAIR reduces to step 1, whether or
  not the method re-estimates (so the study's former guard, "REPAIR unless BatchNorm was
  re-estimated", was wrong for a BatchNorm model whose method opts out of re-estimation: it
  handed a BatchNorm model to REPAIR, which refuses it; the strategies' guard, kept here, is
  right). With one endpoint the merge *is* that client and REPAIR's targets are its own
  statistics, so it is skipped (it would cost ``L`` query rounds for nothing). REPAIR without a
  statistics source is a ``ValueError`` (the REPAIR methods need server data or the clients').
- The temperature is fitted on the calibration source; without one :math:`T = 1`. LEWC's
  prediction (:class:`fedlmc.merging.lewc_temperature.LewcPrediction`) is a source without data:
  its :math:`T` is computed, not fitted.

This module imports no torch at import time (the run-config validation reads
:data:`CALIBRATIONS` without loading torch); each function imports what it needs when it runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from fedlmc.merging.calibrate import BNStats
    from fedlmc.merging.method_registry import MergeMethod
    from fedlmc.merging.repair import UnitStats

    StateDict = dict[str, Tensor]

__all__ = [
    "CALIBRATIONS",
    "Calibration",
    "PostMerged",
    "ServerData",
    "StatisticsSource",
    "calibrate",
    "post_merge",
    "reestimates_batchnorm",
    "repairs",
]

CALIBRATIONS = ("server", "federated", "lewc", "none")
"""Where a strategy's post-merge statistics come from: ``server`` (:class:`ServerData`),
``federated`` (the clients' query rounds), ``lewc`` (no data: :math:`T` predicted from the
chain's depth and the clients' weights, :class:`fedlmc.merging.lewc_temperature.LewcPrediction`;
the plain average of norm-free chains only) or ``none`` (:math:`T = 1`; BatchNorm statistics
still re-estimated on the server data when there is some)."""

NO_SOURCE = "none"


class StatisticsSource(Protocol):
    """Where the post-merge steps take their data from (see the module docstring).

    ``name`` says which (``server`` or ``federated``: what a result's ``bn_source`` records).
    Every method gets the model to measure (on its device, in eval mode) and leaves it as it
    was; the sums are over all the source's data.
    """

    name: str

    def bn_statistics(self, model: nn.Module) -> Mapping[str, BNStats]:
        """Per BatchNorm layer: the per-channel sums of its inputs (train-mode forward)."""
        ...

    def unit_statistics(self, model: nn.Module, layers: Sequence[str]) -> Mapping[str, UnitStats]:
        """Per layer of ``layers`` (Linear/Conv): the per-unit sums of its outputs (eval mode)."""
        ...

    def temperature(self, model: nn.Module) -> tuple[float, list[dict[str, float]]]:
        """``(T, history)``: the temperature minimising the model's mean NLL on the data, and
        the fit's rounds (empty for a fit in one place)."""
        ...


@dataclass(frozen=True)
class ServerData:
    """A :class:`StatisticsSource` on tensors held by the server: inputs ``x`` and labels ``y``
    (the server split). Batch sizes are those of :func:`fedlmc.merging.calibrate.bn_statistics`,
    :func:`fedlmc.merging.repair.unit_statistics` and :func:`fedlmc.evaluation.predict_logits`."""

    x: Tensor
    y: Tensor
    name: str = "server"

    def bn_statistics(self, model: nn.Module) -> dict[str, BNStats]:
        from fedlmc.merging.calibrate import bn_statistics

        return bn_statistics(model, self.x)

    def unit_statistics(self, model: nn.Module, layers: Sequence[str]) -> dict[str, UnitStats]:
        from fedlmc.merging.repair import unit_statistics

        return unit_statistics(model, self.x, layers)

    def temperature(self, model: nn.Module) -> tuple[float, list[dict[str, float]]]:
        from fedlmc.evaluation import model_device, predict_logits
        from fedlmc.merging.calibrate import fit_temperature

        logits = predict_logits(model, self.x, device=model_device(model))
        return float(fit_temperature(logits, self.y)), []


@dataclass(frozen=True)
class PostMerged:
    """The finished merged model (on the device, eval mode), its weights (detached CPU copies),
    where its BatchNorm statistics came from (``bn_source``: a source's ``name``, or ``none``:
    not re-estimated) and whether REPAIR ran."""

    model: nn.Module
    state: StateDict
    bn_source: str
    repaired: bool

    @property
    def bn_reestimated(self) -> bool:
        return self.bn_source != NO_SOURCE


@dataclass(frozen=True)
class Calibration:
    """The fitted temperature and the rounds of its fit (empty for a fit in one place)."""

    temperature: float
    history: tuple[Mapping[str, float], ...] = ()


def reestimates_batchnorm(model: nn.Module, method: MergeMethod) -> bool:
    """Whether ``model`` (merged by ``method``) gets its BatchNorm statistics re-estimated."""
    from fedlmc.merging.calibrate import has_batchnorm

    return method.rule.reestimate_bn and has_batchnorm(model)


def repairs(model: nn.Module, method: MergeMethod, endpoints: int) -> bool:
    """Whether ``model`` (merged by ``method`` from ``endpoints`` clients) is repaired."""
    from fedlmc.merging.calibrate import has_batchnorm

    return method.rule.repair and endpoints >= 2 and not has_batchnorm(model)


def _reestimate_batchnorm(
    model: nn.Module, method: MergeMethod, statistics: StatisticsSource | None
) -> str:
    """BatchNorm statistics from ``statistics`` in place; returns their source's name."""
    from fedlmc.merging.calibrate import apply_bn_statistics

    if not reestimates_batchnorm(model, method):
        return NO_SOURCE
    if statistics is None:
        warnings.warn(
            f"BatchNorm model merged by {method.name!r} without a statistics source (no server "
            "data, calibration 'none'): running statistics kept",
            RuntimeWarning,
            stacklevel=3,
        )
        return NO_SOURCE
    apply_bn_statistics(model, statistics.bn_statistics(model))
    model.eval()
    return statistics.name


def post_merge(
    template: nn.Module,
    merged: Mapping[str, Tensor],
    aligned: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    method: str,
    statistics: StatisticsSource | None,
    *,
    device: str | torch.device | None = None,
) -> PostMerged:
    r"""Steps 1 and 2 of the pipeline on the weights ``merged`` of merge ``method``.

    ``template`` gives the architecture, ``aligned`` are the clients in the merged basis (the
    REPAIR endpoints) with their normalised ``weights``, and ``statistics`` the data source
    (``None``: none; see the module docstring for the guards). The model runs on ``device``
    (default :func:`fedlmc.evaluation.default_device`).
    """
    from fedlmc.averaging import load_state
    from fedlmc.evaluation import resolve_device
    from fedlmc.merging.method_registry import merge_method
    from fedlmc.merging.repair import repair_with_statistics

    entry = merge_method(method)
    dev = resolve_device(device)
    model = load_state(template, merged).to(dev).eval()
    bn_source = _reestimate_batchnorm(model, entry, statistics)
    repaired = repairs(model, entry, len(aligned))
    if repaired:
        if statistics is None:
            raise ValueError(
                f"merge method {entry.name!r} repairs the merged model and needs data for it: "
                "server data or the clients' (calibration = 'federated'); got none"
            )
        endpoints = [load_state(template, sd).to(dev).eval() for sd in aligned]
        model = repair_with_statistics(model, endpoints, weights, statistics.unit_statistics)
        model.eval()
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return PostMerged(model, state, bn_source, repaired)


def calibrate(
    model: nn.Module, statistics: StatisticsSource | None, *, warn: bool = True
) -> Calibration:
    """Step 3: the temperature fitted on ``statistics`` (``None``: :math:`T = 1`). A
    temperature at an end of the fit's range is said in one line, a
    :class:`~fedlmc.merging.temperature_bound.TemperatureAtBoundWarning` (``warn=False``: not
    here, for a caller that says it in its own log, as the strategies do)."""
    from fedlmc.merging.temperature_bound import warn_at_bound

    if statistics is None:
        return Calibration(1.0)
    temperature, history = statistics.temperature(model)
    if warn:
        warn_at_bound("the merged model", float(temperature))
    return Calibration(float(temperature), tuple(history))
