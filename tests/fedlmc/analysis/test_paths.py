"""Interpolation curves, barriers and merge gaps."""

import numpy as np
import pandas as pd
import pytest
import torch

from fedlmc.analysis.paths import CURVE_COLUMNS, barriers, interpolation_curve, merge_gap
from fedlmc.averaging import interpolate, load_state
from fedlmc.data.loading import load_dataset
from fedlmc.evaluation import evaluate
from fedlmc.merging.calibrate import reset_bn_stats
from fedlmc.models.classifiers import build_model
from fedlmc.train import train_model


@pytest.fixture(scope="module")
def digits():
    splits = load_dataset("mnist5k")
    x, y = splits.train
    return (
        (x[:400], y[:400]),
        (x[400:800], y[400:800]),
        (splits.test[0][:300], splits.test[1][:300]),
    )


@pytest.fixture(scope="module")
def two_mlps(digits):
    train, _, _ = digits
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = build_model("mlp", width=0.25)
        train_model(
            model,
            train,
            epochs=8,
            lr=0.1,
            weight_decay=5e-4,
            batch_size=32,
            seed=seed,
            device="cpu",
        )
        models.append(model)
    return models


def test_curve_between_independent_mlps_has_a_positive_loss_barrier(two_mlps, digits):
    _, calibration, test = digits
    a, b = two_mlps
    curve = interpolation_curve(
        a, a.state_dict(), b.state_dict(), test, lambdas=5, calibration=calibration, device="cpu"
    )
    assert list(curve.columns) == list(CURVE_COLUMNS)
    assert np.allclose(curve["lam"], [0, 0.25, 0.5, 0.75, 1])
    result = barriers(curve)
    assert curve["accuracy"].iloc[0] > 0.7 and curve["accuracy"].iloc[-1] > 0.7
    assert result["loss_barrier"] > 0.3
    assert result["accuracy_barrier"] > 0.1
    assert 0 < result["loss_barrier_lam"] < 1
    assert result["loss_barrier_at_half"] <= result["loss_barrier"]
    assert (curve["temperature"] > 0).all() and (curve["temperature"] != 1.0).all()
    # endpoints reproduce evaluate() on each model (lam = 1 is model a)
    for lam, model in ((1.0, a), (0.0, b)):
        row = curve.loc[curve["lam"] == lam].iloc[0]
        direct = evaluate(load_state(model, model.state_dict()), test)
        assert row["accuracy"] == direct["accuracy"]
        assert row["nll"] == pytest.approx(direct["nll"], rel=1e-12)
        assert row["ece"] == pytest.approx(direct["ece"], rel=1e-12)


def test_curve_from_a_model_to_itself_has_zero_barrier(two_mlps, digits):
    _, calibration, test = digits
    a = two_mlps[0]
    curve = interpolation_curve(
        a, a.state_dict(), a.state_dict(), test, lambdas=[0, 0.3, 0.5, 1], calibration=calibration
    )
    result = barriers(curve)
    for key in (
        "loss_barrier",
        "loss_barrier_calibrated",
        "accuracy_barrier",
        "loss_barrier_at_half",
        "loss_barrier_calibrated_at_half",
    ):
        assert abs(result[key]) < 1e-9, key


def test_curve_without_calibration_has_unit_temperature(two_mlps, digits):
    _, _, test = digits
    a, b = two_mlps
    curve = interpolation_curve(a, a.state_dict(), b.state_dict(), test, lambdas=3)
    assert (curve["temperature"] == 1.0).all()
    assert curve["nll_calibrated"].equals(curve["nll"])
    assert curve["ece_calibrated"].equals(curve["ece"])


def test_bn_curve_resets_statistics_at_each_lambda(digits):
    train, _, test = digits
    torch.manual_seed(0)
    a = build_model("resnet20", width=0.125, in_shape=(1, 28, 28))
    b = build_model("resnet20", width=0.125, in_shape=(1, 28, 28))
    b.train()
    with torch.no_grad():
        b(train[0][:64])  # b's running stats now differ from the default (0, 1)
    plain = interpolation_curve(a, a.state_dict(), b.state_dict(), test, lambdas=[0.0, 0.5])
    reset = interpolation_curve(
        a,
        a.state_dict(),
        b.state_dict(),
        test,
        lambdas=[0.0, 0.5],
        bn_data=train[0][:128],
        device="cpu",
    )
    assert not np.allclose(plain["nll"], reset["nll"])
    by_hand = load_state(a, interpolate(a.state_dict(), b.state_dict(), 0.5))
    reset_bn_stats(by_hand, train[0][:128])
    assert reset["nll"].iloc[1] == pytest.approx(evaluate(by_hand, test)["nll"], rel=1e-12)


def test_barriers_of_a_hand_made_curve():
    lam = np.linspace(0, 1, 5)
    curve = pd.DataFrame(
        {
            "lam": lam[::-1],  # order must not matter
            "accuracy": [0.8, 0.6, 0.5, 0.9, 0.9][::-1],
            "nll": [1.0, 1.5, 3.0, 1.25, 0.5][::-1],
            "nll_calibrated": [0.5, 0.6, 0.7, 0.55, 0.5][::-1],
        }
    )
    result = barriers(curve)
    # line for nll: 0.5 + 0.5 * (1 - lam) -> [1.0, 0.875, 0.75, 0.625, 0.5]
    assert result["loss_barrier"] == pytest.approx(2.25)
    assert result["loss_barrier_lam"] == 0.5
    assert result["loss_barrier_at_half"] == pytest.approx(2.25)
    assert result["loss_barrier_calibrated"] == pytest.approx(0.2)
    # accuracy line: 0.9 - 0.1 * (1 - lam) -> [0.8, 0.825, 0.85, 0.875, 0.9]
    assert result["accuracy_barrier"] == pytest.approx(0.35)
    assert result["accuracy_barrier_lam"] == 0.5
    with pytest.raises(ValueError, match="lam"):
        barriers(curve[curve["lam"] > 0])


def test_barrier_at_half_interpolates_between_grid_points():
    curve = pd.DataFrame(
        {
            "lam": [0.0, 0.4, 0.6, 1.0],
            "accuracy": [1.0] * 4,
            "nll": [1.0, 2.0, 3.0, 1.0],
        }
    )
    result = barriers(curve)
    assert result["loss_barrier_at_half"] == pytest.approx(1.5)
    assert result["loss_barrier"] == pytest.approx(2.0) and result["loss_barrier_lam"] == 0.6
    assert "loss_barrier_calibrated" not in result


def test_merge_gap_for_three_models():
    ends = [
        {"accuracy": 0.9, "nll": 0.3, "nll_calibrated": 0.25},
        {"accuracy": 0.8, "nll": 0.5, "nll_calibrated": 0.45},
        {"accuracy": 0.7, "nll": 0.4, "nll_calibrated": 0.35},
    ]
    merged = {"accuracy": 0.6, "nll": 1.4, "nll_calibrated": 0.55}
    gap = merge_gap(ends, merged)
    assert gap["accuracy_gap"] == pytest.approx(0.2)
    assert gap["loss_gap"] == pytest.approx(1.0)
    assert gap["loss_gap_calibrated"] == pytest.approx(0.2)
    raw_only = merge_gap([{"accuracy": 0.5, "nll": 1.0}], {"accuracy": 0.6, "nll": 0.9})
    assert raw_only["accuracy_gap"] == pytest.approx(-0.1) and "loss_gap_calibrated" not in raw_only
    with pytest.raises(ValueError):
        merge_gap([], merged)
    with pytest.raises(ValueError, match="nll"):
        merge_gap([{"accuracy": 1.0}], merged)


def test_lambda_grid_validation(two_mlps, digits):
    a = two_mlps[0]
    with pytest.raises(ValueError, match="lambdas"):
        interpolation_curve(a, a.state_dict(), a.state_dict(), digits[2], lambdas=1)
