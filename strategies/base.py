"""The base of the fedlmc strategies: Flower's ``FedAvg`` that waits for every node and screens.

:class:`ScreenedFedAvg` is what the one-shot merges and the FedAvg baseline share:

- ``configure_train`` waits until at least ``num_clients`` nodes are connected (Flower's sampling
  may sample before every simulated node registered in round 1) and sends the same train
  message to exactly ``num_clients`` of them: the lowest node ids (more SuperNodes than
  ``num_clients`` are left idle, so never more clients are merged than the row says); the
  round's config passes through :meth:`ScreenedFedAvg.round_config`;
- :meth:`ScreenedFedAvg.screen` names one failure per node that sent no good reply (a node
  the SuperLink reported lost by the message it was sent, and by the partition it was assigned
  or claimed in an earlier round: :class:`~fedlmc.strategies.strategy_utils.Senders`), and
  drops every reply that fails the screen of
  :mod:`fedlmc.strategies.screening` (errors, malformed replies, wrong keys, shapes or dtypes
  (against the sent arrays, or with ``client_references`` against each partition's own),
  non-finite or huge weights, bad counts, partition ids out of ``0 .. connected nodes - 1`` or
  claimed twice; :func:`fedlmc.strategies.strategy_utils.screen_replies`) and every reply far
  outside the other clients' (``robust``, :mod:`fedlmc.strategies.robust`), then every copy of
  another client's model (:meth:`ScreenedFedAvg.check_clients`; the one-shot strategies also
  check each client's accuracy on the server split), logs why (and why a
  survivor's per-epoch history was dropped, if it was), and raises
  :class:`~fedlmc.strategies.strategy_utils.NotEnoughClientsError` naming the dropped clients when
  fewer than ``min_clients`` survive;
- :meth:`ScreenedFedAvg.merge_weights` bounds each survivor's weight
  (:class:`fedlmc.strategies.screening.WeightBound`: its true share when the partition sizes are
  known, at most ``max_share`` otherwise);
- :meth:`ScreenedFedAvg.client_metrics` gives the survivors' num-examples-weighted training
  metrics plus ``clients-survived``, ``clients-failed``, ``bytes-received`` and
  ``num-examples``.

No federated evaluation round is configured (``fraction_evaluate = 0``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from logging import WARNING
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.supercore import log

from fedlmc.strategies.flower_compat import construct_messages
from fedlmc.strategies.options import StrategyOptions
from fedlmc.strategies.protocol import (
    HOLDOUT_SHARE_KEY,
    KEEP_MODEL_KEY,
    KEEP_SEVERAL_QUERIES,
    PARTITION_KEY,
    SERVER_ROUND_KEY,
)
from fedlmc.strategies.robust import RobustScreen, copy_outliers, weight_outliers
from fedlmc.strategies.screening import ClientReferences, Reference, WeightBound
from fedlmc.strategies.strategy_utils import (
    Failure,
    RoundReport,
    Senders,
    assigned_partitions,
    require_survivors,
    screen_replies,
    wait_for_nodes,
    weighted_metric_means,
)

__all__ = ["ScreenedFedAvg"]


def claimed_total(report: RoundReport) -> int | float:
    """The survivors' claimed num-examples summed (a float beyond int64: MetricRecord's ints
    are 64-bit; a claim that large carries no more weight than the bound allows)."""
    total = sum(int(u.num_examples) for u in report.survivors)
    return total if total < 2**63 else float(total)


def configured_epochs(config: Mapping[str, Any]) -> int | None:
    """The local epochs a round's config asks for (the length of every client's per-epoch
    history), ``None`` when it names none."""
    epochs = config.get("epochs")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        return None
    return int(epochs)


class ScreenedFedAvg(FedAvg):
    """``FedAvg`` sending to all ``num_clients`` nodes and screening their replies."""

    server_sees = "each model"
    """What the strategy receives of the clients (:mod:`fedlmc.study.server_sees`): every
    reply's weights in the clear, to screen them."""

    def __init__(self, options: StrategyOptions) -> None:
        """``options``: every setting (:class:`fedlmc.strategies.options.StrategyOptions`), kept as
        ``self.options``; ``TypeError`` for anything else."""
        if not isinstance(options, StrategyOptions):
            raise TypeError(f"options = {options!r}; allowed: a StrategyOptions")
        super().__init__(
            fraction_train=1.0,
            min_train_nodes=int(options.num_clients),
            min_available_nodes=int(options.num_clients),
            weighted_by_key=options.weighted_by_key,
            arrayrecord_key=options.arrayrecord_key,
            configrecord_key=options.configrecord_key,
        )
        # No federated evaluation round (set after __init__ to avoid FedAvg's warning).
        self.fraction_evaluate = 0.0
        self.min_evaluate_nodes = 0
        self.options = options
        self._grid: Grid | None = None
        bound, robust = options.weight_bound, options.robust
        self.weight_bound = bound if bound is not None else WeightBound()
        self.robust = robust if robust is not None else RobustScreen()
        self._reference: Reference | ClientReferences | None = None
        self._num_partitions: int | None = None
        self._sent_to: list[int] = []
        self._round_config: dict[str, Any] = {}
        self._assigned: dict[int, int] | None = None
        self._sent: list[Message] = []
        self._claimed: dict[int, int] = {}
        self._lost: set[int] = set()

    @property
    def num_clients(self) -> int:
        """``options.num_clients``: the nodes each round is sent to."""
        return int(self.options.num_clients)

    @property
    def min_clients(self) -> int:
        """``options.min_clients``: the fewest surviving replies a round accepts."""
        return int(self.options.min_clients)

    def round_config(self, server_round: int, config: ConfigRecord) -> ConfigRecord:
        """The train config of ``server_round``: the caller's ``config`` plus only the protocol
        keys of :mod:`fedlmc.strategies.protocol`, from this strategy's own settings:
        ``server-round``, ``holdout-share`` when the clients hold out a share
        (``options.client_holdout > 0``) and ``keep-model`` when they must keep their trained
        weights (:meth:`kept_models`)."""
        config[SERVER_ROUND_KEY] = server_round
        if (share := self.options.client_holdout) > 0:
            config[HOLDOUT_SHARE_KEY] = share
        if (keep := self.kept_models()) is not None:
            config[KEEP_MODEL_KEY] = keep
        return config

    def kept_models(self) -> str | None:
        """What the clients do with their trained weights (``keep-model``): kept for several
        queries with ``options.clients_keep_models``, else nothing (``None``)."""
        return KEEP_SEVERAL_QUERIES if self.options.clients_keep_models else None

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Wait for ``num_clients`` nodes, then send the same train message to the
        ``num_clients`` lowest node ids (partition ids must lie below the connected count). A
        node lost in an earlier round (the SuperLink reported it gone, or it never answered)
        is not waited for again: later rounds train the live nodes (at least ``min_clients``)."""
        self._grid = grid
        self._assigned = assigned_partitions(grid)
        expected = max(self.min_clients, self.num_clients - len(self._lost))
        connected = wait_for_nodes(grid, expected, self.options.wait_timeout)
        nodes = [n for n in connected if n not in self._lost][: self.num_clients]
        if len(connected) > len(nodes):
            log(
                WARNING,
                "round %d: %d nodes connected, training the %d with the lowest node ids",
                server_round,
                len(connected),
                len(nodes),
            )
        config = self.round_config(server_round, config)
        self.expect_replies(arrays, nodes, config, num_partitions=len(connected))
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        self._sent = construct_messages(self, record, nodes, MessageType.TRAIN)
        return self._sent

    def expect_replies(
        self,
        arrays: ArrayRecord,
        node_ids: Sequence[int],
        config: Mapping[str, Any] | None = None,
        num_partitions: int | None = None,
    ) -> None:
        """Remember what a round sent: the reference shapes and dtypes (``arrays``; empty = no
        reference, then survivors must agree among themselves; with ``client_references``,
        clients of different widths, each reply is checked against its partition's
        instead), the nodes asked, the round's
        config and the bound on partition ids (default: the number of nodes asked).
        Called by :meth:`configure_train`."""
        self._reference = self.options.client_references or Reference.of_record(arrays)
        self._sent_to = [int(n) for n in node_ids]
        self._num_partitions = int(num_partitions or len(self._sent_to)) or None
        self._round_config = dict(config or {})

    def screen(self, server_round: int, replies: Iterable[Message]) -> RoundReport:
        """The round's survivors (sorted by partition id) and failures; raises
        :class:`~fedlmc.strategies.strategy_utils.NotEnoughClientsError` below ``min_clients``."""
        report = screen_replies(
            replies,
            self._reference,
            self._sent_to,
            self.weighted_by_key,
            self._num_partitions,
            epochs=configured_epochs(self._round_config),
            assigned=self._assigned,
            senders=Senders.of_messages(self._sent, self._claimed),
        )
        self._claimed.update({u.node_id: u.partition_id for u in report.survivors})
        self._lost.update(f.node_id for f in report.failures if f.lost)
        self.drop_outliers(report)
        self.check_clients(report)
        for failure in report.failures:
            log(WARNING, "round %d: dropped reply from %s", server_round, failure.describe())
        for update in report.survivors:
            for problem in update.metric_problems:
                log(
                    WARNING,
                    "round %d: dropped a metric of node %d (partition %d): %s",
                    server_round,
                    update.node_id,
                    update.partition_id,
                    problem,
                )
            if update.history_problem:
                log(
                    WARNING,
                    "round %d: dropped the training history of node %d (partition %d): %s",
                    server_round,
                    update.node_id,
                    update.partition_id,
                    update.history_problem,
                )
        require_survivors(report, self.min_clients)
        return report

    def drop_outliers(self, report: RoundReport) -> None:
        """Move the survivors whose weights fail the robust screen (far outside the other
        clients', :func:`fedlmc.strategies.robust.weight_outliers`) to the failures."""
        self._drop(report, weight_outliers([u.state for u in report.survivors], self.robust))

    def check_clients(self, report: RoundReport) -> None:
        """Move the survivors whose weights copy an earlier survivor's (partition order,
        :func:`fedlmc.strategies.robust.copy_outliers`) to the failures, unless
        ``client_check = "off"``; the one-shot strategies also check the clients' accuracy on
        the server split."""
        if self.options.client_check == "off":
            return
        labels = [f"partition {u.partition_id}" for u in report.survivors]
        self._drop(report, copy_outliers([u.state for u in report.survivors], labels))

    def _drop(self, report: RoundReport, reasons: Mapping[int, str]) -> None:
        """Move the survivors at the indices of ``reasons`` to the failures, with the reason."""
        for index, update in enumerate(list(report.survivors)):
            if index in reasons:
                failure = Failure(update.node_id, update.partition_id, reasons[index])
                failure.tensor_bytes = update.tensor_bytes
                report.drop(failure)

    def merge_weights(self, report: RoundReport) -> list[float]:
        """The survivors' bounded shares of the merge (:class:`WeightBound`, kind ``train``)."""
        survivors = report.survivors
        return self.weight_bound.shares(
            [u.partition_id for u in survivors], [float(u.num_examples) for u in survivors], "train"
        )

    def client_metrics(self, report: RoundReport, extra_bytes: int = 0) -> dict[str, Any]:
        """Weighted means of the survivors' scalar metrics and the round's counts."""
        skip = (self.weighted_by_key, PARTITION_KEY)
        weights = self.merge_weights(report) if report.survivors else []
        metrics: dict[str, Any] = weighted_metric_means(report.survivors, skip, weights)
        metrics.update(
            {
                "clients-survived": len(report.survivors),
                "clients-failed": len(report.failures),
                "bytes-received": int(report.bytes_received + extra_bytes),
                self.weighted_by_key: claimed_total(report),
            }
        )
        return metrics
