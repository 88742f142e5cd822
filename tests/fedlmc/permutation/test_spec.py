"""fedlmc.permutation.spec: a spec's permutations applied to a state dict keep the model's
function, are undone by their inverses, are seeded, and are validated (names, lengths,
permutation-ness); ``check_spec`` names the group that breaks the symmetry; ``restrict_spec``
keeps only the named groups."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedlmc.models.classifiers import build_model
from fedlmc.permutation.spec import (
    apply_permutation,
    check_spec,
    checked_permutations,
    fan_in_axes,
    identity_permutations,
    invert_permutation,
    perm_sizes,
    random_permutations,
    restrict_spec,
    spec_from_groups,
    unit_axes,
)


def tiny_mlp():
    torch.manual_seed(0)
    return build_model("mlp", width=0.25, base_hidden=16, in_shape=(1, 4, 4)).eval()


def test_a_random_permutation_keeps_the_function_and_its_inverse_restores_every_tensor():
    model = tiny_mlp()
    spec, state = model.permutation_spec(), model.state_dict()
    perms = random_permutations(spec, state, seed=3)
    assert any(not torch.equal(p, torch.arange(len(p))) for p in perms.values())
    permuted = apply_permutation(spec, perms, state)
    x = torch.randn(8, 1, 4, 4)
    with torch.no_grad():
        same = torch.func.functional_call(model, permuted, (x,))
        assert torch.allclose(model(x), same, rtol=1e-5, atol=1e-6)
    back = apply_permutation(spec, {g: invert_permutation(p) for g, p in perms.items()}, permuted)
    assert all(torch.equal(back[k], state[k]) for k in state)
    assert all(torch.equal(state[k], model.state_dict()[k]) for k in state)  # input untouched


def test_random_permutations_are_seeded_and_the_identity_changes_nothing():
    model = tiny_mlp()
    spec, state = model.permutation_spec(), model.state_dict()
    a, b = random_permutations(spec, state, seed=1), random_permutations(spec, state, seed=1)
    assert all(torch.equal(a[g], b[g]) for g in a)
    c = random_permutations(spec, state, seed=2)
    assert any(not torch.equal(a[g], c[g]) for g in a)
    same = apply_permutation(spec, identity_permutations(spec, state), state)
    assert all(torch.equal(same[k], state[k]) for k in state)
    assert perm_sizes(spec, state) == {g: len(p) for g, p in a.items()}


def test_invert_permutation_composes_to_the_identity():
    perm = torch.randperm(11, generator=torch.Generator().manual_seed(0))
    inverse = invert_permutation(perm)
    assert torch.equal(perm[inverse], torch.arange(11))
    assert torch.equal(inverse[perm], torch.arange(11))


def test_a_hand_written_two_layer_spec_swaps_rows_and_columns_consistently():
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    state = net.state_dict()
    groups = {"h": unit_axes("0", net[0]) + fan_in_axes("2")}
    spec = spec_from_groups(groups, {"h": "1"}, state)
    assert spec.axes_to_perm == {"0.weight": ("h", None), "0.bias": ("h",), "2.weight": (None, "h")}
    perm = torch.tensor([2, 0, 3, 1])
    out = apply_permutation(spec, {"h": perm}, state)
    assert torch.equal(out["0.weight"], state["0.weight"][perm])
    assert torch.equal(out["2.weight"], state["2.weight"][:, perm])
    assert out["2.bias"] is state["2.bias"]
    check_spec(net, spec, torch.randn(5, 3))


@pytest.mark.parametrize(
    ("perm", "message"),
    [
        (torch.arange(3), "has length 3; expected"),
        (torch.zeros(4, dtype=torch.long), "is not a permutation of 0..n-1"),
    ],
)
def test_a_bad_permutation_is_refused_naming_its_group(perm, message):
    with pytest.raises(ValueError, match=f"group 'g' {message}"):
        checked_permutations(spec_with_group_g(), {"g": perm}, {"g": 4})
    with pytest.raises(ValueError, match="unknown permutation group 'x'; allowed: \\['g'\\]"):
        checked_permutations(spec_with_group_g(), {"x": perm}, {"g": 4})


def spec_with_group_g():
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    return spec_from_groups({"g": unit_axes("0", net[0])}, {"g": "1"}, net.state_dict())


def test_check_spec_names_the_group_that_breaks_equivalence():
    torch.manual_seed(0)
    model = build_model("mlp", width=0.25, base_hidden=16, in_shape=(1, 4, 4)).eval()
    x = torch.randn(2, 1, 4, 4)
    good = model.permutation_spec()
    check_spec(model, good, x)
    groups = {
        g: [a for a in axes if a != ("hidden.2.linear.weight", 1)]
        for g, axes in good.perm_to_axes.items()
    }
    bad = spec_from_groups(groups, good.activation_modules, model.state_dict())
    with pytest.raises(ValueError, match="group 'hidden.1' .*not a symmetry"):
        check_spec(model, bad, x)


def test_restrict_spec_permutes_only_the_kept_groups():
    torch.manual_seed(0)
    model = build_model("mlp", width=0.25, base_hidden=16, in_shape=(1, 4, 4))
    spec, state = model.permutation_spec(), model.state_dict()
    only = restrict_spec(spec, ["hidden.1"])
    assert list(only.perm_to_axes) == ["hidden.1"]
    assert only.axes_to_perm["hidden.1.linear.weight"] == ("hidden.1", None)
    assert "hidden.0.linear.bias" not in only.axes_to_perm
    perms = random_permutations(spec, state, seed=2)
    restricted = apply_permutation(only, {"hidden.1": perms["hidden.1"]}, state)
    full = apply_permutation(spec, {"hidden.1": perms["hidden.1"]}, state)
    assert all(torch.equal(restricted[key], full[key]) for key in state)
    with pytest.raises(ValueError, match="unknown permutation group 'nope'"):
        restrict_spec(spec, ["nope"])
