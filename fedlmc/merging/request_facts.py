"""What a :class:`~fedlmc.merging.method_registry.MergeRequest` says about the model and the
clients: :func:`model_facts` (the template: its name, whether it is a norm-free plain chain,
its first layer without a bias) and :func:`width_difference` (whether the clients have one
width), asked by ``merge_states``, the study and the strategies before any work.

This module imports no torch at import time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fedlmc.merging.method_registry import REFERENCE_METHODS, base_method, merge_method

if TYPE_CHECKING:
    from torch import Tensor, nn

    from fedlmc.permutation.spec import PermutationSpec

    StateDict = dict[str, Tensor]

__all__ = ["model_facts", "plain_chain_reason", "width_difference"]


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
    """The :class:`~fedlmc.merging.method_registry.MergeRequest` fields about ``template``
    (under ``spec``) that ``methods`` ask: ``model`` (its class name), ``chain_reason``
    (:func:`plain_chain_reason`) when one of them is ``plain_chain_only``, ``bias_free`` (the
    first repaired layer without a bias, :func:`fedlmc.merging.repair.bias_free_layer`; none
    with BatchNorm, whose REPAIR is the statistics' reset) when one of them is ``repair``; the
    others are left unasked."""
    entries = [merge_method(m) for m in methods if base_method(m) not in REFERENCE_METHODS]
    facts: dict[str, Any] = {"model": type(template).__name__}
    if any(e.needs.plain_chain_only for e in entries):
        facts["chain_reason"] = plain_chain_reason(template, spec)
    if any(e.rule.repair for e in entries):
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
