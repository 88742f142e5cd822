r"""Multi-round FedAvg baseline with the same total local epochs as a one-shot run.

With ``R`` rounds and ``E`` total local epochs, round :math:`r = 1..R` trains
:math:`E_r = \lfloor E/R \rfloor + [r \le E \bmod R]` epochs (so :math:`\sum_r E_r = E`), from the
shared global model :math:`\theta^{(r-1)}`; the server then averages the survivors,
:math:`\theta^{(r)} = \sum_i w_i \theta_i^{(r)}`, :math:`w_i = n_i / \sum_j n_j`.

Each round's train ConfigRecord carries ``epochs = E_r`` and ``init = "shared"`` (the client loads
the received weights instead of its own initialisation). Replies are screened as in the one-shot
strategies (errors, non-finite or wrongly shaped arrays are dropped; fewer than ``min_clients``
survivors end the run with a clear error).

Per-round curve (:meth:`FedAvgResult.round_curve`): for every round, the global model's test loss
and accuracy as the caller's ``evaluate_fn`` measured them after the round (Flower's
server-side evaluation, stored under :data:`MERGED_TEST_LOSS` / :data:`MERGED_TEST_ACCURACY` in
``evaluate_metrics_serverapp[r]``; NaN when none ran) and the mean of the round's survivors'
last-local-epoch training loss and accuracy weighted by their merge weights
(``train_metrics_clientapp[r]``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from logging import INFO
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.supercore import log

from fedlmc.averaging import average
from fedlmc.strategies.base import ScreenedFedAvg
from fedlmc.strategies.options import StrategyOptions
from fedlmc.strategies.protocol import metric_record, state_to_record
from fedlmc.strategies.strategy_utils import RoundReport, flower_records

MERGED_TEST_LOSS = "merged-test-loss"
"""``evaluate_fn``'s key for the global model's mean test cross-entropy after a round (T = 1)."""
MERGED_TEST_ACCURACY = "merged-test-accuracy"
"""``evaluate_fn``'s key for the global model's test accuracy after a round."""


def epochs_per_round(total_epochs: int, num_rounds: int) -> list[int]:
    """Local epochs of each round, summing to ``total_epochs`` (earlier rounds get the rest)."""
    if num_rounds < 1 or total_epochs < num_rounds:
        raise ValueError(
            f"fedavg-rounds = {num_rounds}; allowed: 1 .. epochs ({total_epochs}) so that every "
            "round trains at least one epoch"
        )
    base, rest = divmod(int(total_epochs), int(num_rounds))
    return [base + (1 if r < rest else 0) for r in range(int(num_rounds))]


@dataclass(frozen=True)
class FedAvgResult:
    """What :meth:`FedAvgBaseline.start` returns: Flower's ``Result`` records (``arrays``: the
    final global weights; the per-round metric records) and ``reports``, each round's
    survivors and failures by round number."""

    arrays: ArrayRecord
    train_metrics_clientapp: dict[int, MetricRecord]
    evaluate_metrics_clientapp: dict[int, MetricRecord]
    evaluate_metrics_serverapp: dict[int, MetricRecord]
    reports: Mapping[int, RoundReport]

    def round_curve(self) -> list[dict[str, float]]:
        """Per round (1-based ``round``): ``merged_test_loss``, ``merged_test_accuracy`` (the
        global model after the round, on the test split, as ``evaluate_fn`` measured it; NaN
        without one) and ``clients_train_loss``, ``clients_train_accuracy`` (the mean over the
        round's survivors of their last local epoch's training loss/accuracy, weighted by their
        merge weights)."""
        curve = []
        for server_round in sorted(self.reports):
            evaluated = self.evaluate_metrics_serverapp.get(server_round) or {}
            trained = self.train_metrics_clientapp.get(server_round) or {}
            curve.append(
                {
                    "round": server_round,
                    "merged_test_loss": _number(evaluated.get(MERGED_TEST_LOSS)),
                    "merged_test_accuracy": _number(evaluated.get(MERGED_TEST_ACCURACY)),
                    "clients_train_loss": _number(trained.get("train-loss")),
                    "clients_train_accuracy": _number(trained.get("train-accuracy")),
                }
            )
        return curve


def _number(value: object) -> float:
    """``value`` as a float, NaN when it is not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


class FedAvgBaseline(ScreenedFedAvg):
    """Flower ``FedAvg`` over ``num_rounds`` rounds, ``total_epochs`` local epochs in all;
    ``start`` returns a :class:`FedAvgResult`. ``options``
    (:class:`fedlmc.strategies.options.StrategyOptions`): the clients to wait for and accept and
    the screens (the one-shot fields, such as ``calibration``, are not read)."""

    def __init__(
        self,
        options: StrategyOptions,
        *,
        total_epochs: int,
        num_rounds: int,
    ) -> None:
        super().__init__(options)
        self.schedule = epochs_per_round(int(total_epochs), int(num_rounds))
        self._reports: dict[int, RoundReport] = {}

    def summary(self) -> None:
        """Log the strategy's settings."""
        log(
            INFO,
            "\t├──> FedAvgBaseline: %d clients, local epochs per round %s",
            self.num_clients,
            self.schedule,
        )

    def local_epochs(self, server_round: int) -> int:
        """Local epochs of round ``server_round`` (1-based)."""
        if not 1 <= server_round <= len(self.schedule):
            raise ValueError(
                f"server_round = {server_round}; allowed: 1 .. {len(self.schedule)} "
                "(start() with num_rounds equal to the strategy's num_rounds)"
            )
        return self.schedule[server_round - 1]

    def round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        """This round's local epochs, and ``init = "shared"`` (clients load the global model)."""
        config = super().round_config(server_round, config)
        config["epochs"] = self.local_epochs(server_round)
        config["init"] = "shared"
        return config

    def start(
        self, grid: Grid, initial_arrays: ArrayRecord, *args: Any, **kwargs: Any
    ) -> FedAvgResult:
        """Flower's ``Strategy.start`` (same arguments), returning a :class:`FedAvgResult`."""
        self._reports = {}
        flower = super().start(grid, initial_arrays, *args, **kwargs)
        return FedAvgResult(**flower_records(flower), reports=dict(self._reports))

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Weighted average of the surviving replies (the round's report is kept for the
        result of :meth:`start`)."""
        report = self.screen(server_round, replies)
        merged = average([u.state for u in report.survivors], self.merge_weights(report))
        metrics = self.client_metrics(report)
        for update in report.survivors:
            update.state = {}
        self._reports[server_round] = report
        return state_to_record(merged), metric_record(metrics)
