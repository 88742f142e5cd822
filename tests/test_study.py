"""Tests of fedlmc.study: every merge method evaluated on the same client models.

Real MNIST digits (mnist5k, subsampled), tiny MLPs (width 0.25 = 32 hidden units), 5 epochs.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from fedlmc.calibrate import fit_temperature
from fedlmc.data import load_dataset
from fedlmc.evaluation import evaluate, metrics_from_logits, predict_logits
from fedlmc.merge import average, load_state
from fedlmc.models import apply_permutation, build_model, permutation_spec
from fedlmc.permutation import random_permutations
from fedlmc.study import (
    COLUMNS,
    METHODS,
    STRING_COLUMNS,
    evaluate_methods,
    evaluate_model_row,
    merge_clients,
)
from fedlmc.train import train_model

MERGED_FLOATS = (
    "accuracy",
    "nll",
    "ece",
    "temperature",
    "nll_raw",
    "ece_raw",
    "nll_calibrated",
    "ece_calibrated",
    "acc_gap",
    "merge_seconds",
)
BARRIERS = ("accuracy_barrier", "loss_barrier", "loss_barrier_calibrated")
DIAGNOSTICS = ("lewc_cos_mean", "recip_orth_mean", "relu_additivity_mean")
COMMON = (
    "endpoint_acc_mean",
    "endpoint_acc_min",
    "endpoint_acc_max",
    "endpoint_nll_mean",
    "ensemble_acc",
    "ensemble_nll",
)


def subsample(data, count: int, seed: int):
    index = torch.randperm(len(data[1]), generator=torch.Generator().manual_seed(seed))[:count]
    return data[0][index], data[1][index]


@pytest.fixture(scope="module")
def splits():
    full = load_dataset("mnist5k")
    return replace(
        full,
        train=subsample(full.train, 900, 0),
        server=subsample(full.server, 200, 1),
        test=subsample(full.test, 300, 2),
    )


@pytest.fixture(scope="module")
def template(splits):
    torch.manual_seed(0)
    return build_model("mlp", width=0.25, num_classes=splits.num_classes, in_shape=splits.in_shape)


@pytest.fixture(scope="module")
def clients(splits, template):
    """Three clients trained from their own initialisations on disjoint thirds of the pool."""
    x, y = splits.train
    states = []
    for i in range(3):
        torch.manual_seed(100 + i)
        model = build_model(
            "mlp", width=0.25, num_classes=splits.num_classes, in_shape=splits.in_shape
        )
        part = (x[i::3], y[i::3])
        train_model(
            model, part, epochs=5, lr=0.1, weight_decay=3e-3, batch_size=32, seed=i, device="cpu"
        )
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return states


@pytest.fixture(scope="module")
def two_client_rows(template, clients, splits):
    return evaluate_methods(
        template, clients[:2], [200, 200], splits, METHODS, lambdas=5, device="cpu"
    )


def finite(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def test_every_method_gives_one_complete_row(two_client_rows, template):
    assert [r["method"] for r in two_client_rows] == list(METHODS)
    for row in two_client_rows:
        assert tuple(row) == COLUMNS
        assert row["num_clients"] == 2
        assert all(isinstance(row[c], str) for c in STRING_COLUMNS)
        assert all(finite(row[c]) for c in COMMON + ("accuracy", "nll", "ece", "acc_gap"))
        assert row["acc_gap"] == pytest.approx(row["endpoint_acc_mean"] - row["accuracy"])
        if row["method"] == "ensemble":
            assert all(math.isnan(row[c]) for c in BARRIERS + DIAGNOSTICS)
            assert row["curve"] == "" and row["lewc_cos_layers"] == ""
            assert (row["accuracy"], row["nll"]) == (row["ensemble_acc"], row["ensemble_nll"])
            continue
        assert all(finite(row[c]) for c in MERGED_FLOATS + BARRIERS + DIAGNOSTICS), row
        assert row["barrier_kind"] == "curve"
        curve = json.loads(row["curve"])
        assert set(curve) == {"lam", "accuracy", "nll", "nll_calibrated"}
        assert curve["lam"] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
        layers = json.loads(row["lewc_cos_layers"])
        assert len(layers) == len(template.layer_names)
        assert row["lewc_cos_mean"] == pytest.approx(sum(layers) / len(layers))
        assert row["accuracy_barrier"] >= 0 and row["loss_barrier"] >= 0


def test_calibrated_row_shares_the_merge_and_changes_only_nll_and_ece(two_client_rows):
    rows = {r["method"]: r for r in two_client_rows}
    for base in ("average", "weight_matching", "activation_matching", "merge_many"):
        raw, cal = rows[base], rows[f"{base}_t"]
        assert raw["temperature"] == 1.0
        assert (raw["nll"], raw["ece"]) == (raw["nll_raw"], raw["ece_raw"])
        assert (cal["nll"], cal["ece"]) == (cal["nll_calibrated"], cal["ece_calibrated"])
        assert cal["temperature"] > 0
        different = {"method", "nll", "ece", "temperature"}
        assert {c: raw[c] for c in COLUMNS if c not in different} == {
            c: cal[c] for c in COLUMNS if c not in different
        }


def test_temperature_is_the_one_fitted_on_the_server_split(
    two_client_rows, template, clients, splits
):
    """T minimises the server-split NLL, so there it can only improve on T = 1."""
    row = next(r for r in two_client_rows if r["method"] == "average_t")
    merged, info = merge_clients("average", template, clients[:2], [200, 200], splits)
    assert info["merge_seconds"] >= 0 and info["bn_reset"] is False
    model = load_state(template, merged)
    server = predict_logits(model, splits.server[0])
    at_t = metrics_from_logits(server, splits.server[1], row["temperature"])["nll"]
    at_one = metrics_from_logits(server, splits.server[1], 1.0)["nll"]
    assert at_t <= at_one + 1e-9
    assert row["temperature"] == pytest.approx(fit_temperature(server, splits.server[1]), rel=1e-9)
    test = metrics_from_logits(
        predict_logits(model, splits.test[0]), splits.test[1], row["temperature"]
    )
    assert row["accuracy"] == test["accuracy"]
    assert row["nll"] == pytest.approx(test["nll"], abs=1e-9)


def test_weight_matching_recovers_a_permuted_copy_exactly(template, clients, splits):
    state = clients[0]
    spec = permutation_spec(template)
    permuted = apply_permutation(spec, random_permutations(spec, state, seed=3), state)
    assert not torch.equal(permuted["hidden.0.linear.weight"], state["hidden.0.linear.weight"])
    rows = evaluate_methods(
        template,
        [state, permuted],
        None,
        splits,
        ["average", "weight_matching", "merge_many"],
        lambdas=5,
        device="cpu",
    )
    rows = {r["method"]: r for r in rows}
    endpoint = evaluate(load_state(template, state), splits.test)
    for method in ("weight_matching", "merge_many"):
        row = rows[method]
        assert row["endpoint_acc_min"] == row["endpoint_acc_max"] == endpoint["accuracy"]
        assert row["accuracy"] == endpoint["accuracy"]
        assert row["nll"] == pytest.approx(endpoint["nll"], abs=1e-5)
        assert abs(row["loss_barrier"]) < 1e-5 and abs(row["accuracy_barrier"]) < 1e-12
        assert row["lewc_cos_mean"] == pytest.approx(1.0, abs=1e-6)
        assert row["recip_orth_mean"] == pytest.approx(1.0, abs=1e-6)
        assert row["relu_additivity_mean"] == pytest.approx(0.0, abs=1e-6)
    assert rows["average"]["accuracy"] < endpoint["accuracy"] - 0.05
    assert rows["average"]["loss_barrier"] > 0


def test_ensemble_of_identical_clients_equals_the_endpoint(template, clients, splits):
    state = clients[1]
    rows = evaluate_methods(
        template, [state, state], [3, 1], splits, ["ensemble", "average"], lambdas=5, device="cpu"
    )
    endpoint = evaluate(load_state(template, state), splits.test)
    for row in rows:
        assert row["accuracy"] == endpoint["accuracy"]
        assert row["nll_raw"] == pytest.approx(endpoint["nll"], abs=1e-6)
        assert row["ensemble_acc"] == endpoint["accuracy"]
    assert abs(rows[1]["loss_barrier"]) < 1e-6


def test_three_clients_get_merge_gap_barriers(template, clients, splits):
    methods = ["average", "weight_matching_t", "merge_many", "activation_matching", "ensemble"]
    rows = evaluate_methods(template, clients, [1, 2, 3], splits, methods, lambdas=5, device="cpu")
    for row in rows:
        assert row["num_clients"] == 3 and tuple(row) == COLUMNS
        if row["method"] == "ensemble":
            continue
        assert row["barrier_kind"] == "merge_gap" and row["curve"] == ""
        assert all(finite(row[c]) for c in MERGED_FLOATS + BARRIERS + DIAGNOSTICS), row
        assert row["accuracy_barrier"] == pytest.approx(row["acc_gap"])
        assert len(json.loads(row["lewc_cos_layers"])) == len(template.layer_names)


def test_fast_mode_skips_diagnostics_and_is_deterministic(template, clients, splits):
    def run():
        return evaluate_methods(
            template,
            clients[:2],
            None,
            splits,
            ["weight_matching"],
            diagnostics=False,
            device="cpu",
        )

    first, second = run(), run()
    row = first[0]
    assert row["barrier_kind"] == "merge_gap" and row["curve"] == ""
    assert all(math.isnan(row[c]) for c in DIAGNOSTICS) and row["lewc_cos_layers"] == ""
    assert all(finite(row[c]) for c in BARRIERS)
    drop = {"merge_seconds"}
    assert {k: v for k, v in row.items() if k not in drop} == {
        k: v for k, v in second[0].items() if k not in drop
    }


def test_merge_clients_matches_the_weighted_average(template, clients, splits):
    merged, _ = merge_clients("average_t", template, clients[:2], [1, 3], splits)
    expected = average(clients[:2], [1, 3])
    assert all(torch.equal(merged[k], expected[k]) for k in expected)


def test_batchnorm_statistics_are_reset_on_the_server_split(splits):
    """After merging, BN running mean = mean of the merged pre-BN activations on the server data."""
    states = []
    for seed in (5, 6):
        torch.manual_seed(seed)
        model = build_model("mlp", width=0.25, norm="bn", depth=1)
        states.append(model.state_dict())
    merged, info = merge_clients("weight_matching", model, states, None, splits)
    assert info["bn_reset"] is True
    x = splits.server[0].flatten(1).double()
    pre = x @ merged["hidden.0.linear.weight"].double().T + merged["hidden.0.linear.bias"].double()
    assert torch.allclose(merged["hidden.0.norm.running_mean"].double(), pre.mean(0), atol=1e-4)
    assert torch.allclose(merged["hidden.0.norm.running_var"].double(), pre.var(0), rtol=1e-3)


def test_single_model_row(template, clients, splits):
    model = load_state(template, clients[2])
    raw = evaluate_model_row("fedavg", model, splits, device="cpu")
    cal = evaluate_model_row("fedavg_t", model, splits, device="cpu")
    expected = evaluate(model, splits.test)
    assert tuple(raw) == COLUMNS and raw["num_clients"] == 1
    assert raw["accuracy"] == cal["accuracy"] == expected["accuracy"]
    assert raw["nll"] == pytest.approx(expected["nll"]) and raw["temperature"] == 1.0
    assert cal["nll"] == cal["nll_calibrated"] and cal["temperature"] != 1.0
    assert all(math.isnan(raw[c]) for c in BARRIERS + DIAGNOSTICS + COMMON)


def test_unknown_methods_raise(template, clients, splits):
    with pytest.raises(ValueError, match="allowed: average, average_t"):
        evaluate_methods(template, clients[:2], None, splits, ["average", "avg"])
    with pytest.raises(ValueError, match="allowed: average"):
        merge_clients("ensemble", template, clients[:2], None, splits)


def test_a_single_surviving_client_is_its_own_merge(template, clients, splits):
    rows = evaluate_methods(template, clients[:1], None, splits, METHODS, device="cpu")
    endpoint = evaluate(load_state(template, clients[0]), splits.test)
    for row in rows:
        assert row["num_clients"] == 1 and row["accuracy"] == endpoint["accuracy"]
        assert row["nll_raw"] == pytest.approx(endpoint["nll"], abs=1e-9)
        assert all(math.isnan(row[c]) for c in DIAGNOSTICS) and row["curve"] == ""
