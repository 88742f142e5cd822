"""Embedding a narrow model into a wider one through the permutation spec, and slicing it back."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedlmc.models import build_model
from fedlmc.permutation import derive_spec, perm_sizes
from fedlmc.permutation.embed import (
    embed_state,
    embedding_obstacle,
    resolve_slots,
    slice_state,
)

IMAGE = (3, 4, 4)
FLAT = (1, 4, 4)
BUILT_IN = [
    ("mlp", {"norm": "none"}, FLAT),
    ("mlp", {"norm": "none", "bias": False}, FLAT),
    ("mlp", {"norm": "bn"}, FLAT),
    ("vgg11", {"norm": "bn"}, IMAGE),
    ("vgg11", {"norm": "none"}, IMAGE),
    ("resnet20", {"norm": "bn"}, IMAGE),
    ("resnet20", {"norm": "none", "bias": True}, IMAGE),
]


def _randomise_statistics(model: nn.Module, seed: int) -> nn.Module:
    """Non-trivial BatchNorm statistics and affine parameters, so that empty slots matter."""
    generator = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            n = module.num_features
            module.running_mean.copy_(torch.randn(n, generator=generator))
            module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
            module.weight.data.copy_(torch.randn(n, generator=generator))
            module.bias.data.copy_(torch.randn(n, generator=generator))
    return model.eval()


def _pair(name, options, shape, narrow=0.125, wide=0.25, seed=0):
    torch.manual_seed(seed)
    small = _randomise_statistics(build_model(name, narrow, in_shape=shape, **options), seed)
    large = build_model(name, wide, in_shape=shape, **options).eval()
    return small, large


def _outputs(model: nn.Module, state, x):
    model.load_state_dict(state)
    with torch.no_grad():
        return model.eval()(x)


@pytest.mark.parametrize(
    ("name", "options", "shape", "slots"),
    [(*case, "random") for case in BUILT_IN] + [(*BUILT_IN[2], "first")],
)
def test_embedded_built_in_model_computes_the_narrow_function(name, options, shape, slots):
    small, large = _pair(name, options, shape)
    x = torch.randn(3, *shape)
    spec = large.permutation_spec()
    sizes, wide = perm_sizes(spec, small.state_dict()), perm_sizes(spec, large.state_dict())
    assert all(sizes[g] < wide[g] for g in sizes)  # every group really widens
    with torch.no_grad():
        expected, own = small(x), large(x)
    assert not torch.allclose(own, expected, atol=1e-3)  # the wide model's own function differs
    embedded = embed_state(small.state_dict(), large, slots, seed=1)
    got = _outputs(large, dict(embedded), x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


class TinyNet(nn.Module):
    """A model without its own spec: conv -> BN -> ReLU -> conv -> ReLU -> GAP -> linear."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels + 1, 3, padding=1)
        self.head = nn.Linear(channels + 1, 3)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv1(x)))
        h = torch.relu(self.conv2(h)).mean(dim=(2, 3))
        return self.head(h)


def test_embedding_works_through_a_derived_spec():
    torch.manual_seed(0)
    x = torch.randn(2, 2, 5, 5)
    small, large = _randomise_statistics(TinyNet(3), 0), TinyNet(6).eval()
    spec = derive_spec(large, x)
    assert len(spec.perm_to_axes) == 2
    embedded = embed_state(small.state_dict(), large, "random", spec=spec, seed=4)
    with torch.no_grad():
        expected = small(x)
    torch.testing.assert_close(_outputs(large, dict(embedded), x), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("slots", ["first", "random"])
def test_slicing_inverts_embedding_exactly(slots):
    small, large = _pair("resnet20", {"norm": "bn"}, IMAGE)
    state = small.state_dict()
    embedded = embed_state(state, large, slots, seed=2)
    back = slice_state(embedded, small, embedded.slots)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)
    # the holders mark exactly the embedded entries; empty BatchNorm variances are 1
    var = "stem.norm.running_var"
    assert int(embedded.holders[var].sum()) == state[var].numel()
    assert torch.equal(embedded[var][~embedded.holders[var]], torch.ones(2))


def test_first_slot_slice_is_heterofls_nested_submodel():
    small, large = _pair("mlp", {"norm": "none"}, FLAT)
    sliced = slice_state(large.state_dict(), small, "first")
    wide = large.state_dict()
    assert torch.equal(sliced["hidden.0.linear.weight"], wide["hidden.0.linear.weight"][:16])
    assert torch.equal(sliced["hidden.1.linear.weight"], wide["hidden.1.linear.weight"][:16, :16])
    assert torch.equal(sliced["classifier.weight"], wide["classifier.weight"][:, :16])
    assert torch.equal(sliced["classifier.bias"], wide["classifier.bias"])
    small.load_state_dict(sliced)  # a valid state of the narrow model


@pytest.mark.parametrize(("name", "norm"), [("mlp", "LayerNorm"), ("vgg11", "GroupNorm")])
def test_norms_across_units_are_refused_with_the_model_and_reason(name, norm):
    small, large = _pair(name, {"norm": "ln"}, FLAT if name == "mlp" else IMAGE)
    assert norm in embedding_obstacle(large)
    with pytest.raises(ValueError, match=rf"cannot embed model '{name}', norm 'ln'.*{norm}"):
        embed_state(small.state_dict(), large)
    # the same width embeds (nothing widens): the identity is exact
    same = embed_state(large.state_dict(), large)
    assert all(torch.equal(same[k], v) for k, v in large.state_dict().items())


def test_attention_heads_are_refused_even_without_a_norm():
    small = build_model("vit", 0.5, norm="none", depth=1)  # 2 heads of 8 into 4 heads of 8
    large = build_model("vit", 1.0, norm="none", depth=1)
    assert embedding_obstacle(large) is None  # no norm across units: the heads refuse it
    with pytest.raises(ValueError, match=r"group 'blocks\.0\.attn\.qk' is block-structured"):
        embed_state(small.state_dict(), large)


def test_non_hidden_axes_and_too_narrow_servers_are_refused():
    small = build_model("mlp", 0.125, in_shape=FLAT, num_classes=10)
    other = build_model("mlp", 0.25, in_shape=FLAT, num_classes=7)
    with pytest.raises(ValueError, match=r"'classifier.weight' axis 0 is not a hidden axis.*10.*7"):
        embed_state(small.state_dict(), other)
    with pytest.raises(ValueError, match=r"group 'hidden.0' has 32 units, more than.*16"):
        embed_state(build_model("mlp", 0.25, in_shape=FLAT).state_dict(), small)


def test_bad_slots_are_refused():
    small, large = _pair("mlp", {"norm": "none", "depth": 1}, FLAT)
    sizes, wide = {"hidden.0": 16}, {"hidden.0": 32}
    spec = large.permutation_spec()
    with pytest.raises(ValueError, match="slots 'last'; allowed: first, random"):
        resolve_slots(spec, sizes, wide, "last")
    with pytest.raises(ValueError, match="slots of group 'hidden.0': allowed: 16 distinct"):
        embed_state(small.state_dict(), large, {"hidden.0": torch.zeros(16)})
    with pytest.raises(ValueError, match="no slots for group 'hidden.0'"):
        embed_state(small.state_dict(), large, {})
