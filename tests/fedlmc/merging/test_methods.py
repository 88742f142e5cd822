"""Tests of fedlmc.merging.methods, the merge entry: ``merge_states`` with and without its info
(``with_info``), the checks it runs before any work, and the built-in methods
(fedlmc.merging.builtin_methods) it finds registered."""

from __future__ import annotations

import pytest
import torch

from fedlmc.merging import builtin_methods, method_registry
from fedlmc.merging.method_registry import METHODS
from fedlmc.merging.methods import merge_states
from fedlmc.models.classifiers import build_model
from fedlmc.permutation import apply_permutation, permutation_spec, random_permutations


def tiny_mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", width=0.125, in_shape=(1, 4, 4), norm="none").eval()


def test_with_info_adds_the_methods_info_to_the_same_merge():
    """A client and its permuted copy: weight matching undoes the permutation, so the merge is
    the client itself, and the info says how many units it moved (all of a random shuffle's
    but the fixed points)."""
    template = tiny_mlp(0)
    spec = permutation_spec(template)
    sd = template.state_dict()
    perms = random_permutations(spec, sd, seed=5)
    states = [sd, apply_permutation(spec, perms, sd)]
    merged, aligned = merge_states("weight_matching", template, states)
    merged_i, aligned_i, info = merge_states("weight_matching", template, states, with_info=True)
    for key in sd:
        assert torch.equal(merged[key], merged_i[key]), key
        assert torch.allclose(merged[key], sd[key], atol=1e-6), key
        assert torch.equal(aligned_i[1][key], sd[key]), key
    moved = sum(int((p != torch.arange(len(p))).sum()) for p in perms.values())
    assert info["aligned_groups"] == len(perms)
    assert info["aligned_units_moved"] == moved > 0
    weighted = merge_states("weight_matching", template, states, [0.5, 0.5], with_info=True)
    assert weighted[2] == info  # equal weights given explicitly: the same merge, the same info
    plain = merge_states("average", template, states, with_info=True)
    assert plain[2] == {}  # plain averaging reports nothing


def test_merge_states_checks_before_any_work():
    template = tiny_mlp(0)
    sd = template.state_dict()
    with pytest.raises(ValueError, match="need at least one client state dict"):
        merge_states("average", template, [], with_info=True)
    with pytest.raises(ValueError, match="'activation_matching' needs server data"):
        merge_states("activation_matching", template, [sd, sd])
    with pytest.raises(ValueError, match="unknown merge method|allowed"):
        merge_states("no_such_method", template, [sd, sd])


def test_every_built_in_method_is_registered_before_the_first_merge():
    registered = {entry.align for entry in METHODS}
    built_in = {
        value
        for name, value in vars(builtin_methods).items()
        if callable(value) and getattr(value, "__module__", "") == builtin_methods.__name__
    }
    assert {m.name for m in METHODS} >= {"average", "weight_matching", "auto", "merge_many"}
    # every registered built-in is defined in builtin_methods; the registry module defines none
    assert {f for f in registered if f.__module__ == builtin_methods.__name__} <= built_in
    assert not [f for f in registered if f.__module__ == method_registry.__name__]
