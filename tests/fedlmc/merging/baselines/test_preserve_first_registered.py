"""Preserve-First Merging as the registered methods ``preserve_first`` and
``weight_matching_preserve_first`` (fedlmc.merging.baselines.baselines, the registry's
``builds_model``): with no preserved layer its study rows are the plain average's, with every layer
but the head preserved the logit ensemble's; it is refused, naming it, wherever a state dict of the
template is required (the aligned strategy, its run config, merge_clients, load_merged) and for
models with BatchNorm before any work; it is in every list of methods."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedlmc.data.loading import from_arrays
from fedlmc.merging.method_registry import (
    check_template_merge,
    merge_method,
    study_methods,
    template_merge_names,
)
from fedlmc.merging.methods import merge_states
from fedlmc.models.classifiers import build_model
from fedlmc.simulations import load_merged
from fedlmc.simulations.config import ConfigError, validate_run_config
from fedlmc.simulations.config.tables import columns_table, methods_table
from fedlmc.strategies import PermutationAlignedAverage, StrategyOptions
from fedlmc.study.compare import compare_methods, merge_clients
from fedlmc.study.method_policy import evaluation_of

ROOT = Path(__file__).resolve().parents[4]
SHAPE = (1, 4, 4)
DEPTH = 2  # hidden layers: a chain of L = 3 Linear layers


def mlp(seed: int, norm: str = "none") -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", width=0.125, depth=DEPTH, in_shape=SHAPE, norm=norm)


def states(count: int, norm: str = "none") -> list[dict[str, torch.Tensor]]:
    return [mlp(seed, norm).state_dict() for seed in range(count)]


def splits():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(160, *SHAPE, generator=g)
    y = torch.randint(0, 10, (160,), generator=g)
    return from_arrays(x[:100], y[:100], x[100:], y[100:], num_classes=10, server_fraction=0.3)


def rows_by_method(layers: int, weights: list[float]) -> dict[str, dict]:
    rows = compare_methods(
        mlp(0),
        states(3),
        weights,
        splits(),
        ["average", "preserve_first", "logit_ensemble"],
        diagnostics=False,
        method_options={"pfm_layers": layers},
    ).rows
    return {row["method"]: row for row in rows}


@pytest.mark.parametrize(("layers", "equals"), [(0, "average"), (DEPTH, "logit_ensemble")])
def test_no_preserved_layer_is_the_average_and_all_but_the_head_the_logit_ensemble(layers, equals):
    rows = rows_by_method(layers, [1.0, 2.0, 3.0])
    found, expected = rows["preserve_first"], rows[equals]
    assert found["accuracy"] == expected["accuracy"]
    if equals == "logit_ensemble":  # the same predictions on every test input
        assert found["agreement_logit_ensemble"] == 1.0
    for column in ("nll_raw", "ece_raw", "nll_calibrated"):
        assert found[column] == pytest.approx(expected[column], rel=1e-5, abs=1e-6)
    other = "logit_ensemble" if equals == "average" else "average"
    assert found["nll_raw"] != pytest.approx(rows[other]["nll_raw"], rel=1e-4)


def test_the_built_model_is_the_registered_one_on_the_clients_merge_states_aligned():
    entry = merge_method("weight_matching_preserve_first_t")
    assert (entry.name, evaluation_of(entry.name).on_path, entry.needs.plain_chain_only) == (
        "weight_matching_preserve_first",
        False,
        True,
    )
    assert not entry.rule.template_shaped and evaluation_of(entry.name).server_sees == "each model"
    template, clients = mlp(0), states(2)
    merged, aligned = merge_states(entry.name, template, clients)
    model = entry.rule.builds_model(template, aligned, [0.5, 0.5], {})
    assert model.k == 1 and len(model.clients) == 2
    assert all(torch.equal(merged[k], v) for k, v in model.merged.state_dict().items())


def test_consumers_of_template_state_dicts_refuse_it_naming_it(tmp_path):
    expected = "merge method 'preserve_first' builds a model of another architecture"
    with pytest.raises(ValueError, match=f"method='preserve_first'\\): {expected}.*: weight_m"):
        PermutationAlignedAverage(
            mlp(0), StrategyOptions(num_clients=2, calibration="none"), method="preserve_first"
        )
    with pytest.raises(ConfigError, match=f"^align = 'preserve_first': {expected}.*allowed: w"):
        validate_run_config({"strategy": "aligned", "align": "preserve_first"})
    with pytest.raises(ValueError, match=f"^merge_clients: {expected}"):
        merge_clients("preserve_first_t", mlp(0), states(2), None, splits())
    with pytest.raises(ConfigError, match="^load_merged: merge method 'weight_matching_pres"):
        load_merged(tmp_path, "weight_matching_preserve_first_t")
    with pytest.raises(ValueError, match="allowed: average, weight_matching, "):
        check_template_merge("preserve_first", "here")
    assert "preserve_first" not in template_merge_names() and "cca_merge" in template_merge_names()
    assert validate_run_config({"methods": "average,preserve_first,preserve_first_t"})


def test_a_batchnorm_model_is_refused_before_any_work():
    said: list[str] = []
    allowed = "allowed: norm-free plain feed-forward chains"
    with pytest.raises(
        ValueError,
        match=f"^merge method 'preserve_first_t': model 'MLP' is not .*{allowed}",
    ):
        compare_methods(
            mlp(0, "bn"),
            states(2, "bn"),
            None,
            splits(),
            ["average", "preserve_first_t"],
            progress=said.append,
        )
    assert said == []  # nothing merged, nothing evaluated
    with pytest.raises(
        ValueError, match="^merge method 'weight_matching_preserve_first': model 'MLP'"
    ):
        merge_states("weight_matching_preserve_first", mlp(0, "bn"), states(2, "bn"))
    with pytest.raises(
        ConfigError,
        match="'preserve_first': model 'mlp' is not supported: norm = 'bn'",
    ):
        validate_run_config({"methods": "preserve_first_t", "norm": "bn"})


def test_it_is_in_every_list_of_methods():
    names = {"preserve_first", "preserve_first_t", "weight_matching_preserve_first_t"}
    assert names <= set(study_methods())
    assert "`preserve_first`, `preserve_first_t`" in methods_table()
    assert "`merged_parameters_ratio`" in columns_table()
    docs = (ROOT / "docs" / "methods.md").read_text()
    assert "`weight_matching_preserve_first`, `weight_matching_preserve_first_t`" in docs
