"""LEWC's data-free temperature (fedlmc/merging/lewc_temperature.py): the formula, its exactness
on a chain built so that LEWC holds exactly, where it is refused, and the prediction as a
statistics source of the post-merge pipeline."""

from __future__ import annotations

import math

import pytest
import torch

from fedlmc.averaging import average, load_state
from fedlmc.merging.lewc_temperature import (
    LewcPrediction,
    chain_depth,
    lewc_refusal,
    lewc_temperature,
)
from fedlmc.merging.post_merge import calibrate
from fedlmc.models.classifiers import build_model

IN_SHAPE = (1, 4, 4)


def test_the_temperature_is_the_weights_to_the_power_of_the_depth():
    assert lewc_temperature(3, [1, 1]) == 0.25  # 2^(1-3)
    assert lewc_temperature(4, [5, 5, 5, 5]) == pytest.approx(4.0**-3)
    assert lewc_temperature(4, [3, 1]) == pytest.approx(0.75**4 + 0.25**4)
    assert lewc_temperature(1, [2, 7, 1]) == pytest.approx(1.0)  # one layer: linear, no shrinkage
    for weights in ([1, 2, 3], [10, 1], [1, 1, 1, 5]):
        w = [x / sum(weights) for x in weights]
        t = lewc_temperature(3, weights)
        assert len(w) ** -2 < t <= max(w) ** 2  # N^(1-L) only at equal weights
    assert lewc_temperature(3, [1, 1], shared_start=True) == 1.0


@pytest.mark.parametrize("layers", [0, -1, 2.0, True])
def test_a_bad_depth_is_refused(layers):
    with pytest.raises(ValueError, match="layers = .*allowed: an integer >= 1"):
        lewc_temperature(layers, [1, 1])


def test_bad_weights_are_refused():
    with pytest.raises(ValueError, match="weights is empty"):
        lewc_temperature(2, [])
    with pytest.raises(ValueError, match="finite, >= 0"):
        lewc_temperature(2, [1, -1])


def block_clients(weights, units: int = 3, depth: int = 2, seed: int = 0):
    """Clients that compute one function each from their own block of hidden units (zero
    elsewhere): reciprocally orthogonal exactly, so the plain average's logits are exactly
    ``sum_i w_i^L z``."""
    n = len(weights)
    base = build_model("mlp", 1.0, in_shape=IN_SHAPE, depth=depth, base_hidden=units, bias=False)
    torch.manual_seed(seed)
    for p in base.parameters():
        torch.nn.init.normal_(p)
    template = build_model(
        "mlp", 1.0, in_shape=IN_SHAPE, depth=depth, base_hidden=n * units, bias=False
    )
    states = []
    for i in range(n):
        rows = slice(i * units, (i + 1) * units)
        state = {k: torch.zeros_like(v) for k, v in template.state_dict().items()}
        for key, value in base.state_dict().items():
            if key.startswith("hidden.0."):
                state[key][rows] = value
            elif key.startswith("hidden."):
                state[key][rows, rows] = value
            else:
                state[key][:, rows] = value
        states.append(state)
    return template, base, states


def test_merged_logits_over_t_are_the_mean_client_logits_exactly_on_a_block_chain():
    weights = [3.0, 1.0, 2.0]
    template, base, states = block_clients(weights)
    x = torch.randn(32, *IN_SHAPE, generator=torch.Generator().manual_seed(1))
    clients = [load_state(template, sd).eval()(x) for sd in states]
    w = [v / sum(weights) for v in weights]
    mean_logits = sum(wi * z for wi, z in zip(w, clients, strict=True))
    assert torch.allclose(mean_logits, base.eval()(x), atol=1e-5)  # every client computes it
    merged = load_state(template, average(states, weights)).eval()
    t = LewcPrediction.of(template, weights).value
    assert chain_depth(template) == 3 and t == pytest.approx(sum(v**3 for v in w))
    assert torch.allclose(merged(x) / t, mean_logits, atol=1e-5)
    assert not torch.allclose(merged(x), mean_logits, atol=1e-2)  # the raw merge is shrunk


def test_the_prediction_is_a_statistics_source_without_data():
    template = build_model("mlp", 1.0, in_shape=IN_SHAPE, depth=2, base_hidden=4, bias=False)
    source = LewcPrediction(3, (1.0, 1.0))
    assert calibrate(template, source).temperature == 0.25 and source.name == "lewc"
    with pytest.raises(ValueError, match="holds no data"):
        source.bn_statistics(template)
    with pytest.raises(ValueError, match="holds no data"):
        source.unit_statistics(template, ["hidden.0.linear"])


def test_it_is_refused_where_lewc_is_undefined_and_allowed_on_plain_chains():
    bias_free = build_model("mlp", 1.0, in_shape=IN_SHAPE, depth=2, base_hidden=4, bias=False)
    biased = build_model("mlp", 1.0, in_shape=IN_SHAPE, depth=2, base_hidden=4, bias=True)
    assert lewc_refusal(bias_free, "average") == ""
    assert lewc_refusal(biased, "average_lewc_bias") == ""
    assert "biases (hidden.0.linear.bias) averaged plainly" in lewc_refusal(biased, "average")
    assert "plain average only" in lewc_refusal(bias_free, "weight_matching")
    vgg = build_model("vgg11", 0.125, in_shape=(3, 32, 32), bias=False)
    assert "norm-free plain chain: state key 'features.block1.norm" in lewc_refusal(vgg, "average")
    resnet = build_model("resnet20", 0.25, in_shape=(3, 32, 32))
    assert "not one chain (residual?)" in lewc_refusal(resnet, "average")
    plain_vgg = build_model("vgg11", 0.125, in_shape=(3, 32, 32), norm="none", bias=False)
    assert lewc_refusal(plain_vgg, "average") == "" and chain_depth(plain_vgg) == 9
    assert all("\n" not in r for r in (lewc_refusal(resnet, "average"), lewc_refusal(vgg, "x")))
    assert math.isclose(LewcPrediction.of(plain_vgg, [1, 1]).value, 2.0**-8)


def test_a_model_whose_depth_cannot_be_read_is_refused_in_one_line():
    class Bare(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 3, bias=False)

        def forward(self, x):
            return self.layer(x)

    reason = lewc_refusal(Bare(), "average")
    assert reason.startswith("calibration = 'lewc' needs the model's depth: model 'Bare'")
    assert "\n" not in reason
