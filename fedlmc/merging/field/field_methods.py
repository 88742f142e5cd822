r"""The merge methods the model-merging field compares against, registered: Fisher merging,
RegMean, Task Arithmetic, TIES-Merging, DARE and OT fusion, with their options and defaults.

- ``fisher`` (:mod:`fedlmc.merging.field.fisher`): each client's diagonal empirical Fisher of its
  own model on its own data (a query: ``job.clients.fisher_diagonals()``), the Fisher-weighted
  average; a ``sum`` rule that runs under SecAgg+ (:data:`FISHER_SUMS`).
- ``regmean`` (:mod:`fedlmc.merging.field.regmean`): each client's Gram matrices of its linear
  layers' inputs (``job.clients.gram_matrices(layers)``), every linear layer solved; a ``sum`` rule
  that runs under SecAgg+ (:data:`REGMEAN_SUMS`).
- ``task_arithmetic``, ``ties``, ``dare`` (:mod:`fedlmc.merging.field.task_vectors`): relative to
  the clients' common starting model ``job.base`` (``needs_base``).
- ``ot_fusion`` (:mod:`fedlmc.merging.field.ot_fusion`): every client transported onto client 0's
  units by POT, then the average (norm-free chains).

Their merges are not the combination of the (aligned) clients at any weight but ``ot_fusion``'s, so
the study evaluates the other five ``on_path = False`` (NaN barriers; compared by accuracy, NLL and
``merge_gap_*``; :mod:`fedlmc.study.builtin_evaluations`). The method options (``job.options``,
``compare_methods(..., method_options=...)``; the run config's hyphenated keys) and their defaults
are :data:`FIELD_OPTIONS`. This module imports no torch at import time (the run-config validation
reads the registry); each method imports what it needs when it runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fedlmc.columns import Column
from fedlmc.merging.merge_job import Alignment, MergeJob
from fedlmc.merging.method_registry import builtin_method
from fedlmc.merging.sum_form import SecureSums

if TYPE_CHECKING:
    from torch import Tensor, nn

    StateDict = dict[str, Tensor]

__all__ = [
    "CLIENT_STATISTICS_COLUMNS",
    "DARE_DROP",
    "FIELD_OPTIONS",
    "FISHER_EPSILON",
    "FISHER_LABELS",
    "FISHER_SAMPLES",
    "FISHER_SUMS",
    "OT_COLUMNS",
    "OT_REG",
    "REGMEAN_ALPHA",
    "REGMEAN_GROWTH",
    "REGMEAN_RIDGE",
    "REGMEAN_SAMPLES",
    "REGMEAN_SUMS",
    "STATISTICS_RANGE",
    "TA_SCALING",
    "TIES_DENSITY",
    "TIES_SCALING",
    "option",
]

FISHER_EPSILON = 1e-6
r"""Default floor :math:`\varepsilon` added to each unit-norm Fisher."""
FISHER_SAMPLES = 256
"""Default bound on the examples a client computes its Fisher on (FusionBench's
``num_fisher_examples``)."""
FISHER_LABELS = ("data", "sampled")
"""``data``: the empirical Fisher (the data's labels, the default); ``sampled``: labels drawn
from the model's predictive distribution (the Fisher's Monte-Carlo estimate)."""
REGMEAN_ALPHA = 0.6
r"""Default :math:`\alpha`, the scale of the Gram matrices' non-diagonal entries (FusionBench's
for CLIP)."""
REGMEAN_RIDGE = 1e-4
r"""Default relative ridge :math:`\rho` of RegMean's solve."""
REGMEAN_GROWTH = 10.0
r"""Largest growth of RegMean's solution, :math:`\|W\|_F / \max_i \|W_i\|_F` per layer, before
the client without which it grows least is dropped
(:func:`fedlmc.merging.field.regmean.solution_growth`): honest clients' solutions stayed within 1.06
in benchmarks/statistics_attacks.py's runs, one client's Grams with their off-diagonal entries
times -4 took them to 18 to 50 (docs/reliability.md)."""
REGMEAN_SAMPLES = 256
"""Default bound on the examples a client computes its Gram matrices on (FusionBench's
``num_regmean_examples``)."""
STATISTICS_RANGE = 64.0
"""Default :math:`R` under SecAgg+: the largest absolute Gram entry a client may send."""
TA_SCALING = 0.3
r"""Default Task Arithmetic scaling :math:`\lambda` (FusionBench's; also DARE's)."""
TIES_DENSITY = 0.2
"""Default share of each task vector TIES keeps (the paper's k = 20%)."""
TIES_SCALING = 1.0
r"""Default TIES scaling :math:`\lambda` (the paper's)."""
DARE_DROP = 0.5
"""Default DARE drop rate p (FusionBench's ``sparsity_ratio`` for DARE with Task
Arithmetic)."""
OT_REG = 0.0
r"""Default entropic regularisation :math:`\gamma` of OT fusion, relative to the largest cost
(0: the exact problem, the paper's default)."""

FIELD_OPTIONS: dict[str, Any] = {
    "fisher_samples": FISHER_SAMPLES,
    "fisher_labels": FISHER_LABELS[0],
    "fisher_epsilon": FISHER_EPSILON,
    "regmean_samples": REGMEAN_SAMPLES,
    "regmean_alpha": REGMEAN_ALPHA,
    "ta_scaling": TA_SCALING,
    "ties_density": TIES_DENSITY,
    "ties_scaling": TIES_SCALING,
    "dare_drop": DARE_DROP,
    "ot_reg": OT_REG,
}
"""Every method option of this module and its default (a run config's key is the name
hyphenated: ``fisher-samples``, ...)."""


def option(options: Mapping[str, Any], name: str) -> Any:
    """``options[name]``, else its default (:data:`FIELD_OPTIONS`)."""
    return options.get(name, FIELD_OPTIONS[name])


CLIENT_STATISTICS_COLUMNS = (
    Column(
        "client_statistics_bytes",
        "bytes of the statistics the clients sent for the merge",
        "`fisher`, `regmean` rows (and `_t`)",
        "sum over the clients of the tensor bytes of what they answered the merge's query, "
        "beside their weights: the Fisher diagonal (`fisher`: one value per parameter) or the "
        "Gram matrices of the linear layers' inputs (`regmean`: in^2 values per layer)",
    ),
)
"""The column the client-statistics methods fill."""
OT_COLUMNS = (
    Column(
        "ot_map_softness",
        "how far OT fusion's maps are from permutations",
        "`ot_fusion`, `ot_fusion_t` rows",
        "mean over the clients other than client 0 and their hidden layers of the mean over "
        "client 0's units of `1 - max` of the unit's row of the transport map (0: every map a "
        "permutation, the exact problem at equal widths; towards `1 - 1/n`: units averaged)",
    ),
)
"""The column ``ot_fusion`` fills."""


def _statistics_bytes(answers: Sequence[Mapping[str, Tensor]]) -> int:
    return int(sum(t.numel() * t.element_size() for a in answers for t in a.values()))


def _merge_answers(job: MergeJob, answers: Sequence[Any], what: str, merge) -> Alignment:
    """``merge(states, answers, weights)`` of the clients whose answer came (the others left
    out, ``Alignment.kept``), at their renormalised weights, with the answers' bytes."""
    from fedlmc.averaging import normalised_weights

    if len(answers) != len(job.states):
        raise ValueError(f"the clients returned {len(answers)} {what} for {len(job.states)}")
    kept = [i for i, answer in enumerate(answers) if answer is not None]
    states = [job.states[i] for i in kept]
    weights = normalised_weights([job.weights[i] for i in kept], len(kept))
    found = [answers[i] for i in kept]
    info = {"client_statistics_bytes": _statistics_bytes(found)}
    which = None if len(kept) == len(job.states) else kept
    return Alignment(states, merge(states, found, weights), info=info, kept=which)


# ----------------------------------------------------------------------------- Fisher


def fisher_part_shapes(template: nn.Module) -> list[dict[str, tuple[int, ...]]]:
    """Fisher merging's two parts (:func:`fedlmc.merging.field.fisher.fisher_parts`): the template's
    floating-point keys, twice."""
    shapes = {k: tuple(v.shape) for k, v in template.state_dict().items() if v.is_floating_point()}
    return [shapes, dict(shapes)]


def fisher_client_parts(
    model: nn.Module, data: tuple[Tensor, Tensor], options: Mapping[str, Any]
) -> list[StateDict]:
    """One client's Fisher parts: its Fisher on a bounded sample of ``data``, then
    :math:`u \\odot \\theta` and :math:`c\\,u`."""
    from fedlmc.merging.field.fisher import bounded_sample, fisher_diagonal, fisher_parts

    seed = int(options["statistics_seed"])
    x, y = bounded_sample(*data, int(option(options, "fisher_samples")), seed)
    fisher = fisher_diagonal(model, x, y, labels=option(options, "fisher_labels"), seed=seed)
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    eps = float(option(options, "fisher_epsilon"))
    c = float(options["clipping_range"])
    return list(fisher_parts(state, fisher, c, eps, float(options.get("weight_range", c))))


def fisher_secure_merge(
    template: nn.Module, means: list[StateDict], options: Mapping[str, Any]
) -> tuple[StateDict, float]:
    """Fisher merging from its parts' secure means, and its bound
    (:func:`fedlmc.merging.field.fisher.fisher_error_bound`)."""
    from fedlmc.merging.field.fisher import fisher_error_bound, fisher_from_means

    c = float(options["clipping_range"])
    bound = float(options.get("weight_range", c))
    merged = fisher_from_means(means[0], means[1], c, bound)
    eps = float(option(options, "fisher_epsilon"))
    return merged, fisher_error_bound(float(options["entry_error"]), c, eps, bound)


FISHER_SUMS = SecureSums(fisher_part_shapes, fisher_client_parts, fisher_secure_merge)
"""Fisher merging's secure form: :math:`u_i \\odot \\theta_i` and :math:`c\\,u_i` summed."""


@builtin_method(
    "fisher",
    description="Fisher merging: every entry averaged with each client's normalised diagonal "
    "Fisher of its own model on its own data (a client query; runs under SecAgg+)",
    needs_clients=True,
)
def fisher_merging(job: MergeJob) -> Alignment:
    r""":math:`\sum_i w_i u_i \theta_i / \sum_i w_i u_i` with the clients' Fisher diagonals
    (:func:`fedlmc.merging.field.fisher.fisher_merge`); a client whose answer was dropped is left
    out."""
    from fedlmc.merging.field.fisher import fisher_merge

    eps = float(option(job.options, "fisher_epsilon"))
    return _merge_answers(
        job,
        job.clients.fisher_diagonals(),
        "Fisher diagonals",
        lambda states, fishers, weights: fisher_merge(states, fishers, weights, eps),
    )


# ----------------------------------------------------------------------------- RegMean


def regmean_part_shapes(template: nn.Module) -> list[dict[str, tuple[int, ...]]]:
    """RegMean's three parts (:func:`fedlmc.merging.field.regmean.regmean_parts`): the template's
    floating-point keys; per linear layer its ``in x in`` Gram and ``in x out`` product."""
    from fedlmc.merging.field.regmean import regmean_layers

    state = template.state_dict()
    weights = {k: tuple(v.shape) for k, v in state.items() if v.is_floating_point()}
    layers = regmean_layers(template)
    grams = {n: (state[f"{n}.weight"].shape[1],) * 2 for n in layers}
    products = {n: tuple(reversed(state[f"{n}.weight"].shape)) for n in layers}
    return [weights, grams, products]


def regmean_client_parts(
    model: nn.Module, data: tuple[Tensor, Tensor], options: Mapping[str, Any]
) -> list[StateDict]:
    """One client's RegMean parts: its weights and, from a bounded sample of ``data``, its
    reduced Gram matrices and their products with its weights, scaled by :math:`c/R`;
    ``ValueError`` naming the layer when a Gram entry exceeds :math:`R`."""
    from fedlmc.merging.field.fisher import bounded_sample
    from fedlmc.merging.field.regmean import gram_matrices, regmean_layers, regmean_parts

    x, _ = bounded_sample(
        data[0], None, int(option(options, "regmean_samples")), int(options["statistics_seed"])
    )
    grams = gram_matrices(model, x, regmean_layers(model))
    limit = float(options["statistics_range"])
    for layer, gram in grams.items():
        if float(gram.abs().max()) > limit:
            raise ValueError(
                f"{layer!r}: a Gram entry of {float(gram.abs().max()):.6g} is outside "
                f"secagg-statistics-range {limit:g}; allowed: a larger secagg-statistics-range"
            )
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    scale = float(options["clipping_range"]) / limit
    return list(regmean_parts(state, grams, float(option(options, "regmean_alpha")), scale))


def regmean_secure_merge(
    template: nn.Module, means: list[StateDict], options: Mapping[str, Any]
) -> tuple[StateDict, float]:
    """RegMean from its parts' secure means, and its a-posteriori bound
    (:func:`fedlmc.merging.field.regmean.regmean_error_bound`)."""
    from fedlmc.merging.field.regmean import regmean_error_bound, regmean_from_means

    c, limit = float(options["clipping_range"]), float(options["statistics_range"])
    ridge = float(options.get("regmean_ridge", REGMEAN_RIDGE))
    merged = regmean_from_means(*means, c / limit, ridge)
    grams = {layer: g.double() * (limit / c) for layer, g in means[1].items()}
    delta = float(options["entry_error"])
    return merged, regmean_error_bound(grams, merged, delta, delta * limit / c, ridge)


REGMEAN_SUMS = SecureSums(regmean_part_shapes, regmean_client_parts, regmean_secure_merge)
"""RegMean's secure form: the weights, the reduced Grams and their products summed."""


@builtin_method(
    "regmean",
    description="RegMean: every linear layer the least-squares fit of the clients' outputs on "
    "their own inputs, from each client's Gram matrices (a client query; runs under SecAgg+)",
    needs_clients=True,
)
def regmean_merging(job: MergeJob) -> Alignment:
    """RegMean of the clients (:func:`fedlmc.merging.field.regmean.regmean_merge`) from their Gram
    matrices; a client whose answer was dropped is left out."""
    from fedlmc.merging.field.regmean import regmean_layers, regmean_merge

    alpha = float(option(job.options, "regmean_alpha"))
    ridge = float(job.options.get("regmean_ridge", REGMEAN_RIDGE))
    layers = regmean_layers(job.template)
    grams = list(job.clients.gram_matrices(layers))

    def merge(states, found, weights):
        return regmean_merge(states, found, weights, alpha, ridge)

    while True:
        alignment = _merge_answers(job, grams, "sets of Gram matrices", merge)
        culprit = _blow_up_culprit(job, grams, layers, alignment, merge)
        if culprit is None:
            return alignment
        job.clients.refuse(*culprit)
        grams[culprit[0]] = None


def _blow_up_culprit(job: MergeJob, grams: list, layers, alignment: Alignment, merge):
    """``(index, reason)`` of the client whose Gram matrices blow RegMean's solution up (a
    layer's :func:`fedlmc.merging.field.regmean.solution_growth` above :data:`REGMEAN_GROWTH`): the
    one without which the largest growth is smallest; ``None`` when the solution is within the
    limit or fewer than two clients are merged."""
    from fedlmc.averaging import normalised_weights
    from fedlmc.merging.field.regmean import solution_growth

    growth = solution_growth(alignment.merged, alignment.aligned, layers)
    layer = max(growth, key=growth.get)
    kept = [i for i, g in enumerate(grams) if g is not None]
    if growth[layer] <= REGMEAN_GROWTH or len(kept) < 2:
        return None
    without = {}
    for index in kept:
        rest = [i for i in kept if i != index]
        states = [job.states[i] for i in rest]
        weights = normalised_weights([job.weights[i] for i in rest], len(rest))
        merged = merge(states, [grams[i] for i in rest], weights)
        without[index] = max(solution_growth(merged, states, layers).values())
    index = min(without, key=without.get)
    return index, (
        f"with its Gram matrices RegMean's solution of layer {layer!r} has {growth[layer]:.3g} "
        f"x the largest client weight norm, without them at most {without[index]:.3g} x; "
        f"allowed: at most {REGMEAN_GROWTH:g} x"
    )


# ----------------------------------------------------------------------------- task vectors


@builtin_method(
    "task_arithmetic",
    description="Task Arithmetic: the base plus lambda times the sum of the clients' task "
    "vectors (theta_i - theta_0; init = 'shared')",
    needs_base=True,
)
def task_arithmetic_merge(job: MergeJob) -> Alignment:
    r""":math:`\theta_0 + \lambda \sum_i N w_i \tau_i`
    (:func:`fedlmc.merging.field.task_vectors.task_arithmetic`, ``ta_scaling``)."""
    from fedlmc.merging.field.task_vectors import task_arithmetic

    scaling = float(option(job.options, "ta_scaling"))
    merged = task_arithmetic(job.states, job.weights, job.base, scaling)
    return Alignment(list(job.states), merged)


@builtin_method(
    "ties",
    description="TIES-Merging: each task vector trimmed to its top k, signs elected, the "
    "agreeing entries averaged, added to the base (init = 'shared')",
    needs_base=True,
)
def ties_merging(job: MergeJob) -> Alignment:
    """TIES-Merging (:func:`fedlmc.merging.field.task_vectors.ties_merge`, ``ties_density``,
    ``ties_scaling``)."""
    from fedlmc.merging.field.task_vectors import ties_merge

    density = float(option(job.options, "ties_density"))
    scaling = float(option(job.options, "ties_scaling"))
    merged = ties_merge(job.states, job.weights, job.base, density, scaling)
    return Alignment(list(job.states), merged)


@builtin_method(
    "dare",
    description="DARE: each task vector's entries dropped with rate p and rescaled by 1/(1-p) "
    "(seeded), then Task Arithmetic (init = 'shared')",
    needs_base=True,
)
def dare_merging(job: MergeJob) -> Alignment:
    """DARE then Task Arithmetic (:func:`fedlmc.merging.field.task_vectors.dare_merge`,
    ``dare_drop``, ``ta_scaling``, the job's seed)."""
    from fedlmc.merging.field.task_vectors import dare_merge

    drop = float(option(job.options, "dare_drop"))
    scaling = float(option(job.options, "ta_scaling"))
    merged = dare_merge(job.states, job.weights, job.base, drop, scaling, seed=job.seed)
    return Alignment(list(job.states), merged)


# ----------------------------------------------------------------------------- OT fusion


@builtin_method(
    "ot_fusion",
    description="OT fusion: every client's units transported onto client 0's layer by layer "
    "(exact OT, or Sinkhorn with ot-reg > 0; POT), then average (norm-free chains)",
    plain_chain_only=True,
)
def ot_fusion_merge(job: MergeJob) -> Alignment:
    """Every client in client 0's basis (:func:`fedlmc.merging.field.ot_fusion.ot_fusion`,
    ``ot_reg``); the merge is their weighted average."""
    from fedlmc.merging.field.ot_fusion import ot_fusion

    aligned, softness = ot_fusion(job.permutation_spec(), job.states, option(job.options, "ot_reg"))
    return Alignment(aligned, info={"ot_map_softness": softness})
