"""What a merge method receives and returns: :class:`MergeJob` in, :class:`Alignment` out.

A registered method (:func:`fedlmc.merging.method_registry.register_method`) is a function
``align(job: MergeJob) -> Alignment``; :func:`fedlmc.merging.methods.merge_states` builds the
job from its arguments and merges the alignment. In a federation the job carries the clients'
:class:`ClientQueries`, what a method may ask the clients without their data leaving them.

Imports no torch at import time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from fedlmc.permutation.spec import PermutationSpec

    StateDict = dict[str, Tensor]

__all__ = ["Alignment", "ClientQueries", "MergeJob"]


class ClientQueries(Protocol):
    """What a federation lets a merge method ask the clients of ``MergeJob.states`` (in that
    order), without any data leaving them. The strategies implement it with Flower query
    rounds (:class:`fedlmc.strategies.queries.ClientRounds`);
    :class:`fedlmc.merging.clients.LocalClients` answers the same from data held in memory
    (notebooks, tests)."""

    def calibrated_nlls(
        self, states: Sequence[StateDict], reestimate_bn: Sequence[bool]
    ) -> list[float]:
        """Per state dict, the mean NLL over the clients' calibration data at the temperature of
        :func:`fedlmc.merging.calibrate.temperature_grid` minimising it (BatchNorm statistics
        re-estimated on the clients' data first where ``reestimate_bn``)."""
        ...

    def activation_permutations(self, reference: StateDict) -> list[dict[str, Tensor]]:
        """Per client, the permutations matching its own model's hidden units to
        ``reference``'s by activation correlation on its own data; an empty mapping (the
        identity) for client 0, whose model ``reference`` is."""
        ...

    def fisher_diagonals(self) -> list[StateDict | None]:
        """Per client, the diagonal empirical Fisher of its own model on (a bounded sample of)
        its own training data (:func:`fedlmc.merging.field.fisher.fisher_diagonal`); ``None`` for a
        client whose answer was dropped."""
        ...

    def gram_matrices(self, layers: Sequence[str]) -> list[dict[str, Tensor] | None]:
        """Per client, the Gram matrix of each of ``layers``' inputs of its own model on (a
        bounded sample of) its own training data
        (:func:`fedlmc.merging.field.regmean.gram_matrices`); ``None`` for a client whose answer was
        dropped."""
        ...

    def refuse(self, index: int, reason: str) -> None:
        """The merge refused client ``index``'s answer to the latest query (``reason``: one
        line); a federation drops the client by name and asks it nothing more."""
        ...


@dataclass
class MergeJob:
    """What a merge method receives: the clients, their normalised weights and the context
    (the server's held-out data ``(x, y)`` if any, method ``options`` such as
    ``auto_tolerance``, ``clients``, the :class:`ClientQueries` of a federation, and ``base``,
    the clients' common starting model if any)."""

    template: nn.Module
    states: Sequence[StateDict]
    weights: list[float]
    seed: int = 0
    server_data: tuple[Tensor, Tensor] | None = None
    device: torch.device | None = None
    spec: PermutationSpec | None = None
    options: dict[str, Any] = field(default_factory=dict)
    clients: ClientQueries | None = None
    base: StateDict | None = None
    """The clients' common starting model when they had one (``init = "shared"``: the server's
    initialisation), for the methods registered ``needs_base``."""

    @property
    def server_inputs(self) -> Tensor | None:
        """The inputs of the server data (``None`` without server data)."""
        return None if self.server_data is None else self.server_data[0]

    def permutation_spec(self) -> PermutationSpec:
        """The given spec, else the template's (:func:`fedlmc.permutation.permutation_spec`)."""
        if self.spec is None:
            from fedlmc.permutation.model_spec import permutation_spec

            self.spec = permutation_spec(self.template)
        return self.spec


@dataclass
class Alignment:
    """The clients in the merged basis, the method's own merged weights if it has them, and
    what the method reports about its choice (``info``: row columns such as ``auto_choice``)."""

    aligned: list[StateDict]
    merged: StateDict | None = None
    info: dict[str, Any] = field(default_factory=dict)
    kept: list[int] | None = None
    """Indices of the clients in ``aligned`` when the method had to leave some out (a client
    whose answer to a query was dropped); ``None``: all of them."""
