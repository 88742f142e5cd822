r"""fedlmc.permutation.chain: the plain chain read from any spec (none for a residual network),
why LEWC's depths are undefined, and the depth-weighted biases :math:`\sum_i w_i^l b_l^{(i)}`."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedlmc.models.classifiers import build_model
from fedlmc.permutation import permutation_spec
from fedlmc.permutation.chain import (
    chain_layers,
    depth_weighted_bias_average,
    lewc_bias_targets,
    norm_free_chain,
    outside_chain_key,
    residual_reason,
)


def test_chains_are_read_from_any_spec_and_norms_are_refused():
    vgg = build_model("vgg11", width=0.125, norm="none")
    assert len(chain_layers(vgg.permutation_spec(), vgg.state_dict())) == len(vgg.layer_names)
    plain = nn.Sequential(
        nn.Flatten(), nn.Linear(784, 8), nn.ReLU(), nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 10)
    )
    spec = permutation_spec(plain, torch.rand(2, 1, 28, 28))
    assert chain_layers(spec, plain.state_dict()) == ["1", "3", "5"]
    bn = build_model("mlp", width=0.125, norm="bn")
    with pytest.raises(ValueError, match="norm-free"):
        norm_free_chain(bn.permutation_spec(), bn.state_dict())


def plain_chain(seed: int) -> tuple[nn.Module, dict]:
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Flatten(), nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2)
    )
    return net, net.state_dict()


def test_a_residual_network_has_no_chain_and_its_reason_says_so():
    resnet = build_model("resnet20", width=0.25, in_shape=(3, 8, 8), norm="none")
    spec, state = resnet.permutation_spec(), resnet.state_dict()
    assert chain_layers(spec, state) is None
    assert "not one plain chain (residual)" in residual_reason(spec, state, resnet.layer_names)
    net, state = plain_chain(0)
    spec = permutation_spec(net, torch.rand(2, 4))
    assert residual_reason(spec, state, ["2", "4", "5"]) == ""
    assert residual_reason(spec, state, ["2", "5"]) == (
        "the chain has 3 Linear/Conv layers but 2 layer outputs are measured"
    )


def test_the_bias_at_depth_l_is_the_weights_to_the_power_l():
    net_a, a = plain_chain(0)
    _, b = plain_chain(1)
    layers = norm_free_chain(permutation_spec(net_a, torch.rand(2, 4)), a)
    assert outside_chain_key(layers, a) is None
    targets = lewc_bias_targets(layers, [a, b], [3.0, 1.0])  # normalised: 0.75, 0.25
    for depth, layer in enumerate(layers, start=1):
        key = f"{layer}.bias"
        expected = 0.75**depth * a[key] + 0.25**depth * b[key]
        assert torch.allclose(targets[key], expected, atol=1e-7)
    merged = depth_weighted_bias_average(layers, [a, b], [3.0, 1.0])
    assert torch.allclose(merged["1.weight"], 0.75 * a["1.weight"] + 0.25 * b["1.weight"])
    assert torch.allclose(merged["1.bias"], targets["1.bias"])
    single = depth_weighted_bias_average(layers, [a], [1.0])
    assert all(torch.equal(single[k], a[k]) for k in a)


def test_a_norm_layers_key_lies_outside_the_chain():
    state = {
        "1.weight": torch.zeros(2, 2),
        "1.bias": torch.zeros(2),
        "2.running_mean": torch.zeros(2),
    }
    assert outside_chain_key(["1"], state) == "2.running_mean"
