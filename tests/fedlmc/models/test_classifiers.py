"""Models and permutation specs: permuted models compute the same function, specs are complete."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor, nn

from fedlmc.models.classifiers import (
    NORMS,
    apply_permutation,
    build_model,
    model_names,
    permutation_spec,
)
from fedlmc.models.registry import model_entry
from fedlmc.permutation import (
    PermutationSpec,
    identity_permutations,
    invert_permutation,
    perm_sizes,
    random_permutations,
    spec_from_groups,
)

SMALL = {
    "mlp": {"width": 0.5, "base_hidden": 16},
    "vgg11": {"width": 0.125},
    "resnet20": {"width": 0.25},
    "vit": {"width": 0.5, "depth": 2, "patch": 4},
}
CONV_SHAPES = [(1, 28, 28), (3, 32, 32)]

MODELS = model_names()
MODEL_NORMS = [(name, norm) for name in MODELS for norm in model_entry(name).norms]
"""Every registered model with every norm it takes."""


def _cases() -> list[tuple[str, str, tuple[int, int, int], dict]]:
    cases = []
    for norm in NORMS:
        for bias in (True, False):
            for depth in (1, 3):
                cases.append(("mlp", norm, (1, 28, 28), {"bias": bias, "depth": depth}))
        for name in ("vgg11", "resnet20"):
            for shape in CONV_SHAPES:
                cases.append((name, norm, shape, {}))
    for norm in model_entry("vit").norms:
        for options in ({"bias": True}, {"bias": False, "grow_heads": False, "depth": 1}):
            for shape in CONV_SHAPES:
                cases.append(("vit", norm, shape, options))
    cases.append(("vgg11", "bn", (3, 32, 32), {"bias": False}))
    cases.append(("resnet20", "ln", (3, 32, 32), {"bias": True}))
    return cases


def small_model(name: str, norm: str, in_shape=(1, 28, 28), seed: int = 0, **options) -> nn.Module:
    """A tiny model whose every parameter and buffer (norm affine, running stats) is random."""
    torch.manual_seed(seed)
    model = build_model(name, norm=norm, in_shape=in_shape, **{**SMALL[name], **options})
    randomize_norms(model, seed)
    return model.eval()


@torch.no_grad()
def randomize_norms(model: nn.Module, seed: int) -> None:
    """He-normal weights, non-trivial norm affine parameters and BatchNorm running statistics.

    He initialisation keeps the signal alive through the depth, so that a wrongly permuted
    tensor changes the logits by much more than rounding.
    """
    gen = torch.Generator().manual_seed(seed + 1000)
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, nonlinearity="relu", generator=gen)
            if module.bias is not None:
                module.bias.copy_(0.5 * torch.randn(module.bias.shape, generator=gen))
        if isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d | nn.GroupNorm | nn.LayerNorm):
            module.weight.copy_(0.5 + torch.rand(module.weight.shape, generator=gen))
            module.bias.copy_(0.3 * torch.randn(module.bias.shape, generator=gen))
        if isinstance(module, nn.BatchNorm1d | nn.BatchNorm2d):
            module.running_mean.copy_(0.3 * torch.randn(module.running_mean.shape, generator=gen))
            module.running_var.copy_(
                0.5 + 1.5 * torch.rand(module.running_var.shape, generator=gen)
            )


@torch.no_grad()
def logits_with(model: nn.Module, state_dict: dict[str, Tensor], x: Tensor, train=False) -> Tensor:
    """Logits of a fresh model built from ``model.config`` with ``state_dict`` loaded."""
    fresh = build_model(**model.config)
    fresh.load_state_dict(state_dict)
    fresh.train(train)
    return fresh(x)


def relative_error(a: Tensor, b: Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def shifted_permutations(spec: PermutationSpec, state_dict) -> dict[str, Tensor]:
    """``roll(arange(n), 1)`` per group, inside each block of a block-structured group: never
    the identity when n >= 2 (blocks of 2 or more)."""
    return {g: shifted(spec, g, n) for g, n in perm_sizes(spec, state_dict).items()}


def shifted(spec: PermutationSpec, group: str, n: int) -> Tensor:
    size = spec.blocks[group].size if group in spec.blocks else n
    return torch.arange(n).reshape(-1, size).roll(1, dims=1).flatten()


def inputs(in_shape, n: int = 6, seed: int = 1) -> Tensor:
    return torch.randn((n, *in_shape), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("name", "norm", "in_shape", "options"), _cases())
def test_random_permutation_preserves_function(name, norm, in_shape, options):
    model = small_model(name, norm, in_shape, **options)
    spec = permutation_spec(model)
    state = model.state_dict()
    original = {k: v.clone() for k, v in state.items()}
    perms = random_permutations(spec, state, seed=3)
    assert any(not torch.equal(p, torch.arange(len(p))) for p in perms.values())
    permuted = apply_permutation(spec, perms, state)
    assert any(not torch.equal(permuted[k], state[k]) for k in spec.axes_to_perm)
    assert all(torch.equal(state[k], original[k]) for k in state)  # input untouched
    assert set(permuted) == set(state)
    x = inputs(in_shape)
    reference = logits_with(model, state, x)
    assert relative_error(logits_with(model, permuted, x), reference) < 1e-5
    if norm == "bn":  # batch statistics in train mode are permuted too
        reference = logits_with(model, state, x, train=True)
        assert relative_error(logits_with(model, permuted, x, train=True), reference) < 1e-5


@pytest.mark.parametrize(("name", "norm"), MODEL_NORMS)
def test_spec_lists_every_hidden_unit_tensor(name, norm):
    bias_options = [{"bias": True}, {"bias": False}]
    for options in bias_options:
        model = small_model(name, norm, **options)
        state = model.state_dict()
        spec = permutation_spec(model)
        unlisted = {k for k, v in state.items() if v.ndim > 0} - set(spec.axes_to_perm)
        assert unlisted == ({"classifier.bias"} if options["bias"] else set())
        for key, groups in spec.axes_to_perm.items():
            assert len(groups) == state[key].ndim
        assert "classifier.weight" in spec.axes_to_perm
        assert spec.axes_to_perm["classifier.weight"][0] is None  # output axis never permuted
        first = next(k for k in state if k.endswith("weight"))
        assert spec.axes_to_perm[first][1] is None  # input axis never permuted
        shifted = apply_permutation(spec, shifted_permutations(spec, state), state)
        for key in spec.axes_to_perm:  # every listed tensor really moves
            assert not torch.equal(shifted[key], state[key]), key


@pytest.mark.parametrize(("name", "norm"), [c for c in MODEL_NORMS if c[1] in ("bn", "ln")])
def test_omitting_any_axis_breaks_equivalence(name, norm):
    in_shape = (1, 28, 28) if name == "mlp" else (3, 16, 16)
    model = small_model(name, norm, in_shape, bias=True)
    state = model.state_dict()
    spec = permutation_spec(model)
    x = inputs(in_shape)
    reference = logits_with(model, state, x)
    fresh = build_model(**model.config).eval()
    for group, axes in spec.perm_to_axes.items():
        perm = {group: shifted(spec, group, perm_sizes(spec, state)[group])}
        with torch.no_grad():
            fresh.load_state_dict(apply_permutation(spec, perm, state))
            assert relative_error(fresh(x), reference) < 1e-5
        for dropped in axes:
            if dropped[0].endswith("attn.k.bias"):
                continue  # q . (k + b) - q . k is the same for every key: softmax ignores it
            partial = {**spec.perm_to_axes, group: [a for a in axes if a != dropped]}
            broken = spec_from_groups(partial, spec.activation_modules, state)
            with torch.no_grad():
                fresh.load_state_dict(apply_permutation(broken, perm, state))
                assert relative_error(fresh(x), reference) > 1e-3, (group, dropped)


def test_stage_streams_share_one_group_in_resnet():
    model = small_model("resnet20", "bn")
    spec = permutation_spec(model)
    assert spec.axes_to_perm["stem.conv.weight"][0] == "stage1"
    assert spec.axes_to_perm["stage1.2.conv2.weight"][0] == "stage1"
    assert spec.axes_to_perm["stage2.0.shortcut.conv.weight"][:2] == ("stage2", "stage1")
    assert spec.axes_to_perm["stage2.2.norm2.running_var"] == ("stage2",)
    assert spec.axes_to_perm["classifier.weight"] == (None, "stage3")
    assert spec.axes_to_perm["stage3.1.conv2.weight"][:2] == ("stage3", "stage3.1.inner")
    assert len(spec.perm_to_axes) == 3 + 9
    assert not any(k.endswith("num_batches_tracked") for k in spec.axes_to_perm)


@pytest.mark.parametrize("name", MODELS)
def test_activation_modules_carry_their_group_on_dim1(name):
    in_shape = (1, 28, 28)
    model = small_model(name, "bn" if "bn" in model_entry(name).norms else "ln", in_shape)
    state = model.state_dict()
    spec = permutation_spec(model)
    sizes = perm_sizes(spec, state)
    modules = dict(model.named_modules())
    outputs: dict[str, Tensor] = {}
    hooks = [
        modules[m].register_forward_hook(lambda _m, _i, out, m=m: outputs.__setitem__(m, out))
        for m in spec.activation_modules.values()
    ]
    model(inputs(in_shape))
    for hook in hooks:
        hook.remove()
    for group, module_name in spec.activation_modules.items():
        dim = spec.activation_dims.get(group, 1)  # -1: the features of (N, T, D) tokens
        assert outputs[module_name].shape[dim] == sizes[group]
    assert set(spec.activation_modules) == set(spec.perm_to_axes)


def test_inverse_round_trip_is_exact():
    model = small_model("resnet20", "bn")
    state = model.state_dict()
    spec = permutation_spec(model)
    perms = random_permutations(spec, state, seed=7)
    inverse = {g: invert_permutation(p) for g, p in perms.items()}
    for perm, inv in zip(perms.values(), inverse.values(), strict=True):
        assert torch.equal(perm[inv], torch.arange(len(perm)))
        assert torch.equal(inv[perm], torch.arange(len(perm)))
    back = apply_permutation(spec, inverse, apply_permutation(spec, perms, state))
    assert all(torch.equal(back[k], state[k]) for k in state)
    same = apply_permutation(spec, identity_permutations(spec, state), state)
    assert all(torch.equal(same[k], state[k]) for k in state)


def test_random_permutations_depend_on_seed_only():
    model = small_model("mlp", "none")
    state = model.state_dict()
    spec = permutation_spec(model)
    a, b = random_permutations(spec, state, 5), random_permutations(spec, state, 5)
    c = random_permutations(spec, state, 6)
    assert all(torch.equal(a[g], b[g]) for g in a)
    assert any(not torch.equal(a[g], c[g]) for g in a)


def test_bad_permutations_raise():
    model = small_model("mlp", "none")
    state = model.state_dict()
    spec = permutation_spec(model)
    perms = identity_permutations(spec, state)
    with pytest.raises(ValueError, match="length 7"):
        apply_permutation(spec, {**perms, "hidden.1": torch.arange(7)}, state)
    with pytest.raises(ValueError, match="not a permutation"):
        apply_permutation(spec, {**perms, "hidden.1": torch.zeros(8, dtype=torch.long)}, state)
    with pytest.raises(ValueError, match="nope"):
        apply_permutation(spec, {"nope": torch.arange(8)}, state)
    bad_groups = {"g": [("hidden.0.linear.weight", 0), ("hidden.0.linear.weight", 1)]}
    with pytest.raises(ValueError, match="different sizes"):
        spec_from_groups(bad_groups, {}, state)


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"name": "resnet18"}, "resnet18"),
        ({"name": "mlp", "norm": "gn"}, "gn"),
        ({"name": "vgg11", "width": 0}, "0"),
        ({"name": "resnet20", "width": -1.5}, "-1.5"),
        ({"name": "mlp", "in_shape": (28, 28)}, "(28, 28)"),
        ({"name": "mlp", "depth": 0}, "depth = 0"),
        ({"name": "vgg11", "depth": 2}, "depth"),
        ({"name": "mlp", "num_classes": 0}, "num_classes 0"),
    ],
)
def test_bad_build_arguments_raise_value_error(kwargs, text):
    with pytest.raises(ValueError) as error:
        build_model(**kwargs)
    message = str(error.value)
    assert text in message and "\n" not in message


def test_unknown_names_list_allowed_values():
    with pytest.raises(ValueError, match="mlp, vgg11, resnet20"):
        build_model("alexnet")
    with pytest.raises(ValueError, match="bn, ln, none"):
        build_model("mlp", norm="batch")


@pytest.mark.parametrize(("name", "norm"), MODEL_NORMS)
def test_layer_names_resolve_and_last_is_logits(name, norm):
    model = small_model(name, norm)
    modules = dict(model.named_modules())
    assert all(layer in modules for layer in model.layer_names)
    expected = {"mlp": 3 + 1, "vgg11": 8 + 1, "resnet20": 1 + 9 + 1, "vit": 2 + 1}[name]
    assert len(model.layer_names) == expected
    outputs: dict[str, Tensor] = {}
    relu_calls: list[nn.Module] = []
    for layer in model.layer_names:
        modules[layer].register_forward_hook(
            lambda _m, _i, out, layer=layer: outputs.__setitem__(layer, out)
        )
    for module in model.modules():
        if isinstance(module, nn.ReLU):
            module.register_forward_hook(lambda m, _i, _o: relu_calls.append(m))
    logits = model(inputs((1, 28, 28)))
    assert torch.equal(outputs[model.layer_names[-1]], logits)
    assert len(outputs) == len(model.layer_names)
    relus = [m for m in model.modules() if isinstance(m, nn.ReLU)]
    assert len(relu_calls) == len(relus) and len({id(m) for m in relu_calls}) == len(relus)


@pytest.mark.parametrize("name", MODELS)
def test_config_rebuilds_identical_architecture(name):
    options = {"patch": 8} if name == "vit" else {}
    model = build_model(name, 0.25, num_classes=7, in_shape=[3, 32, 32], norm="ln", **options)
    rebuilt = build_model(**model.config)
    assert rebuilt.config == model.config
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == shapes
    assert model.config["in_shape"] == (3, 32, 32)
    assert model(inputs((3, 32, 32), n=2)).shape == (2, 7)


def test_options_mapping_equals_keywords():
    a = build_model("mlp", 0.5, depth=2, bias=False)
    b = build_model("mlp", 0.5, options={"depth": 2, "bias": False})
    assert a.config == b.config and len(a.hidden) == 2
    assert a.classifier.bias is None


def test_default_norms_and_widths():
    assert build_model("mlp").config["norm"] == "none"
    assert isinstance(build_model("resnet20", 0.125).stem.norm, nn.BatchNorm2d)
    assert isinstance(build_model("vgg11", 0.125, norm="ln").features.block1.norm, nn.GroupNorm)
    assert isinstance(build_model("mlp", 0.125, norm="ln").hidden[0].norm, nn.LayerNorm)
    assert build_model("mlp", 0.125).hidden[0].linear.out_features == 16
    assert build_model("mlp", 0.001).hidden[0].linear.out_features == 1
    assert build_model("resnet20", 0.125).stage3[0].conv1.out_channels == 8
    assert build_model("vgg11", 0.125).classifier.in_features == 64


@pytest.mark.parametrize("name", MODELS)
def test_parameter_count_grows_with_width(name):
    # a ViT grows by whole heads: 0.125 and 0.25 both round to one of its 4 heads
    vit = name == "vit"
    widths, options = ((0.25, 0.5, 1.0), {"patch": 8}) if vit else ((0.125, 0.25, 0.5), {})
    counts = [
        sum(p.numel() for p in build_model(name, w, in_shape=(3, 32, 32), **options).parameters())
        for w in widths
    ]
    assert counts[0] < counts[1] < counts[2]


def test_extreme_widths_build():
    wide = build_model("mlp", 32)
    assert wide.hidden[0].linear.out_features == 4096
    assert wide(torch.zeros(1, 1, 28, 28)).shape == (1, 10)
    assert build_model("mlp", 0.125).hidden[2].linear.out_features == 16
    for name in ("vgg11", "resnet20"):
        for shape in [(1, 28, 28), (3, 32, 32), (3, 4, 4)]:
            model = build_model(name, 0.125, in_shape=shape)
            assert model.eval()(inputs(shape, n=2)).shape == (2, 10)


def test_spec_is_frozen():
    spec = permutation_spec(small_model("mlp", "none"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.perm_to_axes = {}


def test_spec_requires_a_built_in_model():
    with pytest.raises(ValueError, match="Sequential"):
        permutation_spec(nn.Sequential(nn.Linear(2, 2)))
