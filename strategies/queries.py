r"""The query rounds a one-shot strategy runs on its surviving clients after the training round.

:class:`ClientRounds` is bound to one round's survivors; every method is one or more Flower
message rounds (``query.<action>`` messages, :mod:`strategies.protocol`), and the object counts
them (``rounds``) and the payload bytes of the replies (``bytes_received``,
:func:`strategies.protocol.payload_bytes`). What the clients answer is computed on their own
data, and only sums, statistics or permutation indices come back:

- the temperature: one query on a grid of :math:`u = \log T` values over
  ``[log T_MIN, log T_MAX]``, then Newton rounds of one value each
  (:func:`fedlmc.calibrate.fit_temperature_federated`); sums are exact, so the result equals a
  centralised fit on the clients' calibration data (their held-out shares);
- calibrated NLLs (``auto``): the grid query alone, :math:`\min_u \sum_c \mathrm{NLL}_c(u) /
  \sum_c n_c` over the grid (steps of 0.014 in :math:`\log T` with the default 1001 points),
  for several models in one round;
- BatchNorm statistics (``query.bn_stats``) and REPAIR's per-unit statistics
  (``query.unit_stats``; :func:`fedlmc.repair.repair_with_statistics` asks ``N + L`` times);
- client-side activation matching (``query.align``): the reference model goes to every other
  client, which returns the permutations of its own trained model and the digest of the weights
  they apply to; the digest must equal that of the weights the client sent in the training round.

:class:`ClientRounds` implements :class:`fedlmc.methods.ClientQueries`, so registered merge
methods (``auto``, ``activation_federated``) reach the clients through it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from logging import WARNING
from typing import Any

from flwr.app import ArrayRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log
from torch import Tensor, nn

from fedlmc.calibrate import (
    BNStats,
    TemperatureStats,
    apply_bn_statistics,
    combine_bn_statistics,
    fit_temperature_federated,
    grid_minimum,
    has_batchnorm,
    newton_step,
    temperature_grid,
)
from fedlmc.merge import load_state
from fedlmc.repair import UnitStats, combine_unit_statistics, repair_with_statistics
from strategies.common import ClientUpdate, NotEnoughClientsError, StateDict, query_nodes
from strategies.protocol import (
    ALIGN_QUERY,
    BN_QUERY,
    TEMPERATURE_QUERY,
    UNIT_STATS_QUERY,
    bn_stats_from_content,
    models_query_content,
    payload_bytes,
    permutations_from_content,
    query_content,
    state_digest,
    state_to_record,
    temperature_stats_by_model,
    temperature_stats_from_content,
    unit_stats_from_content,
)

NEWTON_TOL = 1e-4  # after the grid start one Newton round is usually within this


class ClientQueryError(RuntimeError):
    """A client's answer cannot be used (failed alignment query, digest mismatch)."""


class ClientRounds:
    """Query rounds on one round's ``survivors`` (see the module docstring).

    ``config`` is the round's train config (sent with every query, so clients see the same run
    configuration); a query round in which fewer than ``min_clients`` clients answer raises
    :class:`~strategies.common.NotEnoughClientsError`.
    """

    def __init__(
        self,
        grid: Grid | None,
        survivors: Sequence[ClientUpdate],
        config: Mapping[str, Any],
        *,
        template: nn.Module,
        device: Any,
        timeout: float | None,
        min_clients: int,
        grid_points: int = 1001,
        newton_steps: int = 8,
    ) -> None:
        self.grid = grid
        self.survivors = list(survivors)
        self.config = {k: v for k, v in config.items() if k != "server-round"}
        self.template = template
        self.device = device
        self.timeout = timeout
        self.min_clients = int(min_clients)
        self.grid_points = int(grid_points)
        self.newton_steps = int(newton_steps)
        self.rounds = 0
        self.bytes_received = 0
        temperature_grid(self.grid_points)  # validates

    # ------------------------------------------------------------------------- one round

    def ask(
        self,
        action: str,
        arrays: ArrayRecord | Sequence[ArrayRecord],
        extra: Mapping[str, Any] | None = None,
        clients: Sequence[ClientUpdate] | None = None,
    ) -> list[tuple[ClientUpdate, RecordDict]]:
        """One ``query.<action>`` round about ``arrays`` (one model, or a list of models sent
        together) to ``clients`` (default: every survivor); the answers in the clients' order,
        failures logged and left out."""
        if self.grid is None:
            raise RuntimeError(f"the {action} query needs the Grid of configure_train; got none")
        targets = self.survivors if clients is None else list(clients)
        config = {**self.config, **dict(extra or {})}
        answers, failures = query_nodes(
            self.grid,
            [u.node_id for u in targets],
            action,
            lambda: (
                query_content(arrays, config)
                if isinstance(arrays, ArrayRecord)
                else models_query_content(arrays, config)
            ),
            self.timeout,
        )
        self.rounds += 1
        self.bytes_received += sum(payload_bytes(c) for c in answers.values())
        for failure in failures:
            log(WARNING, "%s query failed for %s", action, failure.describe())
        if clients is None and len(answers) < self.min_clients:
            raise NotEnoughClientsError(
                f"only {len(answers)} client(s) answered the {action} query "
                f"(min-clients = {self.min_clients}); failures: "
                + "; ".join(f.describe() for f in failures)
            )
        if clients is not None and failures:
            raise ClientQueryError(
                f"the {action} query failed: " + "; ".join(f.describe() for f in failures)
            )
        return [(u, answers[u.node_id]) for u in targets if u.node_id in answers]

    # ------------------------------------------------------------------------- temperature

    def grid_minima(self, models: Sequence[ArrayRecord]) -> list[tuple[float, TemperatureStats]]:
        """Per model, the grid point of log T with the lowest NLL summed over the answering
        clients and its sums (:func:`fedlmc.calibrate.grid_minimum`): one round for all."""
        grid = temperature_grid(self.grid_points)
        extra = {"log-t": [float(u) for u in grid]}
        answers = self.ask(TEMPERATURE_QUERY, list(models), extra)
        per_client = [temperature_stats_by_model(c) for _, c in answers]
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

    def _one_point(self, arrays: ArrayRecord, log_t: float) -> list[TemperatureStats]:
        extra = {"log-t": [float(log_t)]}
        answers = self.ask(TEMPERATURE_QUERY, arrays, extra)
        return [temperature_stats_from_content(c)[0] for _, c in answers]

    # ------------------------------------------------------------------------- statistics

    def bn_statistics(self, model: nn.Module) -> dict[str, BNStats]:
        """Per-layer BatchNorm input moments summed over the clients' training data."""
        answers = self.ask(BN_QUERY, state_to_record(model.state_dict()))
        return combine_bn_statistics([bn_stats_from_content(c) for _, c in answers])

    def unit_statistics(self, model: nn.Module, layers: Sequence[str]) -> dict[str, UnitStats]:
        """Per-unit output moments of ``layers`` summed over the clients' training data."""
        extra = {"layers": [str(name) for name in layers]}
        answers = self.ask(UNIT_STATS_QUERY, state_to_record(model.state_dict()), extra)
        return combine_unit_statistics([unit_stats_from_content(c) for _, c in answers])

    def repair(
        self, merged: nn.Module, endpoints: Sequence[nn.Module], weights: Sequence[float]
    ) -> nn.Module:
        """Federated REPAIR: :func:`fedlmc.repair.repair_with_statistics` with the clients'
        summed unit statistics (``N + L`` rounds for ``N`` endpoints and ``L`` layers)."""
        return repair_with_statistics(merged, endpoints, weights, self.unit_statistics)

    # ------------------------------------------------------------------------- ClientQueries

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

    def activation_permutations(self, reference: StateDict) -> list[dict[str, Tensor]]:
        """Client-side activation matching: ``reference`` goes to every survivor but the first
        (whose model it is), each returns its permutations; an empty mapping (the identity) for the
        first. Raises
        :class:`ClientQueryError` when a client fails or its digest does not match the weights
        it sent in the training round."""
        first, others = self.survivors[0], self.survivors[1:]
        if state_digest(reference) != state_digest(first.state):
            raise ClientQueryError("the reference of client-side matching must be client 0's model")
        answers = self.ask(ALIGN_QUERY, state_to_record(reference), clients=others)
        perms: list[dict[str, Tensor]] = [{}]
        for update, content in answers:
            found, digest = permutations_from_content(content)
            if digest != state_digest(update.state):
                raise ClientQueryError(
                    f"partition {update.partition_id} matched weights other than those it "
                    "sent in the training round (digest mismatch)"
                )
            perms.append(found)
        return perms
