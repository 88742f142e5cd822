r"""One-shot merging strategies for Flower's Message API (``flwr.serverapp.strategy``).

One round: every connected client trains (independently initialised in the paper's setting) and
sends its weights; the server merges the survivors in one shot,

.. math:: \bar\theta = \sum_i w_i\, \pi_i(\theta_i), \qquad w_i = n_i / \textstyle\sum_j n_j,

with :math:`n_i` the client's ``num-examples`` and :math:`\pi_i` the identity
(:class:`OneShotAverage`) or the permutations of a registered merge method
(:class:`PermutationAlignedAverage`, :mod:`fedlmc.methods`: weight or activation matching,
MergeMany, the random-permutation control, ...).
Then, for BatchNorm models, the merged model's running statistics are re-estimated, and one
softmax temperature :math:`T` is fitted (``calibration``):

- ``"server"``: on the server's own held-out data (``server_data``);
- ``"federated"``: on the clients' training data without moving it. The server sends the
  merged weights and values of :math:`u = \log T` in ``query.temperature`` messages; each client
  returns, per value, 4 sums over its samples (count, NLL, dNLL/du, d²NLL/du²), which the server
  adds up. Round 1 asks for a grid of ``temperature_grid_points`` values over
  ``[log T_MIN, log T_MAX]`` and takes a Newton step from the grid's best point; then
  :func:`fedlmc.calibrate.fit_temperature_federated` refines it with Newton rounds of one value
  each (usually one suffices). Every message round costs a ClientApp start in a deployment
  (SuperNodes start a process per message), hence the grid. Summing is exact, so the result
  equals a centralised fit on the survivors' data. BN statistics come from one
  ``query.bn_stats`` round (per-layer sums, sums of squares and counts);
- ``"none"``: :math:`T = 1` (BN statistics, if any, still re-estimated on ``server_data``).

Where the results travel. ``strategy.start(...)`` returns Flower's ``Result``: ``result.arrays``
holds the merged (BN-re-estimated) weights and ``result.train_metrics_clientapp[1]`` is a
MetricRecord with ``temperature``, ``log-temperature``, ``clients-survived``, ``clients-failed``,
``bytes-received`` (tensor bytes of every reply's arrays, calibration replies included),
``bn-reestimated`` (0/1) and the num-examples-weighted means of the clients' training metrics.
Shared with the FedAvg baseline (:class:`strategies.base.ScreenedFedAvg`): waiting for every node,
screening the replies, the client counts.
The strategy object keeps the details of the last round: ``strategy.report`` (survivors sorted
by partition id, failures with reasons), ``strategy.temperature``, ``strategy.calibration_history``
and ``strategy.merged_state``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping, Sequence
from logging import INFO, WARNING
from typing import Any

import torch
from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.supercore import log
from torch import Tensor, nn

from fedlmc.calibrate import (
    LOG_T_MAX,
    LOG_T_MIN,
    BNStats,
    TemperatureStats,
    apply_bn_statistics,
    combine_bn_statistics,
    combine_temperature_statistics,
    fit_temperature,
    fit_temperature_federated,
    has_batchnorm,
    newton_step,
    reset_bn_stats,
)
from fedlmc.evaluation import predict_logits, resolve_device
from fedlmc.merge import load_state
from fedlmc.methods import AUTO_TOLERANCE, merge_method, merge_with_info
from fedlmc.permutation import PermutationSpec
from fedlmc.repair import repair
from strategies.base import ScreenedFedAvg
from strategies.common import (
    ClientUpdate,
    NotEnoughClientsError,
    RoundReport,
    StateDict,
    query_nodes,
)
from strategies.protocol import (
    BN_QUERY,
    NUM_EXAMPLES_KEY,
    TEMPERATURE_QUERY,
    bn_stats_from_content,
    metric_record,
    query_content,
    state_to_record,
    temperature_stats_from_content,
    tensor_bytes,
)

Data = tuple[Tensor, Tensor]
CALIBRATIONS = ("server", "federated", "none")
NEWTON_TOL = 1e-4  # after the grid start one Newton round is usually within this


def temperature_grid(points: int) -> list[float]:
    """``points`` evenly spaced values of log T from log T_MIN to log T_MAX."""
    if points < 2:
        raise ValueError(f"temperature_grid_points = {points}; allowed: an integer >= 2")
    step = (LOG_T_MAX - LOG_T_MIN) / (points - 1)
    return [LOG_T_MIN + i * step for i in range(points)]


def _check_choice(what: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{what} = {value!r}; allowed: {', '.join(allowed)}")
    return value


class OneShotAverage(ScreenedFedAvg):
    """Flower ``FedAvg`` turned into a robust one-shot merge with temperature calibration.

    Parameters
    ----------
    template : nn.Module
        A model of the clients' architecture (its weights are not used): needed to load the
        merged weights for BN re-estimation and temperature fitting.
    num_clients : int
        Nodes to wait for before sending the round (``wait_timeout`` seconds at most).
    min_clients : int
        Fewest surviving replies the merge accepts (:class:`NotEnoughClientsError` otherwise).
    calibration : "server" | "federated" | "none"
    server_data : (x, y), optional
        The server's held-out data; required for ``calibration="server"`` and used for BN
        re-estimation unless calibration is federated.
    keep_client_states : bool
        Keep the survivors' state dicts in ``strategy.report`` (for studies comparing methods).

    Calibration queries carry the round's train config, so clients see the same run
    configuration.
    """

    merge_method = "average"
    """The registered merge method (:mod:`fedlmc.methods`) this strategy applies."""

    def __init__(
        self,
        template: nn.Module,
        *,
        num_clients: int,
        min_clients: int = 2,
        calibration: str = "server",
        server_data: Data | None = None,
        wait_timeout: float = 600.0,
        query_timeout: float | None = 600.0,
        keep_client_states: bool = False,
        temperature_steps: int = 8,
        temperature_grid_points: int = 1001,
        device: str | torch.device | None = None,
        weighted_by_key: str = NUM_EXAMPLES_KEY,
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
    ) -> None:
        super().__init__(
            num_clients=num_clients,
            min_clients=min_clients,
            wait_timeout=wait_timeout,
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
        )
        self.template = copy.deepcopy(template).cpu().eval()
        self.calibration = _check_choice("calibration", calibration, CALIBRATIONS)
        if calibration == "server" and server_data is None:
            raise ValueError("calibration = 'server' needs server_data (x, y); got None")
        self.server_data = server_data
        self.query_timeout = query_timeout
        self.keep_client_states = bool(keep_client_states)
        self.temperature_steps = int(temperature_steps)
        self.temperature_grid_points = int(temperature_grid_points)
        temperature_grid(self.temperature_grid_points)  # validates
        self.device = resolve_device(device)
        self.report = RoundReport()
        self.temperature = 1.0
        self.calibration_history: list[dict[str, float]] = []
        self.bn_source = "none"
        self.query_bytes = 0
        self.merged_state: StateDict | None = None
        self.seed = 0
        self.spec: PermutationSpec | None = None
        self.method_options: dict[str, Any] = {}
        self.merge_info: dict[str, Any] = {}

    # ------------------------------------------------------------------------- Flower hooks

    def summary(self) -> None:
        """Log the strategy's settings."""
        log(
            INFO,
            "\t├──> %s (%s): %d clients (min %d survivors), calibration %s",
            type(self).__name__,
            self.merge_method,
            self.num_clients,
            self.min_clients,
            self.calibration,
        )
        log(INFO, "\t└──> Weighted by: '%s'", self.weighted_by_key)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Screen the replies, merge the survivors, re-estimate BN, fit the temperature."""
        self.query_bytes = 0
        report = self.screen(server_round, replies)
        self.report = report
        states = [u.state for u in report.survivors]
        weights = [float(u.num_examples) for u in report.survivors]
        merged, aligned = self.merge(states, weights)
        model = load_state(self.template, merged).to(self.device).eval()
        self.bn_source = self.reestimate_batchnorm(model, report.survivors)
        model = self.repair_units(model, aligned, weights)
        final = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        self.merged_state = final
        arrays = state_to_record(final)
        self.temperature = self.calibrate_temperature(model, arrays, report.survivors)
        if not self.keep_client_states:
            for update in report.survivors:
                update.state = {}
        log(
            INFO,
            "aggregate_train: merged %d clients %s (%s), temperature %.4f",
            len(states),
            report.survivor_ids,
            self.merge_method,
            self.temperature,
        )
        return arrays, metric_record(self.round_metrics(report))

    # ------------------------------------------------------------------------- merge

    def merge(
        self, states: Sequence[StateDict], weights: Sequence[float]
    ) -> tuple[StateDict, list[StateDict]]:
        r""":func:`fedlmc.methods.merge_states` with this strategy's ``merge_method``:
        :math:`\sum_i w_i \pi_i(\theta_i)` (plain average: :math:`\pi_i = \mathrm{id}`) and the
        clients in the merged basis."""
        merged, aligned, self.merge_info = merge_with_info(
            self.merge_method,
            self.template,
            states,
            weights,
            server_data=self.server_data,
            seed=self.seed,
            device=self.device,
            spec=self.spec,
            options=self.method_options,
        )
        return merged, aligned

    def repair_units(
        self, model: nn.Module, aligned: Sequence[StateDict], weights: Sequence[float]
    ) -> nn.Module:
        """REPAIR (:func:`fedlmc.repair.repair`) on the server data's inputs when the merge
        method asks for it and the model has no BatchNorm (whose re-estimation is REPAIR)."""
        if not merge_method(self.merge_method).repair or has_batchnorm(model) or len(aligned) < 2:
            return model
        endpoints = [load_state(self.template, sd).to(self.device).eval() for sd in aligned]
        return repair(model, endpoints, weights, self.server_data[0]).eval()

    # ------------------------------------------------------------------------- calibration

    def reestimate_batchnorm(self, model: nn.Module, survivors: Sequence[ClientUpdate]) -> str:
        """Reset BN running statistics in place (unless the merge method opts out); returns where
        they came from."""
        if not has_batchnorm(model) or not merge_method(self.merge_method).reestimate_bn:
            return "none"
        if self.calibration == "federated":
            apply_bn_statistics(model, self.federated_bn_statistics(model, survivors))
            model.eval()
            return "federated"
        if self.server_data is not None:
            reset_bn_stats(model, self.server_data)
            model.eval()
            return "server"
        log(WARNING, "BatchNorm model merged without server data: running statistics kept")
        return "none"

    def calibrate_temperature(
        self, model: nn.Module, arrays: ArrayRecord, survivors: Sequence[ClientUpdate]
    ) -> float:
        """:math:`T` by the configured calibration; fills ``calibration_history``."""
        self.calibration_history = []
        if self.calibration == "none":
            return 1.0
        if self.calibration == "server":
            x, y = self.server_data
            return float(fit_temperature(predict_logits(model, x, device=self.device), y))
        nodes = [u.node_id for u in survivors]
        start, first = self._temperature_grid_start(arrays, nodes)
        temperature, history = fit_temperature_federated(
            lambda log_t: [c[0] for c in self._temperature_query(arrays, nodes, [log_t])],
            log_t0=start,
            steps=self.temperature_steps,
            tol=NEWTON_TOL,
        )
        self.calibration_history = [first, *history]
        return float(temperature)

    def _temperature_grid_start(
        self, arrays: ArrayRecord, nodes: Sequence[int]
    ) -> tuple[float, dict[str, float]]:
        r"""One query for the NLL sums on a grid of :math:`u = \log T` over
        ``[log T_MIN, log T_MAX]``; returns a Newton step from the grid's best point (the start
        of :func:`fedlmc.calibrate.fit_temperature_federated`) and that point's history entry."""
        grid = temperature_grid(self.temperature_grid_points)
        per_client = self._temperature_query(arrays, nodes, grid)
        combined = [
            combine_temperature_statistics([client[i] for client in per_client])
            for i in range(len(grid))
        ]
        best = min(range(len(grid)), key=lambda i: combined[i].nll_sum)
        stats = combined[best]
        entry = {
            "round": -1,
            "log_t": grid[best],
            "temperature": math.exp(grid[best]),
            "nll": stats.nll_sum / stats.count,
            "grad": stats.grad_sum,
            "hess": stats.hess_sum,
            "clients": len(per_client),
        }
        return newton_step(stats, grid[best]), entry

    def _query(self, action: str, arrays: ArrayRecord, nodes: Sequence[int], extra: Mapping):
        if self._grid is None:
            raise RuntimeError("federated calibration needs the grid of configure_train")
        config = {k: v for k, v in self._round_config.items() if k != "server-round"}
        config.update(extra)
        answers, failures = query_nodes(
            self._grid, nodes, action, lambda: query_content(arrays, config), self.query_timeout
        )
        for failure in failures:
            log(WARNING, "%s query failed for %s", action, failure.describe())
        self.query_bytes += sum(
            tensor_bytes(record) for c in answers.values() for record in c.array_records.values()
        )
        if len(answers) < self.min_clients:
            raise NotEnoughClientsError(
                f"only {len(answers)} client(s) answered the {action} query "
                f"(min-clients = {self.min_clients}); failures: "
                + "; ".join(f.describe() for f in failures)
            )
        return [answers[n] for n in nodes if n in answers]

    def _temperature_query(
        self, arrays: ArrayRecord, nodes: Sequence[int], points: Sequence[float]
    ) -> list[list[TemperatureStats]]:
        """Per answering client, its statistics at each of ``points`` (one message round)."""
        extra = {"log-t": [float(u) for u in points]}
        answers = self._query(TEMPERATURE_QUERY, arrays, nodes, extra)
        return [temperature_stats_from_content(content) for content in answers]

    def federated_bn_statistics(
        self, model: nn.Module, survivors: Sequence[ClientUpdate]
    ) -> dict[str, BNStats]:
        """Per-layer BN input moments summed over the survivors' training data."""
        arrays = state_to_record(model.state_dict())
        nodes = [u.node_id for u in survivors]
        answers = self._query(BN_QUERY, arrays, nodes, {})
        return combine_bn_statistics([bn_stats_from_content(c) for c in answers])

    # ------------------------------------------------------------------------- metrics

    def round_metrics(self, report: RoundReport) -> dict[str, float | int]:
        """Weighted client metrics plus the merge's own numbers (see the module docstring)."""
        metrics = self.client_metrics(report, extra_bytes=self.query_bytes)
        metrics.update(
            {
                "temperature": float(self.temperature),
                "log-temperature": float(math.log(self.temperature)),
                "bn-reestimated": int(self.bn_source != "none"),
            }
        )
        return metrics


class PermutationAlignedAverage(OneShotAverage):
    r"""One-shot merge after permutation alignment by a registered merge method.

    ``method`` is any registered merge method but ``average`` (:mod:`fedlmc.methods`;
    built in: ``weight_matching`` and ``activation_matching`` permute every client onto client
    0, the lowest partition id, ``merge_many`` runs MergeMany, ``random_permutation`` is the
    scrambled control), then :math:`\sum_i w_i \pi_i(\theta_i)`. Methods that need server
    inputs (activation matching) use ``server_data``'s. ``spec`` overrides the template's
    permutation spec.
    """

    def __init__(
        self,
        template: nn.Module,
        *,
        method: str = "weight_matching",
        seed: int = 0,
        spec: PermutationSpec | None = None,
        method_options: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(template, **kwargs)
        entry = merge_method(method)
        if entry.name == "average":
            raise ValueError("method = 'average': use OneShotAverage; allowed: an aligning method")
        if entry.needs_server_data and self.server_data is None:
            raise ValueError(f"method = {method!r} needs server_data for its inputs; got None")
        self.merge_method = entry.name
        self.seed = int(seed)
        self.spec = spec
        self.method_options = dict(method_options or {})


class AutoMerge(PermutationAlignedAverage):
    """The ``auto`` merge (:func:`fedlmc.methods.automatic_choice`): plain averaging when its
    calibrated NLL on the server data is within ``tolerance`` nats of the endpoints', else the
    better of it and weight matching. ``strategy.merge_info`` holds ``auto_choice`` and
    ``auto_nll_gap`` after the round."""

    def __init__(
        self, template: nn.Module, *, tolerance: float = AUTO_TOLERANCE, **kwargs: Any
    ) -> None:
        if not tolerance >= 0:
            raise ValueError(f"tolerance = {tolerance!r}; allowed: a number >= 0 (nats)")
        options = {"auto_tolerance": float(tolerance)}
        super().__init__(template, method="auto", method_options=options, **kwargs)
