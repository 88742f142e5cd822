r"""The merge entry, :func:`merge_states`, and the merge-method registry's public names.

:func:`merge_states` merges client state dicts with a registered method (the one function the
study and the strategies call; ``with_info=True`` also returns what the method reports).
The registry (:func:`register_method`, :class:`MergeJob`, :class:`Alignment`, :data:`METHODS`,
...) is :mod:`fedlmc.merging.method_registry`, the built-in methods
:mod:`fedlmc.merging.builtin_methods`; both are importable from here, and importing this module
registers the built-in methods.

This module imports no torch at import time (the run-config validation reads the method names
without loading torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

from fedlmc.merging.builtin_methods import (
    AUTO_COLUMNS,
    AUTO_TOLERANCE,
    activation_matching_on_clients,
    activation_matching_to_first,
    automatic_choice,
    calibrated_nll,
    embed_first_slots,
    embed_matched_slots,
    holder_combination,
    lewc_bias_combination,
    merge_many_alignment,
    permuted,
    plain_average,
    random_direction,
    random_permutation_control,
    weight_matching_to_first,
)
from fedlmc.merging.merge_job import Alignment, ClientQueries, MergeJob
from fedlmc.merging.method_registry import (
    CALIBRATED_SUFFIX,
    METHODS,
    REFERENCE_METHODS,
    MergeMethod,
    MergeRequest,
    base_method,
    check_method,
    check_own_columns,
    check_template_merge,
    merge_method,
    merge_method_names,
    mixed_width_row,
    refusal,
    register_method,
    study_methods,
    template_merge_names,
)

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from fedlmc.permutation.spec import PermutationSpec

    StateDict = dict[str, Tensor]

__all__ = [
    "AUTO_COLUMNS",
    "AUTO_TOLERANCE",
    "CALIBRATED_SUFFIX",
    "METHODS",
    "REFERENCE_METHODS",
    "Alignment",
    "ClientQueries",
    "MergeJob",
    "MergeMethod",
    "MergeRequest",
    "activation_matching_on_clients",
    "activation_matching_to_first",
    "automatic_choice",
    "base_method",
    "calibrated_nll",
    "check_method",
    "check_own_columns",
    "check_template_merge",
    "embed_first_slots",
    "embed_matched_slots",
    "holder_combination",
    "lewc_bias_combination",
    "merge_many_alignment",
    "merge_method",
    "merge_method_names",
    "merge_states",
    "mixed_width_row",
    "model_facts",
    "permuted",
    "plain_average",
    "random_direction",
    "plain_chain_reason",
    "random_permutation_control",
    "refusal",
    "register_method",
    "study_methods",
    "template_merge_names",
    "weight_matching_to_first",
    "width_difference",
]


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
    reports (its ``Alignment.info``, e.g. ``auto``'s choice; the columns it declared).

    ``merged`` is the method's own merge or :math:`\sum_i w_i \pi_i(\theta_i)` (the method's
    ``combine`` rule where it has one), :math:`w_i` the normalised ``weights`` (default:
    uniform); no BatchNorm re-estimation and no temperature here (the callers add them). A
    single client is returned unchanged (a ``mixed_widths`` method embeds it into
    ``template``'s shapes). ``server_data`` (the server's held-out ``(x, y)``), ``seed``,
    ``device``, ``spec`` (default: the template's), ``options`` (e.g. ``auto_tolerance``),
    ``clients`` (a federation's :class:`ClientQueries`) and ``base`` (the clients' common
    starting model, for the task-vector methods) reach the method in its :class:`MergeJob`.
    ``ValueError``, before any work, when there is no client or the method is unknown, and with
    the method's one refusal (:func:`~fedlmc.merging.method_registry.refusal`, asked once on the
    :class:`MergeRequest` of these arguments) when it does not accept them: clients' state dicts
    that differ in shape for a method that is not ``mixed_widths`` (those embed every client
    into ``template``'s shapes, the server width), missing ``server_data`` (or, for methods that
    take the clients' data instead, ``clients``), ``clients`` or ``base``, too many or too few
    clients, a model that is no norm-free plain chain for a ``plain_chain_only`` method, a layer
    without a bias for REPAIR (:func:`model_facts`); after the merge when the method reports a
    column it did not declare.
    """
    from fedlmc.averaging import average, normalised_weights
    from fedlmc.evaluation import resolve_device

    if not states:
        raise ValueError("need at least one client state dict, got none")
    request = MergeRequest(
        num_clients=len(states),
        fewest_clients=len(states),
        widths=width_difference(states),
        server_data=server_data is not None,
        federated_data=clients is not None,
        clients=clients is not None,
        base=base is not None,
        **model_facts(template, spec, [method]),
    )
    entry = check_method(method, request)
    w = normalised_weights(weights, len(states))
    if len(states) == 1 and not entry.mixed_widths:
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
    aligned clients at the weights of the clients it kept) and its declared info."""
    from fedlmc.averaging import normalised_weights

    alignment = entry.align(job)
    undeclared = sorted(set(alignment.info) - {c.name for c in entry.columns})
    if undeclared:
        raise ValueError(
            f"merge method {entry.name!r} reports column {undeclared[0]!r} it does not declare; "
            "allowed: the names in its register_method(columns=...)"
        )
    w = job.weights
    if alignment.kept is not None:
        w = normalised_weights([w[i] for i in alignment.kept], len(alignment.kept))
    merged = alignment.merged
    if merged is None:
        spec = job.spec if entry.combine is None else job.permutation_spec()
        merged = entry.combined(spec, alignment.aligned, w)
    return merged, alignment.aligned, dict(alignment.info)


def plain_chain_reason(template: nn.Module, spec: PermutationSpec | None) -> str:
    """Why ``template`` (under ``spec``, default: its own) is no norm-free plain chain of
    Linear/Conv layers (:func:`fedlmc.permutation.chain.chain_layers`, and no state key outside
    the chain's weights and biases, :func:`fedlmc.permutation.chain.outside_chain_key`: no
    BatchNorm or other norm layer); ``""`` when it is one."""
    from fedlmc.permutation.chain import chain_layers, outside_chain_key
    from fedlmc.permutation.model_spec import permutation_spec

    state = template.state_dict()
    layers = chain_layers(spec or permutation_spec(template), state)
    if layers is None:
        return "its Linear/Conv layers are not one chain (residual?)"
    other = outside_chain_key(layers, state)
    return (
        ""
        if other is None
        else f"state key {other!r} is no Linear/Conv weight or bias of the chain"
    )


def model_facts(
    template: nn.Module, spec: PermutationSpec | None, methods: Sequence[str]
) -> dict[str, Any]:
    """The :class:`MergeRequest` fields about ``template`` (under ``spec``) that ``methods``
    ask: ``model`` (its class name), ``chain_reason`` (:func:`plain_chain_reason`) when one
    of them is ``plain_chain_only``, ``bias_free`` (the first repaired layer without a bias,
    :func:`fedlmc.merging.repair.bias_free_layer`; none with BatchNorm, whose REPAIR is the
    statistics' reset) when one of them is ``repair``; the others are left unasked."""
    entries = [merge_method(m) for m in methods if base_method(m) not in REFERENCE_METHODS]
    facts: dict[str, Any] = {"model": type(template).__name__}
    if any(e.plain_chain_only for e in entries):
        facts["chain_reason"] = plain_chain_reason(template, spec)
    if any(e.repair for e in entries):
        from fedlmc.merging.calibrate import has_batchnorm
        from fedlmc.merging.repair import bias_free_layer

        layer = None if has_batchnorm(template) else bias_free_layer(template)
        facts["bias_free"] = "" if layer is None else f"layer {layer!r}"
    return facts


def width_difference(states: Sequence[StateDict]) -> str:
    """The first key whose shape differs between client 0 and another client (or that one of
    them lacks), as a refusal names it; ``""`` when the clients have one width."""
    reference = states[0] if states else {}
    for index, sd in enumerate(states[1:], start=1):
        for key in dict.fromkeys([*reference, *sd]):
            a, b = reference.get(key), sd.get(key)
            shape_a = "no such key" if a is None else tuple(a.shape)
            shape_b = "no such key" if b is None else tuple(b.shape)
            if shape_a != shape_b:
                return f"{key!r} has shape {shape_a} in client 0 and {shape_b} in client {index}"
    return ""


# ----------------------------------------------------------------------------- built-in methods
