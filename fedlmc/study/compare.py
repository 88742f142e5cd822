r"""Comparison of one-shot merge methods on the client models of one federated round.

Given the client state dicts :math:`\theta_1, \dots, \theta_N` of one round (same architecture)
and their merge weights :math:`c_i` (e.g. sample counts, :math:`w_i = c_i / \sum_j c_j`), every
method of :func:`fedlmc.merging.method_registry.study_methods` is evaluated on the *same* client
models and gives one tidy row (columns: :mod:`fedlmc.study.rows`). The merge methods are those
registered in :mod:`fedlmc.merging.method_registry`; the built-in ones:

- ``average``: :math:`\bar\theta = \sum_i w_i \theta_i` (no permutation).
- ``weight_matching`` / ``activation_matching``: every client is permuted onto the reference
  client 0 (Git Re-Basin weight matching, or activation matching on the server split's inputs),
  then :math:`\bar\theta = \sum_i w_i \pi_i(\theta_i)` with :math:`\pi_0 = \mathrm{id}`.
- ``merge_many``: MergeMany (each model repeatedly matched to the mean of the others), then the
  weighted mean of the permuted models.
- ``random_permutation``: the scrambled control, every client but the first randomly permuted.
- ``<method>_t``: the same merged model with one softmax temperature fitted on the server split,
  :math:`p(y|x) = \mathrm{softmax}(f(x; \bar\theta) / T)`; :math:`T` never changes the accuracy.
- the reference ensembles, N forward passes each, which a single merged model tries to reach
  (:mod:`fedlmc.study.baseline`): ``ensemble``,
  :math:`p(y|x) = \sum_i w_i \, \mathrm{softmax}(f(x; \theta_i))`; ``ensemble_equal``, the
  same with :math:`w_i = 1/N`; ``ensemble_calibrated``, each member at its own server-fitted
  :math:`T_i`, :math:`\sum_i w_i \, \mathrm{softmax}(f(x; \theta_i) / T_i)`; and
  ``logit_ensemble``, :math:`\mathrm{softmax}(\sum_i w_i f(x; \theta_i))`.

The *server split* (``splits.server``) is held out of the clients' pool and never given to any
client: it is the server's own small data set, used to fit temperatures, to provide the inputs of
activation matching and, for BatchNorm models, to re-estimate the merged model's running
statistics (REPAIR-style reset, Jordan et al. 2023). All reported metrics are on the test split.

Every row has the merge gap (:func:`fedlmc.analysis.paths.merge_gap`: the merged model against the
mean of the endpoints, ``merge_gap_*``). Two clients with diagnostics on also get barriers: the
interpolation curve :math:`\theta(\lambda) = \lambda \theta_1 + (1-\lambda) \pi(\theta_2)`
(:math:`\pi` = the method's alignment, identity for ``average``) on the test split, with
:math:`T` refitted on the server split at every :math:`\lambda`, and
:func:`fedlmc.analysis.paths.barriers` of it: signed at :math:`\lambda = 1/2` (``*_barrier_half``,
the paper's Table 1) and the maximum over the path (``*_barrier_max``). Column definitions:
:mod:`fedlmc.study.rows`.

For BatchNorm models every point of the curve (its endpoints included) has its statistics
re-estimated on the server split, while the endpoint columns use each client's own statistics.
With a single client (the others failed) every merge is that client; diagnostics are then NaN.

Every distinct model is evaluated once per input set and reused
(:func:`~fedlmc.study.compare.shared_forwards`, a
:class:`~fedlmc.analysis.shared_forwards.ForwardCache`): the clients' logits serve the endpoint
metrics, the ensembles, the temperatures and the ends of every path that starts at them; a
merge's serve its row and its path's midpoint; one capture of a model serves every diagnostic
that reads it (the same values as ``share_forwards=False``). The base merge of a ``_t`` method
is computed once and shared with its raw row.

The study's modules, one concern each: :mod:`fedlmc.study.context` (the frozen
:class:`~fedlmc.study.context.StudyContext` every step reads, :class:`Predictions`, the checks
run before any work; :func:`compare_methods` turns its settings into one, :func:`study_context`),
:mod:`fedlmc.study.model_rows` (a merged model's metric columns, the one evaluator, and its raw
and ``_t`` rows), :mod:`fedlmc.study.merge` (one merge and its post-merge pipeline),
:mod:`fedlmc.study.barriers` (merge gap and path barriers), :mod:`fedlmc.study.diagnostic_columns`
(LEWC, LLFC and the mechanism columns), :mod:`fedlmc.study.baseline` (the clients' predictions
and the ensembles every merge is compared with), and this one, the driver
(:func:`compare_methods`, :func:`study_context`, the rows). The names the rows' code had here
are importable from here still.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from fedlmc.analysis.diagnostics import layer_names_of, relu_layers
from fedlmc.analysis.shared_forwards import ForwardCache, sharing
from fedlmc.averaging import normalised_weights
from fedlmc.capture import linear_layers
from fedlmc.evaluation import resolve_device
from fedlmc.merging.merge_job import ClientQueries
from fedlmc.merging.merge_result import calibrated
from fedlmc.merging.method_registry import (
    CALIBRATED_SUFFIX,
    REFERENCE_METHODS,
    MergeRequest,
    base_method,
    refusal,
)
from fedlmc.merging.post_merge import Calibration
from fedlmc.merging.request_facts import model_facts
from fedlmc.permutation.model_spec import permutation_spec
from fedlmc.permutation.spec import PermutationSpec
from fedlmc.study.barriers import (
    client_barrier_columns,
    curve_columns,
    gap_columns,
    pairwise_barrier_columns,
)
from fedlmc.study.baseline import (
    AGREEMENT_COLUMNS,
    ClientBaseline,
    agreement_columns,
    client_baseline,
    reference_row,
    temperature_columns,
)
from fedlmc.study.context import (
    Predictions,
    Progress,
    StudyContext,
    check_client_count,
    check_methods,
    check_states,
    default_methods,
)
from fedlmc.study.diagnostic_columns import (
    QUARTER,
    diagnostic_columns,
    lewc_undefined_reason,
    prediction_columns,
)
from fedlmc.study.flags import flag_columns
from fedlmc.study.merge import (
    Merged,
    merge_clients,
    merge_in_context,
    parameters_ratio,
    path_rule,
)
from fedlmc.study.model_rows import metric_row

if TYPE_CHECKING:
    from fedlmc.data.loading import DataSplits

StateDict = dict[str, Tensor]
PAIRWISE_MAX_CLIENTS = 6  # pairwise barrier matrices up to this many clients (N(N-1)/2 paths)

__all__ = [
    "AGREEMENT_COLUMNS",
    "PAIRWISE_MAX_CLIENTS",
    "QUARTER",
    "Comparison",
    "Merged",
    "Predictions",
    "StudyContext",
    "agreement_columns",
    "check_client_count",
    "check_methods",
    "compare_methods",
    "default_methods",
    "gap_columns",
    "merge_clients",
    "path_rule",
    "prediction_columns",
    "shared_forwards",
    "study_context",
    "temperature_columns",
]


def study_context(
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float] | None,
    splits: DataSplits,
    *,
    device: torch.device,
    seed: int = 0,
    lambdas: int = 25,
    diagnostics: bool = True,
    diagnostic_samples: int = 512,
    spec: PermutationSpec | None = None,
    layer_names: Sequence[str] | None = None,
    method_options: Mapping[str, Any] | None = None,
    progress: Progress = None,
    clients: ClientQueries | None = None,
    base: StateDict | None = None,
) -> StudyContext:
    """The :class:`~fedlmc.study.context.StudyContext` of one study: weights normalised, the
    diagnostics' inputs (the first ``diagnostic_samples`` test inputs) and layers
    (``layer_names``, else the template's, else derived from its graph) and the reason LEWC's
    depths are undefined, if any. ``template`` is used as given (on ``device``, eval mode)."""
    x = splits.test[0][: int(diagnostic_samples)]
    names = layer_names_of(template, x.to(device), layer_names) if diagnostics else []
    undefined = lewc_undefined_reason(template, spec, x.to(device), names) if diagnostics else ""
    return StudyContext(
        template=template,
        states=tuple(states),
        weights=tuple(normalised_weights(weights, len(states))),
        splits=splits,
        device=device,
        seed=int(seed),
        lambdas=int(lambdas),
        diagnostics=bool(diagnostics),
        diagnostic_x=x,
        spec=spec,
        layer_names=tuple(names),
        method_options=MappingProxyType(dict(method_options or {})),
        progress=progress,
        lewc_undefined=undefined,
        clients=clients,
        base=base,
    )


# ----------------------------------------------------------------------------- rows


@dataclass
class _BaseMerge:
    """One base merge and every column its raw and ``_t`` rows share."""

    merged: Merged
    columns: dict[str, Any]
    metrics: dict[str, float]
    temperature: float


def _base_columns(context: StudyContext, baseline: ClientBaseline, method: str) -> _BaseMerge:
    """Merge once for ``method`` and compute every column its raw and ``_t`` rows share."""
    context.say(f"merging: {method}")
    merged = merge_in_context(context, method)
    pred = context.predict(merged.model)
    merged = calibrated(merged, Calibration(pred.temperature))  # its _t row evaluates it at T
    metrics = pred.metrics(context.splits.test[1])
    columns: dict[str, Any] = {"merge_seconds": merged.seconds, **merged.info}
    if merged.query_rounds:  # the federation adds its collecting round's (the ServerApp)
        columns.update(rounds=merged.query_rounds, bytes_sent_by_clients=merged.query_bytes)
        columns.update(lost_columns(merged.query_lost))
    columns["merged_parameters_ratio"] = parameters_ratio(merged, context.template)
    columns.update(gap_columns(baseline.endpoints, metrics))
    columns.update(agreement_columns(baseline.top1, pred.test.argmax(dim=1)))
    columns.update(temperature_columns(baseline, pred.temperature))
    columns.update(_path_columns(context, merged, method))
    if context.diagnostics and context.num_clients >= 2:
        context.say(f"diagnostics: {method}")
        columns.update(diagnostic_columns(context, merged))
    return _BaseMerge(merged, columns, metrics, pred.temperature)


def lost_columns(lost: Sequence[Any]) -> dict[str, Any]:
    """``clients_dropped`` (distinct nodes) and ``clients_dropped_reasons`` of the clients a
    method lost to the query rounds (:attr:`fedlmc.study.merge.Merged.query_lost`); the
    federation adds its collecting round's (the ServerApp)."""
    return {
        "clients_dropped": len({f.node_id for f in lost}),
        "clients_dropped_reasons": "; ".join(f.describe() for f in lost),
    }


def _path_columns(context: StudyContext, merged: Merged, method: str) -> dict[str, Any]:
    """With diagnostics: the barriers of two clients' path, or, for more, of each client's path
    to the merge and between every pair (up to :data:`PAIRWISE_MAX_CLIENTS` clients); none for
    a merge that is no state dict of the template (no path reaches it: NaN)."""
    columns: dict[str, Any] = {}
    if not merged.template_shaped:
        return columns
    if context.diagnostics and context.num_clients == 2 and merged.path is not None:
        context.say(f"interpolation curve: {method}")
        depth = 0 if context.lewc_undefined else len(context.layer_names)
        columns.update(curve_columns(context, merged, depth))
    if context.diagnostics and context.num_clients > 2:
        context.say(f"client barriers: {method}")
        columns.update(client_barrier_columns(context, merged))
        if context.num_clients <= PAIRWISE_MAX_CLIENTS:
            columns.update(pairwise_barrier_columns(context, merged))
    return columns


@dataclass
class Comparison:
    """The rows of :func:`compare_methods` and each base merge's weights (BN re-estimated)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    merged: dict[str, StateDict] = field(default_factory=dict)


def compare_methods(
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float] | None,
    splits: DataSplits,
    methods: Sequence[str] | None = None,
    *,
    lambdas: int = 25,
    seed: int = 0,
    diagnostics: bool = True,
    diagnostic_samples: int = 512,
    device: str | torch.device | None = None,
    spec: PermutationSpec | None = None,
    layer_names: Sequence[str] | None = None,
    method_options: dict[str, Any] | None = None,
    progress: Progress = None,
    client_templates: Sequence[nn.Module] | None = None,
    clients: ClientQueries | None = None,
    base: StateDict | None = None,
    share_forwards: bool = True,
) -> Comparison:
    """One row per requested method (columns :func:`fedlmc.study.rows.row_columns`), all on the same
    client models, and the merged weights of each base merge (``Comparison.merged``).

    ``methods`` defaults to the :func:`~fedlmc.merging.method_registry.study_methods` that
    accept this many clients (:func:`default_methods`) and can merge such models (each method's
    one refusal, :func:`~fedlmc.merging.method_registry.refusal`, asked once on the
    :class:`~fedlmc.merging.method_registry.MergeRequest` of the arguments and the
    ``method_options``: no ``plain_chain_only`` method for a ResNet or a BatchNorm model, no
    REPAIR for a bias-free one). A method given explicitly that does not accept them (such as
    ``krum`` with fewer than :math:`2f + 3` clients) is refused with it before any work.
    Each base merge is computed once; its ``_t`` row reuses it with the server-fitted
    temperature. Raw rows have ``temperature = 1``; ``nll_raw``/``nll_calibrated`` (and ECE) are
    filled for both; the ``merge_gap_*`` columns compare with the unweighted mean endpoint.
    ``diagnostics=False`` skips the interpolation curves (barriers), LEWC, orthogonality, ReLU
    additivity and ranks (the merge gap remains). Diagnostics use the first ``diagnostic_samples``
    test inputs. ``spec`` (default: the template's, derived from its graph for models without a
    hand-written one) and ``layer_names`` (default: ``template.layer_names``, else derived from
    the graph) make any traceable model work. ``method_options`` reach every merge method (e.g.
    ``{"auto_tolerance": 0.05}``). ``progress`` (optional) receives one-line status messages.
    ``client_templates`` (one model per client) are the architectures the clients' weights load
    into when they differ from ``template`` (clients of different widths, merged at
    ``template``'s width by a mixed-width merge method); default: ``template`` for every client.
    ``clients`` (a federation's :class:`~fedlmc.merging.merge_job.ClientQueries`, in the order
    of ``states``: a :class:`~fedlmc.merging.clients.LocalClients`, or the compare strategy's
    query rounds) lets the methods that run on the clients (``fisher``, ``regmean``,
    ``activation_federated``) be rows; ``base`` (the clients' common starting model, e.g. the
    server's initialisation of ``init = "shared"``) the task-vector methods
    (``task_arithmetic``, ``ties``, ``dare``): without it the default ``methods`` leave them out
    and a method given explicitly is refused before any work.
    ``share_forwards=False`` runs every measurement's own forward passes; the default runs each
    distinct model once per input set (:func:`~fedlmc.study.compare.shared_forwards`).
    """
    _check_resolution(lambdas, diagnostic_samples)
    dev = resolve_device(device)
    template = copy.deepcopy(template).to(dev).eval()
    methods, spec = _checked_methods(
        template, dev, states, splits, methods, spec, clients, base, method_options
    )
    context = study_context(
        template,
        states,
        weights,
        splits,
        device=dev,
        seed=seed,
        lambdas=lambdas,
        diagnostics=diagnostics,
        diagnostic_samples=diagnostic_samples,
        spec=spec,
        layer_names=layer_names,
        method_options=method_options,
        progress=progress,
        clients=clients,
        base=base,
    )
    result = _shared_rows(context, client_templates, methods, share_forwards)
    for row in result.rows:
        row.update(flag_columns(row, splits.num_classes, len(splits.test[1])))
    return result


def _check_resolution(lambdas: int, diagnostic_samples: int) -> None:
    if int(lambdas) < 2:
        raise ValueError(f"lambdas must be an integer >= 2, got {lambdas}")
    if int(diagnostic_samples) < 1:
        raise ValueError(f"diagnostic_samples must be >= 1, got {diagnostic_samples}")


def _shared_rows(
    context: StudyContext,
    client_templates: Sequence[nn.Module] | None,
    methods: Sequence[str],
    share: bool,
) -> Comparison:
    """:func:`_rows` with the study's forward passes shared (``share``: a
    :func:`shared_forwards` cache in the context, active for the diagnostics' captures)."""
    if share:
        context = replace(context, forwards=shared_forwards(context))
    with sharing(context.forwards):
        return _rows(context, client_baseline(context, client_templates), methods)


def shared_forwards(context: StudyContext) -> ForwardCache:
    """The :class:`~fedlmc.analysis.shared_forwards.ForwardCache` of a study: on a miss, a
    capture takes every module the diagnostics read (the layer outputs and the logits, the
    inputs of every Linear/Conv and ReLU), so each model runs once over ``diagnostic_x``."""
    if not context.diagnostics:
        return ForwardCache()
    template = context.template
    return ForwardCache(
        plan={
            "output": [*context.layer_names, ""],
            "input": [*linear_layers(template), *relu_layers(template)],
        }
    )


def _checked_methods(
    template: nn.Module,
    device: torch.device,
    states: Sequence[StateDict],
    splits: DataSplits,
    methods: Sequence[str] | None,
    spec: PermutationSpec | None,
    clients: ClientQueries | None,
    base: StateDict | None,
    options: Mapping[str, Any] | None = None,
) -> tuple[list[str], PermutationSpec | None]:
    """The methods of :func:`compare_methods`, checked before any work (known, and each
    method's one refusal asked, :func:`_accepted_methods`), and the permutation ``spec``
    (derived once from the graph on two test inputs when a method aligns and neither ``spec``
    nor the template gives one); the refusal reads the method ``options`` (Krum's fewest
    clients)."""
    check_states(states)
    defaulted = methods is None
    chosen = default_methods(len(states)) if methods is None else methods
    methods = check_methods(chosen, clients is not None)
    aligning = any(base_method(m) != "average" for m in methods if m not in REFERENCE_METHODS)
    if spec is None and aligning and not hasattr(template, "permutation_spec"):
        spec = permutation_spec(template, splits.test[0][:2].to(device))
    request = MergeRequest(
        num_clients=len(states),
        fewest_clients=len(states),
        clients=clients is not None,
        base=base is not None,
        options=dict(options or {}),
        **model_facts(template, spec, methods),
    )
    return _accepted_methods(methods, request, defaulted), spec


def _accepted_methods(methods: Sequence[str], request: MergeRequest, defaulted: bool) -> list[str]:
    """``methods`` that run on ``request`` (each method's one refusal,
    :func:`fedlmc.merging.method_registry.refusal`): the default ones leave out those refused (no
    ``plain_chain_only`` method for a ResNet or a BatchNorm VGG, no REPAIR for a bias-free MLP,
    no task-vector method without a ``base``); ``ValueError`` with the refusal of one given
    explicitly, before any work."""
    kept = []
    for method in methods:
        reason = None if method in REFERENCE_METHODS else refusal(method, request)
        if reason and not defaulted:
            raise ValueError(reason)
        if not reason:
            kept.append(method)
    return kept


def _rows(context: StudyContext, baseline: ClientBaseline, methods: Sequence[str]) -> Comparison:
    """One row per method; each base merge computed once and shared with its ``_t`` row."""
    shared: dict[str, _BaseMerge] = {}
    result = Comparison()
    for method in methods:
        if method in REFERENCE_METHODS:
            result.rows.append(reference_row(context, baseline, method))
            continue
        base = base_method(method)
        if base not in shared:
            shared[base] = _base_columns(context, baseline, base)
            if shared[base].merged.template_shaped:  # only template state dicts are kept
                result.merged[base] = shared[base].merged.state
        found = shared[base]
        calibrated = method.endswith(CALIBRATED_SUFFIX)
        row = metric_row(
            method, context.num_clients, found.metrics, found.temperature, calibrated=calibrated
        )
        row.update(baseline.common)
        row.update(found.columns)
        result.rows.append(row)
    return result
