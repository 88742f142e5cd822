"""The run-config keys of the field's merge methods (:mod:`fedlmc.merging.field.field_methods`):
their declarations (spliced into the key table by
:func:`fedlmc.simulations.config.keys.declared_keys`), and the method options they give the merge
(:func:`field_method_options`); that the task-vector methods have a base is their own refusal
(:func:`fedlmc.simulations.config.checks.check_merge_methods`). No heavy import (the run-config
validation reads it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedlmc.merging.field.field_methods import FIELD_OPTIONS, FISHER_LABELS, STATISTICS_RANGE
from fedlmc.simulations.config.derived import selected_methods
from fedlmc.simulations.config.schema import Key, Rule, fraction, integers, named, numbers
from fedlmc.simulations.config.secure import is_secure
from fedlmc.simulations.config.values import (
    EXAMPLES_WHY,
    MAX_EXAMPLES,
    SECAGG_MAX_RANGE,
    SECAGG_WHY,
)

__all__ = ["field_method_keys", "field_method_options"]


def _runs(*methods: str) -> Rule:
    text = " or ".join(f"`{m}`" for m in methods)
    return Rule(f"{text} runs", lambda c: bool(set(methods) & set(selected_methods(c))))


_at_most_one = numbers(0.0, 1.0, low_open=True)
_alpha = numbers(0.0, 1.0)
SAMPLES = integers(1, MAX_EXAMPLES, EXAMPLES_WHY)
SCALING = numbers(0.0, 100.0, "lambda scales a sum of task vectors: published ones are <= 1")


def field_method_keys() -> dict[str, Key]:
    """The keys, in documentation order; each reaches its method as the option of its name with
    underscores (``fisher-samples`` -> ``fisher_samples``)."""
    d = FIELD_OPTIONS
    return {
        "fisher-samples": Key(
            int,
            d["fisher_samples"],
            "fisher: the most training examples each client computes its Fisher on (a seeded "
            "subset)",
            SAMPLES,
            applies=_runs("fisher"),
        ),
        "fisher-labels": named(
            str,
            d["fisher_labels"],
            "fisher: the labels of the log-likelihood: data (the empirical Fisher) or sampled "
            "(drawn from the model's predictive distribution)",
            FISHER_LABELS,
            applies=_runs("fisher"),
        ),
        "fisher-epsilon": Key(
            float,
            d["fisher_epsilon"],
            "fisher: the floor added to each client's unit-norm Fisher",
            numbers(0.0, 1.0, "a floor of 1 outweighs the unit-norm Fisher", low_open=True),
            applies=_runs("fisher"),
        ),
        "regmean-samples": Key(
            int,
            d["regmean_samples"],
            "regmean: the most training examples each client computes its Gram matrices on",
            SAMPLES,
            applies=_runs("regmean"),
        ),
        "regmean-alpha": Key(
            float,
            d["regmean_alpha"],
            "regmean: the scale of the Gram matrices' non-diagonal entries",
            _alpha,
            applies=_runs("regmean"),
        ),
        "ta-scaling": Key(
            float,
            d["ta_scaling"],
            "task_arithmetic, dare: lambda, the scale of the summed task vectors",
            SCALING,
            applies=_runs("task_arithmetic", "dare"),
        ),
        "ties-density": Key(
            float,
            d["ties_density"],
            "ties: the share of each task vector's largest entries kept",
            _at_most_one,
            applies=_runs("ties"),
        ),
        "ties-scaling": Key(
            float,
            d["ties_scaling"],
            "ties: lambda, the scale of the merged task vector",
            SCALING,
            applies=_runs("ties"),
        ),
        "dare-drop": Key(
            float,
            d["dare_drop"],
            "dare: the drop rate p of each task-vector entry (survivors rescaled by 1/(1-p))",
            fraction,
            applies=_runs("dare"),
        ),
        "ot-reg": Key(
            float,
            d["ot_reg"],
            "ot_fusion: entropic regularisation relative to the largest cost (0: exact OT)",
            numbers(0.0, 1000.0, "beyond, the plan is uniform"),
            applies=_runs("ot_fusion"),
        ),
        "secagg-statistics-range": Key(
            float,
            STATISTICS_RANGE,
            "regmean under SecAgg+: the largest absolute Gram entry a client may send (a "
            "client beyond it refuses, naming the layer)",
            numbers(0.0, SECAGG_MAX_RANGE, SECAGG_WHY, low_open=True),
            applies=Rule(
                '`secure-aggregation = "secagg+"` and `regmean` runs',
                lambda c: is_secure(c) and "regmean" in selected_methods(c),
            ),
        ),
    }


def field_method_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The method options of a validated run config (:data:`FIELD_OPTIONS`' names)."""
    return {name: config[name.replace("_", "-")] for name in FIELD_OPTIONS}
