"""The moments of a model on the clients' training data as query rounds
(:class:`MomentRounds`): BatchNorm input moments (``query.bn_stats``) and REPAIR's per-unit
output moments (``query.unit_stats``; :func:`fedlmc.merging.repair.repair_with_statistics` asks
``N + L`` times), summed over the clients, each client's sums scaled by its weight bound's
factor, and screened by the relative rule on moments
(:func:`fedlmc.strategies.robust.moments_outliers`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from flwr.app import RecordDict
from torch import nn

from fedlmc.merging.calibrate import BNStats, batchnorm_layers, combine_bn_statistics
from fedlmc.merging.repair import UnitStats, combine_unit_statistics
from fedlmc.strategies.protocol import (
    BN_QUERY,
    UNIT_STATS_QUERY,
    bn_stats_from_content,
    state_to_record,
    unit_stats_from_content,
)
from fedlmc.strategies.query_round import QueryRound
from fedlmc.strategies.robust import moments_outliers
from fedlmc.strategies.screening import screen_moments_reply

__all__ = ["MomentRounds"]


class MomentRounds(QueryRound):
    """A model's moments on the clients' data (see the module docstring)."""

    def bn_statistics(self, model: nn.Module) -> dict[str, BNStats]:
        """Per-layer BatchNorm input moments summed over the clients' training data."""
        widths = {name: int(m.num_features) for name, m in batchnorm_layers(model).items()}
        answers = self.ask(
            BN_QUERY,
            state_to_record(model.state_dict()),
            screen=lambda c: screen_moments_reply(c, widths),
            compare=self._compare_moments(bn_stats_from_content),
        )
        return combine_bn_statistics(
            self._bounded_moments([bn_stats_from_content(c) for _, c in answers], answers, BNStats)
        )

    def unit_statistics(self, model: nn.Module, layers: Sequence[str]) -> dict[str, UnitStats]:
        """Per-unit output moments of ``layers`` summed over the clients' training data."""
        extra = {"layers": [str(name) for name in layers]}
        state = model.state_dict()
        widths = {str(name): int(state[f"{name}.weight"].shape[0]) for name in layers}
        answers = self.ask(
            UNIT_STATS_QUERY,
            state_to_record(state),
            extra,
            screen=lambda c: screen_moments_reply(c, widths),
            compare=self._compare_moments(unit_stats_from_content),
        )
        decoded = [unit_stats_from_content(c) for _, c in answers]
        return combine_unit_statistics(self._bounded_moments(decoded, answers, UnitStats))

    def _bounded_moments(self, per_client, answers, kind) -> list[dict[str, Any]]:
        """Each client's per-layer sums scaled by its bound factor (kind ``train``)."""
        if not per_client:
            return per_client
        scaled: list[dict[str, Any]] = [{} for _ in per_client]
        for layer in per_client[0]:
            counts = [float(client[layer].count) for client in per_client]
            for index, f in enumerate(self._factors(answers, counts, "train")):
                st = per_client[index][layer]
                scaled[index][layer] = kind(
                    sum=st.sum * f, sum_sq=st.sum_sq * f, count=round(st.count * f)
                )
        return scaled

    def _compare_moments(self, decode) -> Callable[[list[RecordDict]], dict[int, str]]:
        """The relative rule on moments replies decoded by ``decode``
        (:func:`fedlmc.strategies.robust.moments_outliers`)."""
        return lambda contents: moments_outliers([decode(c) for c in contents], self.robust)
