r"""Multi-round FedAvg baseline with the same total local epochs as a one-shot run.

With ``R`` rounds and ``E`` total local epochs, round :math:`r = 1..R` trains
:math:`E_r = \lfloor E/R \rfloor + [r \le E \bmod R]` epochs (so :math:`\sum_r E_r = E`), from the
shared global model :math:`\theta^{(r-1)}`; the server then averages the survivors,
:math:`\theta^{(r)} = \sum_i w_i \theta_i^{(r)}`, :math:`w_i = n_i / \sum_j n_j`.

Each round's train ConfigRecord carries ``epochs = E_r`` and ``init = "shared"`` (the client loads
the received weights instead of its own initialisation). Replies are screened as in the one-shot
strategies (errors, non-finite or wrongly shaped arrays are dropped; fewer than ``min_clients``
survivors end the run with a clear error).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from logging import INFO, WARNING

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.supercore import log

from fedlmc.merge import average
from strategies.common import (
    PARTITION_KEY,
    RoundReport,
    check_client_counts,
    metric_record,
    record_shapes,
    require_survivors,
    screen_replies,
    state_to_record,
    wait_for_nodes,
    weighted_metric_means,
)


def epochs_per_round(total_epochs: int, num_rounds: int) -> list[int]:
    """Local epochs of each round, summing to ``total_epochs`` (earlier rounds get the rest)."""
    if num_rounds < 1 or total_epochs < num_rounds:
        raise ValueError(
            f"fedavg-rounds = {num_rounds}; allowed: 1 .. epochs ({total_epochs}) so that every "
            "round trains at least one epoch"
        )
    base, rest = divmod(int(total_epochs), int(num_rounds))
    return [base + (1 if r < rest else 0) for r in range(int(num_rounds))]


class FedAvgBaseline(FedAvg):
    """Flower ``FedAvg`` over ``num_rounds`` rounds, ``total_epochs`` local epochs in all."""

    def __init__(
        self,
        *,
        num_clients: int,
        total_epochs: int,
        num_rounds: int,
        min_clients: int = 2,
        wait_timeout: float = 600.0,
        weighted_by_key: str = "num-examples",
    ) -> None:
        check_client_counts(num_clients, min_clients)
        super().__init__(
            fraction_train=1.0,
            min_train_nodes=int(num_clients),
            min_available_nodes=int(num_clients),
            weighted_by_key=weighted_by_key,
        )
        self.fraction_evaluate = 0.0
        self.min_evaluate_nodes = 0
        self.num_clients = int(num_clients)
        self.min_clients = int(min_clients)
        self.schedule = epochs_per_round(int(total_epochs), int(num_rounds))
        self.wait_timeout = float(wait_timeout)
        self.reports: dict[int, RoundReport] = {}
        self._reference: dict[str, tuple[int, ...]] | None = None
        self._sent_to: list[int] = []

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

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Wait for every node, then send the global model with this round's epochs."""
        nodes = wait_for_nodes(grid, self.num_clients, self.wait_timeout)
        config["server-round"] = server_round
        config["epochs"] = self.local_epochs(server_round)
        config["init"] = "shared"
        self.expect_replies(arrays, nodes)
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, nodes, MessageType.TRAIN)

    def expect_replies(self, arrays: ArrayRecord, node_ids: Sequence[int]) -> None:
        """Remember the reference shapes and the nodes asked (called by configure_train)."""
        self._reference = record_shapes(arrays) or None
        self._sent_to = [int(n) for n in node_ids]

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Weighted average of the surviving replies."""
        report = screen_replies(replies, self._reference, self._sent_to, self.weighted_by_key)
        for failure in report.failures:
            log(WARNING, "round %d: dropped reply from %s", server_round, failure.describe())
        require_survivors(report, self.min_clients)
        merged = average(
            [u.state for u in report.survivors], [float(u.num_examples) for u in report.survivors]
        )
        skip = (self.weighted_by_key, PARTITION_KEY)
        metrics = weighted_metric_means(report.survivors, skip=skip)
        metrics.update(
            {
                "clients-survived": len(report.survivors),
                "clients-failed": len(report.failures),
                "bytes-received": int(report.bytes_received),
                self.weighted_by_key: int(sum(u.num_examples for u in report.survivors)),
            }
        )
        for update in report.survivors:
            update.state = {}
        self.reports[server_round] = report
        return state_to_record(merged), metric_record(metrics)
