r"""The federated temperature under secure aggregation: the server never sees one client's loss.

fedlmc's clear federated fit (:func:`fedlmc.merging.calibrate.fit_temperature_federated`)
adds the clients' sums of the NLL and its first two derivatives in :math:`u = \log T` at the
point the server sends, and takes safeguarded Newton steps. Here every such round is one SecAgg+
round (:func:`fedlmc.strategies.secure.secure_round`): client :math:`i` answers its *means*
:math:`v_i = (\bar\ell_i, \bar\ell_{u,i}, \bar\ell_{uu,i})` over its :math:`n_i` calibration
examples for the merged model (the arrays the round sends) with ``num_examples`` :math:`n_i`,
and SecAgg+ returns :math:`\sum_i r_i v_i / \sum_i r_i \approx \sum_i n_i v_i / \sum_i n_i`,
the pooled means; times :math:`\sum_i n_i` (the counts travel in the clear in Flower's legacy
results, the losses do not) they are the sums the clear fit adds. The fit starts at
:math:`T = 1` (the clear one starts from a 1001-point grid over :math:`[10^{-3}, 10^3]`, whose
NLL values at small :math:`T` reach thousands of nats: beyond a useful clipping range).

Settings (:func:`temperature_settings`): clipping range :data:`TEMPERATURE_CLIPPING` (a mean
NLL or derivative outside :math:`[-c, c]` is an error at the client, never clipped) and the
largest quantisation range that keeps SecAgg+'s modular sum exact, :math:`Q = 2^{31} /
2^{\lceil \log_2 N \rceil}`; the per-value error is :meth:`SecureSettings.error_bound`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedlmc.merging.calibrate import TemperatureStats, fit_temperature_federated
from fedlmc.strategies.secure import (
    CLIPPING_KEY,
    MAX_WEIGHT_KEY,
    SecureRound,
    SecureSettings,
    secure_round,
)
from fedlmc.strategies.temperature_rounds import NEWTON_TOL

__all__ = [
    "LOG_T_KEY",
    "TASK_KEY",
    "TEMPERATURE_CLIPPING",
    "TEMPERATURE_TASK",
    "SecureTemperature",
    "secure_temperature",
    "temperature_settings",
]

TASK_KEY = "secagg-task"
TEMPERATURE_TASK = "temperature"
LOG_T_KEY = "secagg-log-t"
TEMPERATURE_CLIPPING = 1024.0
NEWTON_ROUNDS = 12


def temperature_settings(num_clients: int, max_weight: float) -> SecureSettings:
    """:data:`TEMPERATURE_CLIPPING` and :math:`Q = 2^{31} / 2^{\\lceil \\log_2 N \\rceil}`."""
    q = 2**31 // 2 ** math.ceil(math.log2(max(num_clients, 2)))
    return SecureSettings(TEMPERATURE_CLIPPING, float(max_weight), quantization_range=q)


@dataclass
class SecureTemperature:
    """The fitted temperature, the fit's history (one entry per round, as the clear fit's)
    and its SecAgg+ rounds."""

    temperature: float
    history: list[dict[str, float]]
    rounds: list[SecureRound] = field(default_factory=list)

    @property
    def message_rounds(self) -> int:
        return sum(r.rounds for r in self.rounds)

    @property
    def bytes_sent(self) -> int:
        return sum(r.bytes_sent for r in self.rounds)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.rounds)

    @property
    def error_bound(self) -> float:
        """The largest quantisation error of a pooled mean in any of the rounds."""
        return max((r.error_bound for r in self.rounds), default=math.nan)


def pooled_statistics(found: SecureRound) -> TemperatureStats:
    """The clients' summed statistics from a round's pooled means and their counts."""
    count = sum(found.num_examples)
    nll, grad, hess = (float(v) for v in np.asarray(found.aggregate[0]).reshape(-1))
    return TemperatureStats(count, nll * count, grad * count, hess * count)


def secure_temperature(
    grid: Any,
    merged: Mapping[str, torch.Tensor],
    num_clients: int,
    fit_config: Mapping[str, Any],
    max_weight: float,
    timeout: float | None = None,
) -> SecureTemperature:
    """:math:`T` minimising the clients' pooled NLL of ``merged``, every round under SecAgg+
    (see the module docstring); ``fit_config`` is the run's (the clients read their data from
    it)."""
    settings = temperature_settings(num_clients, max_weight)
    sent = [v.detach().cpu().numpy() for v in merged.values()]
    rounds: list[SecureRound] = []

    def statistics_at(log_t: float) -> list[TemperatureStats]:
        config = {**fit_config, TASK_KEY: TEMPERATURE_TASK, LOG_T_KEY: float(log_t)}
        config.update({CLIPPING_KEY: settings.clipping_range, MAX_WEIGHT_KEY: max_weight})
        found = secure_round(grid, sent, num_clients, config, settings, timeout)
        rounds.append(found)
        return [pooled_statistics(found)]

    temperature, history = fit_temperature_federated(
        statistics_at, log_t0=0.0, steps=NEWTON_ROUNDS, tol=NEWTON_TOL
    )
    return SecureTemperature(float(temperature), history, rounds)
