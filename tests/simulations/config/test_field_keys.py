"""The field methods' run-config keys (simulations/config/field_keys.py): declared with their
methods' defaults, reaching the merge as its options, checked (a Fisher label that is not one,
a density out of (0, 1]), applying only where their method runs (cells differing only in them
are one cell elsewhere), and the task-vector methods refused before any work without a shared
initialisation."""

from __future__ import annotations

import pytest

from fedlmc.merging.field.field_methods import FIELD_OPTIONS
from fedlmc.simulations.config import ConfigError, canonical_run_config, validate_run_config
from fedlmc.simulations.config.field_keys import field_method_keys, field_method_options

COMPARE = {"strategy": "compare", "methods": "average,fisher,regmean"}


def test_every_option_is_a_key_with_its_default_and_reaches_the_merge():
    keys = field_method_keys()
    assert {name.replace("-", "_") for name in keys} == set(FIELD_OPTIONS) | {
        "secagg_statistics_range"
    }
    config = validate_run_config({**COMPARE, "fisher-samples": 32, "regmean-alpha": 0.9})
    options = field_method_options(config)
    assert options["fisher_samples"] == 32 and options["regmean_alpha"] == 0.9
    assert {k: v for k, v in options.items() if k not in ("fisher_samples", "regmean_alpha")} == {
        k: v for k, v in FIELD_OPTIONS.items() if k not in ("fisher_samples", "regmean_alpha")
    }


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"fisher-labels": "model"}, "fisher-labels = 'model'"),
        ({"ties-density": 0.0}, "ties-density = 0.0: allowed: a number in (0, 1]"),
        ({"dare-drop": 1.0}, "dare-drop = 1.0: allowed: a number in [0, 1)"),
        ({"regmean-alpha": 1.5}, "regmean-alpha = 1.5: allowed: a number in [0, 1]"),
    ],
)
def test_a_bad_value_is_refused_naming_it(values, words):
    with pytest.raises(
        ConfigError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        validate_run_config(
            {**COMPARE, "methods": "average,fisher,ties,dare,regmean", "init": "shared", **values}
        )


def canonical(values: dict) -> dict:
    return canonical_run_config(validate_run_config(values))


def test_a_key_applies_only_where_its_method_runs():
    plain = canonical({"strategy": "compare", "methods": "average", "fisher-samples": 32})
    assert plain["fisher-samples"] == FIELD_OPTIONS["fisher_samples"]  # reset: one cell
    fisher = canonical({**COMPARE, "fisher-samples": 32})
    assert fisher["fisher-samples"] == 32
    clear = canonical({**COMPARE, "secagg-statistics-range": 8.0})
    assert clear["secagg-statistics-range"] == 64.0  # only under SecAgg+ with regmean


def test_task_vector_methods_need_a_shared_initialisation():
    for cell in (
        {"strategy": "aligned", "align": "ties"},
        {"strategy": "compare", "methods": "average,task_arithmetic_t"},
    ):
        with pytest.raises(
            ConfigError, match="needs the clients' common base model; got none: its task vectors"
        ):
            validate_run_config(cell)
        assert validate_run_config({**cell, "init": "shared"})["init"] == "shared"
