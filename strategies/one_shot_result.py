"""What a one-shot strategy's round produces: the one merge result, with the round around it.

:class:`OneShotRound` is a :class:`fedlmc.merging.merge_result.MergeResult` (the merge, its
post-merge steps and its temperature, built by the same pipeline as the study's and the
ServerApp's private modes) plus what Flower's ``aggregate_train`` hands on and the round's report;
:class:`OneShotResult` adds the records Flower's ``Result`` holds. Both are built by
:class:`fedlmc.strategies.one_shot.OneShotAverage`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flwr.app import ArrayRecord, MetricRecord

from fedlmc.merging.merge_result import MergeResult
from fedlmc.strategies.strategy_utils import RoundReport, StateDict

__all__ = ["OneShotResult", "OneShotRound"]


@dataclass(frozen=True, kw_only=True)
class OneShotRound(MergeResult):
    """What one one-shot round produced
    (:meth:`~fedlmc.strategies.one_shot.OneShotAverage.merge_round`).

    Its merge result (:class:`~fedlmc.merging.merge_result.MergeResult`): ``state`` (also
    ``merged_state``) the finished merged weights, ``model`` the finished model, ``weights`` the
    survivors' merge weights (bounded shares, in ``report.survivors`` order), ``temperature``
    the fitted :math:`T` (1 for ``calibration = "none"``), ``calibration_history`` the federated
    fit's rounds (empty otherwise), ``bn_source`` where the BatchNorm statistics came from
    (``server``, ``federated`` or ``none``: not re-estimated), ``repaired`` whether REPAIR ran,
    ``seconds`` (also ``merge_seconds``) alignment, averaging, BN re-estimation and REPAIR,
    ``info`` (also ``merge_info``) what the merge method reported (e.g. ``auto_choice``,
    ``auto_nll_gap``); ``aligned`` the clients in the merged basis only with
    ``keep_client_states``. The round: ``arrays`` and ``metrics`` what ``aggregate_train`` hands
    Flower (the merged weights as an ArrayRecord, the round's MetricRecord: the module docstring
    of :mod:`fedlmc.strategies.one_shot`); ``report`` the survivors and failures (the survivors'
    states are kept only with ``keep_client_states``); ``server_split_temperature`` the
    :math:`T` fitted on the server data for the same model (NaN without server data or with
    ``"none"``); ``query_rounds`` and ``query_bytes`` the message rounds after training and
    their reply payload.
    """

    arrays: ArrayRecord
    metrics: MetricRecord
    report: RoundReport
    server_split_temperature: float
    query_rounds: int
    query_bytes: int

    @property
    def merged_state(self) -> StateDict:
        """The finished merged weights (``state``)."""
        return self.state

    @property
    def merge_seconds(self) -> float:
        """Alignment, averaging, BN re-estimation and REPAIR (``seconds``)."""
        return self.seconds

    @property
    def merge_info(self) -> Mapping[str, Any]:
        """What the merge method reported (``info``)."""
        return self.info


@dataclass(frozen=True, kw_only=True)
class OneShotResult(OneShotRound):
    """What ``strategy.start(...)`` returns: the (last) round's :class:`OneShotRound` and the
    records Flower's ``Result`` holds (``arrays`` is the merged weights), so code written for
    Flower's ``Result`` reads it unchanged."""

    train_metrics_clientapp: dict[int, MetricRecord]
    evaluate_metrics_clientapp: dict[int, MetricRecord]
    evaluate_metrics_serverapp: dict[int, MetricRecord]
