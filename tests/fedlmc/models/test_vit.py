"""The Vision Transformer (``fedlmc.models.vit``): its widths, and its permutation spec as a
symmetry of a trained model (every group, heads as whole blocks), recovered exactly by weight
matching, activation matching and MergeMany, and equal to what the graph derivation gives with
the attention groups declared."""

from __future__ import annotations

import warnings

import pytest
import torch

from fedlmc.data.loading import load_dataset
from fedlmc.models import build_model
from fedlmc.permutation import (
    activation_matching,
    apply_permutation,
    check_spec,
    derive_spec,
    invert_permutation,
    merge_many,
    random_permutations,
    reference_weight_matching,
    restrict_spec,
    spec_from_groups,
    weight_matching,
)
from fedlmc.permutation.blocks import block_permutation
from fedlmc.train import train_model

TINY = {"width": 0.5, "depth": 2}  # 2 heads of 8 dims: embedding 16, MLP 32


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = load_dataset("mnist5k").train
    return x[:600], y[:600]


@pytest.fixture(scope="module")
def trained(digits):
    """A tiny ViT trained for 2 epochs on 600 real digits (its weights far from the init)."""
    torch.manual_seed(0)
    model = build_model("vit", **TINY)
    common = {"epochs": 2, "lr": 3e-3, "weight_decay": 0.05, "batch_size": 32}
    train_model(model, digits, optimizer="adamw", seed=0, **common)
    return model.eval()


def test_width_grows_the_heads_or_the_head_dimension():
    wide = build_model("vit", 2.0)
    assert (wide.heads, wide.head_dim, wide.blocks[0].fc1.out_features) == (8, 8, 128)
    deep = build_model("vit", 2.0, grow_heads=False, depth=4)
    assert (deep.heads, deep.head_dim, len(deep.blocks)) == (4, 16, 4)
    assert build_model("vit").pos_embed.shape == (1, 16 + 1, 32)  # 7-pixel patches on 28x28
    assert build_model("vit", 0.1).heads == 1


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"in_shape": (3, 32, 32)}, "patch = 7 does not divide the 32x32 image"),
        ({"norm": "bn"}, "unknown norm 'bn' for model 'vit'; allowed: ln, none"),
    ],
)
def test_a_bad_layout_is_refused_in_one_line(kwargs, text):
    with pytest.raises(ValueError, match=text) as error:
        build_model("vit", **kwargs)
    assert "\n" not in str(error.value)


def test_every_group_permuted_at_random_leaves_a_trained_vit_unchanged(trained, digits):
    spec = trained.permutation_spec()
    heads = [g for g in spec.perm_to_axes if g.endswith((".qk", ".vo"))]
    assert len(spec.perm_to_axes) == 1 + 3 * 2 and len(heads) == 4
    state = trained.state_dict()
    perms = random_permutations(spec, state, seed=4)
    for group in heads:  # whole heads move, and not only inside a head
        assert block_permutation(perms[group], 8) is not None
    assert any(not torch.equal(block_permutation(perms[g], 8), torch.arange(2)) for g in heads)
    permuted = apply_permutation(spec, perms, state)
    assert all(not torch.equal(permuted[k], state[k]) for k in spec.axes_to_perm)
    fresh = build_model("vit", **TINY).eval()
    fresh.load_state_dict(permuted)
    x = digits[0][:64]
    with torch.no_grad():
        assert torch.allclose(fresh(x), trained(x), rtol=1e-4, atol=1e-5)


def test_heads_permuted_as_free_units_are_no_symmetry(trained, digits):
    spec = trained.permutation_spec()
    free = spec_from_groups(spec.perm_to_axes, {}, trained.state_dict())  # no block structure
    with pytest.raises(ValueError, match=r"group 'blocks\.\d\.attn\.(qk|vo)'.*not a symmetry"):
        check_spec(trained, free, digits[0][:8], seed=1)
    check_spec(trained, spec, digits[0][:8], seed=1)


@pytest.mark.parametrize("matcher", [weight_matching, reference_weight_matching])
def test_weight_matching_recovers_a_known_permutation_exactly(trained, matcher):
    spec = trained.permutation_spec()
    state = trained.state_dict()
    perms = random_permutations(spec, state, seed=11)
    found = matcher(spec, state, apply_permutation(spec, perms, state), seed=2)
    for group, perm in perms.items():
        assert torch.equal(found[group], invert_permutation(perm)), group


def test_activation_matching_and_merge_many_recover_it_too(trained, digits):
    spec = trained.permutation_spec()
    state = trained.state_dict()
    perms = random_permutations(spec, state, seed=12)
    other = build_model("vit", **TINY).eval()
    other.load_state_dict(apply_permutation(spec, perms, state))
    found = activation_matching(trained, other, digits[0][:128], spec=spec)
    for group, perm in perms.items():  # token features on the last axis (activation_dims)
        assert torch.equal(found[group], invert_permutation(perm)), group
    merged, aligned = merge_many(spec, [state, other.state_dict()])
    other.load_state_dict(merged)  # both aligned into one frame: the average is the same model
    x = digits[0][:64]
    with torch.no_grad():
        assert torch.allclose(other(x), trained(x), rtol=1e-4, atol=1e-5)
    assert any(not torch.equal(p, torch.arange(len(p))) for q in aligned for p in q.values())


def test_the_graph_derives_the_stream_and_mlps_and_the_heads_are_declared(trained, digits):
    spec = trained.permutation_spec()
    x = digits[0][:2]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        derived = derive_spec(trained, x)
    dropped = sorted(str(w.message).split()[4] for w in caught)  # "the units of <module> are"
    assert dropped == [f"blocks.{i}.attn.{p}" for i in range(2) for p in "kqv"]
    assert sorted(map(sorted, derived.perm_to_axes.values())) == sorted(
        sorted(spec.perm_to_axes[g]) for g in ("stream", "blocks.0.mlp", "blocks.1.mlp")
    )
    heads = restrict_spec(spec, [g for g in spec.perm_to_axes if g in spec.blocks])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the declared heads' units are dropped silently
        combined = derive_spec(trained, x, declared=heads)
    assert sorted(map(sorted, combined.perm_to_axes.values())) == sorted(
        map(sorted, spec.perm_to_axes.values())
    )
    assert combined.blocks == heads.blocks
