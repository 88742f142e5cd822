r"""One merge result, built by one pipeline: merge, post-merge, calibration.

Every path that merges clients produces a :class:`MergeResult`: the study's comparison
(:func:`fedlmc.study.merge.merge_in_context`), the strategies' merge round
(:meth:`fedlmc.strategies.one_shot.OneShotAverage.merge_round`), the ServerApp's SecAgg+ and DP
modes and the library (:func:`merge_and_finish`). It holds the finished model and its weights, the
combination before the post-merge steps, the aligned clients and their weights, what the method
reported (``info``), where the BatchNorm statistics came from, whether REPAIR ran, the time it
took, the temperature :math:`T` and what the server received of the clients to compute it.

The pipeline is written once:

1. **merge** (:func:`fedlmc.merging.methods.merge_states`): the registered method's combination
   :math:`\bar\theta` and the aligned clients; a path whose merge is a protocol (SecAgg+'s sum,
   DP's clipped and noised average) brings its :math:`\bar\theta` instead;
2. **post-merge** (:func:`finish_merge`): :func:`fedlmc.merging.post_merge.post_merge` on a
   merge that is a state dict of the template (BatchNorm statistics, REPAIR), or the model a
   ``builds_model`` method builds;
3. **calibration** (:func:`calibrated`): :math:`T` from a
   :class:`~fedlmc.merging.post_merge.Calibration` (fitted on a statistics source, predicted,
   or computed by a protocol).

A ``_t`` row is an evaluation of the result at its :math:`T` (the study's rows,
:func:`fedlmc.study.model_rows.merge_rows`), never a second merge: the library's merge entries
refuse ``_t`` names (:func:`fedlmc.merging.method_registry.refuse_calibrated_row`).
This module imports no torch at import time.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from fedlmc.merging.post_merge import NO_SOURCE, Calibration, StatisticsSource

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from fedlmc.merging.merge_job import ClientQueries
    from fedlmc.permutation.spec import PermutationSpec

    StateDict = dict[str, Tensor]

__all__ = ["IN_THE_CLEAR", "MergeResult", "calibrated", "finish_merge", "merge_and_finish"]

IN_THE_CLEAR = "each model"
"""What the server of a merge in the clear receives: every client's model."""


@dataclass(frozen=True)
class MergeResult:
    """One finished merge (see the module docstring).

    ``method``: the registered merge (no ``_t``); ``model``: the finished model (on its device,
    eval mode); ``state``: its weights (detached CPU copies; for a ``builds_model`` merge, the
    combination its later layers use); ``combined``: the merge before the post-merge steps;
    ``aligned``: the clients in the merged basis, at ``weights``; ``info``: what the method
    reported (its ``Alignment.info``); ``bn_source``: where the BatchNorm statistics came from
    (``none``: not re-estimated); ``repaired``: whether REPAIR ran; ``template_shaped``: whether
    ``model`` is the template's architecture; ``seconds``: merge and post-merge; ``temperature``
    and ``calibration_history``: :math:`T` (1 until calibrated) and its fit's rounds;
    ``server_saw``: what the server received of the clients (:data:`IN_THE_CLEAR` unless the
    producing path says less, such as a secure sum)."""

    method: str
    model: nn.Module
    state: StateDict
    combined: StateDict
    aligned: list[StateDict]
    weights: tuple[float, ...]
    info: Mapping[str, Any] = field(default_factory=dict)
    bn_source: str = NO_SOURCE
    repaired: bool = False
    template_shaped: bool = True
    seconds: float = 0.0
    temperature: float = 1.0
    calibration_history: tuple[Mapping[str, float], ...] = ()
    server_saw: str = IN_THE_CLEAR

    @property
    def bn_reset(self) -> bool:
        """Whether the BatchNorm statistics were re-estimated."""
        return self.bn_source != NO_SOURCE


def finish_merge(
    method: str,
    template: nn.Module,
    combined: Mapping[str, Tensor],
    aligned: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    statistics: StatisticsSource | None,
    *,
    device: str | torch.device | None = None,
    info: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    started: float | None = None,
    server_saw: str = IN_THE_CLEAR,
) -> MergeResult:
    """Step 2 on the merge ``combined`` of ``method``:
    :func:`~fedlmc.merging.post_merge.post_merge` with ``statistics`` for a merge that is a
    state dict of ``template``, else the model the method builds (``builds_model(template,
    aligned, weights, options)``, no post-merge step). ``seconds`` counts from ``started``
    (a ``time.perf_counter()`` value; default: now); :math:`T = 1` until :func:`calibrated`."""
    from fedlmc.evaluation import resolve_device
    from fedlmc.merging.method_registry import merge_method
    from fedlmc.merging.post_merge import post_merge

    start = time.perf_counter() if started is None else started
    entry = merge_method(method)
    dev = resolve_device(device)
    if entry.rule.template_shaped:
        done = post_merge(template, combined, aligned, weights, method, statistics, device=dev)
        model, state, bn_source, repaired = done.model, done.state, done.bn_source, done.repaired
    else:
        built = entry.rule.builds_model(template, aligned, weights, dict(options or {}))
        model, state, bn_source, repaired = built.to(dev).eval(), dict(combined), NO_SOURCE, False
    if dev.type == "cuda":
        import torch

        torch.cuda.synchronize(dev)
    return MergeResult(
        method=entry.name,
        model=model,
        state=state,
        combined=dict(combined),
        aligned=list(aligned),
        weights=tuple(float(w) for w in weights),
        info=dict(info or {}),
        bn_source=bn_source,
        repaired=repaired,
        template_shaped=entry.rule.template_shaped,
        seconds=time.perf_counter() - start,
        server_saw=server_saw,
    )


def calibrated(result: MergeResult, calibration: Calibration) -> MergeResult:
    """Step 3: ``result`` at the temperature of ``calibration`` (the model is unchanged)."""
    return replace(
        result,
        temperature=float(calibration.temperature),
        calibration_history=tuple(calibration.history),
    )


def merge_and_finish(
    method: str,
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float] | None = None,
    *,
    server_data: tuple[Tensor, Tensor] | None = None,
    statistics: StatisticsSource | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
    spec: PermutationSpec | None = None,
    options: Mapping[str, Any] | None = None,
    clients: ClientQueries | None = None,
    base: StateDict | None = None,
) -> MergeResult:
    """The whole pipeline's steps 1 and 2 for the library:
    :func:`~fedlmc.merging.methods.merge_states` (its arguments and refusals, a ``_t`` name
    included), then
    :func:`finish_merge` with ``statistics`` (default: the server's ``server_data``,
    :class:`~fedlmc.merging.post_merge.ServerData`). Calibrate with
    ``calibrated(result, calibrate(result.model, source))``."""
    from fedlmc.averaging import normalised_weights
    from fedlmc.evaluation import resolve_device
    from fedlmc.merging.methods import merge_states
    from fedlmc.merging.post_merge import ServerData

    start = time.perf_counter()
    dev = resolve_device(device)
    w = normalised_weights(weights, len(states))
    combined, aligned, info = merge_states(
        method,
        template,
        states,
        w,
        server_data=server_data,
        seed=seed,
        device=dev,
        spec=spec,
        options=dict(options or {}),
        clients=clients,
        base=base,
        with_info=True,
    )
    if statistics is None and server_data is not None:
        statistics = ServerData(*server_data)
    return finish_merge(
        method,
        template,
        combined,
        aligned,
        w,
        statistics,
        device=dev,
        info=info,
        options=options,
        started=start,
    )
