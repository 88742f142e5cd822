r"""Clients in one process: :class:`fedlmc.merging.methods.ClientQueries` on in-memory data, no
Flower.

The merge methods that talk to the clients (``activation_federated``; ``auto`` on the clients'
calibration data) reach them through a :class:`~fedlmc.merging.methods.ClientQueries`. In a
federation the strategies provide one that sends Flower query rounds
(:class:`fedlmc.strategies.queries.ClientRounds`); :class:`LocalClients` computes the same answers
from each client's data held in memory, with the same functions the ClientApp calls and the same
combination the server makes, so a notebook can run these methods (and a test can check a
federation against them)::

    clients = LocalClients(template, states, train_inputs=[x0, x1], calibration=[(xc0, yc0), ...])
    merged, aligned = merge_states("activation_federated", template, states, clients=clients)

- :meth:`LocalClients.activation_permutations`: client ``i >= 1`` matches its own model to the
  reference by :func:`fedlmc.permutation.matching.activation_matching` on ``train_inputs[i]``;
- :meth:`LocalClients.calibrated_nlls`: per model, BatchNorm statistics re-estimated on every
  client's training inputs (exact sums, as the ``query.bn_stats`` round) where asked, then
  :math:`\min_u \sum_c \mathrm{NLL}_c(u) / \sum_c n_c` over the grid of
  :func:`fedlmc.merging.calibrate.temperature_grid` (as the federated grid round).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fedlmc.averaging import load_state
from fedlmc.evaluation import predict_logits, resolve_device
from fedlmc.merging.calibrate import (
    apply_bn_statistics,
    bn_statistics,
    combine_bn_statistics,
    grid_minimum,
    has_batchnorm,
    temperature_grid,
    temperature_statistics,
)
from fedlmc.permutation.matching import activation_matching

StateDict = dict[str, Tensor]
Data = tuple[Tensor, Tensor]

__all__ = ["LocalClients"]


@dataclass
class LocalClients:
    """Clients ``0..N-1`` with their trained ``states``, the inputs they trained on and their
    calibration data (held-out shares), answering :class:`fedlmc.merging.methods.ClientQueries`."""

    template: nn.Module
    states: Sequence[StateDict]
    train_inputs: Sequence[Tensor]
    calibration: Sequence[Data]
    grid_points: int = 1001
    device: str | torch.device | None = None

    def __post_init__(self) -> None:
        n = len(self.states)
        if len(self.train_inputs) != n or len(self.calibration) != n:
            raise ValueError(
                f"{n} client states need {n} train_inputs and {n} calibration sets; got "
                f"{len(self.train_inputs)} and {len(self.calibration)}"
            )
        temperature_grid(self.grid_points)  # validates
        self.device = resolve_device(self.device)

    def _model(self, state: StateDict) -> nn.Module:
        return load_state(self.template, state).to(self.device).eval()

    def activation_permutations(self, reference: StateDict) -> list[dict[str, Tensor]]:
        """Per client, its own model matched to ``reference`` on its training inputs; an empty
        mapping (the identity) for client 0, whose model the reference is."""
        ref = self._model(reference)
        perms: list[dict[str, Tensor]] = [{}]
        for state, x in zip(self.states[1:], self.train_inputs[1:], strict=True):
            perms.append(dict(activation_matching(ref, self._model(state), x)))
        return perms

    def calibrated_nlls(
        self, states: Sequence[StateDict], reestimate_bn: Sequence[bool]
    ) -> list[float]:
        """Per state, the clients' summed NLL per sample at the grid's best temperature."""
        grid = temperature_grid(self.grid_points)
        nlls = []
        for state, reestimate in zip(states, reestimate_bn, strict=True):
            model = self._model(state)
            if reestimate and has_batchnorm(model):
                stats = [bn_statistics(model, x) for x in self.train_inputs]
                apply_bn_statistics(model, combine_bn_statistics(stats))
                model.eval()
            per_client = []
            for x, y in self.calibration:
                logits = predict_logits(model, x, device=self.device)
                per_client.append([temperature_statistics(logits, y, u) for u in grid])
            _, best = grid_minimum(per_client, grid)
            nlls.append(best.nll_sum / best.count)
        return nlls
