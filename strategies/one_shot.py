r"""One-shot merging strategies for Flower's Message API (``flwr.serverapp.strategy``).

One round: every connected client trains (independently initialised in the paper's setting) and
sends its weights; the server merges the survivors in one shot,

.. math:: \bar\theta = \sum_i w_i\, \pi_i(\theta_i), \qquad w_i = n_i / \textstyle\sum_j n_j,

with :math:`n_i` the client's ``num-examples`` and :math:`\pi_i` the identity
(:class:`OneShotAverage`) or a Git Re-Basin permutation (:class:`PermutationAlignedAverage`).
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
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.supercore import log
from torch import Tensor, nn

from fedlmc.align import align_to_reference, merge_many
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
from fedlmc.merge import average, load_state
from fedlmc.models import permutation_spec
from strategies.common import (
    PARTITION_KEY,
    ClientUpdate,
    NotEnoughClientsError,
    RoundReport,
    StateDict,
    bn_stats_from_content,
    check_client_counts,
    metric_record,
    query_content,
    query_nodes,
    record_shapes,
    require_survivors,
    screen_replies,
    state_to_record,
    temperature_stats_from_content,
    tensor_bytes,
    wait_for_nodes,
    weighted_metric_means,
)

Data = tuple[Tensor, Tensor]
CALIBRATIONS = ("server", "federated", "none")
TEMPERATURE_QUERY = "temperature"
NEWTON_TOL = 1e-4  # after the grid start one Newton round is usually within this


def temperature_grid(points: int) -> list[float]:
    """``points`` evenly spaced values of log T from log T_MIN to log T_MAX."""
    if points < 2:
        raise ValueError(f"temperature_grid_points = {points}; allowed: an integer >= 2")
    step = (LOG_T_MAX - LOG_T_MIN) / (points - 1)
    return [LOG_T_MIN + i * step for i in range(points)]


BN_QUERY = "bn_stats"


def _check_choice(what: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{what} = {value!r}; allowed: {', '.join(allowed)}")
    return value


class OneShotAverage(FedAvg):
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
    query_config : mapping, optional
        Extra entries for the ConfigRecord of calibration queries (the train config of the
        round is always forwarded, so clients see the same run configuration).
    """

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
        weighted_by_key: str = "num-examples",
        arrayrecord_key: str = "arrays",
        configrecord_key: str = "config",
    ) -> None:
        check_client_counts(num_clients, min_clients)
        super().__init__(
            fraction_train=1.0,
            min_train_nodes=int(num_clients),
            min_available_nodes=int(num_clients),
            weighted_by_key=weighted_by_key,
            arrayrecord_key=arrayrecord_key,
            configrecord_key=configrecord_key,
        )
        # One-shot: no federated evaluation round (set after __init__ to avoid FedAvg's warning).
        self.fraction_evaluate = 0.0
        self.min_evaluate_nodes = 0
        self.template = copy.deepcopy(template).cpu().eval()
        self.num_clients = int(num_clients)
        self.min_clients = int(min_clients)
        self.calibration = _check_choice("calibration", calibration, CALIBRATIONS)
        if calibration == "server" and server_data is None:
            raise ValueError("calibration = 'server' needs server_data (x, y); got None")
        self.server_data = server_data
        self.wait_timeout = float(wait_timeout)
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
        self._grid: Grid | None = None
        self._reference: dict[str, tuple[int, ...]] | None = None
        self._sent_to: list[int] = []
        self._round_config: dict[str, Any] = {}

    # ------------------------------------------------------------------------- Flower hooks

    def summary(self) -> None:
        """Log the strategy's settings."""
        log(
            INFO,
            "\t├──> %s: %d clients (min %d survivors), calibration %s",
            type(self).__name__,
            self.num_clients,
            self.min_clients,
            self.calibration,
        )
        log(INFO, "\t└──> Weighted by: '%s'", self.weighted_by_key)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Wait for all ``num_clients`` nodes, then send every one the same train message."""
        self._grid = grid
        nodes = wait_for_nodes(grid, self.num_clients, self.wait_timeout)
        config["server-round"] = server_round
        self.expect_replies(arrays, nodes, config)
        log(INFO, "configure_train: sending to %d nodes", len(nodes))
        record = RecordDict({self.arrayrecord_key: arrays, self.configrecord_key: config})
        return self._construct_messages(record, nodes, MessageType.TRAIN)

    def expect_replies(
        self, arrays: ArrayRecord, node_ids: Sequence[int], config: Mapping[str, Any] | None = None
    ) -> None:
        """Remember what a round sent: the reference shapes (``arrays``; empty = no reference,
        then survivors must agree among themselves), the nodes asked and the round's config
        (forwarded with calibration queries). Called by :meth:`configure_train`."""
        self._reference = record_shapes(arrays) or None
        self._sent_to = [int(n) for n in node_ids]
        self._round_config = dict(config or {})

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Screen the replies, merge the survivors, re-estimate BN, fit the temperature."""
        report = screen_replies(replies, self._reference, self._sent_to, self.weighted_by_key)
        self.report = report
        self.query_bytes = 0
        for failure in report.failures:
            log(WARNING, "dropped reply from %s", failure.describe())
        require_survivors(report, self.min_clients)
        states = [u.state for u in report.survivors]
        weights = [float(u.num_examples) for u in report.survivors]
        merged = self.merge_states(states, weights)
        model = load_state(self.template, merged).to(self.device).eval()
        self.bn_source = self.reestimate_batchnorm(model, report.survivors)
        final = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        self.merged_state = final
        arrays = state_to_record(final)
        self.temperature = self.fit_temperature(model, arrays, report.survivors)
        if not self.keep_client_states:
            for update in report.survivors:
                update.state = {}
        log(
            INFO,
            "aggregate_train: merged %d clients %s, temperature %.4f",
            len(states),
            report.survivor_ids,
            self.temperature,
        )
        return arrays, metric_record(self.round_metrics(report))

    # ------------------------------------------------------------------------- merge

    def merge_states(self, states: Sequence[StateDict], weights: Sequence[float]) -> StateDict:
        r"""Plain weighted average :math:`\sum_i w_i \theta_i` (no permutation)."""
        return average(states, weights)

    # ------------------------------------------------------------------------- calibration

    def reestimate_batchnorm(self, model: nn.Module, survivors: Sequence[ClientUpdate]) -> str:
        """Reset BN running statistics in place; returns where they came from."""
        if not has_batchnorm(model):
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

    def fit_temperature(
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
        skip = (self.weighted_by_key, PARTITION_KEY)
        metrics = weighted_metric_means(report.survivors, skip=skip)
        metrics.update(
            {
                "temperature": float(self.temperature),
                "log-temperature": float(math.log(self.temperature)),
                "clients-survived": len(report.survivors),
                "clients-failed": len(report.failures),
                "bytes-received": int(report.bytes_received + self.query_bytes),
                "bn-reestimated": int(self.bn_source != "none"),
                self.weighted_by_key: int(sum(u.num_examples for u in report.survivors)),
            }
        )
        return metrics


class PermutationAlignedAverage(OneShotAverage):
    r"""One-shot merge after Git Re-Basin permutation alignment.

    ``multi="reference"``: every client is permuted onto client 0 (the lowest partition id) by
    weight matching (``method="weight"``) or activation matching on the server data's inputs
    (``method="activation"``), then :math:`\sum_i w_i \pi_i(\theta_i)`. ``multi="merge_many"``:
    MergeMany (each model matched to the weighted mean of the others until no permutation
    changes), weight matching only.
    """

    def __init__(
        self,
        template: nn.Module,
        *,
        method: str = "weight",
        multi: str = "reference",
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(template, **kwargs)
        self.method = _check_choice("method", method, ("weight", "activation"))
        self.multi = _check_choice("multi", multi, ("reference", "merge_many"))
        if method == "activation" and multi == "merge_many":
            raise ValueError("multi = 'merge_many' works with method = 'weight' only")
        if method == "activation" and self.server_data is None:
            raise ValueError("method = 'activation' needs server_data for its inputs; got None")
        self.seed = int(seed)
        self.spec = permutation_spec(self.template)

    def merge_states(self, states: Sequence[StateDict], weights: Sequence[float]) -> StateDict:
        """Align (see the class docstring), then average with ``weights``."""
        if len(states) == 1:
            return average(states, weights)
        if self.multi == "merge_many":
            merged, _ = merge_many(self.spec, list(states), weights=list(weights), seed=self.seed)
            return merged
        models, x = None, None
        if self.method == "activation":
            models = [load_state(self.template, sd).to(self.device).eval() for sd in states]
            x = self.server_data[0]
        aligned = align_to_reference(
            self.spec,
            list(states),
            reference=0,
            method=self.method,
            models=models,
            x=x,
            seed=self.seed,
        )
        return average(aligned, weights)
