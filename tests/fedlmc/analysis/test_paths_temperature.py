"""The fitted temperature along a two-model path against LEWC's prediction of it
(``temperature_path``, ``temperature_path_lewc``), on constructed bias-free ReLU chains whose
logits along the path are known multiples of one model's logits."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from torch import nn

from fedlmc.analysis.paths import interpolation_curve, lewc_temperature_path
from fedlmc.merging.calibrate import fit_temperature

HIDDEN, INPUTS, CLASSES, DEPTH = 6, 8, 5, 3
LAMS = [0.0, 0.25, 0.5, 0.75, 1.0]


def chain() -> nn.Module:
    """A bias-free ReLU chain of ``DEPTH`` Linear layers with ``2 * HIDDEN`` hidden units."""
    return nn.Sequential(
        nn.Linear(INPUTS, 2 * HIDDEN, bias=False),
        nn.ReLU(),
        nn.Linear(2 * HIDDEN, 2 * HIDDEN, bias=False),
        nn.ReLU(),
        nn.Linear(2 * HIDDEN, CLASSES, bias=False),
    )


def own_half(weights: list[torch.Tensor], half: int, head_scale: float = 1.0) -> dict:
    """``weights`` (``HIDDEN``-unit layers) placed in hidden units ``half`` of the chain; every
    entry reading or writing the other half is 0, and the last layer is scaled by
    ``head_scale``: two such models with different halves merge exactly as LEWC says."""
    own = slice(half * HIDDEN, (half + 1) * HIDDEN)
    w1 = torch.zeros(2 * HIDDEN, INPUTS)
    w2 = torch.zeros(2 * HIDDEN, 2 * HIDDEN)
    w3 = torch.zeros(CLASSES, 2 * HIDDEN)
    w1[own] = weights[0]
    w2[own, own] = weights[1]
    w3[:, own] = head_scale * weights[2]
    return {"0.weight": w1, "2.weight": w2, "4.weight": w3}


@pytest.fixture(scope="module")
def setup():
    generator = torch.Generator().manual_seed(0)
    weights = [
        torch.randn(HIDDEN, INPUTS, generator=generator),
        torch.randn(HIDDEN, HIDDEN, generator=generator) / HIDDEN**0.5,
        torch.randn(CLASSES, HIDDEN, generator=generator) / HIDDEN**0.5,
    ]
    x = torch.randn(400, INPUTS, generator=generator)
    model = chain()
    model.load_state_dict(own_half(weights, 0))
    with torch.no_grad():
        y = model(x).argmax(dim=1)
    flip = torch.rand(len(y), generator=generator) < 0.3  # an interior fitted T
    y = torch.where(flip, torch.randint(0, CLASSES, y.shape, generator=generator), y)
    return weights, (x[:200], y[:200]), (x[200:], y[200:])


def temperature_of(state: dict, calibration) -> float:
    model = chain()
    model.load_state_dict(state)
    with torch.no_grad():
        return fit_temperature(model(calibration[0]), calibration[1])


def test_lewc_exact_path_fits_the_predicted_temperature(setup):
    """Model b is model a moved to the other hidden units with its logits times c: the path's
    logits are exactly (l^3 + c (1 - l)^3) z_a, so T(l) is that multiple of T_a, LEWC's
    prediction, and the endpoints are each model's own T."""
    weights, calibration, test = setup
    scale = 2.0
    sd_a, sd_b = own_half(weights, 0), own_half(weights, 1, head_scale=scale)
    curve = interpolation_curve(chain(), sd_a, sd_b, test, lambdas=LAMS, calibration=calibration)
    measured = curve["temperature"].to_numpy()
    t_a, t_b = temperature_of(sd_a, calibration), temperature_of(sd_b, calibration)
    assert 0.05 < t_a < 20.0  # interior: the clamps at 1e-3 and 1e3 are not what is tested
    assert measured[-1] == pytest.approx(t_a, rel=1e-9)
    assert measured[0] == pytest.approx(t_b, rel=1e-9)
    assert t_b == pytest.approx(scale * t_a, rel=1e-6)
    expected = [(lam**DEPTH + scale * (1 - lam) ** DEPTH) * t_a for lam in LAMS]
    assert list(measured) == pytest.approx(expected, rel=1e-6)
    assert lewc_temperature_path(curve, DEPTH) == pytest.approx(expected, rel=1e-6)
    assert measured[2] == pytest.approx((1 + scale) / 8 * t_a, rel=1e-6)  # shrinks 4x at 1/2


def test_a_path_off_lewc_scales_t_by_its_own_factor_and_disagrees(setup):
    """Model b is model a with every layer times k (same hidden units): the path's logits are
    (l + (1 - l) k)^3 z_a, so the fitted T scales by that factor, not by LEWC's; at k = 1 the
    path is constant and LEWC's prediction (1/4 of T at 1/2) is off by 4x."""
    weights, calibration, test = setup
    for k in (1.0, 1.5):
        sd_a = own_half(weights, 0)
        sd_b = {key: k * value for key, value in sd_a.items()}
        curve = interpolation_curve(
            chain(), sd_a, sd_b, test, lambdas=LAMS, calibration=calibration
        )
        t_a = temperature_of(sd_a, calibration)
        expected = [(lam + (1 - lam) * k) ** DEPTH * t_a for lam in LAMS]
        assert list(curve["temperature"]) == pytest.approx(expected, rel=1e-6)
        predicted = lewc_temperature_path(curve, DEPTH)
        assert predicted[0] == curve["temperature"].iloc[0]  # the endpoints are the fits
        assert predicted[-1] == curve["temperature"].iloc[-1]
        assert predicted[2] < 0.5 * expected[2]  # LEWC predicts a shrinkage this path lacks


def test_lewc_temperature_path_formula_and_bad_input():
    curve = pd.DataFrame({"lam": [1.0, 0.5, 0.0], "temperature": [2.0, 9.0, 4.0]})
    assert lewc_temperature_path(curve, 2) == pytest.approx([2.0, 0.25 * 2 + 0.25 * 4, 4.0])
    assert lewc_temperature_path(curve, 1) == pytest.approx([2.0, 3.0, 4.0])  # the chord
    with pytest.raises(ValueError, match="depth 0; allowed: an integer >= 1"):
        lewc_temperature_path(curve, 0)
    with pytest.raises(ValueError, match="no row at lam=0.0"):
        lewc_temperature_path(curve.iloc[:2], 2)
