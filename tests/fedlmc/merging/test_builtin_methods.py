"""The built-in merge methods (:mod:`fedlmc.merging.builtin_methods`) run as their rules say."""

from __future__ import annotations

import torch

from fedlmc.merging.method_registry import METHODS
from fedlmc.merging.methods import merge_states
from fedlmc.models.classifiers import build_model
from fedlmc.permutation.model_spec import permutation_spec
from fedlmc.permutation.spec import apply_permutation, random_permutations
from fedlmc.strategies.secure_forms import runs_securely
from fedlmc.study.method_policy import evaluation_of


def mlp(seed: int):
    torch.manual_seed(seed)
    return build_model("mlp", width=0.25, num_classes=10, in_shape=(1, 8, 8), depth=2)


def test_the_plain_average_is_the_weighted_mean_of_every_tensor():
    template = mlp(0)
    a, b = template.state_dict(), mlp(1).state_dict()
    merged, aligned = merge_states("average", template, [a, b], [0.25, 0.75])
    for key in a:
        assert torch.allclose(merged[key], 0.25 * a[key] + 0.75 * b[key], atol=1e-6)
    assert all(torch.equal(aligned[0][k], a[k]) for k in a)


def test_weight_matching_undoes_a_planted_permutation():
    template = mlp(0)
    state = template.state_dict()
    spec = permutation_spec(template)
    moved = apply_permutation(spec, random_permutations(spec, state, seed=3), state)
    assert any(not torch.equal(moved[k], state[k]) for k in state)  # the units really moved
    merged, aligned = merge_states("weight_matching", template, [state, moved])
    for key in state:
        assert torch.allclose(aligned[1][key], state[key]) and torch.allclose(
            merged[key], state[key]
        )


def test_weight_matching_forward_merges_with_the_forward_start():
    """``weight_matching_forward``: client 1 aligned by ``weight_matching(start="forward")``
    onto client 0 (seeded by the job), then averaged; a planted permutation is undone."""
    from fedlmc.permutation.coordinate_descent import weight_matching

    template = mlp(0)
    a, b = template.state_dict(), mlp(1).state_dict()
    spec = permutation_spec(template)
    merged, aligned = merge_states("weight_matching_forward", template, [a, b], seed=5)
    expected = apply_permutation(spec, weight_matching(spec, a, b, seed=5, start="forward"), b)
    published = apply_permutation(spec, weight_matching(spec, a, b, seed=5), b)
    assert any(not torch.equal(published[k], expected[k]) for k in b)  # another descent
    for key in a:
        assert torch.equal(aligned[1][key], expected[key]), key
        assert torch.allclose(merged[key], (a[key] + expected[key]) / 2, atol=1e-6), key
    moved = apply_permutation(spec, random_permutations(spec, a, seed=3), a)
    merged, _ = merge_states("weight_matching_forward", template, [a, moved])
    assert all(torch.allclose(merged[key], a[key]) for key in a)
    assert evaluation_of("weight_matching_forward").server_sees == "each model"


def test_the_built_in_methods_declare_what_they_need():
    assert runs_securely("average") and evaluation_of("average").server_sees == "sum"
    assert evaluation_of("weight_matching").server_sees == "each model"
    assert METHODS.get("activation_matching").needs.server_data
    assert METHODS.get("activation_federated").needs.clients
