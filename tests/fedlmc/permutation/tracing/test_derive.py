"""Permutation specs and LEWC layer names derived from a model's torch.fx graph."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlmc.models.classifiers import build_model
from fedlmc.permutation import (
    PermutationSpec,
    apply_permutation,
    derive_layer_names,
    derive_spec,
    invert_permutation,
    random_permutations,
)
from fedlmc.permutation.matching import weight_matching
from fedlmc.permutation.tracing import SpecDerivationWarning

BUILT_IN = {
    "mlp": {"width": 0.25, "base_hidden": 16, "in_shape": (1, 6, 6)},
    "vgg11": {"width": 0.125, "in_shape": (3, 8, 8)},
    "resnet20": {"width": 0.25, "in_shape": (3, 8, 8)},
}


@torch.no_grad()
def randomize_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random affine parameters and running statistics, as in a trained model."""
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d | nn.LayerNorm | nn.GroupNorm):
            for name in ("weight", "bias", "running_mean", "running_var"):
                tensor = getattr(module, name, None)
                if tensor is not None:
                    tensor.copy_(torch.rand(tensor.shape, generator=gen) + 0.5)
    return model.eval()


def partition(spec: PermutationSpec) -> dict[frozenset, str]:
    """The groups as sets of (key, axis), mapped to their names."""
    return {frozenset(axes): group for group, axes in spec.perm_to_axes.items()}


def outputs_after_random_permutation(model: nn.Module, spec: PermutationSpec, x: Tensor, seed=1):
    """(original outputs, outputs of the model with every group randomly permuted)."""
    state = model.state_dict()
    permuted = apply_permutation(spec, random_permutations(spec, state, seed), state)
    with torch.no_grad():
        reference = model(x)
        result = torch.func.functional_call(model, permuted, (x,))
    return reference, result


def assert_symmetry(model: nn.Module, spec: PermutationSpec, x: Tensor) -> None:
    reference, result = outputs_after_random_permutation(model.eval(), spec, x)
    assert torch.allclose(reference, result, rtol=1e-4, atol=1e-5)


def derive_quietly(model: nn.Module, x) -> PermutationSpec:
    """``derive_spec`` that must not drop any hidden group."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpecDerivationWarning)
        return derive_spec(model, x)


# ----------------------------------------------------------------------------- built-in models


@pytest.mark.parametrize("name", sorted(BUILT_IN))
@pytest.mark.parametrize("norm", ["none", "ln", "bn"])
def test_derived_spec_equals_hand_written(name, norm):
    torch.manual_seed(0)
    model = randomize_norms(build_model(name, norm=norm, **BUILT_IN[name]))
    x = torch.randn(2, *model.config["in_shape"])
    derived, written = derive_spec(model, x), model.permutation_spec()
    by_axes_derived, by_axes_written = partition(derived), partition(written)
    assert set(by_axes_derived) == set(by_axes_written)
    for axes, group in by_axes_derived.items():
        expected = written.activation_modules[by_axes_written[axes]]
        assert derived.activation_modules[group] == expected
    assert derive_layer_names(model, x) == model.layer_names


# ----------------------------------------------------------------------------- other models


class SmallCNN(nn.Module):
    """conv-BN-ReLU-maxpool-conv-BN-ReLU, then GAP or a flatten of the whole map, then an MLP."""

    def __init__(self, pool: bool = True) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 6, 3, padding=1),
            nn.BatchNorm2d(6),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 7, 3, padding=1),
            nn.BatchNorm2d(7),
            nn.ReLU(),
        )
        self.pool = nn.AdaptiveAvgPool2d(1) if pool else nn.Identity()
        fan_in = 7 if pool else 7 * 4 * 4
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(fan_in, 9), nn.ReLU(), nn.Dropout(0.2), nn.Linear(9, 4)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.pool(self.features(x)))


def test_small_cnn_with_global_pooling_permutes_every_hidden_layer():
    torch.manual_seed(0)
    model, x = randomize_norms(SmallCNN(pool=True)), torch.randn(2, 3, 8, 8)
    spec = derive_quietly(model, x)
    bn = ["weight", "bias", "running_mean", "running_var"]
    assert spec.perm_to_axes == {
        "features.0": [("features.0.weight", 0), ("features.0.bias", 0)]
        + [(f"features.1.{n}", 0) for n in bn]
        + [("features.4.weight", 1)],
        "features.4": [("features.4.weight", 0), ("features.4.bias", 0)]
        + [(f"features.5.{n}", 0) for n in bn]
        + [("head.1.weight", 1)],
        "head.1": [("head.1.weight", 0), ("head.1.bias", 0), ("head.4.weight", 1)],
    }
    assert spec.activation_modules == {
        "features.0": "features.2",
        "features.4": "features.6",
        "head.1": "head.2",  # the ReLU, not the dropout after it
    }
    assert_symmetry(model, spec, x)
    assert derive_layer_names(model, x) == ["features.2", "features.6", "head.2", "head.4"]


class Dense(nn.Module):
    """A layer the project did not write: its own parameters through ``F.linear``."""

    def __init__(self, fan_in: int, units: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(units, fan_in) / math.sqrt(fan_in))
        self.bias = nn.Parameter(torch.randn(units))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.ff = nn.Sequential(Dense(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, h: Tensor) -> Tensor:
        return h + self.ff(h)


class ResidualMLP(nn.Module):
    def __init__(self, dim: int = 6, hidden: int = 10, blocks: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(12, dim)
        self.blocks = nn.Sequential(*(Block(dim, hidden) for _ in range(blocks)))
        self.norm = nn.LayerNorm(dim)
        self.act = nn.ReLU()
        self.head = nn.Linear(dim, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.act(self.norm(self.blocks(self.inp(x)))))


def test_residual_mlp_ties_the_stream_and_keeps_inner_groups():
    torch.manual_seed(0)
    model, x = randomize_norms(ResidualMLP()), torch.randn(4, 12)
    spec = derive_quietly(model, x)
    stream = {("inp.weight", 0), ("inp.bias", 0), ("norm.weight", 0), ("norm.bias", 0)}
    stream |= {("head.weight", 1)}
    for b in range(2):
        stream |= {(f"blocks.{b}.ff.0.weight", 1), (f"blocks.{b}.ff.2.weight", 0)}
        stream |= {(f"blocks.{b}.ff.2.bias", 0)}
    inner = [
        {
            (f"blocks.{b}.ff.0.weight", 0),
            (f"blocks.{b}.ff.0.bias", 0),
            (f"blocks.{b}.ff.2.weight", 1),
        }
        for b in range(2)
    ]
    assert set(partition(spec)) == {frozenset(stream), *map(frozenset, inner)}
    assert spec.activation_modules == {
        "inp": "act",  # the stream's last activation function
        "blocks.0.ff.0": "blocks.0.ff.1",
        "blocks.1.ff.0": "blocks.1.ff.1",
    }
    assert_symmetry(model, spec, x)
    assert derive_layer_names(model, x) == ["inp", "blocks.0", "act", "head"]


@pytest.fixture
def one_thread():
    """One torch thread: on a shared 2-core machine this is much faster than two contending."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_torchvision_resnet18_spec_is_a_symmetry_and_weight_matching_recovers_it():
    import torchvision  # here, not at collection (1.4 s of each pytest worker)

    torch.manual_seed(0)
    model = randomize_norms(torchvision.models.resnet18(num_classes=10))
    x = torch.randn(2, 3, 32, 32)
    spec = derive_quietly(model, x)
    assert len(spec.perm_to_axes) == 4 + 8  # one stream per stage, one inner group per block
    stream1 = set(spec.perm_to_axes["conv1"])
    assert {("conv1.weight", 0), ("layer1.1.bn2.running_var", 0)} <= stream1
    assert {("layer2.0.conv1.weight", 1), ("layer2.0.downsample.0.weight", 1)} <= stream1
    assert ("fc.weight", 1) in spec.perm_to_axes["layer4.0.conv2"]
    assert spec.activation_modules["conv1"] == "layer1.1"  # relu is reused: the block output
    assert_symmetry(model, spec, x)

    sd_a = model.state_dict()
    perms = random_permutations(spec, sd_a, seed=3)
    sd_b = apply_permutation(spec, perms, sd_a)
    matching = weight_matching(spec, sd_a, sd_b)
    for group, perm in perms.items():
        assert torch.equal(matching[group], invert_permutation(perm))
    aligned = apply_permutation(spec, matching, sd_b)
    assert all(torch.equal(aligned[key], sd_a[key]) for key in sd_a)

    names = derive_layer_names(model, x)
    blocks = [f"layer{s}.{b}" for s in range(1, 5) for b in range(2)]
    assert names == ["relu", *blocks, "fc"]
