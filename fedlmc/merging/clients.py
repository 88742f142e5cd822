r"""Clients in one process: :class:`fedlmc.merging.merge_job.ClientQueries` on in-memory data, no
Flower.

The merge methods that talk to the clients (``activation_federated``; ``auto`` on the clients'
calibration data) reach them through a :class:`~fedlmc.merging.merge_job.ClientQueries`. In a
federation the strategies provide one that sends Flower query rounds
(:class:`fedlmc.strategies.queries.ClientRounds`); :class:`LocalClients` computes the same answers
from each client's data held in memory, with the same functions the ClientApp calls and the same
combination the server makes, so a notebook can run these methods (and a test can check a
federation against them)::

    clients = LocalClients(template, states, train_inputs=[x0, x1], calibration=[(xc0, yc0), ...])
    merged, aligned = merge_states("activation_federated", template, states, clients=clients)

- :meth:`LocalClients.activation_permutations`: client ``i >= 1`` matches its own model to the
  reference by :func:`fedlmc.permutation.matching.activation_matching` on ``train_inputs[i]``;
- :meth:`LocalClients.fisher_diagonals`, :meth:`LocalClients.gram_matrices`: client :math:`i`'s
  diagonal Fisher of its own model on ``train_inputs[i]`` and ``train_labels[i]``, or the Gram
  matrices of its layers' inputs on ``train_inputs[i]``, each on at most ``fisher_samples`` /
  ``regmean_samples`` of them (the seeded subset the ClientApp draws,
  :func:`fedlmc.merging.field.fisher.statistics_seed` of ``seed`` and ``i``);
- :meth:`LocalClients.calibrated_nlls`: per model, BatchNorm statistics re-estimated on every
  client's training inputs (exact sums, as the ``query.bn_stats`` round) where asked, then
  :math:`\min_u \sum_c \mathrm{NLL}_c(u) / \sum_c n_c` over the grid of
  :func:`fedlmc.merging.calibrate.temperature_grid` (as the federated grid round).

:class:`LocalClients` is also a :class:`fedlmc.merging.post_merge.StatisticsSource` (``name =
"federated"``), so the post-merge pipeline runs on in-memory clients as a federation runs it
on its clients: :meth:`~LocalClients.bn_statistics` and :meth:`~LocalClients.unit_statistics`
sum every client's statistics over its training inputs (as ``query.bn_stats`` and
``query.unit_stats``), :meth:`~LocalClients.temperature` fits :math:`T` on the union of the
clients' calibration data (the optimum the federated grid and Newton rounds converge to).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from fedlmc.averaging import load_state
from fedlmc.evaluation import predict_logits, resolve_device
from fedlmc.merging.calibrate import (
    BNStats,
    apply_bn_statistics,
    bn_statistics,
    combine_bn_statistics,
    fit_temperature,
    grid_minimum,
    has_batchnorm,
    temperature_grid,
    temperature_statistics,
)
from fedlmc.merging.field.field_methods import FISHER_LABELS, FISHER_SAMPLES, REGMEAN_SAMPLES
from fedlmc.merging.repair import UnitStats, combine_unit_statistics, unit_statistics
from fedlmc.permutation.matching import activation_matching

StateDict = dict[str, Tensor]
Data = tuple[Tensor, Tensor]

__all__ = ["LocalClients"]


@dataclass
class LocalClients:
    """Clients ``0..N-1`` with their trained ``states``, the inputs they trained on and their
    calibration data (held-out shares), answering
    :class:`fedlmc.merging.merge_job.ClientQueries`."""

    template: nn.Module
    states: Sequence[StateDict]
    train_inputs: Sequence[Tensor]
    calibration: Sequence[Data]
    grid_points: int = 1001
    device: str | torch.device | None = None
    train_labels: Sequence[Tensor] = ()
    fisher_samples: int = FISHER_SAMPLES
    fisher_labels: str = FISHER_LABELS[0]
    regmean_samples: int = REGMEAN_SAMPLES
    seed: int = 0

    refused: list[tuple[int, str]] = field(default_factory=list)
    """``(client, reason)`` for every answer a merge refused (:meth:`refuse`)."""

    def refuse(self, index: int, reason: str) -> None:
        """Record that the merge refused client ``index``'s answer (in-memory clients are
        asked again by the next merge)."""
        self.refused.append((int(index), str(reason)))

    def __post_init__(self) -> None:
        n = len(self.states)
        if len(self.train_inputs) != n or len(self.calibration) != n:
            raise ValueError(
                f"{n} client states need {n} train_inputs and {n} calibration sets; got "
                f"{len(self.train_inputs)} and {len(self.calibration)}"
            )
        if self.train_labels and len(self.train_labels) != n:
            raise ValueError(
                f"{n} client states need {n} train_labels; got {len(self.train_labels)}"
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

    def fisher_diagonals(self) -> list[StateDict]:
        """Per client, the diagonal empirical Fisher of its own model on a bounded sample of its
        training data (:func:`fedlmc.merging.field.fisher.fisher_diagonal`)."""
        from fedlmc.merging.field.fisher import bounded_sample, fisher_diagonal, statistics_seed

        if len(self.train_labels) != len(self.states):
            raise ValueError("the Fisher needs the clients' train_labels; got none")
        fishers = []
        for index, (state, x, y) in enumerate(
            zip(self.states, self.train_inputs, self.train_labels, strict=True)
        ):
            seed = statistics_seed(self.seed, index)
            xs, ys = bounded_sample(x, y, self.fisher_samples, seed)
            fishers.append(
                fisher_diagonal(self._model(state), xs, ys, labels=self.fisher_labels, seed=seed)
            )
        return fishers

    def gram_matrices(self, layers: Sequence[str]) -> list[dict[str, Tensor]]:
        """Per client, the Gram matrices of ``layers``' inputs of its own model on a bounded
        sample of its training inputs (:func:`fedlmc.merging.field.regmean.gram_matrices`)."""
        from fedlmc.merging.field.fisher import bounded_sample, statistics_seed
        from fedlmc.merging.field.regmean import gram_matrices

        grams = []
        for index, (state, x) in enumerate(zip(self.states, self.train_inputs, strict=True)):
            xs, _ = bounded_sample(x, None, self.regmean_samples, statistics_seed(self.seed, index))
            grams.append(gram_matrices(self._model(state), xs, layers))
        return grams

    def calibrated_nlls(
        self, states: Sequence[StateDict], reestimate_bn: Sequence[bool]
    ) -> list[float]:
        """Per state, the clients' summed NLL per sample at the grid's best temperature."""
        grid = temperature_grid(self.grid_points)
        nlls = []
        for state, reestimate in zip(states, reestimate_bn, strict=True):
            model = self._model(state)
            if reestimate and has_batchnorm(model):
                apply_bn_statistics(model, self.bn_statistics(model))
                model.eval()
            per_client = []
            for x, y in self.calibration:
                logits = predict_logits(model, x, device=self.device)
                per_client.append([temperature_statistics(logits, y, u) for u in grid])
            _, best = grid_minimum(per_client, grid)
            nlls.append(best.nll_sum / best.count)
        return nlls

    # ------------------------------------------------------------------------- StatisticsSource

    name = "federated"

    def bn_statistics(self, model: nn.Module) -> dict[str, BNStats]:
        """Per BatchNorm layer, the clients' input sums over their training inputs, added."""
        return combine_bn_statistics([bn_statistics(model, x) for x in self.train_inputs])

    def unit_statistics(self, model: nn.Module, layers: Sequence[str]) -> dict[str, UnitStats]:
        """Per layer, the clients' per-unit output sums over their training inputs, added."""
        per_client = [unit_statistics(model, x, layers) for x in self.train_inputs]
        return combine_unit_statistics(per_client)

    def temperature(self, model: nn.Module) -> tuple[float, list[dict[str, float]]]:
        """:math:`T` minimising the mean NLL over the union of the clients' calibration data."""
        logits = [predict_logits(model, x, device=self.device) for x, _ in self.calibration]
        labels = torch.cat([y for _, y in self.calibration])
        return float(fit_temperature(torch.cat(logits), labels)), []
