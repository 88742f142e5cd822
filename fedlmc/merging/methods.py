r"""The merge entry, :func:`merge_states`: client state dicts merged with a registered method.

:func:`merge_states` is the one function the study and the strategies call (``with_info=True``
also returns what the method reports). The methods are registered in
:mod:`fedlmc.merging.method_registry`; a method receives a
:class:`~fedlmc.merging.merge_job.MergeJob` and returns an
:class:`~fedlmc.merging.merge_job.Alignment`.

This module imports no torch at import time (the run-config validation reads the method names
without loading torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from fedlmc.merging.merge_job import MergeJob
from fedlmc.merging.method_registry import (
    MergeMethod,
    MergeRequest,
    check_method,
    refuse_calibrated_row,
)
from fedlmc.merging.request_facts import model_facts, width_difference

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from fedlmc.merging.merge_job import ClientQueries
    from fedlmc.permutation.spec import PermutationSpec

    StateDict = dict[str, Tensor]

__all__ = ["CALIBRATE_CALL", "merge_states"]

CALIBRATE_CALL = (
    "fedlmc.merging.post_merge.calibrate(load_state(template, merged), ServerData(x, y))"
    ".temperature"
)
"""The library's calibration call, which a refusal of a ``_t`` name points to."""


@overload
def merge_states(
    method: str,
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float] | None = None,
    *,
    server_data: tuple[Tensor, Tensor] | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
    spec: PermutationSpec | None = None,
    options: dict[str, Any] | None = None,
    clients: ClientQueries | None = None,
    base: StateDict | None = None,
    with_info: Literal[False] = False,
) -> tuple[StateDict, list[StateDict]]: ...


@overload
def merge_states(
    method: str,
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float] | None = None,
    *,
    server_data: tuple[Tensor, Tensor] | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
    spec: PermutationSpec | None = None,
    options: dict[str, Any] | None = None,
    clients: ClientQueries | None = None,
    base: StateDict | None = None,
    with_info: Literal[True],
) -> tuple[StateDict, list[StateDict], dict[str, Any]]: ...


def merge_states(
    method: str,
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float] | None = None,
    *,
    server_data: tuple[Tensor, Tensor] | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
    spec: PermutationSpec | None = None,
    options: dict[str, Any] | None = None,
    clients: ClientQueries | None = None,
    base: StateDict | None = None,
    with_info: bool = False,
) -> tuple[StateDict, list[StateDict]] | tuple[StateDict, list[StateDict], dict[str, Any]]:
    r"""Merge ``states`` with the registered ``method``: ``(merged, aligned clients)``, and with
    ``with_info=True`` ``(merged, aligned clients, info)``, ``info`` being what the method
    reports (its ``Alignment.info``, e.g. ``auto``'s choice; the study and the strategies check
    it against the columns its evaluation policy declares,
    :func:`fedlmc.study.method_policy.check_info`).

    ``merged`` is the method's own merge or :math:`\sum_i w_i \pi_i(\theta_i)` (the method's
    ``combine`` rule where it has one), :math:`w_i` the normalised ``weights`` (default:
    uniform); no BatchNorm re-estimation, no REPAIR and no temperature here (the callers add
    them: :func:`~fedlmc.merging.post_merge.post_merge`, then :data:`CALIBRATE_CALL`). A
    single client is returned unchanged (a ``mixed_widths`` method embeds it into
    ``template``'s shapes). ``server_data`` (the server's held-out ``(x, y)``), ``seed``,
    ``device``, ``spec`` (default: the template's), ``options`` (e.g. ``auto_tolerance``),
    ``clients`` (a federation's :class:`ClientQueries`) and ``base`` (the clients' common
    starting model, for the task-vector methods) reach the method in its :class:`MergeJob`.
    A ``_t`` name (a study row: the merge with a fitted temperature) is refused in one line
    naming the merge and the calibration call (:data:`CALIBRATE_CALL`,
    :func:`~fedlmc.merging.method_registry.refuse_calibrated_row`): this function fits no
    temperature, and the model it returns is not the one the row describes.
    ``ValueError``, before any work, when there is no client or the method is unknown, and with
    the method's one refusal (:func:`~fedlmc.merging.method_registry.refusal`, asked once on the
    :class:`MergeRequest` of these arguments) when it does not accept them: clients' state dicts
    that differ in shape for a method that is not ``mixed_widths`` (those embed every client
    into ``template``'s shapes, the server width), missing ``server_data`` (or, for methods that
    take the clients' data instead, ``clients``), ``clients`` or ``base``, too many or too few
    clients, a model that is no norm-free plain chain for a ``plain_chain_only`` method, a layer
    without a bias for REPAIR (:func:`model_facts`).
    """
    from fedlmc.averaging import average, normalised_weights
    from fedlmc.evaluation import resolve_device

    if not states:
        raise ValueError("need at least one client state dict, got none")
    refuse_calibrated_row(method, "merge_states", CALIBRATE_CALL)
    request = MergeRequest(
        num_clients=len(states),
        fewest_clients=len(states),
        widths=width_difference(states),
        server_data=server_data is not None,
        federated_data=clients is not None,
        clients=clients is not None,
        base=base is not None,
        options=options or {},
        **model_facts(template, spec, [method]),
    )
    entry = check_method(method, request)
    w = normalised_weights(weights, len(states))
    if len(states) == 1 and not entry.needs.mixed_widths:
        merged, aligned, info = average(states, w), list(states), {}
    else:
        job = MergeJob(
            template=template,
            states=list(states),
            weights=w,
            seed=int(seed),
            server_data=server_data,
            device=resolve_device(device),
            spec=spec,
            options=dict(options or {}),
            clients=clients,
            base=base,
        )
        merged, aligned, info = _run(entry, job)
    return (merged, aligned, info) if with_info else (merged, aligned)


def _run(entry: MergeMethod, job: MergeJob) -> tuple[StateDict, list[StateDict], dict[str, Any]]:
    """The method's alignment of ``job``, its merge (its own, else its ``combine`` of the
    aligned clients at the weights of the clients it kept) and its info."""
    from fedlmc.averaging import normalised_weights

    alignment = entry.align(job)
    w = job.weights
    if alignment.kept is not None:
        w = normalised_weights([w[i] for i in alignment.kept], len(alignment.kept))
    merged = alignment.merged
    if merged is None:
        spec = job.spec if entry.rule.combine is None else job.permutation_spec()
        merged = entry.rule.combined(spec, alignment.aligned, w)
    return merged, alignment.aligned, dict(alignment.info)
