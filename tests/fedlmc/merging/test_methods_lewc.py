"""LEWC where it is defined: depth-weighted biases, BatchNorm measured before re-estimation,
residual networks refused, the logit ensemble and the temperature LEWC predicts.

Every check runs on constructed networks where LEWC is exact: two models whose hidden units live
in disjoint coordinates (each model's weights read and write only its own half of every hidden
group), built generically from the permutation spec for the MLP with biases, a BatchNorm MLP
and a ResNet-20.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from fedlmc.analysis.diagnostics import bias_shares, dead_unit_fractions, layer_predictions
from fedlmc.averaging import average, load_state
from fedlmc.data.loading import load_dataset
from fedlmc.merging.methods import merge_states
from fedlmc.models.classifiers import build_model
from fedlmc.permutation.chain import chain_layers, depth_weighted_bias_average, norm_free_chain
from fedlmc.simulations.config import ConfigError, canonical_run_config, validate_run_config
from fedlmc.study.compare import compare_methods


@pytest.fixture(scope="module")
def splits():
    full = load_dataset("mnist5k")
    pick = torch.Generator().manual_seed(0)
    server = torch.randperm(len(full.server[1]), generator=pick)[:200]
    test = torch.randperm(len(full.test[1]), generator=pick)[:200]
    return replace(
        full,
        server=(full.server[0][server], full.server[1][server]),
        test=(full.test[0][test], full.test[1][test]),
    )


def disjoint_pair(template: nn.Module, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Two random models of ``template``'s architecture whose hidden units are disjoint: model
    a keeps the first half of every permutation group, model b the second; every entry of a
    tensor that writes or reads the other half is 0. Norm layers are shared and act as a fixed
    per-unit scale (running mean 0, running variance 1, shift 0, the same positive scale in
    both), so the merge before BatchNorm re-estimation is exactly LEWC's prediction."""
    spec = template.permutation_spec()
    norms = {
        n for n, m in template.named_modules() if isinstance(m, nn.BatchNorm1d | nn.BatchNorm2d)
    }
    generator = torch.Generator().manual_seed(seed)
    shared_scale = {
        f"{n}.weight": 0.5 + torch.rand(template.get_submodule(n).num_features, generator=generator)
        for n in norms
    }
    pair = []
    for own in (0, 1):
        state = {}
        for key, value in template.state_dict().items():
            module = key.rpartition(".")[0]
            if module in norms:
                state[key] = _norm_entry(key, value, shared_scale)
                continue
            tensor = torch.randn(value.shape, generator=generator) * 0.5
            for axis, group in enumerate(spec.axes_to_perm.get(key, ())):
                if group is not None:  # zero the other model's half of this unit axis
                    size = value.shape[axis]
                    start, length = (size // 2, size - size // 2) if own == 0 else (0, size // 2)
                    tensor.narrow(axis, start, length).zero_()
            state[key] = tensor
        pair.append(state)
    return pair


def _norm_entry(key: str, value: torch.Tensor, shared_scale: dict) -> torch.Tensor:
    if key.endswith("running_var"):
        return torch.ones_like(value)
    if key.endswith("num_batches_tracked"):
        return value.clone()
    if key in shared_scale:
        return shared_scale[key].clone()
    return torch.zeros_like(value)  # shift and running mean


def test_the_constructed_pair_is_disjoint_and_reciprocally_orthogonal():
    template = build_model("mlp", width=0.125, bias=True)
    a, b = disjoint_pair(template)
    for key, value in a.items():
        if value.ndim == 2:  # no weight entry is used by both models
            assert float((value * b[key]).abs().sum()) == 0.0


@pytest.mark.parametrize("weights", [[0.5, 0.5], [0.25, 0.75]])
def test_depth_weighted_biases_make_lewc_exact_where_the_plain_average_is_not(weights):
    template = build_model("mlp", width=0.125, bias=True)
    pair = disjoint_pair(template, seed=1)
    x = torch.rand(64, 1, 28, 28, generator=torch.Generator().manual_seed(2))
    lewc_merge, _ = merge_states("average_lewc_bias", template, pair, weights)
    rows = layer_predictions(template, pair, weights, lewc_merge, x)
    assert all(row["lewc_error"] < 1e-5 for row in rows), rows
    plain = layer_predictions(template, pair, weights, average(pair, weights), x)
    assert plain[0]["lewc_error"] < 1e-5  # depth 1: the two rules coincide
    assert plain[-1]["lewc_error"] > 0.1, plain  # the averaged biases swamp the shrunk signal


def test_depth_weighted_bias_rule_keeps_the_endpoints_and_leaves_weights_alone():
    template = build_model("mlp", width=0.125, bias=True)
    pair = disjoint_pair(template, seed=3)
    layers = norm_free_chain(template.permutation_spec(), pair[0])
    assert layers == ["hidden.0.linear", "hidden.1.linear", "hidden.2.linear", "classifier"]
    for lam in (0.0, 1.0):
        end = depth_weighted_bias_average(layers, pair, [lam, 1 - lam])
        assert all(torch.equal(end[k], pair[0 if lam else 1][k]) for k in end)
    half = depth_weighted_bias_average(layers, pair, [1, 1])
    plain = average(pair)
    for depth, layer in enumerate(layers, start=1):
        assert torch.equal(half[f"{layer}.weight"], plain[f"{layer}.weight"])
        expected = 0.5**depth * (pair[0][f"{layer}.bias"] + pair[1][f"{layer}.bias"])
        assert torch.allclose(half[f"{layer}.bias"], expected, atol=1e-7)


def labelled_by(models: list[nn.Module], splits, flip: float = 0.3):
    """``splits`` with server and test labels the argmax of the models' summed logits, a share
    ``flip`` replaced by random classes: data on which a fitted temperature is interior."""
    generator = torch.Generator().manual_seed(1)

    def labels(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            y = sum(model(x) for model in models).argmax(dim=1)
        noisy = torch.rand(len(y), generator=generator) < flip
        return torch.where(noisy, torch.randint(0, 10, y.shape, generator=generator), y)

    x_server, x_test = splits.server[0], splits.test[0]
    return replace(splits, server=(x_server, labels(x_server)), test=(x_test, labels(x_test)))


def test_the_study_measures_the_bias_rule_on_its_own_path(splits):
    template = build_model("mlp", width=0.125, bias=True)
    pair = disjoint_pair(template, seed=4)
    splits = labelled_by([load_state(template, sd) for sd in pair], splits)
    rows = compare_methods(
        template, pair, None, splits, ["average", "average_lewc_bias"], lambdas=5, seed=0
    ).rows
    plain, lewc = rows
    for at in ("", "_quarter"):
        assert max(json.loads(lewc[f"lewc_error_layers{at}"])) < 1e-5, lewc
        assert json.loads(plain[f"lewc_error_layers{at}"])[-1] > 0.05
    assert json.loads(lewc["lewc_bias_mismatch_layers"]) == pytest.approx([0.0] * 4, abs=1e-6)
    mismatch = json.loads(plain["lewc_bias_mismatch_layers"])  # Σ w_i b_i vs Σ w_i^l b_i
    assert mismatch == pytest.approx([0.0, 1.0, 3.0, 7.0], rel=1e-5, abs=1e-6)
    # the sufficient conditions without biases hold for both: they cannot see the bias
    assert plain["recip_orth_mean"] == 0.0 and lewc["recip_orth_mean"] == 0.0
    # merged logits = (1/2)^(L-1) x the logit ensemble's: the fitted T scales by that exactly
    for row in rows:
        assert row["lewc_temperature_ratio"] == pytest.approx(0.5**3, rel=1e-9)
    assert lewc["temperature_ratio_logit_ensemble"] == pytest.approx(0.5**3, rel=2e-2)
    assert lewc["agreement_logit_ensemble"] == 1.0  # a positive multiple: the same argmax
    assert lewc["lewc_measured_on"] == "combined weights (the evaluated merge)"
    # the temperature along the path: fitted at every lambda of the curve, the endpoints the
    # clients' own T; LEWC's prediction (L = 4) shares those endpoints
    for row in rows:
        path, predicted = (
            json.loads(row["temperature_path"]),
            json.loads(row["temperature_path_lewc"]),
        )
        assert len(path) == len(predicted) == len(json.loads(row["curve"])["lam"]) == 5
        assert (path[0] + path[-1]) / 2 == pytest.approx(row["endpoint_temperature_mean"], rel=1e-9)
        assert predicted[0] == path[0] and predicted[-1] == path[-1]
        assert predicted[2] == pytest.approx((path[0] + path[-1]) / 16, rel=1e-12)
    # on its own path the midpoint is the merge itself
    assert json.loads(lewc["temperature_path"])[2] == pytest.approx(
        lewc["merge_temperature"], rel=1e-6
    )


def test_batchnorm_lewc_is_measured_before_re_estimation(splits):
    template = build_model("mlp", width=0.125, norm="bn", bias=False)
    pair = disjoint_pair(template, seed=5)
    result = compare_methods(template, pair, None, splits, ["average"], lambdas=3, seed=0)
    (row,) = result.rows
    assert row["lewc_measured_on"] == "combined weights, before BatchNorm re-estimation"
    assert max(json.loads(row["lewc_error_layers"])) < 1e-5, row
    # what the re-estimated merge computes is not LEWC's prediction: re-estimation rescales it
    x = splits.test[0][:512]
    after = layer_predictions(template, pair, None, result.merged["average"], x)
    assert max(r["lewc_error"] for r in after) > 0.1


def test_a_residual_network_has_no_lewc_numbers(splits):
    template = build_model("resnet20", width=0.125, norm="none", bias=False)
    pair = disjoint_pair(template, seed=6)
    assert chain_layers(template.permutation_spec(), pair[0]) is None
    small = replace(splits, test=(splits.test[0][:64], splits.test[1][:64]))
    (row,) = compare_methods(
        template, pair, None, small, ["average"], lambdas=3, diagnostic_samples=64
    ).rows
    assert "not one plain chain" in row["lewc_undefined_reason"]
    assert math.isnan(row["lewc_error_mean"]) and math.isnan(row["lewc_temperature_ratio"])
    assert row["lewc_error_layers"] == "" and row["lewc_norm_ratio_layers"] == ""
    assert len(json.loads(row["temperature_path"])) == 3 and row["temperature_path_lewc"] == ""
    # LLFC makes no depth claim: its columns, and the measured ratio, stay
    assert len(json.loads(row["llfc_scaled_error_layers"])) == len(template.layer_names)
    assert len(json.loads(row["norm_ratio_layers"])) == len(template.layer_names)
    assert row["recip_orth_mean"] == 0.0  # both sufficient conditions hold, LEWC has no exponent
    with pytest.raises(ValueError, match="not one chain"):
        merge_states("average_lewc_bias", template, pair)


def test_dead_units_and_bias_shares_show_a_merge_that_passes_only_its_biases():
    model = build_model("mlp", width=0.125, bias=True)
    with torch.no_grad():
        model.hidden[1].linear.weight.zero_()
        model.hidden[1].linear.bias.fill_(-1.0)  # layer 2 never fires
    x = torch.rand(32, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    dead = dead_unit_fractions(model, x)
    assert len(dead) == 3 and dead[1] == 1.0 and dead[2] < 1.0
    shares = bias_shares(model, x)
    assert len(shares) == 4 and shares[1] == 1.0 and 0 < shares[0] < 1
    assert bias_shares(build_model("mlp", width=0.125, bias=False), x) == [0.0] * 4


def test_bias_is_a_run_config_key_resolved_from_the_model():
    assert validate_run_config({"bias": False})["bias"] == "false"
    assert validate_run_config({"bias": "true"})["bias"] == "true"
    with pytest.raises(ConfigError, match="bias = 'maybe': allowed: auto, true, false"):
        validate_run_config({"bias": "maybe"})
    assert canonical_run_config(validate_run_config({}))["bias"] == "true"  # the MLP's default
    resnet = validate_run_config({"model": "resnet20"})
    assert canonical_run_config(resnet)["bias"] == "false"
    with pytest.raises(ConfigError, match="has no bias option"):
        validate_run_config({"model": "fedlmc.models:MLP", "bias": False})


@pytest.mark.parametrize(
    "values, message",
    [
        ({"model": "resnet20"}, "is not supported: residual"),
        ({"model": "vgg11"}, "norm = 'bn'"),
        ({"model": "mlp", "norm": "ln"}, "norm = 'ln'"),
        ({"strategy": "aligned", "align": "average_lewc_bias", "norm": "bn"}, "norm = 'bn'"),
    ],
)
def test_the_bias_rule_is_refused_before_any_work_where_it_is_undefined(values, message):
    values = {"methods": "average_lewc_bias_t", **values}
    with pytest.raises(ConfigError, match=message):
        validate_run_config(values)


def test_the_bias_rule_is_accepted_on_norm_free_chains():
    validate_run_config({"methods": "average_lewc_bias,average_lewc_bias_t"})
    validate_run_config({"model": "vgg11", "norm": "none", "methods": "average_lewc_bias"})


def test_a_bias_free_model_is_built_from_the_run_config():
    from fedlmc.simulations.task import build_from_config

    splits = load_dataset("mnist5k")
    config = canonical_run_config(validate_run_config({"bias": False, "width": 0.125}))
    model = build_from_config(config, splits)
    assert not any(key.endswith("bias") for key in model.state_dict())
    assert load_state(model, model.state_dict()) is not None


def test_a_user_module_is_aligned_and_diagnosed_with_a_spec_derived_on_test_inputs(splits):
    """compare_methods derives the spec of a plain nn.Module (no permutation_spec method, no
    config) on two test inputs: weight matching and the depth-weighted biases both run, and the
    chain is found in the derived spec."""

    def make(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(784, 16),
            nn.ReLU(),
            nn.Linear(16, 16),
            nn.ReLU(),
            nn.Linear(16, 10),
        )

    states = [make(1).state_dict(), make(2).state_dict()]
    small = replace(splits, test=(splits.test[0][:64], splits.test[1][:64]))
    rows = compare_methods(
        make(0), states, None, small, ["weight_matching", "average_lewc_bias"], lambdas=3
    ).rows
    assert [r["method"] for r in rows] == ["weight_matching", "average_lewc_bias"]
    assert all(r["lewc_undefined_reason"] == "" for r in rows)
    assert json.loads(rows[1]["lewc_bias_mismatch_layers"]) == pytest.approx([0.0] * 3, abs=1e-6)
