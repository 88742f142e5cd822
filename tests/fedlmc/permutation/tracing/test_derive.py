"""Permutation specs and LEWC layer names derived from a model's torch.fx graph."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
import torchvision
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
from fedlmc.permutation import tracing as spec_tracing
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


def test_flatten_of_a_feature_map_ends_the_group_of_the_last_conv():
    torch.manual_seed(0)
    model, x = randomize_norms(SmallCNN(pool=False)), torch.randn(2, 3, 8, 8)
    with pytest.warns(SpecDerivationWarning, match="features.4.*reshapes .*7, 4, 4"):
        spec = derive_spec(model, x)
    assert set(spec.perm_to_axes) == {"features.0", "head.1"}
    assert spec.axes_to_perm["features.4.weight"] == (None, "features.0", None, None)
    assert "features.4.bias" not in spec.axes_to_perm
    assert spec.axes_to_perm["head.1.weight"] == ("head.1", None)
    assert_symmetry(model, spec, x)


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


class TwoBranch(nn.Module):
    """Two conv branches concatenated along the channels, then a 1x1 conv and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.stem_act = nn.Conv2d(3, 6, 3, padding=1), nn.ReLU()
        self.a, self.a_act = nn.Conv2d(6, 4, 1), nn.ReLU()
        self.b, self.b_act = nn.Conv2d(6, 5, 3, padding=1), nn.ReLU()
        self.mix, self.mix_act = nn.Conv2d(9, 8, 1), nn.ReLU()
        self.pool, self.head = nn.AdaptiveAvgPool2d(1), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        s = self.stem_act(self.stem(x))
        y = torch.cat([self.a_act(self.a(s)), self.b_act(self.b(s))], dim=1)
        return self.head(torch.flatten(self.pool(self.mix_act(self.mix(y))), 1))


def test_concatenated_groups_are_dropped_with_a_warning():
    torch.manual_seed(0)
    model, x = TwoBranch().eval(), torch.randn(2, 3, 6, 6)
    with pytest.warns(SpecDerivationWarning, match="concatenates along axis 1") as record:
        spec = derive_spec(model, x)
    dropped = " ".join(str(w.message) for w in record)
    assert "units of a" in dropped and "units of b" in dropped
    assert set(spec.perm_to_axes) == {"stem", "mix"}
    assert set(spec.perm_to_axes["stem"]) == {
        ("stem.weight", 0),
        ("stem.bias", 0),
        ("a.weight", 1),
        ("b.weight", 1),
    }
    assert spec.axes_to_perm["mix.weight"] == ("mix", None, None, None)
    assert_symmetry(model, spec, x)


@pytest.fixture
def one_thread():
    """One torch thread: on a shared 2-core machine this is much faster than two contending."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_torchvision_resnet18_spec_is_a_symmetry_and_weight_matching_recovers_it():
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


# ----------------------------------------------------------------------------- what is refused


class Gate(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x if x.sum() > 0 else -x


def test_untraceable_model_names_the_module():
    model = nn.Sequential(nn.Linear(4, 4), Gate(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"cannot trace module '1' \(Gate\).*permutation_spec"):
        derive_spec(model, torch.randn(2, 4))


def test_bad_example_input_names_the_node():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match="node '_0'.*failed"):
        derive_spec(model, torch.randn(2, 5))
    with pytest.raises(ValueError, match="example_input must be a tensor"):
        derive_spec(model, [])


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.inp_act = nn.Linear(6, 8), nn.ReLU()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.out, self.out_act = nn.Linear(8, 8), nn.ReLU()
        self.head = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.inp_act(self.inp(x))
        a = self.attn(h, h, h)[0]
        return self.head(self.out_act(self.out(a))).mean(dim=1)


def test_attention_ends_the_groups_it_reads():
    torch.manual_seed(0)
    model, x = Attention().eval(), torch.randn(2, 5, 6)
    with pytest.warns(SpecDerivationWarning, match="units of inp.*'attn' .MultiheadAttention"):
        spec = derive_spec(model, x)
    assert spec.perm_to_axes == {"out": [("out.weight", 0), ("out.bias", 0), ("head.weight", 1)]}
    assert not any(key.startswith("attn.") for key in spec.axes_to_perm)
    assert spec.activation_modules == {}  # the units are on the last axis of (N, T, D)


class Grouped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.grouped = nn.Conv2d(8, 8, 3, padding=1, groups=2)
        self.pw = nn.Conv2d(8, 6, 1)
        self.dw = nn.Conv2d(6, 6, 3, padding=1, groups=6)
        self.bn, self.act = nn.BatchNorm2d(6), nn.ReLU()
        self.head = nn.Linear(6, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = self.pw(F.relu(self.grouped(F.relu(self.c1(x)))))
        return self.head(self.act(self.bn(self.dw(h))).mean((2, 3)))


def test_grouped_conv_ends_groups_and_depthwise_conv_carries_them():
    torch.manual_seed(0)
    model, x = randomize_norms(Grouped()), torch.randn(2, 3, 6, 6)
    with pytest.warns(SpecDerivationWarning, match="grouped convolution .groups=2") as record:
        spec = derive_spec(model, x)
    assert {str(w.message).split(" are ")[0] for w in record} == {
        "derive_spec: the units of c1",
        "derive_spec: the units of grouped",
    }
    assert list(spec.perm_to_axes) == ["pw"]
    assert set(spec.perm_to_axes["pw"]) == {
        ("pw.weight", 0),
        ("pw.bias", 0),
        ("dw.weight", 0),
        ("dw.bias", 0),
        ("bn.weight", 0),
        ("bn.bias", 0),
        ("bn.running_mean", 0),
        ("bn.running_var", 0),
        ("head.weight", 1),
    }
    assert spec.activation_modules == {"pw": "act"}
    assert_symmetry(model, spec, x)


class Cumulative(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.b(torch.cumsum(self.a(x), dim=-1))


def test_unknown_function_ends_its_group_and_a_wrong_rule_is_caught(monkeypatch):
    model, x = Cumulative(), torch.randn(3, 4)
    with pytest.warns(SpecDerivationWarning, match="units of a .*cumsum.* not supported"):
        assert derive_spec(model, x).perm_to_axes == {}
    # Pretend cumsum were pointwise: the check on the example input refuses the wrong spec.
    monkeypatch.setitem(spec_tracing.FUNCTION_KINDS, torch.cumsum, "activation")
    with pytest.raises(ValueError, match="wrong spec.*group 'a'"):
        derive_spec(model, x)


# ----------------------------------------------------------------------------- more structure


class SharedLayer(nn.Module):
    """One Linear applied twice: its input and output axes fall into one group."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.mid, self.out = nn.Linear(5, 7), nn.Linear(7, 7), nn.Linear(7, 2)
        self.r1, self.r2, self.r3 = nn.ReLU(), nn.ReLU(), nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.r3(self.mid(self.r2(self.mid(self.r1(self.inp(x)))))))


def test_a_module_called_twice_ties_its_input_and_output_units():
    torch.manual_seed(0)
    model, x = SharedLayer(), torch.randn(3, 5)
    spec = derive_quietly(model, x)
    assert list(spec.perm_to_axes) == ["inp"]
    assert spec.axes_to_perm["mid.weight"] == ("inp", "inp")
    assert_symmetry(model, spec, x)
    assert derive_layer_names(model, x) == ["r1", "r2", "r3", "out"]


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(3, 5), nn.Linear(4, 5), nn.Linear(5, 2)

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        return self.head(F.relu(self.a(x) + self.b(y)))


def test_tuple_example_input_and_functional_activation():
    torch.manual_seed(0)
    model, args = TwoInputs(), (torch.randn(3, 3), torch.randn(3, 4))
    spec = derive_quietly(model, args)
    assert set(partition(spec)) == {
        frozenset(
            {("a.weight", 0), ("a.bias", 0), ("b.weight", 0), ("b.bias", 0), ("head.weight", 1)}
        )
    }
    # The sum's units sit on dim 1 of a's and b's outputs; F.relu is no module.
    assert spec.activation_modules == {"a": "b"}
    with pytest.warns(SpecDerivationWarning, match="node 'relu' is not the output of a module"):
        assert derive_layer_names(model, args) == ["head"]


class ClassToken(nn.Module):
    """A learned token expanded over the batch and concatenated along the token axis."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.act, self.head = nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)
        self.token = nn.Parameter(torch.randn(1, 1, 6))

    def forward(self, x: Tensor) -> Tensor:
        h = self.embed(x)
        h = torch.cat([self.token.expand(h.shape[0], -1, -1), h], dim=1)
        return self.head(self.act(h)[:, 0])


def test_concatenation_along_tokens_joins_the_feature_axes():
    torch.manual_seed(0)
    model, x = ClassToken(), torch.randn(2, 5, 4)
    spec = derive_quietly(model, x)
    assert spec.perm_to_axes == {
        "embed": [("embed.weight", 0), ("embed.bias", 0), ("token", 2), ("head.weight", 1)]
    }
    assert spec.activation_modules == {}  # features are on the last axis of (N, T, D)
    assert derive_layer_names(model, x) == ["act", "head"]  # h[:, 0] is skipped like a pool


def test_reshape_runs_match_axes_of_equal_product():
    runs = spec_tracing._reshape_runs
    assert runs((2, 8, 1, 1), (2, 8)) == [([0], [0]), ([1], [1])]
    assert runs((2, 8, 3, 3), (2, 72)) == [([0], [0]), ([1, 2, 3], [1])]
    assert runs((1, 8, 1, 1), (8,)) == [([1], [0])]
    assert runs((2, 6), (2, 4)) is None
