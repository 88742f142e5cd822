"""RESCALE (fedlmc.merging.baselines.rescale and the ``average_rescale`` /
``weight_matching_rescale`` methods of fedlmc.merging.baselines.baselines): a constructed shrunken
merge is restored exactly with the shrink factors reported, the rescaled units hit the endpoints'
std with their mean scaled (not shifted as REPAIR does, whose weights it shares), and BatchNorm
models are left to their re-estimated statistics."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fedlmc.averaging import average, load_state
from fedlmc.merging.baselines.rescale import rescale
from fedlmc.merging.methods import merge_states
from fedlmc.merging.repair import repair, repair_targets, unit_statistics
from fedlmc.models.classifiers import build_model

SMALL = (1, 6, 6)
LAYERS = ["hidden.0.linear", "hidden.1.linear", "hidden.2.linear"]


def _mlp(seed: int, **options) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", in_shape=SMALL, depth=3, base_hidden=8, **options).eval()


def _inputs(n: int = 400) -> torch.Tensor:
    return torch.randn(n, *SMALL, generator=torch.Generator().manual_seed(0))


def test_a_shrunken_copy_is_restored_exactly_and_the_shrink_is_reported():
    a, x = _mlp(0), _inputs()
    shrink = [0.5, 0.25, 0.8]
    state = dict(a.state_dict())
    for layer, c in zip(LAYERS, shrink, strict=True):  # z_l -> c_l z_l, layer by layer
        state[f"{layer}.weight"] = state[f"{layer}.weight"] * c
        state[f"{layer}.bias"] = state[f"{layer}.bias"] * c
    shrunken = load_state(a, state)
    with torch.no_grad():
        assert float((shrunken(x) - a(x)).abs().max()) > 0.01
        restored, factors = rescale(shrunken, [a], None, x)
        torch.testing.assert_close(restored(x), a(x), atol=1e-5, rtol=1e-5)
    assert factors == pytest.approx([1 / c for c in shrink], rel=1e-5)


def test_rescaled_units_have_the_endpoints_std_and_a_scaled_not_shifted_mean():
    a, b, x = _mlp(0), _mlp(1), _inputs()
    merged = load_state(a, average([a.state_dict(), b.state_dict()], [0.3, 0.7]))
    targets = repair_targets([unit_statistics(m, x) for m in (a, b)], [0.3, 0.7])
    before = unit_statistics(merged, x)
    rescaled, _ = rescale(merged, [a, b], [0.3, 0.7], x)
    after = unit_statistics(rescaled, x)
    for name in LAYERS:
        torch.testing.assert_close(after[name].std, targets[name].std, atol=1e-6, rtol=1e-5)
    # the first layer sees unchanged inputs: its mean is scaled by the same factor as its std
    scale = after[LAYERS[0]].std / before[LAYERS[0]].std
    torch.testing.assert_close(after[LAYERS[0]].mean, scale * before[LAYERS[0]].mean)
    assert float((after[LAYERS[0]].mean - targets[LAYERS[0]].mean).abs().max()) > 1e-3


def test_rescale_is_repair_without_the_mean_shift():
    # the first layer sees the same inputs under both: the same factor on its weights, and only
    # REPAIR moves its biases to the target mean
    a, b, x = _mlp(0), _mlp(1), _inputs()
    merged = load_state(a, average([a.state_dict(), b.state_dict()]))
    rescaled, _ = rescale(merged, [a, b], None, x)
    repaired = repair(merged, [a, b], None, x)
    first = LAYERS[0]
    torch.testing.assert_close(
        rescaled.state_dict()[f"{first}.weight"], repaired.state_dict()[f"{first}.weight"]
    )
    shift = repaired.state_dict()[f"{first}.bias"] - rescaled.state_dict()[f"{first}.bias"]
    assert float(shift.abs().max()) > 1e-3


def test_the_registered_methods_rescale_the_average_and_report_their_factors():
    a, b, x = _mlp(0), _mlp(1), _inputs()
    states = [a.state_dict(), b.state_dict()]
    y = torch.zeros(len(x), dtype=torch.long)
    merged, aligned, info = merge_states(
        "average_rescale", a, states, server_data=(x, y), with_info=True
    )
    expected, factors = rescale(load_state(a, average(states)), [a, b], None, x)
    for key, value in expected.state_dict().items():
        torch.testing.assert_close(merged[key], value)
    assert json.loads(info["rescale_factor_layers"]) == pytest.approx(factors, abs=1e-6)
    assert info["rescale_factor_mean"] == pytest.approx(sum(factors) / 3)
    assert info["rescale_factor_mean"] > 1.0  # averaging independent models shrinks features
    _, _, matched = merge_states(
        "weight_matching_rescale", a, states, server_data=(x, y), with_info=True
    )
    assert matched["aligned_groups"] == 3 and 0 < matched["rescale_factor_mean"]


def test_rescale_needs_server_data_and_leaves_batchnorm_models_to_their_statistics():
    a, b = _mlp(0), _mlp(1)
    with pytest.raises(ValueError, match="'average_rescale' needs server data"):
        merge_states("average_rescale", a, [a.state_dict(), b.state_dict()])
    bn_a, bn_b, x = _mlp(0, norm="bn"), _mlp(1, norm="bn"), _inputs(64)
    with pytest.raises(ValueError, match="BatchNorm"):
        rescale(bn_a, [bn_a, bn_b], None, x)
    states = [bn_a.state_dict(), bn_b.state_dict()]
    merged, _, info = merge_states(
        "average_rescale", bn_a, states, server_data=(x, torch.zeros(64).long()), with_info=True
    )
    assert math.isnan(info["rescale_factor_mean"]) and info["rescale_factor_layers"] == ""
    for key, value in average(states).items():
        torch.testing.assert_close(merged[key], value)
