r"""One merge of the study: the registered method, then the post-merge pipeline, timed.

:func:`merge_in_context` merges the clients of a :class:`~fedlmc.study.context.StudyContext` with
one registered method (:func:`fedlmc.merging.methods.merge_states`) and runs the post-merge
pipeline on the server split (:func:`fedlmc.merging.merge_result.finish_merge`: BatchNorm
statistics re-estimated, or, for REPAIR methods, every hidden unit repaired). The :class:`Merged`
it returns is the one merge result every path produces
(:class:`~fedlmc.merging.merge_result.MergeResult`: the evaluated model, the aligned clients,
the weights as the method combined them, the time it took) with what the study adds: the
method's path rule :math:`\theta(\lambda)` between two models and the clients' query rounds.
A method registered with ``builds_model`` (Preserve-First Merging) evaluates the model it builds
from the aligned clients instead, with no post-merge step (its methods are plain chains without
BatchNorm); its ``state`` is then the combination of the aligned clients its later layers use,
and ``template_shaped`` is false. :func:`merge_clients` is the same merge
for a caller without a context (template-shaped merges only).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from fedlmc.analysis.paths import PathRule
from fedlmc.averaging import interpolate, normalised_weights
from fedlmc.evaluation import resolve_device
from fedlmc.merging.merge_result import MergeResult, finish_merge
from fedlmc.merging.method_registry import (
    check_template_merge,
    merge_method,
    refuse_calibrated_row,
)
from fedlmc.merging.methods import CALIBRATE_CALL, merge_states
from fedlmc.merging.post_merge import ServerData
from fedlmc.permutation.model_spec import permutation_spec
from fedlmc.permutation.spec import PermutationSpec
from fedlmc.study.context import StudyContext, check_states
from fedlmc.study.method_policy import check_info, evaluation_of

if TYPE_CHECKING:
    from fedlmc.data.loading import DataSplits

StateDict = dict[str, Tensor]

__all__ = [
    "Merged",
    "merge_clients",
    "merge_in_context",
    "parameter_count",
    "parameters_ratio",
    "path_rule",
]


@dataclass(frozen=True)
class Merged(MergeResult):
    """A study's merge result (:class:`~fedlmc.merging.merge_result.MergeResult`: the finished
    ``model``, ``state``, the ``aligned`` clients, ``combined``: the weights as the method
    combined them, before BatchNorm re-estimation or REPAIR, ``seconds``, ``bn_reset``,
    ``repaired``, ``info``, ``template_shaped``: false for a method registered with
    ``builds_model``, whose ``model`` is of another architecture and ``state`` only the
    combination of the aligned clients) with the method's path rule between two models
    (``path``; ``None`` for a method whose merge is on no path between them, e.g.
    ``random_direction``). ``query_rounds`` and ``query_bytes``: the message rounds and reply
    bytes of the clients' query rounds the method ran (a federation's clients that count them,
    such as :class:`fedlmc.strategies.queries.ClientRounds`; 0 otherwise), ``query_lost`` the
    clients it merged without because a query dropped them."""

    path: PathRule | None = interpolate
    query_rounds: int = 0
    query_bytes: int = 0
    query_lost: list[Any] = field(default_factory=list)
    """The clients a method that merges the clients' answers (``needs_clients``) lost to the
    query rounds, by then or in its own (a federation's failures, each with ``node_id`` and
    ``describe()``, e.g. :class:`fedlmc.strategies.strategy_utils.Failure`): a client dropped
    from one query is asked nothing later, so the method merged without it."""


def parameter_count(model: nn.Module) -> int:
    """The parameters ``model`` needs to predict: its ``parameter_count`` attribute where it has
    one (:attr:`fedlmc.merging.baselines.preserve_first.PreserveFirstModel.parameter_count`), else
    the number of entries of its parameters."""
    counted = getattr(model, "parameter_count", None)
    return int(counted) if counted is not None else sum(p.numel() for p in model.parameters())


def parameters_ratio(merged: Merged, template: nn.Module) -> float:
    r"""``merged_parameters_ratio``: :math:`P_{\mathrm{merge}} / P_{\mathrm{template}}`, the
    parameters the merged model needs (:func:`parameter_count`) over the template's; 1 for every
    merge that is a state dict of the template."""
    if merged.template_shaped:
        return 1.0
    return parameter_count(merged.model) / parameter_count(template)


def path_rule(method: str, template: nn.Module, spec: PermutationSpec | None) -> PathRule | None:
    r"""The path :math:`\theta(\lambda)` between two models under ``method``'s combination rule:
    the linear interpolation, or the method's own ``combine`` at weights
    :math:`(\lambda, 1 - \lambda)` (e.g. depth-weighted biases at every :math:`\lambda`);
    ``None`` for a method registered ``on_path = False`` (its barrier columns stay NaN)."""
    entry = merge_method(method)
    if not evaluation_of(method).on_path:
        return None
    if entry.rule.combine is None:
        return interpolate
    spec = spec if spec is not None else permutation_spec(template)
    return lambda sd_a, sd_b, lam: entry.rule.combined(spec, [sd_a, sd_b], [lam, 1.0 - lam])


def merge_in_context(context: StudyContext, method: str) -> Merged:
    """The registered merge of ``method`` on the context's clients, then the post-merge pipeline
    on the server split (see the module docstring)."""
    start = time.perf_counter()
    server_data = context.server_data
    weights = list(context.weights)
    entry = merge_method(method)
    before = _query_counts(context.clients)
    merged, aligned, info = merge_states(
        method,
        context.template,
        context.states,
        weights,
        server_data=server_data,
        seed=context.seed,
        device=context.device,
        spec=context.spec,
        options=dict(context.method_options),
        clients=context.clients if entry.needs.clients else None,
        base=context.base,
        with_info=True,
    )
    check_info(method, info)
    result = finish_merge(
        method,
        context.template,
        merged,
        aligned,
        weights,
        None if server_data is None else ServerData(*server_data),
        device=context.device,
        info=info,
        options=context.method_options,
        started=start,
    )
    after = _query_counts(context.clients)
    return Merged(
        **{f.name: getattr(result, f.name) for f in fields(MergeResult)},
        path=path_rule(method, context.template, context.spec),
        query_rounds=after[0] - before[0],
        query_bytes=after[1] - before[1],
        query_lost=list(getattr(context.clients, "dropped", ())) if entry.needs.clients else [],
    )


def _query_counts(clients: object) -> tuple[int, int]:
    """``(rounds, bytes_received)`` of a federation's clients that count them, else zeros."""
    return int(getattr(clients, "rounds", 0)), int(getattr(clients, "bytes_received", 0))


def merge_clients(
    method: str,
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float] | None,
    splits: DataSplits,
    *,
    seed: int = 0,
    device: str | torch.device | None = None,
    spec: PermutationSpec | None = None,
) -> tuple[StateDict, dict[str, Any]]:
    r"""Merged weights for one registered merge method (:mod:`fedlmc.merging.method_registry`; a
    ``_t`` row's name is refused in one line naming its merge and the calibration call,
    :func:`~fedlmc.merging.method_registry.refuse_calibrated_row`: this function fits no
    temperature).

    Multi-client weight/activation matching aligns every client to client 0 and takes the
    weighted mean :math:`\sum_i w_i \pi_i(\theta_i)`; activation matching correlates activations on
    the server split's inputs. BatchNorm models get their running statistics re-estimated on the
    server split after merging (the server split is never given to clients).

    Returns ``(state_dict, info)`` with ``info = {"method", "merge_seconds" (alignment + averaging
    + BN reset), "bn_reset", "aligned"}``; ``aligned`` is the list of clients in the merged basis
    (client 0 unchanged for the reference-based methods).
    """
    check_template_merge(method, "merge_clients")  # ValueError naming the registered methods
    refuse_calibrated_row(method, "merge_clients", CALIBRATE_CALL)
    check_states(states)
    context = StudyContext(
        template=template,
        states=tuple(states),
        weights=tuple(normalised_weights(weights, len(states))),
        splits=splits,
        device=resolve_device(device),
        seed=int(seed),
        spec=spec,
    )
    merged = merge_in_context(context, method)
    info = {
        "method": method,
        "merge_seconds": merged.seconds,
        "bn_reset": merged.bn_reset,
        "aligned": merged.aligned,
    }
    return merged.state, info
