r"""The query rounds a one-shot strategy runs on its surviving clients after the training round.

:class:`ClientRounds` is bound to one round's survivors; every method is one or more Flower
message rounds (``query.<action>`` messages, :mod:`fedlmc.strategies.protocol`), and the object
counts them (``rounds``) and the payload bytes of the replies (``bytes_received``,
:func:`fedlmc.strategies.protocol.payload_bytes`). What the clients answer is computed on their own
data, and only sums, statistics or permutation indices come back. The class is the sum of one
class per kind of question, each in its own module over the round itself
(:class:`fedlmc.strategies.query_round.QueryRound`):

- the temperature: one query on a grid of :math:`u = \log T` values over
  ``[log T_MIN, log T_MAX]``, then Newton rounds of one value each
  (:func:`fedlmc.merging.calibrate.fit_temperature_federated`); sums are exact, so the result equals
  a centralised fit on the clients' calibration data (their held-out shares);
- calibrated NLLs (``auto``): the grid query alone, :math:`\min_u \sum_c \mathrm{NLL}_c(u) /
  \sum_c n_c` over the grid (steps of 0.014 in :math:`\log T` with the default 1001 points),
  for several models in one round (both :mod:`fedlmc.strategies.temperature_rounds`);
- BatchNorm statistics (``query.bn_stats``) and REPAIR's per-unit statistics
  (``query.unit_stats``; :func:`fedlmc.merging.repair.repair_with_statistics` asks ``N + L`` times;
  :mod:`fedlmc.strategies.moment_rounds`);
- client-side activation matching (``query.align``): the reference model goes to every other
  client, which returns the permutations of its own trained model and the digest of the weights
  they apply to; the digest must equal that of the weights the client sent in the training round;
- the clients' own statistics (``query.fisher``, Fisher merging; ``query.gram``, RegMean): every
  client returns the diagonal Fisher, or its layers' input Gram matrices, of its own trained
  model on its own training data, with the digest of those weights (checked the same way; both
  :mod:`fedlmc.strategies.own_model_rounds`).

:class:`ClientRounds` implements :class:`fedlmc.merging.merge_job.ClientQueries`, so registered
merge methods (``auto``, ``activation_federated``) reach the clients through it, and
:class:`fedlmc.merging.post_merge.StatisticsSource` (``bn_statistics``, ``unit_statistics``,
``temperature``), so the post-merge pipeline takes the clients' data through it.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedlmc.averaging import load_state
from fedlmc.merging.calibrate import apply_bn_statistics, has_batchnorm
from fedlmc.strategies.moment_rounds import MomentRounds
from fedlmc.strategies.own_model_rounds import ClientQueryError, OwnModelRounds
from fedlmc.strategies.protocol import (
    ALIGN_QUERY,
    FISHER_QUERY,
    GRAM_QUERY,
    state_to_record,
)
from fedlmc.strategies.strategy_utils import StateDict
from fedlmc.strategies.temperature_rounds import TemperatureRounds

__all__ = ["MERGE_QUERIES", "ClientQueryError", "ClientRounds"]

MERGE_QUERIES = (ALIGN_QUERY, FISHER_QUERY, GRAM_QUERY)
"""The queries whose answers a merge method uses: a client dropped in one of them is left out
of the merge (not only of later query rounds)."""


class ClientRounds(TemperatureRounds, MomentRounds, OwnModelRounds):
    """Query rounds on one round's ``survivors`` (see the module docstring): every question of
    :class:`~fedlmc.strategies.temperature_rounds.TemperatureRounds`,
    :class:`~fedlmc.strategies.moment_rounds.MomentRounds` and
    :class:`~fedlmc.strategies.own_model_rounds.OwnModelRounds`, on the round of
    :class:`~fedlmc.strategies.query_round.QueryRound` (its arguments)."""

    name = "federated"
    """The :class:`fedlmc.merging.post_merge.StatisticsSource` name: the clients' data."""

    def calibrated_nlls(
        self, states: Sequence[StateDict], reestimate_bn: Sequence[bool]
    ) -> list[float]:
        """Per state, the clients' summed NLL per sample at the grid's best temperature: one
        round for all of them, after a BatchNorm statistics round per model where
        ``reestimate_bn`` and the model has BatchNorm."""
        records = []
        for state, reestimate in zip(states, reestimate_bn, strict=True):
            model = load_state(self.template, state).to(self.device).eval()
            if reestimate and has_batchnorm(model):
                apply_bn_statistics(model, self.bn_statistics(model))
                model.eval()
            records.append(state_to_record(model.state_dict()))
        return [stats.nll_sum / stats.count for _, stats in self.grid_minima(records)]
