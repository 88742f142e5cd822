r"""The built-in merge methods, one :func:`~fedlmc.merging.method_registry.register_method` each.

Plain average, weight / activation matching onto client 0 (server-side or on the clients'
data), MergeMany, the random-permutation control, the LEWC bias rule, ``auto`` (the plain or
the weight-matched average, whichever has the lower calibrated NLL), the mixed-width embeddings
and HeteroFL's holder average, and the ``random_direction`` flatness control. The methods table
(``fedlmc methods``, [Merge methods](../methods.md)) lists them with their descriptions.

Declared with :func:`~fedlmc.merging.method_registry.builtin_method`: the registry registers them
when it first lists or looks up a method; no torch at import time (each function imports what
it needs when it runs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fedlmc.columns import Column
from fedlmc.merging.alignment_record import alignment_info
from fedlmc.merging.merge_job import Alignment, MergeJob
from fedlmc.merging.method_registry import builtin_method

if TYPE_CHECKING:
    from torch import Tensor

    from fedlmc.permutation.spec import PermutationSpec

    StateDict = dict[str, Tensor]


@builtin_method(
    "average",
    description="plain weighted average, no permutation",
)
def plain_average(job: MergeJob) -> Alignment:
    r""":math:`\pi_i = \mathrm{id}`: the clients as they are."""
    return Alignment(list(job.states))


@builtin_method(
    "weight_matching",
    description="Git Re-Basin weight matching of every client onto client 0, then average",
)
def weight_matching_to_first(job: MergeJob) -> Alignment:
    """Every client permuted onto client 0 by weight matching (coordinate descent + LAP)."""
    from fedlmc.permutation.matching import reference_permutations

    spec = job.permutation_spec()
    perms = reference_permutations(spec, job.states, reference=0, method="weight", seed=job.seed)
    return permuted(spec, job.states, perms)


@builtin_method(
    "weight_matching_forward",
    description="weight matching onto client 0 from the forward start (layer by layer, each "
    "matched on its incoming weights given the previous one's permutation; then the descent), "
    "then average",
)
def weight_matching_forward_to_first(job: MergeJob) -> Alignment:
    """As ``weight_matching``, the descent started from the forward start's pass
    (:mod:`fedlmc.permutation.coordinate_descent`)."""
    from fedlmc.permutation.matching import reference_permutations

    spec = job.permutation_spec()
    perms = reference_permutations(spec, job.states, 0, "weight", seed=job.seed, start="forward")
    return permuted(spec, job.states, perms)


def permuted(
    spec: PermutationSpec, states: Sequence[StateDict], perms: Sequence[dict[str, Tensor]]
) -> Alignment:
    """``states`` with their ``perms`` applied (an empty mapping leaves a client as it is), and
    what the alignment did (:func:`fedlmc.merging.alignment_record.alignment_info`)."""
    from fedlmc.permutation.spec import apply_permutation

    aligned = [
        apply_permutation(spec, p, sd) if p else dict(sd)
        for p, sd in zip(perms, states, strict=True)
    ]
    return Alignment(aligned, info=alignment_info(spec, perms))


@builtin_method(
    "activation_matching",
    description="activation matching onto client 0 on the server split's inputs, then average",
    needs_server_data=True,
)
def activation_matching_to_first(job: MergeJob) -> Alignment:
    """Every client permuted onto client 0 by correlating activations on the server inputs."""
    from fedlmc.averaging import load_state
    from fedlmc.permutation.matching import reference_permutations

    spec = job.permutation_spec()
    models = [load_state(job.template, sd).to(job.device).eval() for sd in job.states]
    perms = reference_permutations(
        spec, job.states, 0, "activation", models=models, x=job.server_inputs, seed=job.seed
    )
    return permuted(spec, job.states, perms)


@builtin_method(
    "activation_federated",
    description="activation matching onto client 0 computed by each client on its own data; "
    "only permutation indices leave the clients",
    needs_clients=True,
)
def activation_matching_on_clients(job: MergeJob) -> Alignment:
    r"""Client-side activation matching: every client receives client 0's model, correlates its
    hidden activations with its own model's on its own data, solves the assignments and returns
    only its permutations (``job.clients.activation_permutations``); the server applies them,
    :math:`\pi_i(\theta_i)`. Each permutation is checked to be one over its group's units."""
    from fedlmc.permutation.spec import apply_permutation

    spec = job.permutation_spec()
    perms = job.clients.activation_permutations(job.states[0])
    if len(perms) != len(job.states):
        raise ValueError(
            f"the clients returned {len(perms)} permutation sets for {len(job.states)} clients"
        )
    aligned, kept, applied = [job.states[0]], [0], [{}]
    for index, (found, sd) in enumerate(zip(perms[1:], job.states[1:], strict=True), start=1):
        if found is None:  # the client's answer was dropped: it is left out of the merge
            continue
        kept.append(index)
        missing = sorted(set(spec.perm_to_axes) - set(found))
        if missing:
            raise ValueError(f"client {index} returned no permutation for group {missing[0]!r}")
        aligned.append(apply_permutation(spec, found, sd))  # validates every permutation
        applied.append(found)
    kept_all = len(kept) == len(job.states)
    return Alignment(aligned, kept=None if kept_all else kept, info=alignment_info(spec, applied))


@builtin_method(
    "merge_many",
    description="MergeMany: each client matched to the weighted mean of the others, repeated",
)
def merge_many_alignment(job: MergeJob) -> Alignment:
    """MergeMany's permutations and its merged weights."""
    from fedlmc.permutation.matching import merge_many
    from fedlmc.permutation.spec import apply_permutation

    spec = job.permutation_spec()
    merged, perms = merge_many(spec, list(job.states), weights=job.weights, seed=job.seed)
    aligned = [apply_permutation(spec, p, sd) for p, sd in zip(perms, job.states, strict=True)]
    return Alignment(aligned, merged, info=alignment_info(spec, perms))


@builtin_method(
    "random_permutation",
    description="control: every client but the first randomly permuted, then average",
)
def random_permutation_control(job: MergeJob) -> Alignment:
    r"""The scrambled control of the LMC literature: :math:`\pi_0 = \mathrm{id}` and, for
    :math:`i \ge 1`, an independent uniformly random permutation of every hidden group (seeded
    by ``(seed, i)``), so the average mixes unrelated units."""
    import numpy as np

    from fedlmc.permutation.spec import random_permutations

    spec = job.permutation_spec()
    perms: list[dict[str, Tensor]] = [{}]
    for i, sd in enumerate(job.states[1:], start=1):
        seed = int(np.random.SeedSequence([job.seed, i]).generate_state(1)[0])
        perms.append(random_permutations(spec, sd, seed=seed))
    return permuted(spec, job.states, perms)


builtin_method(
    "average_repair",
    description="plain average, then REPAIR of every hidden unit's mean and std (server split, "
    "or the clients' data when calibration is federated); needs biases (bias-free: "
    "average_rescale)",
    needs_server_data=True,
    repair=True,
    clients_for_data=True,
)(plain_average)
builtin_method(
    "weight_matching_repair",
    description="weight matching onto client 0, average, then REPAIR (server split, or the "
    "clients' data when calibration is federated); needs biases (bias-free: "
    "weight_matching_rescale)",
    needs_server_data=True,
    repair=True,
    clients_for_data=True,
)(weight_matching_to_first)


def lewc_bias_combination(
    spec: PermutationSpec | None, states: Sequence[StateDict], weights: Sequence[float]
) -> StateDict:
    r""":math:`\sum_i w_i \theta_i`, but each layer's bias :math:`\sum_i w_i^{\,l} b^{(i)}_l`
    (:func:`fedlmc.permutation.chain.depth_weighted_bias_average`; ``ValueError`` for models that
    are not norm-free plain chains)."""
    from fedlmc.permutation.chain import depth_weighted_bias_average, norm_free_chain

    layers = norm_free_chain(spec, states[0])
    return depth_weighted_bias_average(layers, states, weights)


builtin_method(
    "average_lewc_bias",
    description="plain average, but layer l's bias combined as sum_i w_i^l b_i, the way LEWC "
    "says the signal combines (norm-free plain chains: MLP, VGG without BatchNorm)",
    combine=lewc_bias_combination,
    plain_chain_only=True,
    reestimate_bn=False,
)(plain_average)


AUTO_TOLERANCE = 0.05
"""Default tolerance of ``auto`` in nats: the plain average is kept when its calibrated NLL on
the server split is at most this much above the endpoints' mean calibrated NLL."""


def calibrated_nll(job: MergeJob, state: StateDict, *, reestimate_bn: bool = True) -> float:
    """Mean NLL on the server data of the model with ``state``, at the temperature fitted on
    that data (BatchNorm statistics re-estimated on it first when ``reestimate_bn``)."""
    from fedlmc.averaging import load_state
    from fedlmc.evaluation import metrics_from_logits, predict_logits
    from fedlmc.merging.calibrate import fit_temperature, has_batchnorm, reset_bn_stats

    x, y = job.server_data
    model = load_state(job.template, state).to(job.device).eval()
    if reestimate_bn and has_batchnorm(model):
        reset_bn_stats(model, job.server_data)
        model.eval()
    logits = predict_logits(model, x, device=job.device)
    return float(metrics_from_logits(logits, y, fit_temperature(logits, y))["nll"])


AUTO_COLUMNS = (
    Column(
        "auto_choice",
        "the merge the auto method picked",
        "`auto`, `auto_t` rows",
        "`average` or `weight_matching`: the plain average when its calibrated-NLL gap "
        "`auto_nll_gap` is at most `auto-tolerance`, else the one of the two with the lower "
        "calibrated NLL (on the server split, or the clients' held-out data when calibration is "
        "federated)",
        kind="text",
    ),
    Column(
        "auto_nll_gap",
        "the plain average's calibrated-NLL gap the auto method measured",
        "`auto`, `auto_t` rows",
        "`L_T(sum_i w_i theta_i) - mean_i L_T(theta_i)`, with `L_T` the NLL at the temperature "
        "fitted on the same data (BatchNorm statistics of the average re-estimated), nats",
    ),
)
"""The columns the ``auto`` method fills (:func:`automatic_choice`'s ``info``)."""


@builtin_method(
    "auto",
    description="plain average if its calibrated NLL is within auto-tolerance of the endpoints', "
    "else the better of it and weight matching (server split, or the clients' held-out data "
    "when calibration is federated)",
    needs_server_data=True,
    clients_for_data=True,
)
def automatic_choice(job: MergeJob) -> Alignment:
    r"""Decide whether permutation alignment is worth its cost.

    With :math:`\bar L_T(\theta)` the NLL on the server split at the temperature fitted there,
    the gap :math:`g = \bar L_T(\sum_i w_i \theta_i) - \frac1N \sum_i \bar L_T(\theta_i)` of the
    plain average (BatchNorm statistics re-estimated) is measured first. If
    :math:`g \le` ``auto_tolerance`` (``job.options``, default :data:`AUTO_TOLERANCE` nats) the
    plain average is kept and no alignment runs; otherwise every client is weight-matched onto
    client 0 and the merge with the lower calibrated NLL is kept. ``info``: ``auto_choice``
    (``average`` or ``weight_matching``), ``auto_nll_gap`` (:math:`g`) and, when it kept weight
    matching, what that alignment did (``aligned_groups``, ``aligned_units_moved``).

    With ``job.clients`` set (federated calibration) the same NLLs are measured on the clients'
    held-out data by :meth:`ClientQueries.calibrated_nlls` (exact sums over the clients, at the
    grid temperature minimising their summed NLL): the plain average and the endpoints in one call,
    the weight-matched merge in a second one only when alignment runs.
    """
    from fedlmc.averaging import average
    from fedlmc.permutation.matching import reference_permutations

    tolerance = float(job.options.get("auto_tolerance", AUTO_TOLERANCE))
    plain_state = average(job.states, job.weights)
    if job.clients is not None:
        nlls = job.clients.calibrated_nlls(
            [plain_state, *job.states], [True] + [False] * len(job.states)
        )
        plain, endpoints = nlls[0], nlls[1:]
    else:
        plain = calibrated_nll(job, plain_state)
        endpoints = [calibrated_nll(job, sd, reestimate_bn=False) for sd in job.states]
    gap = plain - sum(endpoints) / len(endpoints)
    info: dict[str, Any] = {"auto_choice": "average", "auto_nll_gap": gap}
    if gap <= tolerance:
        return Alignment(list(job.states), info=info)
    spec = job.permutation_spec()
    perms = reference_permutations(spec, job.states, reference=0, method="weight", seed=job.seed)
    matched = permuted(spec, job.states, perms)
    aligned_state = average(matched.aligned, job.weights)
    if job.clients is not None:
        aligned_nll = job.clients.calibrated_nlls([aligned_state], [True])[0]
    else:
        aligned_nll = calibrated_nll(job, aligned_state)
    if aligned_nll < plain:
        info.update(matched.info, auto_choice="weight_matching")
        return Alignment(matched.aligned, info=info)
    return Alignment(list(job.states), info=info)


# ----------------------------------------------------------------------------- mixed widths


@builtin_method(
    "embed_average",
    description="mixed widths: every client embedded at the first units of the server width "
    "(HeteroFL's nesting), then the plain weighted average",
    mixed_widths=True,
)
def embed_first_slots(job: MergeJob) -> Alignment:
    """Every client embedded into the server shapes at its first units
    (:func:`fedlmc.merging.widths.embed_clients`)."""
    from fedlmc.merging.widths import embed_clients

    return Alignment(embed_clients(job.template, job.states, job.permutation_spec(), "first"))


@builtin_method(
    "embed_weight_matching",
    description="mixed widths: the widest client at the first units of the server width, every "
    "other client weight-matched onto its units (rectangular assignments), then average",
    mixed_widths=True,
)
def embed_matched_slots(job: MergeJob) -> Alignment:
    """Every client embedded at the slots that weight-match it onto the widest client
    (:func:`fedlmc.merging.widths.match_to_widest`)."""
    from fedlmc.merging.widths import match_to_widest

    spec = job.permutation_spec()
    matched, _ = match_to_widest(job.template, job.states, spec, seed=job.seed)
    return Alignment(matched, info=alignment_info(spec, [m.slots for m in matched]))


builtin_method(
    "embed_weight_matching_repair",
    description="mixed widths: embed_weight_matching, then REPAIR of every hidden unit's "
    "mean and std (server split, or the clients' data when calibration is federated); needs "
    "biases",
    needs_server_data=True,
    repair=True,
    clients_for_data=True,
    mixed_widths=True,
)(embed_matched_slots)


def holder_combination(
    spec: PermutationSpec | None, states: Sequence[StateDict], weights: Sequence[float]
) -> StateDict:
    """HeteroFL's rule: every entry averaged over the clients that hold it
    (:func:`fedlmc.merging.widths.holder_average`)."""
    from fedlmc.merging.widths import holder_average

    return holder_average(spec, states, weights)


builtin_method(
    "heterofl",
    description="mixed widths: every client embedded at the first units of the server width, "
    "each entry averaged over the clients that hold it (HeteroFL's aggregation)",
    combine=holder_combination,
    mixed_widths=True,
)(embed_first_slots)


@builtin_method(
    "random_direction",
    description="control (flatness): client 0 moved by a seeded Gaussian direction of the "
    "length of its step to the plain average (two clients)",
    many_clients=False,
)
def random_direction(job: MergeJob) -> Alignment:
    r"""The flatness control: :math:`\theta_0 + \|s\|\,g/\|g\|` with :math:`s = \bar\theta -
    \theta_0` the step to the plain average at the job's weights
    (:mod:`fedlmc.merging.random_direction`). The clients
    stay as they are (no common basis); the moved endpoint is the merge."""
    from fedlmc.averaging import average
    from fedlmc.merging.random_direction import parameter_keys, random_step

    plain = average(job.states, job.weights)
    moved, length = random_step(job.states[0], plain, parameter_keys(job.template), job.seed)
    return Alignment(list(job.states), moved, info={"random_direction_step_norm": length})
