"""Tests of fedlmc.study: every merge method evaluated on the same client models.

Real MNIST digits (mnist5k, subsampled), tiny MLPs (width 0.25 = 32 hidden units), 5 epochs.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

from fedlmc.averaging import average, load_state
from fedlmc.data.loading import load_dataset
from fedlmc.evaluation import evaluate, metrics_from_logits, predict_logits
from fedlmc.merging.calibrate import fit_temperature
from fedlmc.merging.method_registry import REFERENCE_METHODS, merge_method, study_methods
from fedlmc.merging.random_direction import global_norm
from fedlmc.models.classifiers import apply_permutation, build_model, permutation_spec
from fedlmc.permutation import random_permutations
from fedlmc.study.compare import compare_methods, merge_clients
from fedlmc.study.method_policy import evaluation_of
from fedlmc.study.model_rows import merge_rows
from fedlmc.study.rows import row_columns, string_columns
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
    "merge_gap_accuracy",
    "merge_gap_loss",
    "merge_gap_loss_calibrated",
    "merge_seconds",
)
BARRIERS = (
    "accuracy_barrier_half",
    "loss_barrier_half",
    "loss_barrier_half_calibrated",
    "accuracy_barrier_max",
    "loss_barrier_max",
    "loss_barrier_max_calibrated",
)
DIAGNOSTICS = (
    "lewc_cos_mean",
    "lewc_error_mean",
    "llfc_scaled_error_mean",
    "llfc_cos_mean",
    "logit_norm_ratio_logit_ensemble",
    "logit_norm_ratio_client_norms",
    "recip_orth_mean",
    "relu_additivity_mean",
)
QUARTER = ("lewc_error_mean_quarter", "llfc_scaled_error_mean_quarter")
CLIENT_BARRIERS = tuple(
    f"client_to_merge_path_loss_barrier_{at}{cal}_{over}"
    for at in ("half", "max")
    for cal in ("", "_calibrated")
    for over in ("mean", "worst")
)
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
    """Every study method that takes two clients (all but ``krum`` and ``multi_krum``, which
    need 2f + 3: :func:`fedlmc.study.context.default_methods`); the template's weights stand in
    for the shared start the task-vector methods need as their base."""
    from fedlmc.study.context import default_methods

    methods = default_methods(2)
    assert set(study_methods()) - set(methods) == {"krum", "krum_t", "multi_krum", "multi_krum_t"}
    return compare_methods(
        template,
        clients[:2],
        [200, 200],
        splits,
        methods,
        lambdas=5,
        device="cpu",
        base=template.state_dict(),
    ).rows


def finite(value) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


PROBABILITY_ENSEMBLES = {
    "ensemble": "ensemble_acc",
    "ensemble_equal": "ensemble_equal_acc",
    "ensemble_calibrated": "ensemble_calibrated_acc",
}


def test_every_method_gives_one_complete_row(two_client_rows, template):
    from fedlmc.study.context import default_methods

    assert [r["method"] for r in two_client_rows] == default_methods(2)
    assert set(PROBABILITY_ENSEMBLES) <= {r["method"] for r in two_client_rows}
    for row in two_client_rows:
        assert tuple(row) == row_columns()
        assert row["num_clients"] == 2
        assert all(isinstance(row[c], str) for c in string_columns())
        assert all(finite(row[c]) for c in COMMON + ("accuracy", "nll", "ece"))
        assert row["merge_gap_accuracy"] == pytest.approx(
            row["endpoint_acc_mean"] - row["accuracy"]
        )
        assert row["merge_gap_loss"] == pytest.approx(row["nll_raw"] - row["endpoint_nll_mean"])
        assert (
            json.loads(row["stable_rank_layers"])
            and len(json.loads(row["stable_rank_layers"])) == len(template.layer_names) - 1
        )
        if row["method"] in PROBABILITY_ENSEMBLES:  # each with its accuracy on every row
            assert all(math.isnan(row[c]) for c in BARRIERS + DIAGNOSTICS + QUARTER)
            assert row["curve"] == "" and row["lewc_cos_layers"] == ""
            assert row["accuracy"] == row[PROBABILITY_ENSEMBLES[row["method"]]]
            assert row["merged_parameters_ratio"] == 2.0
            if row["method"] == "ensemble":
                assert row["nll"] == row["ensemble_nll"]
                assert row["agreement_prob_ensemble"] == 1.0
            continue
        if row["method"] == "logit_ensemble":
            assert row["accuracy"] == row["logit_ensemble_acc"] and row["temperature"] == 1.0
            assert row["agreement_logit_ensemble"] == 1.0
            assert row["nll_calibrated"] <= row["nll_raw"] + 1e-9
            continue
        if not merge_method(row["method"]).rule.template_shaped:  # preserve_first: another model
            assert all(math.isnan(row[c]) for c in BARRIERS + QUARTER + DIAGNOSTICS[:6])
            assert all(finite(row[c]) for c in MERGED_FLOATS + DIAGNOSTICS[6:]), row
            assert row["lewc_undefined_reason"] and row["merged_parameters_ratio"] > 1
            continue
        if not evaluation_of(row["method"]).on_path:  # random_direction: on no path between them
            assert all(math.isnan(row[c]) for c in BARRIERS + QUARTER) and row["curve"] == ""
            assert all(finite(row[c]) for c in MERGED_FLOATS + DIAGNOSTICS), row
            continue
        assert all(finite(row[c]) for c in MERGED_FLOATS + BARRIERS + DIAGNOSTICS + QUARTER), row
        curve = json.loads(row["curve"])
        assert set(curve) == {"lam", "accuracy", "nll", "nll_calibrated"}
        assert curve["lam"] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
        for column in ("lewc_cos_layers", "lewc_error_layers", "llfc_scaled_error_layers"):
            assert len(json.loads(row[column])) == len(template.layer_names)
        layers = json.loads(row["lewc_cos_layers"])
        assert row["lewc_cos_mean"] == pytest.approx(sum(layers) / len(layers))
        assert len(json.loads(row["recip_orth_layers"])) == len(template.layer_names)
        assert row["accuracy_barrier_max"] >= 0 and row["loss_barrier_max"] >= 0
        for kind in ("accuracy", "loss"):  # lam = 1/2 is on the grid: the max is at least it
            assert row[f"{kind}_barrier_max"] >= row[f"{kind}_barrier_half"] - 1e-12


def test_calibrated_row_shares_the_merge_and_changes_only_nll_and_ece(two_client_rows):
    rows = {r["method"]: r for r in two_client_rows}
    for base in (
        "average",
        "weight_matching",
        "activation_matching",
        "merge_many",
        "random_direction",
    ):
        raw, cal = rows[base], rows[f"{base}_t"]
        assert raw["temperature"] == 1.0
        assert (raw["nll"], raw["ece"]) == (raw["nll_raw"], raw["ece_raw"])
        assert (cal["nll"], cal["ece"]) == (cal["nll_calibrated"], cal["ece_calibrated"])
        assert cal["temperature"] > 0
        different = {"method", "nll", "ece", "temperature"}
        assert {c: raw[c] for c in row_columns() if c not in different} == {
            c: cal[c] for c in row_columns() if c not in different
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
    rows = compare_methods(
        template,
        [state, permuted],
        None,
        splits,
        ["average", "weight_matching", "merge_many"],
        lambdas=5,
        device="cpu",
    ).rows
    rows = {r["method"]: r for r in rows}
    endpoint = evaluate(load_state(template, state), splits.test)
    for method in ("weight_matching", "merge_many"):
        row = rows[method]
        assert row["endpoint_acc_min"] == row["endpoint_acc_max"] == endpoint["accuracy"]
        assert row["accuracy"] == endpoint["accuracy"]
        assert row["nll"] == pytest.approx(endpoint["nll"], abs=1e-5)
        assert abs(row["loss_barrier_half"]) < 1e-5 and abs(row["loss_barrier_max"]) < 1e-5
        assert abs(row["accuracy_barrier_half"]) < 1e-12
        assert row["lewc_cos_mean"] == pytest.approx(1.0, abs=1e-6)
        # one model merged with itself: LLFC is exact, LEWC predicts (1/2)^l + (1/2)^l
        assert row["llfc_scaled_error_mean"] == pytest.approx(0.0, abs=1e-5)
        assert json.loads(row["norm_ratio_layers"]) == pytest.approx([1.0] * 4, abs=1e-5)
        assert json.loads(row["lewc_error_layers"]) == pytest.approx(
            [abs(1 - 2 * 0.5**depth) for depth in range(1, 5)], abs=1e-5
        )
        assert row["recip_orth_mean"] == pytest.approx(1.0, abs=1e-6)
        assert row["relu_additivity_mean"] == pytest.approx(0.0, abs=1e-6)
    assert rows["average"]["accuracy"] < endpoint["accuracy"] - 0.05
    assert rows["average"]["loss_barrier_half"] > 0


def test_ensemble_of_identical_clients_equals_the_endpoint(template, clients, splits):
    state = clients[1]
    rows = compare_methods(
        template, [state, state], [3, 1], splits, ["ensemble", "average"], lambdas=5, device="cpu"
    ).rows
    endpoint = evaluate(load_state(template, state), splits.test)
    for row in rows:
        assert row["accuracy"] == endpoint["accuracy"]
        assert row["nll_raw"] == pytest.approx(endpoint["nll"], abs=1e-6)
        assert row["ensemble_acc"] == endpoint["accuracy"]
    assert abs(rows[1]["loss_barrier_half"]) < 1e-6


def test_a_column_of_some_merge_methods_has_a_value_exactly_where_the_registry_says(
    two_client_rows,
):
    """The method scope a column declares (``Column.methods``) is what the study does: with two
    clients and diagnostics, each merge row has a value in such a column exactly when the
    registry puts its method in the scope (:data:`fedlmc.study.rows.METHOD_SCOPE_RULES`, the
    text ``fedlmc run`` and the docs derive from it); median has no barrier, average has one."""
    from fedlmc.study.rows import METHOD_SCOPE_RULES, column_table

    scoped = [
        c
        for c in column_table()
        if c.methods and "three" not in c.applies and not c.name.startswith("lewc_")
    ]  # the columns of two-client cells (LEWC's own: where it is defined, another condition)
    names = {c.name for c in scoped}
    assert {"loss_barrier_half", "curve", "temperature_path", "llfc_cos_mean"} <= names
    seen = set()
    for row in two_client_rows:
        if row["method"] in REFERENCE_METHODS:
            continue
        entry = merge_method(row["method"])
        for column in scoped:
            value = row[column.name]
            filled = value != "" if column.is_string else not math.isnan(value)
            assert filled == METHOD_SCOPE_RULES[column.methods][1](entry), (row["method"], column)
        seen.add((row["method"], finite(row["loss_barrier_half"])))
    assert {("median", False), ("median_t", False), ("average", True)} <= seen


def test_half_barrier_is_the_signed_excess_of_the_midpoint_over_the_chord(two_client_rows):
    for row in two_client_rows:
        if row["method"] in REFERENCE_METHODS or not evaluation_of(row["method"]).on_path:
            continue  # references and merges on no path (random_direction, RESCALE) have none
        curve = json.loads(row["curve"])
        half = curve["lam"].index(0.5)
        for kind, column, sign in (
            ("loss_barrier_half", "nll", 1),
            ("loss_barrier_half_calibrated", "nll_calibrated", 1),
            ("accuracy_barrier_half", "accuracy", -1),
        ):
            values = curve[column]
            chord = (values[0] + values[-1]) / 2
            assert row[kind] == pytest.approx(sign * (values[half] - chord), abs=1e-12)
            assert row[kind.replace("half", "max")] == pytest.approx(
                max(
                    sign * (v - (lam * values[-1] + (1 - lam) * values[0]))
                    for lam, v in zip(curve["lam"], values, strict=True)
                ),
                abs=1e-12,
            )


def test_random_direction_row_steps_as_far_as_the_average_on_trained_models(
    two_client_rows, template, clients, splits
):
    rows = {r["method"]: r for r in two_client_rows}
    keys = [k for k, _ in template.named_parameters()]
    half_step = 0.5 * global_norm([clients[1][k] - clients[0][k] for k in keys])
    plain = average(clients[:2], [200, 200])
    step = global_norm([plain[k].double() - clients[0][k].double() for k in keys])
    # the step to the float32 average is the half difference up to float32 rounding
    assert step == pytest.approx(half_step, rel=1e-6)
    for method in ("random_direction", "random_direction_t"):
        assert rows[method]["random_direction_step_norm"] == pytest.approx(step, rel=1e-9)
        assert math.isnan(rows["average"]["random_direction_step_norm"])
    moved, _ = merge_clients("random_direction", template, clients[:2], [200, 200], splits)
    assert global_norm([moved[k] - clients[0][k] for k in keys]) == pytest.approx(
        half_step,
        rel=1e-5,  # float32 weights
    )


def test_repair_rows_change_the_merge_of_a_network_without_batchnorm(two_client_rows):
    rows = {r["method"]: r for r in two_client_rows}
    for base in ("average", "weight_matching"):
        plain, repaired = rows[base], rows[f"{base}_repair"]
        assert plain["endpoint_acc_mean"] == repaired["endpoint_acc_mean"]
        assert plain["nll_raw"] != repaired["nll_raw"]
        # the barrier is measured on the repaired path, not the plain one
        assert finite(repaired["loss_barrier_half"])
        assert repaired["loss_barrier_half"] != plain["loss_barrier_half"]
        curve = json.loads(repaired["curve"])
        assert curve["nll"][0] == json.loads(plain["curve"])["nll"][0]  # same endpoints


def test_three_clients_get_merge_gap_barriers(template, clients, splits):
    methods = ["average", "weight_matching_t", "merge_many", "activation_matching", "ensemble"]
    rows = compare_methods(
        template, clients, [1, 2, 3], splits, methods, lambdas=5, device="cpu"
    ).rows
    for row in rows:
        assert row["num_clients"] == 3 and tuple(row) == row_columns()
        if row["method"] == "ensemble":
            continue
        assert row["curve"] == "" and all(math.isnan(row[c]) for c in BARRIERS + QUARTER)
        assert all(finite(row[c]) for c in MERGED_FLOATS + DIAGNOSTICS + CLIENT_BARRIERS), row
        for kind in ("half", "max", "half_calibrated", "max_calibrated"):
            assert (
                row[f"client_to_merge_path_loss_barrier_{kind}_worst"]
                >= row[f"client_to_merge_path_loss_barrier_{kind}_mean"] - 1e-12
            )
        matrix = json.loads(row["pairwise_loss_barrier_half"])
        assert len(matrix) == 3 and all(len(r) == 3 for r in matrix)
        assert all(
            matrix[i][i] == 0 and matrix[i][j] == matrix[j][i] for i in range(3) for j in range(3)
        )
        assert row["merge_gap_accuracy"] == pytest.approx(
            row["endpoint_acc_mean"] - row["accuracy"]
        )
        assert len(json.loads(row["lewc_cos_layers"])) == len(template.layer_names)


def test_repair_is_applied_on_every_n_client_path(template, clients, splits):
    """With three clients the REPAIR method's client-to-merge paths and pairwise paths are
    repaired like its two-client curve: same clients, same basis as the plain average, other
    numbers on every path."""
    rows = compare_methods(
        template, clients, None, splits, ["average", "average_repair"], lambdas=3, device="cpu"
    ).rows
    plain, repaired = rows
    for name in ("pairwise_loss_barrier_half", "pairwise_loss_barrier_half_calibrated"):
        a, b = json.loads(plain[name]), json.loads(repaired[name])
        assert all(a[i][j] != b[i][j] for i in range(3) for j in range(3) if i != j)
    for column in (c for c in CLIENT_BARRIERS if "_half" in c):  # the max can be 0 for both
        assert plain[column] != repaired[column]
    # the LEWC columns measure the combined weights before REPAIR: the same as the average's
    assert repaired["lewc_measured_on"] == "combined weights, before REPAIR"
    assert repaired["lewc_error_layers"] == plain["lewc_error_layers"]


def test_n_client_barriers_vanish_when_alignment_undoes_a_permutation(template, clients, splits):
    """Three copies of one model, one permuted: aligned, every path is flat; plain, the
    permuted copy is far from the others."""
    state = clients[0]
    spec = permutation_spec(template)
    permuted = apply_permutation(spec, random_permutations(spec, state, seed=5), state)
    rows = compare_methods(
        template, [state, permuted, state], None, splits, ["average", "weight_matching"], lambdas=5
    ).rows
    plain, matched = rows
    aligned = json.loads(matched["pairwise_loss_barrier_half"])
    assert max(abs(v) for r in aligned for v in r) < 1e-5
    assert abs(matched["client_to_merge_path_loss_barrier_max_worst"]) < 1e-5
    unaligned = json.loads(plain["pairwise_loss_barrier_half"])
    assert unaligned[0][1] > 0.1 and unaligned[1][2] > 0.1 and abs(unaligned[0][2]) < 1e-6
    worst, mean = (plain[f"client_to_merge_path_loss_barrier_max_{k}"] for k in ("worst", "mean"))
    assert worst > mean > 0


def test_fast_mode_skips_diagnostics_and_is_deterministic(template, clients, splits):
    def run():
        return compare_methods(
            template,
            clients[:2],
            None,
            splits,
            ["weight_matching"],
            diagnostics=False,
            device="cpu",
        ).rows

    first, second = run(), run()
    row = first[0]
    assert row["curve"] == "" and all(math.isnan(row[c]) for c in BARRIERS)
    assert all(math.isnan(row[c]) for c in DIAGNOSTICS) and row["lewc_cos_layers"] == ""
    assert all(finite(row[c]) for c in ("merge_gap_accuracy", "merge_gap_loss"))
    drop = {"merge_seconds"}
    assert {k: v for k, v in row.items() if k not in drop} == {
        k: v for k, v in second[0].items() if k not in drop
    }


def test_merge_clients_matches_the_weighted_average(template, clients, splits):
    merged, _ = merge_clients("average", template, clients[:2], [1, 3], splits)
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
    raw, cal = merge_rows("fedavg", model, splits, device="cpu", calibrated=True)
    expected = evaluate(model, splits.test)
    assert tuple(raw) == row_columns() and raw["num_clients"] == 1
    assert raw["accuracy"] == cal["accuracy"] == expected["accuracy"]
    assert raw["nll"] == pytest.approx(expected["nll"]) and raw["temperature"] == 1.0
    assert cal["nll"] == cal["nll_calibrated"] and cal["temperature"] != 1.0
    assert all(math.isnan(raw[c]) for c in BARRIERS + DIAGNOSTICS + COMMON)


def test_unknown_methods_raise(template, clients, splits):
    with pytest.raises(ValueError, match="allowed: average, average_t"):
        compare_methods(template, clients[:2], None, splits, ["average", "avg"])
    with pytest.raises(ValueError, match="allowed: average"):
        merge_clients("ensemble", template, clients[:2], None, splits)


def test_a_single_surviving_client_is_its_own_merge(template, clients, splits):
    rows = compare_methods(
        template, clients[:1], None, splits, list(study_methods()), device="cpu", base=clients[0]
    ).rows
    endpoint = evaluate(load_state(template, clients[0]), splits.test)
    for row in rows:
        assert row["num_clients"] == 1 and row["accuracy"] == endpoint["accuracy"]
        assert row["nll_raw"] == pytest.approx(endpoint["nll"], abs=1e-9)
        assert all(math.isnan(row[c]) for c in DIAGNOSTICS) and row["curve"] == ""


def test_auto_keeps_the_plain_average_within_tolerance_and_aligns_beyond(template, clients, splits):
    state = clients[0]
    spec = permutation_spec(template)
    permuted = apply_permutation(spec, random_permutations(spec, state, seed=9), state)

    def auto_row(states, tolerance):
        rows = compare_methods(
            template,
            states,
            None,
            splits,
            ["auto", "average", "weight_matching"],
            diagnostics=False,
            method_options={"auto_tolerance": tolerance},
        ).rows
        return {r["method"]: r for r in rows}

    lenient = auto_row([state, permuted], 1e6)  # any gap is within: no alignment runs
    assert lenient["auto"]["auto_choice"] == "average" and lenient["average"]["auto_choice"] == ""
    assert lenient["auto"]["accuracy"] == lenient["average"]["accuracy"]
    strict = auto_row([state, permuted], 0.0)  # the scrambled copy: alignment wins, exactly
    assert strict["auto"]["auto_choice"] == "weight_matching"
    assert strict["auto"]["auto_nll_gap"] == lenient["auto"]["auto_nll_gap"] > 0.1
    assert strict["auto"]["accuracy"] == strict["weight_matching"]["accuracy"]
    assert math.isnan(strict["weight_matching"]["auto_nll_gap"])


def test_default_methods_on_a_batchnorm_model_leave_out_the_plain_chain_ones(splits):
    """``methods=None`` on a BatchNorm MLP runs every default method the model supports: the
    ``plain_chain_only`` ones (LEWC biases, CCA Merge, Preserve-First) are left out, not refused,
    and so are the task-vector ones without a base."""
    from fedlmc.study.compare import compare_methods
    from fedlmc.study.context import default_methods

    states = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = build_model(
            "mlp", width=0.25, norm="bn", num_classes=splits.num_classes, in_shape=splits.in_shape
        )
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    rows = compare_methods(
        load_state(model, states[0]), states, None, splits, diagnostics=False, lambdas=2
    ).rows
    chain_only = {
        m
        for m in default_methods(2)
        if m not in REFERENCE_METHODS and merge_method(m).needs.plain_chain_only
    }
    assert {"average_lewc_bias", "cca_merge", "preserve_first"} <= chain_only
    needs_base = {
        m for m in default_methods(2) if m not in REFERENCE_METHODS and merge_method(m).needs.base
    }
    assert {"task_arithmetic", "ties_t", "dare"} <= needs_base
    left_out = chain_only | needs_base
    assert [r["method"] for r in rows] == [m for m in default_methods(2) if m not in left_out]
    assert all(finite(r["accuracy"]) for r in rows)
