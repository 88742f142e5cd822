r"""Published baselines registered as merge methods: RESCALE and Preserve-First Merging (Vanishing
Feature) and CCA Merge.

- ``average_rescale``, ``weight_matching_rescale``: the plain average, or weight matching onto
  client 0 then the average, followed by RESCALE (Qu and Horvath, CPAL 2025;
  :mod:`fedlmc.merging.baselines.rescale`): every hidden unit's pre-activation std set to the
  weighted mean of the endpoints' by a factor folded into its weights, on the server split's inputs
  (the data the ``_repair`` methods use in the study).
- ``cca_merge``: every client mapped onto client 0 by the linear maps of CCA of the hidden
  activations on the server split's inputs, then the average (Horoi et al., ICML 2024;
  :mod:`fedlmc.merging.baselines.cca`), for N >= 2 clients; norm-free plain chains only (the MLP,
  VGG-11 with ``norm = "none"``).

RESCALE's merge is not the combination of the aligned clients at any weight (its factors depend
on the data and on :math:`\lambda`), so the study evaluates them ``on_path = False``: their
barrier and path columns stay NaN and they are compared by their ``merge_gap_*`` columns (the
``_repair`` methods instead repair every point of their paths). ``cca_merge`` is an alignment
followed by the plain average, so its paths are the usual ones between the mapped clients.

- ``preserve_first``, ``weight_matching_preserve_first``: Preserve-First Merging (Qu and Horvath,
  CPAL 2025; :mod:`fedlmc.merging.baselines.preserve_first`) with
  :data:`~fedlmc.merging.baselines.preserve_first.PFM_LAYERS` preserved layer (the method option
  ``pfm_layers``, e.g. ``compare_methods(..., method_options={"pfm_layers": 0})``, sets
  another :math:`k`), of the clients as they are
  or weight-matched onto client 0 (the basis Qu and Horvath evaluate): every client's first
  layers run on the input, their outputs are averaged at the weights and the plain average's
  later layers continue. The merge keeps :math:`N` copies of the first layers, so it is a model
  of another architecture (registered with ``builds_model``): its rows have the accuracy, NLL,
  ECE, temperature, merge gap and agreement of that model and ``merged_parameters_ratio``
  :math:`1 + (N - 1) P_{\mathrm{early}} / P` (:math:`P_{\mathrm{early}}` the preserved
  layers' parameters, :math:`P` the model's), NaN barriers (``on_path = False``) and NaN LEWC/LLFC
  columns (``lewc_undefined_reason`` says why); strategies and saved merges refuse it.
  Norm-free plain chains only.

This module imports no torch at import time (the registry imports it to register the methods,
:data:`fedlmc.merging.method_registry.BUILTIN_MODULES`); each method imports what it needs when
it runs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fedlmc.columns import Column
from fedlmc.merging.builtin_methods import plain_average, weight_matching_to_first
from fedlmc.merging.merge_job import Alignment, MergeJob
from fedlmc.merging.method_registry import builtin_method

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from torch import Tensor, nn

__all__ = ["CCA_COLUMNS", "CCA_RIDGE", "RESCALE_COLUMNS", "preserve_first_model"]

CCA_RIDGE = 1e-2
r"""Default ridge :math:`\gamma` of ``cca_merge`` (the method option ``cca_ridge``, run-config
key ``cca-ridge``), relative to the mean activation variance (:mod:`fedlmc.merging.baselines.cca`):
our choice, not tuned (Horoi et al. search an absolute ``gamma`` per experiment). It keeps the
auto-covariances invertible when units are dead (variance 0) or outnumber the samples: with
:math:`n` server samples the centred covariances have rank at most :math:`n - 1`, so at 400
samples and 512 units the whitened cross-covariance has at least 113 zero singular values, and
on their span the map is whatever basis the SVD returns."""

RESCALE_COLUMNS = (
    Column(
        "rescale_factor_mean",
        "mean RESCALE factor over the hidden units",
        "`average_rescale`, `weight_matching_rescale` rows (and `_t`); NaN for BatchNorm models, "
        "whose re-estimated statistics set the scale instead",
        "mean over the rescaled layers of the mean over their units of `s_c = sigma_t / sigma_m` "
        "(the endpoints' weighted pre-activation std over the merged model's, on the server "
        "split); above 1: the merge had shrunk the features (Vanishing Feature)",
    ),
    Column(
        "rescale_factor_layers",
        "mean RESCALE factor per hidden layer",
        "`average_rescale`, `weight_matching_rescale` rows (and `_t`); empty for BatchNorm models",
        "JSON list, input to output: per rescaled layer the mean over its units of "
        "`sigma_t / sigma_m`, each layer measured after the earlier ones were rescaled",
        kind="JSON",
    ),
)
"""The columns the RESCALE methods fill."""

CCA_COLUMNS = (
    Column(
        "cca_map_condition",
        "largest condition number of CCA Merge's linear maps",
        "`cca_merge`, `cca_merge_t` rows",
        "max over the clients other than client 0 and their hidden layers of the 2-norm "
        "condition number of the map `T` taking the client's units to client 0's (1 for a "
        "permutation or an orthogonal map; large: the map amplifies some directions)",
    ),
)
"""The column ``cca_merge`` fills."""


def _rescaled(job: MergeJob, alignment: Alignment) -> Alignment:
    """``alignment``'s clients averaged at ``job.weights``, then RESCALE on the server inputs
    (BatchNorm models: the average as it is, their statistics re-estimated afterwards)."""
    import json

    from fedlmc.averaging import average, load_state
    from fedlmc.merging.baselines.rescale import rescale
    from fedlmc.merging.calibrate import has_batchnorm

    merged = average(alignment.aligned, job.weights)
    info = dict(alignment.info)
    if has_batchnorm(job.template):
        info.update(rescale_factor_mean=math.nan, rescale_factor_layers="")
        return Alignment(alignment.aligned, merged, info, alignment.kept)
    model = load_state(job.template, merged).to(job.device).eval()
    endpoints = [load_state(job.template, sd).to(job.device).eval() for sd in alignment.aligned]
    rescaled, factors = rescale(model, endpoints, job.weights, job.server_inputs)
    state = {k: v.detach().cpu().clone() for k, v in rescaled.state_dict().items()}
    info.update(
        rescale_factor_mean=sum(factors) / len(factors) if factors else math.nan,
        rescale_factor_layers=json.dumps([round(f, 6) for f in factors]),
    )
    return Alignment(alignment.aligned, state, info, alignment.kept)


@builtin_method(
    "average_rescale",
    description="plain average, then RESCALE (Vanishing Feature): every hidden unit's std set to "
    "the endpoints' weighted mean by a factor on its weights, on the server split",
    needs_server_data=True,
)
def average_rescale(job: MergeJob) -> Alignment:
    r""":math:`\bar\theta = \sum_i w_i \theta_i`, then RESCALE
    (:func:`fedlmc.merging.baselines.rescale.rescale`) on the server inputs."""
    return _rescaled(job, Alignment(list(job.states)))


@builtin_method(
    "weight_matching_rescale",
    description="weight matching onto client 0, average, then RESCALE (Vanishing Feature) on "
    "the server split",
    needs_server_data=True,
)
def weight_matching_rescale(job: MergeJob) -> Alignment:
    r"""Weight matching onto client 0
    (:func:`~fedlmc.merging.builtin_methods.weight_matching_to_first`),
    :math:`\sum_i w_i \pi_i(\theta_i)`, then RESCALE on the server inputs."""
    return _rescaled(job, weight_matching_to_first(job))


def _condition(matrix: Tensor) -> float:
    import torch

    values = torch.linalg.svdvals(matrix)
    return float(values[0] / values[-1]) if float(values[-1]) > 0 else math.inf


@builtin_method(
    "cca_merge",
    description="CCA Merge: every client mapped onto client 0 by the linear maps of CCA of the "
    "hidden activations on the server split, then average (norm-free chains: MLP, VGG-11 "
    "without norm)",
    needs_server_data=True,
    plain_chain_only=True,
)
def cca_merge(job: MergeJob) -> Alignment:
    r"""Client :math:`i` in client 0's basis, :math:`W'_l = T_l W_l T_{l-1}^{-1}`,
    :math:`b'_l = T_l b_l` (:func:`fedlmc.merging.baselines.cca.cca_align`, ridge :data:`CCA_RIDGE`
    unless the method option ``job.options["cca_ridge"]``, the run-config key ``cca-ridge``);
    the merge is the weighted average of the mapped clients."""
    from fedlmc.averaging import load_state
    from fedlmc.merging.baselines.cca import cca_align

    ridge = float(job.options.get("cca_ridge", CCA_RIDGE))
    spec = job.permutation_spec()
    models = [load_state(job.template, sd).to(job.device).eval() for sd in job.states]
    aligned, maps = cca_align(models, spec, job.server_inputs, ridge=ridge)
    conditions = [_condition(t) for client in maps for t, _ in client.values()]
    worst = max(conditions) if conditions else math.nan
    return Alignment(aligned, info={"cca_map_condition": worst})


def preserve_first_model(
    template: nn.Module,
    aligned: Sequence[dict[str, Tensor]],
    weights: Sequence[float],
    options: Mapping[str, Any],
) -> nn.Module:
    """PFM of the aligned clients at ``weights`` with ``options["pfm_layers"]`` preserved layers
    (a method option, default :data:`~fedlmc.merging.baselines.preserve_first.PFM_LAYERS`;
    :func:`fedlmc.merging.baselines.preserve_first.preserve_first`, which refuses a count out of
    range)."""
    from fedlmc.merging.baselines.preserve_first import PFM_LAYERS, preserve_first

    return preserve_first(template, aligned, weights, int(options.get("pfm_layers", PFM_LAYERS)))


builtin_method(
    "preserve_first",
    description="Preserve-First Merging (Vanishing Feature): every client's first layer kept, "
    "their outputs averaged, then the plain average's later layers (a model with N first "
    "layers; norm-free chains)",
    plain_chain_only=True,
    reestimate_bn=False,
    builds_model=preserve_first_model,
)(plain_average)
builtin_method(
    "weight_matching_preserve_first",
    description="weight matching onto client 0, then Preserve-First Merging of the matched "
    "clients (a model with N first layers; norm-free chains)",
    plain_chain_only=True,
    reestimate_bn=False,
    builds_model=preserve_first_model,
)(weight_matching_to_first)
