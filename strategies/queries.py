r"""The query rounds a one-shot strategy runs on its surviving clients after the training round.

:class:`ClientRounds` is bound to one round's survivors; every method is one or more Flower
message rounds (``query.<action>`` messages, :mod:`fedlmc.strategies.protocol`), and the object
counts them (``rounds``) and the payload bytes of the replies (``bytes_received``,
:func:`fedlmc.strategies.protocol.payload_bytes`). What the clients answer is computed on their own
data, and only sums, statistics or permutation indices come back:

- the temperature: one query on a grid of :math:`u = \log T` values over
  ``[log T_MIN, log T_MAX]``, then Newton rounds of one value each
  (:func:`fedlmc.merging.calibrate.fit_temperature_federated`); sums are exact, so the result equals
  a centralised fit on the clients' calibration data (their held-out shares);
- calibrated NLLs (``auto``): the grid query alone, :math:`\min_u \sum_c \mathrm{NLL}_c(u) /
  \sum_c n_c` over the grid (steps of 0.014 in :math:`\log T` with the default 1001 points),
  for several models in one round;
- BatchNorm statistics (``query.bn_stats``) and REPAIR's per-unit statistics
  (``query.unit_stats``; :func:`fedlmc.merging.repair.repair_with_statistics` asks ``N + L`` times);
- client-side activation matching (``query.align``): the reference model goes to every other
  client, which returns the permutations of its own trained model and the digest of the weights
  they apply to; the digest must equal that of the weights the client sent in the training round;
- the clients' own statistics (``query.fisher``, Fisher merging; ``query.gram``, RegMean): every
  client returns the diagonal Fisher, or its layers' input Gram matrices, of its own trained
  model on its own training data, with the digest of those weights (checked the same way).

:class:`ClientRounds` implements :class:`fedlmc.merging.merge_job.ClientQueries`, so registered
merge methods (``auto``, ``activation_federated``) reach the clients through it, and
:class:`fedlmc.merging.post_merge.StatisticsSource` (``bn_statistics``, ``unit_statistics``,
``temperature``), so the post-merge pipeline takes the clients' data through it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from logging import WARNING
from typing import Any

from flwr.app import ArrayRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log
from torch import Tensor, nn

from fedlmc.averaging import load_state
from fedlmc.merging.calibrate import (
    BNStats,
    TemperatureStats,
    apply_bn_statistics,
    batchnorm_layers,
    combine_bn_statistics,
    fit_temperature_federated,
    grid_minimum,
    has_batchnorm,
    newton_step,
    temperature_grid,
)
from fedlmc.merging.repair import UnitStats, combine_unit_statistics
from fedlmc.permutation.model_spec import permutation_spec
from fedlmc.strategies.protocol import (
    ALIGN_QUERY,
    BN_QUERY,
    FISHER_QUERY,
    GRAM_QUERY,
    TEMPERATURE_QUERY,
    UNIT_STATS_QUERY,
    bn_stats_from_content,
    models_query_content,
    payload_bytes,
    permutations_from_content,
    query_content,
    state_digest,
    state_to_record,
    statistics_from_content,
    temperature_stats_by_model,
    temperature_stats_from_content,
    unit_stats_from_content,
)
from fedlmc.strategies.robust import (
    OFF,
    RobustScreen,
    check_temperature_bounds,
    moments_outliers,
    nll_outliers,
    num_classes_of,
)
from fedlmc.strategies.screening import (
    UNBOUNDED,
    ScreenError,
    WeightBound,
    screen_align_reply,
    screen_moments_reply,
    screen_statistics_reply,
    screen_temperature_reply,
)
from fedlmc.strategies.statistics_screen import Summary, statistics_outliers
from fedlmc.strategies.strategy_utils import (
    ClientsFailedError,
    ClientUpdate,
    Failure,
    NotEnoughClientsError,
    StateDict,
    query_nodes,
)

NEWTON_TOL = 1e-4  # after the grid start one Newton round is usually within this
MERGE_QUERIES = (ALIGN_QUERY, FISHER_QUERY, GRAM_QUERY)
"""The queries whose answers a merge method uses: a client dropped in one of them is left out
of the merge (not only of later query rounds)."""


class ClientQueryError(ClientsFailedError):
    """A client's answer cannot be used (failed alignment query, digest mismatch)."""


class ClientRounds:
    """Query rounds on one round's ``survivors`` (see the module docstring).

    ``config`` is the round's train config (sent with every query: the caller's keys and the
    protocol keys, :mod:`fedlmc.strategies.protocol`, so a client holds out the same
    ``holdout-share`` and finds the model ``keep-model`` kept); a query round in which fewer
    than ``min_clients`` clients answer raises
    :class:`~fedlmc.strategies.strategy_utils.NotEnoughClientsError`. Every answer passes the
    screen of its message type (:mod:`fedlmc.strategies.screening`); a client whose answer
    fails, errs or does not come is dropped from this and every later query round and recorded
    in ``dropped`` (a :class:`~fedlmc.strategies.strategy_utils.Failure` with the query as its
    ``stage``). Counts are bounded by ``weight_bound``
    (:class:`~fedlmc.strategies.screening.WeightBound`).
    """

    name = "federated"
    """The :class:`fedlmc.merging.post_merge.StatisticsSource` name: the clients' data."""

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
        weight_bound: WeightBound = UNBOUNDED,
        spec: Any = None,
        robust: RobustScreen = OFF,
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
        self.weight_bound = weight_bound
        self.spec = spec
        self.robust = robust
        self.num_classes = num_classes_of(template)
        self.dropped: list[Failure] = []
        self.last_query = ""
        """The action of the latest query round (the stage :meth:`refuse` names)."""
        self.clients = list(survivors)
        """The round's survivors as the merge received them (the order of ``MergeJob.states``)."""
        temperature_grid(self.grid_points)  # validates

    # ------------------------------------------------------------------------- one round

    def ask(
        self,
        action: str,
        arrays: ArrayRecord | Sequence[ArrayRecord],
        extra: Mapping[str, Any] | None = None,
        clients: Sequence[ClientUpdate] | None = None,
        screen: Callable[[RecordDict], None] | None = None,
        compare: Callable[[list[RecordDict]], dict[int, str]] | None = None,
    ) -> list[tuple[ClientUpdate, RecordDict]]:
        """One ``query.<action>`` round about ``arrays`` (one model, or a list of models sent
        together) to ``clients`` (default: every survivor); the answers that pass ``screen``
        (raising :class:`~fedlmc.strategies.screening.ScreenError`) and then ``compare`` (the
        robust screen of the answers against each other, :mod:`fedlmc.strategies.robust`: index
        -> reason) in the clients' order; failures are logged, recorded in ``dropped`` and left
        out (of later rounds too)."""
        if self.grid is None:
            raise RuntimeError(f"the {action} query needs the Grid of configure_train; got none")
        targets = self.survivors if clients is None else list(clients)
        self.last_query = action
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
        by_node = {u.node_id: u for u in targets}
        for node, content in list(answers.items()):
            try:
                if screen is not None:
                    screen(content)
            except (ScreenError, ValueError, KeyError, TypeError) as err:
                del answers[node]
                failures.append(Failure(node, by_node[node].partition_id, str(err)))
        if compare is not None and answers:
            nodes = [u.node_id for u in targets if u.node_id in answers]
            for index, reason in compare([answers[n] for n in nodes]).items():
                del answers[nodes[index]]
                failures.append(Failure(nodes[index], by_node[nodes[index]].partition_id, reason))
        for failure in failures:
            failure.stage = action
            if failure.partition_id is None and failure.node_id in by_node:
                failure.partition_id = by_node[failure.node_id].partition_id
            log(WARNING, "%s query: dropped %s", action, failure.describe())
        self.dropped.extend(failures)
        failed = {f.node_id for f in failures}
        self.survivors = [u for u in self.survivors if u.node_id not in failed]
        if clients is None and len(answers) < self.min_clients:
            raise NotEnoughClientsError(
                f"only {len(answers)} client(s) answered the {action} query "
                f"(min-clients = {self.min_clients}); dropped: "
                + "; ".join(f.describe() for f in self.dropped)
            )
        return [(u, answers[u.node_id]) for u in targets if u.node_id in answers]

    def _factors(self, answers, counts: Sequence[float], kind: str) -> list[float]:
        """The weight bound's factors for the answering clients' claimed ``counts``."""
        return self.weight_bound.factors([u.partition_id for u, _ in answers], counts, kind)

    # ------------------------------------------------------------------------- temperature

    def grid_minima(self, models: Sequence[ArrayRecord]) -> list[tuple[float, TemperatureStats]]:
        """Per model, the grid point of log T with the lowest NLL summed over the answering
        clients and its sums (:func:`fedlmc.merging.calibrate.grid_minimum`): one round for all."""
        grid = temperature_grid(self.grid_points)
        extra = {"log-t": [float(u) for u in grid]}
        names = [f"stats-{k}" for k in range(len(models))]
        answers = self.ask(
            TEMPERATURE_QUERY,
            list(models),
            extra,
            screen=lambda c: self._screen_temperature(c, names, len(grid)),
            compare=self._compare_temperature,
        )
        per_client = bound_temperature_stats(
            [temperature_stats_by_model(c) for _, c in answers],
            [u.partition_id for u, _ in answers],
            self.weight_bound,
        )
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

    def _screen_temperature(self, content: RecordDict, names: Sequence[str], points: int) -> None:
        """The per-reply screen of a temperature reply and its exact bounds
        (:func:`fedlmc.strategies.robust.check_temperature_bounds`)."""
        for count, values in screen_temperature_reply(content, names, points).values():
            for nll, grad, hess in values:
                check_temperature_bounds(count, nll, grad, hess, self.num_classes)

    def _compare_temperature(self, contents: list[RecordDict]) -> dict[int, str]:
        """The relative rule on the answers' per-sample NLLs
        (:func:`fedlmc.strategies.robust.nll_outliers`)."""
        decoded = [temperature_stats_by_model(c) for c in contents]
        return nll_outliers(decoded, self.robust, self.num_classes or 2)

    def _compare_moments(self, decode) -> Callable[[list[RecordDict]], dict[int, str]]:
        """The relative rule on moments replies decoded by ``decode``
        (:func:`fedlmc.strategies.robust.moments_outliers`)."""
        return lambda contents: moments_outliers([decode(c) for c in contents], self.robust)

    def _one_point(self, arrays: ArrayRecord, log_t: float) -> list[TemperatureStats]:
        extra = {"log-t": [float(log_t)]}
        answers = self.ask(
            TEMPERATURE_QUERY,
            arrays,
            extra,
            screen=lambda c: self._screen_temperature(c, ["stats"], 1),
            compare=self._compare_temperature,
        )
        per_client = [[temperature_stats_from_content(c)] for _, c in answers]
        return [
            client[0][0]
            for client in bound_temperature_stats(
                per_client, [u.partition_id for u, _ in answers], self.weight_bound
            )
        ]

    # ------------------------------------------------------------------------- statistics

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

    def temperature(self, model: nn.Module) -> tuple[float, list[dict[str, float]]]:
        """:meth:`fit_temperature` of ``model``'s weights (the post-merge pipeline's step)."""
        return self.fit_temperature(state_to_record(model.state_dict()))

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

    def activation_permutations(self, reference: StateDict) -> list[dict[str, Tensor] | None]:
        """Client-side activation matching: ``reference`` goes to every survivor but the first
        (whose model it is), each returns its permutations; an empty mapping (the identity) for the
        first, ``None`` for a client whose answer failed the screen (a permutation of every
        group of the spec), did not come, or whose digest does not match the weights it sent
        in the training round (it is in ``dropped`` and must be left out of the merge)."""
        first, others = self.survivors[0], self.survivors[1:]
        if state_digest(reference) != state_digest(first.state):
            raise ClientQueryError("the reference of client-side matching must be client 0's model")
        spec = self.spec or permutation_spec(self.template)
        groups = _group_sizes(spec, self.template)
        answers = dict(
            (u.node_id, c)
            for u, c in self.ask(
                ALIGN_QUERY,
                state_to_record(reference),
                clients=others,
                screen=lambda c: screen_align_reply(c, groups, spec),
            )
        )
        perms: list[dict[str, Tensor] | None] = [{}]
        for update in others:
            if update.node_id not in answers:
                perms.append(None)
                continue
            found, digest = permutations_from_content(answers[update.node_id])
            if digest != state_digest(update.state):
                reason = self._digest_reason(update)
                failure = Failure(update.node_id, update.partition_id, reason, stage=ALIGN_QUERY)
                log(WARNING, "align query: dropped %s", failure.describe())
                self.dropped.append(failure)
                self.survivors = [u for u in self.survivors if u.node_id != update.node_id]
                perms.append(None)
                continue
            perms.append(found)
        return perms

    def fisher_diagonals(self) -> list[StateDict | None]:
        """Per client (:attr:`clients`), the diagonal Fisher of its own trained model on its own
        training data (``query.fisher``); ``None`` for a client dropped (now or earlier)."""
        shapes = {k: tuple(p.shape) for k, p in self.template.named_parameters()}
        return self._own_statistics(FISHER_QUERY, shapes, "fisher", {})

    def gram_matrices(self, layers: Sequence[str]) -> list[dict[str, Tensor] | None]:
        """Per client (:attr:`clients`), the Gram matrices of ``layers``' inputs of its own
        trained model on its own training data (``query.gram``); ``None`` for a client
        dropped."""
        state = self.template.state_dict()
        shapes = {str(n): (int(state[f"{n}.weight"].shape[1]),) * 2 for n in layers}
        return self._own_statistics(GRAM_QUERY, shapes, "gram", {"layers": list(shapes)})

    def _own_statistics(
        self, action: str, shapes: Mapping[str, tuple[int, ...]], kind: str, extra: Mapping
    ) -> list[dict[str, Tensor] | None]:
        """One ``query.<action>`` round about the survivors' kept models: the screened answers
        (each on its own, then their scales against each other's,
        :mod:`fedlmc.strategies.statistics_screen`) whose digest is that of the weights the
        client sent, per client of :attr:`clients`."""
        scales: dict[int, Summary] = {}

        def screen(content: RecordDict) -> None:
            scales[id(content)] = screen_statistics_reply(content, shapes, kind)

        def compare(contents: list[RecordDict]) -> dict[int, str]:
            return statistics_outliers([scales[id(c)] for c in contents], self.robust)

        answers = dict(
            (u.node_id, c)
            for u, c in self.ask(action, ArrayRecord(), extra, screen=screen, compare=compare)
        )
        found: list[dict[str, Tensor] | None] = []
        for update in self.clients:
            if update.node_id not in answers:
                found.append(None)
                continue
            tensors, digest = statistics_from_content(answers[update.node_id])
            if digest != state_digest(update.state):
                failure = Failure(
                    update.node_id, update.partition_id, self._digest_reason(update), stage=action
                )
                log(WARNING, "%s query: dropped %s", action, failure.describe())
                self.dropped.append(failure)
                self.survivors = [u for u in self.survivors if u.node_id != update.node_id]
                found.append(None)
                continue
            found.append(tensors)
        return found

    def refuse(self, index: int, reason: str) -> None:
        """Drop client ``index`` of :attr:`clients` by name: the merge refused its answer to the
        latest query (RegMean's solution blows up with its Gram matrices); it is recorded in
        ``dropped`` with that query as its stage and asked nothing more."""
        update = self.clients[index]
        failure = Failure(update.node_id, update.partition_id, reason, stage=self.last_query)
        log(WARNING, "%s query: dropped %s", self.last_query, failure.describe())
        self.dropped.append(failure)
        self.survivors = [u for u in self.survivors if u.node_id != update.node_id]

    def _digest_reason(self, update: ClientUpdate) -> str:
        """Why ``update``'s permutations do not apply to the weights it sent: a dtype other than
        the model's (e.g. float64 weights: the client matched its float32 model), else another
        model altogether."""
        expected = self.template.state_dict()
        for key, tensor in update.state.items():
            if key in expected and tensor.dtype != expected[key].dtype:
                sent = str(tensor.dtype).removeprefix("torch.")
                want = str(expected[key].dtype).removeprefix("torch.")
                return (
                    f"sent {sent} weights ({key!r}) where the model is {want}: client-side "
                    f"matching needs the exact {want} weights it trained (digest mismatch)"
                )
        return "matched weights other than those it sent in the training round (digest mismatch)"


def _group_sizes(spec: Any, template: nn.Module) -> dict[str, int]:
    """Units of every permutation group of ``spec`` (the size of its first axis)."""
    state = template.state_dict()
    return {
        group: int(state[axes[0][0]].shape[axes[0][1]]) for group, axes in spec.perm_to_axes.items()
    }


def bound_temperature_stats(
    per_client: Sequence[Sequence[Sequence[TemperatureStats]]],
    partition_ids: Sequence[int],
    bound: WeightBound,
) -> list[list[list[TemperatureStats]]]:
    """``per_client[c][model][point]`` with each client's count and sums multiplied by its
    factor of ``bound`` (:meth:`WeightBound.factors`, kind ``calibration``)."""
    counts = [float(client[0][0].count) for client in per_client]
    factors = bound.factors(partition_ids, counts, "calibration")
    return [
        [[_scaled_temperature(st, f) for st in model] for model in client]
        for client, f in zip(per_client, factors, strict=True)
    ]


def _scaled_temperature(stats: TemperatureStats, factor: float) -> TemperatureStats:
    """``stats`` with its count and sums multiplied by ``factor`` (the count rounded)."""
    if factor == 1.0:
        return stats
    return TemperatureStats(
        round(stats.count * factor),
        stats.nll_sum * factor,
        stats.grad_sum * factor,
        stats.hess_sum * factor,
    )
