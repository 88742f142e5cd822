r"""The temperature's query rounds (:class:`TemperatureRounds`): one query on a grid of
:math:`u = \log T` values over ``[log T_MIN, log T_MAX]``, then Newton rounds of one value each
(:func:`fedlmc.merging.calibrate.fit_temperature_federated`); sums are exact, so the result
equals a centralised fit on the clients' calibration data (their held-out shares). The grid
query alone gives calibrated NLLs (``auto``): :math:`\min_u \sum_c \mathrm{NLL}_c(u) /
\sum_c n_c` over the grid (steps of 0.014 in :math:`\log T` with the default 1001 points), for
several models in one round. Each client's count and sums are scaled by its weight bound's
factor (:func:`bound_temperature_stats`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from flwr.app import ArrayRecord, RecordDict
from torch import nn

from fedlmc.merging.calibrate import (
    TemperatureStats,
    fit_temperature_federated,
    grid_minimum,
    newton_step,
    temperature_grid,
)
from fedlmc.strategies.protocol import (
    TEMPERATURE_QUERY,
    state_to_record,
    temperature_stats_by_model,
    temperature_stats_from_content,
)
from fedlmc.strategies.query_round import QueryRound
from fedlmc.strategies.robust import check_temperature_bounds, nll_outliers
from fedlmc.strategies.screening import WeightBound, screen_temperature_reply

__all__ = ["NEWTON_TOL", "TemperatureRounds", "bound_temperature_stats"]

NEWTON_TOL = 1e-4  # after the grid start one Newton round is usually within this


class TemperatureRounds(QueryRound):
    """The temperature fitted on the clients' data (see the module docstring)."""

    def grid_minima(self, models: Sequence[ArrayRecord]) -> list[tuple[float, TemperatureStats]]:
        """Per model, the grid point of log T with the lowest NLL summed over the answering
        clients and its sums (:func:`fedlmc.merging.calibrate.grid_minimum`): one round for all."""
        grid = temperature_grid(self.grid_points)
        extra = {"log-t": [float(u) for u in grid]}
        names = [f"stats-{k}" for k in range(len(models))]
        answers = self.ask(
            TEMPERATURE_QUERY,
            list(models),
            extra,
            screen=lambda c: self._screen_temperature(c, names, len(grid)),
            compare=self._compare_temperature,
        )
        per_client = bound_temperature_stats(
            [temperature_stats_by_model(c) for _, c in answers],
            [u.partition_id for u, _ in answers],
            self.weight_bound,
        )
        return [
            grid_minimum([client[k] for client in per_client], grid) for k in range(len(models))
        ]

    def fit_temperature(self, arrays: ArrayRecord) -> tuple[float, list[dict[str, float]]]:
        """:math:`T` minimising the clients' summed NLL: the grid's best point, then Newton
        rounds; returns ``(T, history)`` (the grid entry first, ``round = -1``)."""
        ((log_t, stats),) = self.grid_minima([arrays])
        first = {
            "round": -1,
            "log_t": log_t,
            "temperature": math.exp(log_t),
            "nll": stats.nll_sum / stats.count,
            "grad": stats.grad_sum,
            "hess": stats.hess_sum,
            "clients": len(self.survivors),
        }
        temperature, history = fit_temperature_federated(
            lambda u: self._one_point(arrays, u),
            log_t0=newton_step(stats, log_t),
            steps=self.newton_steps,
            tol=NEWTON_TOL,
        )
        return float(temperature), [first, *history]

    def _screen_temperature(self, content: RecordDict, names: Sequence[str], points: int) -> None:
        """The per-reply screen of a temperature reply and its exact bounds
        (:func:`fedlmc.strategies.robust.check_temperature_bounds`)."""
        for count, values in screen_temperature_reply(content, names, points).values():
            for nll, grad, hess in values:
                check_temperature_bounds(count, nll, grad, hess, self.num_classes)

    def _compare_temperature(self, contents: list[RecordDict]) -> dict[int, str]:
        """The relative rule on the answers' per-sample NLLs
        (:func:`fedlmc.strategies.robust.nll_outliers`)."""
        decoded = [temperature_stats_by_model(c) for c in contents]
        return nll_outliers(decoded, self.robust, self.num_classes or 2)

    def _one_point(self, arrays: ArrayRecord, log_t: float) -> list[TemperatureStats]:
        extra = {"log-t": [float(log_t)]}
        answers = self.ask(
            TEMPERATURE_QUERY,
            arrays,
            extra,
            screen=lambda c: self._screen_temperature(c, ["stats"], 1),
            compare=self._compare_temperature,
        )
        per_client = [[temperature_stats_from_content(c)] for _, c in answers]
        return [
            client[0][0]
            for client in bound_temperature_stats(
                per_client, [u.partition_id for u, _ in answers], self.weight_bound
            )
        ]

    # ------------------------------------------------------------------------- statistics

    def temperature(self, model: nn.Module) -> tuple[float, list[dict[str, float]]]:
        """:meth:`fit_temperature` of ``model``'s weights (the post-merge pipeline's step)."""
        return self.fit_temperature(state_to_record(model.state_dict()))


def bound_temperature_stats(
    per_client: Sequence[Sequence[Sequence[TemperatureStats]]],
    partition_ids: Sequence[int],
    bound: WeightBound,
) -> list[list[list[TemperatureStats]]]:
    """``per_client[c][model][point]`` with each client's count and sums multiplied by its
    factor of ``bound`` (:meth:`WeightBound.factors`, kind ``calibration``)."""
    counts = [float(client[0][0].count) for client in per_client]
    factors = bound.factors(partition_ids, counts, "calibration")
    return [
        [[_scaled_temperature(st, f) for st in model] for model in client]
        for client, f in zip(per_client, factors, strict=True)
    ]


def _scaled_temperature(stats: TemperatureStats, factor: float) -> TemperatureStats:
    """``stats`` with its count and sums multiplied by ``factor`` (the count rounded)."""
    if factor == 1.0:
        return stats
    return TemperatureStats(
        round(stats.count * factor),
        stats.nll_sum * factor,
        stats.grad_sum * factor,
        stats.hess_sum * factor,
    )
