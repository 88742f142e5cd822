"""What the clients compute on their own trained models, as query rounds
(:class:`OwnModelRounds`); each answer carries the digest of the weights it was computed on,
which must equal that of the weights the client sent in the training round (a client whose
digest differs is dropped, :meth:`~fedlmc.strategies.query_round.QueryRound.refuse`'s way):

- client-side activation matching (``query.align``): the reference model goes to every other
  client, which returns the permutations of its own trained model;
- the clients' own statistics (``query.fisher``, Fisher merging; ``query.gram``, RegMean): every
  client returns the diagonal Fisher, or its layers' input Gram matrices, of its own trained
  model on its own training data, screened on its own and then by scale against the others'
  (:mod:`fedlmc.strategies.statistics_screen`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flwr.app import ArrayRecord, RecordDict
from torch import Tensor, nn

from fedlmc.permutation.model_spec import permutation_spec
from fedlmc.strategies.protocol import (
    ALIGN_QUERY,
    FISHER_QUERY,
    GRAM_QUERY,
    permutations_from_content,
    state_digest,
    state_to_record,
    statistics_from_content,
)
from fedlmc.strategies.query_round import QueryRound
from fedlmc.strategies.screening import screen_align_reply, screen_statistics_reply
from fedlmc.strategies.statistics_screen import Summary, statistics_outliers
from fedlmc.strategies.strategy_utils import ClientsFailedError, ClientUpdate, StateDict

__all__ = ["ClientQueryError", "OwnModelRounds"]


class ClientQueryError(ClientsFailedError):
    """A client's answer cannot be used (failed alignment query, digest mismatch)."""


class OwnModelRounds(QueryRound):
    """Answers the clients compute on their own trained models (see the module docstring)."""

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
        return [{}, *self._digest_checked(others, answers, permutations_from_content, ALIGN_QUERY)]

    def fisher_diagonals(self) -> list[StateDict | None]:
        """Per client (:attr:`~fedlmc.strategies.query_round.QueryRound.clients`), the diagonal
        Fisher of its own trained model on its own training data (``query.fisher``); ``None`` for a
        client dropped (now or earlier)."""
        shapes = {k: tuple(p.shape) for k, p in self.template.named_parameters()}
        return self._own_statistics(FISHER_QUERY, shapes, "fisher", {})

    def gram_matrices(self, layers: Sequence[str]) -> list[dict[str, Tensor] | None]:
        """Per client (:attr:`~fedlmc.strategies.query_round.QueryRound.clients`), the Gram matrices
        of ``layers``' inputs of its own trained model on its own training data (``query.gram``);
        ``None`` for a client dropped."""
        state = self.template.state_dict()
        shapes = {str(n): (int(state[f"{n}.weight"].shape[1]),) * 2 for n in layers}
        return self._own_statistics(GRAM_QUERY, shapes, "gram", {"layers": list(shapes)})

    def _own_statistics(
        self, action: str, shapes: Mapping[str, tuple[int, ...]], kind: str, extra: Mapping
    ) -> list[dict[str, Tensor] | None]:
        """One ``query.<action>`` round about the survivors' kept models: the screened answers
        (each on its own, then their scales against each other's,
        :mod:`fedlmc.strategies.statistics_screen`) whose digest is that of the weights the
        client sent, per client of :attr:`~fedlmc.strategies.query_round.QueryRound.clients`."""
        scales: dict[int, Summary] = {}

        def screen(content: RecordDict) -> None:
            scales[id(content)] = screen_statistics_reply(content, shapes, kind)

        def compare(contents: list[RecordDict]) -> dict[int, str]:
            return statistics_outliers([scales[id(c)] for c in contents], self.robust)

        answers = dict(
            (u.node_id, c)
            for u, c in self.ask(action, ArrayRecord(), extra, screen=screen, compare=compare)
        )
        return self._digest_checked(self.clients, answers, statistics_from_content, action)

    def _digest_checked(
        self,
        updates: Sequence[ClientUpdate],
        answers: Mapping[int, RecordDict],
        decode: Callable[[RecordDict], tuple[Any, str]],
        stage: str,
    ) -> list[Any]:
        """Per client of ``updates``, its answer decoded by ``decode`` (the value and the digest
        of the weights it was computed on) when that digest is the one of the weights the client
        sent in the training round; ``None`` for a client that did not answer, and for one whose
        digest differs, which is dropped (``QueryRound._drop``, at ``stage``)."""
        found: list[Any] = []
        for update in updates:
            if update.node_id not in answers:
                found.append(None)
                continue
            value, digest = decode(answers[update.node_id])
            if digest != state_digest(update.state):
                self._drop(update, self._digest_reason(update), stage)
                found.append(None)
                continue
            found.append(value)
        return found


def _group_sizes(spec: Any, template: nn.Module) -> dict[str, int]:
    """Units of every permutation group of ``spec`` (the size of its first axis)."""
    state = template.state_dict()
    return {
        group: int(state[axes[0][0]].shape[axes[0][1]]) for group, axes in spec.perm_to_axes.items()
    }
