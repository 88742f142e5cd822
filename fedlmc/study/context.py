r"""The settings of one study, as one frozen object, and what is checked before any work.

:class:`StudyContext` holds everything the rows of one :func:`fedlmc.study.compare_methods` call
share: the template, the clients' state dicts and normalised weights :math:`w_i`, the splits,
the device, the seed, the path resolution, the diagnostics' inputs and layers, the permutation
spec, the merge methods' options and the progress callback.
:func:`fedlmc.study.compare.study_context` builds it from ``compare_methods``' arguments
(checked there); the merge (:mod:`fedlmc.study.merge`), the path
columns (:mod:`fedlmc.study.barriers`), the diagnostics (:mod:`fedlmc.study.diagnostic_columns`)
and the driver (:mod:`fedlmc.study.compare`) read it instead of a dozen re-passed settings.
:class:`Predictions` is one model's logits on the test and server splits with its fitted
temperature, computed once per model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from fedlmc.analysis.shared_forwards import ForwardCache
from fedlmc.evaluation import metrics_from_logits, predict_logits
from fedlmc.merging.calibrate import fit_temperature
from fedlmc.merging.merge_job import ClientQueries
from fedlmc.merging.method_registry import (
    REFERENCE_METHODS,
    MergeRequest,
    check_method,
    refusal,
    resolve_method_entry,
    study_methods,
)
from fedlmc.permutation.spec import PermutationSpec

if TYPE_CHECKING:
    from fedlmc.data.loading import DataSplits

StateDict = dict[str, Tensor]
Progress = Callable[[str], None] | None

__all__ = [
    "Predictions",
    "Progress",
    "StudyContext",
    "check_client_count",
    "check_methods",
    "check_states",
    "count_request",
    "default_methods",
    "templates_of_clients",
]


@dataclass(frozen=True)
class StudyContext:
    """Everything the rows of one study share (see the module docstring); frozen: built once.

    ``weights`` are normalised; ``diagnostic_x`` are the first ``diagnostic_samples`` test
    inputs; ``layer_names`` the layers the diagnostics measure (empty without diagnostics);
    ``lewc_undefined`` why LEWC's depths are undefined for this model ("" where defined);
    ``clients`` the federation's :class:`~fedlmc.merging.merge_job.ClientQueries` the methods that
    run on the clients query (``None``: none of them runs); ``base`` the clients' common
    starting model (``None``: the task-vector methods do not run); ``forwards`` the
    :class:`~fedlmc.analysis.shared_forwards.ForwardCache` that shares the study's forward
    passes (``None``: every measurement runs its own).
    """

    template: nn.Module
    states: tuple[StateDict, ...]
    weights: tuple[float, ...]
    splits: DataSplits
    device: torch.device
    seed: int = 0
    lambdas: int = 25
    diagnostics: bool = True
    diagnostic_x: Tensor | None = None
    spec: PermutationSpec | None = None
    layer_names: tuple[str, ...] = ()
    method_options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    progress: Progress = None
    lewc_undefined: str = ""
    clients: ClientQueries | None = None
    base: StateDict | None = None
    forwards: ForwardCache | None = None

    @property
    def num_clients(self) -> int:
        return len(self.states)

    @property
    def server_data(self) -> tuple[Tensor, Tensor] | None:
        """The server split ``(x, y)``, ``None`` when it is empty."""
        return self.splits.server if len(self.splits.server[1]) else None

    def say(self, message: str) -> None:
        """``message`` to the progress callback, if any."""
        if self.progress is not None:
            self.progress(message)

    def predict(self, model: nn.Module) -> Predictions:
        """:meth:`Predictions.of` ``model`` on the context's splits, or, with a ``forwards``
        cache, the predictions of an equal model evaluated before (the same values)."""
        if self.forwards is None:
            return Predictions.of(model, self.splits, self.device)
        inputs = (self.splits.test[0], self.splits.server[0], self.splits.server[1])
        return self.forwards.memo(
            "predictions",
            [model],
            inputs,
            lambda: Predictions.of(model, self.splits, self.device),
        )


@dataclass
class Predictions:
    """Logits of one model on the test and server splits, with the server-fitted temperature."""

    test: Tensor
    server: Tensor
    temperature: float

    @classmethod
    def of(cls, model: nn.Module, splits: DataSplits, device: torch.device) -> Predictions:
        test = predict_logits(model, splits.test[0], device=device)
        server = predict_logits(model, splits.server[0], device=device)
        return cls(test, server, fit_temperature(server, splits.server[1]))

    def metrics(self, labels: Tensor, temperature: float | None = None) -> dict[str, float]:
        """Test ``accuracy``, ``nll_raw``, ``ece_raw``, ``nll_calibrated``, ``ece_calibrated``:
        the calibrated ones at ``temperature`` (default: the one fitted on the server split)."""
        raw = metrics_from_logits(self.test, labels)
        at = self.temperature if temperature is None else float(temperature)
        cal = metrics_from_logits(self.test, labels, at)
        return {
            "accuracy": raw["accuracy"],
            "nll_raw": raw["nll"],
            "ece_raw": raw["ece"],
            "nll_calibrated": cal["nll"],
            "ece_calibrated": cal["ece"],
        }


# ----------------------------------------------------------------------------- checks


def check_states(states: Sequence[StateDict]) -> None:
    """``ValueError`` for no client state dict at all."""
    if len(states) == 0:
        raise ValueError("need at least one client state dict, got none")


def check_methods(methods: Sequence[str], federated: bool = False) -> list[str]:
    """``methods`` without duplicates, in order, an import path ``"package.module:function"``
    resolved to its rows' name (:func:`~fedlmc.merging.method_registry.resolve_method_entry`,
    as a run config's ``methods``); ``ValueError`` naming one that does not import or is
    unknown, or one that runs on the clients when the study has none (``federated`` false)."""
    if isinstance(methods, str):
        methods = [methods]
    methods = [resolve_method_entry(m) for m in methods]
    allowed = study_methods(federated)
    for method in methods:
        if method not in allowed:
            if method in study_methods(federated=True):
                check_method(method, MergeRequest(num_clients=1, clients=False))
            raise ValueError(f"unknown merge method {method!r}; allowed: {', '.join(allowed)}")
    return list(dict.fromkeys(methods))


def default_methods(num_clients: int) -> list[str]:
    """Every study method that accepts ``num_clients`` clients (:func:`count_request`: those
    registered ``many_clients = False``, such as ``random_direction``, only up to two; those
    registered with a ``min_clients``, such as ``krum``, from that many)."""
    request = count_request(num_clients)
    return [m for m in study_methods() if m in REFERENCE_METHODS or not refusal(m, request)]


def count_request(num_clients: int) -> MergeRequest:
    """The :class:`~fedlmc.merging.method_registry.MergeRequest` of a study's ``num_clients``
    clients, its other preconditions unasked."""
    return MergeRequest(num_clients=num_clients, fewest_clients=num_clients)


def check_client_count(methods: list[str], num_clients: int) -> list[str]:
    """``methods``; ``ValueError`` with the refusal of the first one that does not accept
    ``num_clients`` clients (:func:`fedlmc.merging.method_registry.refusal`), before any work."""
    request = count_request(num_clients)
    for method in methods:
        if method not in REFERENCE_METHODS:
            check_method(method, request)
    return methods


def templates_of_clients(
    template: nn.Module, given: Sequence[nn.Module] | None, count: int
) -> list[nn.Module]:
    """The model each client's weights load into: ``given`` (one per client, e.g. each at its own
    width), else ``template`` for every client."""
    if given is None:
        return [template] * count
    if len(given) != count:
        raise ValueError(
            f"client_templates: {len(given)} models for {count} client state dicts; allowed: "
            "one per client"
        )
    return list(given)
