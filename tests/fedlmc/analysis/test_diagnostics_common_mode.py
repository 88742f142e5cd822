"""Diagnostics that cannot flatter: centred cosines, the shuffled-input baseline and the
common-mode share, on constructed features and on a tiny MLP's layer predictions."""

import json
import math

import pandas as pd
import pytest
import torch

from fedlmc.analysis.cosines import (
    centred,
    centred_cosine,
    common_mode_share,
    mean_cosine,
    shuffled_cosine,
)
from fedlmc.analysis.diagnostics import layer_predictions
from fedlmc.averaging import average
from fedlmc.columns import PREDICTION_KEYS
from fedlmc.models.classifiers import build_model
from fedlmc.study.compare import prediction_columns


def _uniform(n: int, d: int, seed: int) -> torch.Tensor:
    return torch.rand(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_a_constant_feature_has_no_centred_direction_and_all_its_energy_in_the_mean():
    constant = torch.tensor([0.5, 2.0, -3.0, 0.25]).repeat(8, 1)  # the same vector for 8 inputs
    varying = _uniform(8, 4, 0)
    assert math.isnan(centred_cosine(constant, varying))
    assert math.isnan(centred_cosine(varying, constant))
    assert common_mode_share(constant) == 1.0
    # a mean that float64 does not hold exactly still centres to exactly 0
    inexact = torch.full((7, 3), 0.1, dtype=torch.float64)
    assert bool((centred(inexact) == 0).all())
    assert math.isnan(centred_cosine(inexact, varying[:7, :3]))
    assert common_mode_share(inexact) == pytest.approx(1.0, abs=1e-12)
    # the raw cosine of the constant feature is still defined: only the centred one is not
    assert not math.isnan(mean_cosine(constant, varying))


def test_zero_mean_features_have_common_mode_share_zero():
    x = _uniform(16, 5, 1)
    assert common_mode_share(torch.cat([x, -x])) == 0.0
    assert math.isnan(common_mode_share(torch.zeros(4, 3)))


def test_common_mode_share_of_uniform_features_is_their_squared_mean_over_second_moment():
    # E[u]^2 / E[u^2] = (1/4) / (1/3) = 3/4 for u ~ U(0, 1)
    assert common_mode_share(_uniform(4096, 64, 2)) == pytest.approx(0.75, abs=0.01)


def test_a_prediction_equal_to_the_features_has_centred_cosine_one_and_a_lower_shuffled_one():
    features = _uniform(64, 32, 3)
    assert centred_cosine(features, features) == pytest.approx(1.0, abs=1e-12)
    baseline = shuffled_cosine(features, features)
    assert baseline < 0.9  # non-negative features: high, but below the matched cosine
    assert baseline == shuffled_cosine(features, features)  # a fixed, seeded permutation


def test_the_shuffled_baseline_never_pairs_an_input_with_itself():
    one_hot = torch.eye(10, dtype=torch.float64)  # each input orthogonal to every other
    assert mean_cosine(one_hot, one_hot) == 1.0
    for seed in range(5):
        assert shuffled_cosine(one_hot, one_hot, seed=seed) == 0.0
    assert math.isnan(shuffled_cosine(one_hot[:1], one_hot[:1]))


def test_independent_non_negative_features_have_a_high_raw_and_a_near_zero_centred_cosine():
    a, b = _uniform(512, 256, 4), _uniform(512, 256, 5)
    raw = mean_cosine(a, b)
    assert raw > 0.7  # E[ab] / E[a^2] = 3/4 for independent U(0, 1) coordinates
    assert abs(centred_cosine(a, b)) < 0.05
    assert shuffled_cosine(a, b) == pytest.approx(raw, abs=0.02)  # no input-specific agreement


def test_a_shared_input_independent_vector_moves_the_raw_cosine_but_not_the_centred_one():
    a, b = _uniform(64, 16, 6) - 0.5, _uniform(64, 16, 7) - 0.5
    offset = 10.0 * torch.ones(16, dtype=torch.float64)
    assert mean_cosine(a + offset, b + offset) > 0.9 > abs(mean_cosine(a, b))
    assert centred_cosine(a + offset, b + offset) == pytest.approx(centred_cosine(a, b), abs=1e-12)


def _pair():
    torch.manual_seed(0)
    a = build_model("mlp", width=0.125, bias=False)
    torch.manual_seed(1)
    b = build_model("mlp", width=0.125, bias=False)
    x = torch.rand(64, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    return a, [a.state_dict(), b.state_dict()], x


def test_layer_predictions_report_the_unflattering_diagnostics_per_layer():
    template, states, x = _pair()
    same = layer_predictions(template, [states[0]] * 2, None, states[0], x)
    assert all(r["lewc_cos_centred"] == pytest.approx(1.0, abs=1e-9) for r in same)
    assert all(r["llfc_cos_shuffled"] < r["llfc_cos"] for r in same)
    merged = layer_predictions(template, states, None, average(states), x)
    for row in merged:
        assert 0.0 <= row["common_mode_share"] <= 1.0
        assert row["lewc_cos_centred"] < row["lewc_cos"]  # ReLU features share a direction
        assert row["llfc_cos_centred"] == pytest.approx(row["lewc_cos_centred"], abs=1e-9)


def test_prediction_columns_store_them_as_json_lists_with_means():
    template, states, x = _pair()
    names = template.layer_names
    cols = prediction_columns(template, states, [0.5, 0.5], average(states), x, names)
    share = json.loads(cols["common_mode_share_layers"])
    assert len(share) == len(names) and "common_mode_share_mean" not in cols
    centred_layers = json.loads(cols["lewc_cos_centred_layers"])
    assert cols["lewc_cos_centred_mean"] == pytest.approx(sum(centred_layers) / len(names))
    residual = prediction_columns(
        template, states, [0.5, 0.5], average(states), x, names, lewc_undefined="residual"
    )
    assert "lewc_cos_centred_layers" not in residual and "lewc_cos_shuffled_mean" not in residual
    assert {"llfc_cos_centred_layers", "common_mode_share_layers"} <= set(residual)
    assert {f"{k}_layers" for k in PREDICTION_KEYS} == {k for k in cols if k.endswith("_layers")}


def test_the_lewc_figure_draws_the_raw_cosine_against_its_baseline_and_the_centred_one(tmp_path):
    from matplotlib.image import imread

    from fedlmc.simulations.report.layer_figures import (
        LEWC_COSINE_PANELS,
        RAW_LEWC_COSINE_PANELS,
        layer_figure,
        lewc_cosine_panels,
    )

    layers = {"lewc_cos_layers": [0.9, 0.8], "lewc_cos_shuffled_layers": [0.85, 0.7]}
    layers["lewc_cos_centred_layers"] = [0.5, float("nan")]  # a constant layer: NaN
    rows = pd.DataFrame(
        [
            {"method": "average", "width": w, **{k: json.dumps(v) for k, v in layers.items()}}
            for w in (0.5, 1.0)
        ]
    )
    assert lewc_cosine_panels(list(rows.columns)) == LEWC_COSINE_PANELS
    old = rows.drop(columns=["lewc_cos_shuffled_layers", "lewc_cos_centred_layers"])
    assert lewc_cosine_panels(list(old.columns)) == RAW_LEWC_COSINE_PANELS
    settings = {"dpi": 60}
    for frame, name in ((rows, "new.png"), (old, "old.png")):
        path = layer_figure(frame, tmp_path / name, settings, lewc_cosine_panels(frame.columns))
        assert path is not None and imread(path).std() > 0
    # two panel rows against one: the figure with the baseline and centred panels is taller
    assert imread(tmp_path / "new.png").shape[0] > imread(tmp_path / "old.png").shape[0]
