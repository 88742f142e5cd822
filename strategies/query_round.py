"""One query round on the survivors of a training round (:class:`QueryRound`), the base of
:class:`fedlmc.strategies.queries.ClientRounds`.

:meth:`QueryRound.ask` sends one ``query.<action>`` message to each surviving client (about one
model or several, :mod:`fedlmc.strategies.protocol`), screens each answer on its own and then
against the others, drops the clients whose answer fails, errs or does not come (from every
later round too, recorded in ``dropped``), and counts the rounds and the payload bytes. What
each round asks is in the subclasses: the temperature
(:mod:`fedlmc.strategies.temperature_rounds`), the moments of a model on the clients' data
(:mod:`fedlmc.strategies.moment_rounds`), and what the clients compute on their own models
(:mod:`fedlmc.strategies.own_model_rounds`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from logging import WARNING
from typing import Any

from flwr.app import ArrayRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log
from torch import nn

from fedlmc.merging.calibrate import temperature_grid
from fedlmc.strategies.protocol import models_query_content, payload_bytes, query_content
from fedlmc.strategies.robust import OFF, RobustScreen, num_classes_of
from fedlmc.strategies.screening import UNBOUNDED, ScreenError, WeightBound
from fedlmc.strategies.strategy_utils import (
    ClientUpdate,
    Failure,
    NotEnoughClientsError,
    query_nodes,
)

__all__ = ["QueryRound"]


class QueryRound:
    """Query rounds on one round's ``survivors``: the round itself (:meth:`ask`) and who is dropped.

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

    def _drop(self, update: ClientUpdate, reason: str, stage: str) -> None:
        """Drop ``update``'s client for ``reason``: logged, recorded in ``dropped`` with the query
        ``stage``, and asked nothing more."""
        failure = Failure(update.node_id, update.partition_id, reason, stage=stage)
        log(WARNING, "%s query: dropped %s", stage, failure.describe())
        self.dropped.append(failure)
        self.survivors = [u for u in self.survivors if u.node_id != update.node_id]

    def refuse(self, index: int, reason: str) -> None:
        """Drop client ``index`` of :attr:`clients` by name: the merge refused its answer to the
        latest query (RegMean's solution blows up with its Gram matrices); it is recorded in
        ``dropped`` with that query as its stage and asked nothing more."""
        self._drop(self.clients[index], reason, self.last_query)

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
