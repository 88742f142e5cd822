"""fedlmc.permutation.cost_matrices: the incrementally updated cost matrices give the
objective's change for any new permutation, and the forward start's partial matrices are the
reference's, their missing terms added whole once needed."""

from __future__ import annotations

import pytest
import torch

from fedlmc.permutation import permutation_spec
from fedlmc.permutation.cost_matrices import CostMatrices
from fedlmc.permutation.objective import matching_objective
from fedlmc.permutation.reference_matching import cost_matrix
from fedlmc.permutation.spec import random_permutations
from tests.fedlmc.permutation.test_matching import CIFAR, MNIST, make


@pytest.mark.parametrize("name", ["mlp", "resnet20"])
def test_cost_matrices_and_exact_gain_match_the_objective(name):
    """The incrementally updated A_p gives J's change for any new perm of group p."""
    in_shape = MNIST if name == "mlp" else CIFAR
    model_a = make(name, 0.25, in_shape, "ln", seed=0)
    model_b = make(name, 0.25, in_shape, "ln", seed=1)
    spec = permutation_spec(model_a)
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    matcher = CostMatrices(spec, sd_a, sd_b)
    perms = random_permutations(spec, sd_a, seed=0)
    for group in spec.perm_to_axes:  # build every A_p once
        matcher.matrix(group, perms)
    for step, group in enumerate(spec.perm_to_axes):  # move a few units of each group in turn
        new = perms[group].clone()
        new[:3] = new[:3].roll(1)
        perms = {**perms, group: new}
        target = list(spec.perm_to_axes)[(step + 1) % len(spec.perm_to_axes)]
        cost = matcher.matrix(target, perms)  # low-rank update
        candidate = torch.randperm(len(cost), generator=torch.Generator().manual_seed(step))
        moved = {**perms, target: candidate}
        expected = matching_objective(spec, sd_a, sd_b, moved) - matching_objective(
            spec, sd_a, sd_b, perms
        )
        rows = torch.arange(len(cost))
        from_cost = float(cost[rows, candidate].sum() - cost[rows, perms[target]].sum())
        exact = matcher.exact_gain(target, perms, perms[target], candidate)
        assert exact == pytest.approx(expected, rel=1e-9, abs=1e-9)
        assert from_cost == pytest.approx(expected, rel=1e-4, abs=1e-5)


def test_partial_cost_matrices_are_the_reference_ones_and_get_their_terms_later():
    model_a = make("mlp", 0.25, MNIST, "none", seed=0)
    model_b = make("mlp", 0.25, MNIST, "none", seed=1)
    spec = permutation_spec(model_a)
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    perms = random_permutations(spec, sd_a, seed=3)
    matrices = CostMatrices(spec, sd_a, sd_b, float64_costs=True)
    hidden = frozenset({"hidden.2"})

    def reference(group, perms, hidden=frozenset()):
        return cost_matrix(spec, group, sd_a, sd_b, perms, hidden=hidden)

    partial = matrices.matrix("hidden.1", perms, hidden).clone()
    torch.testing.assert_close(partial, reference("hidden.1", perms, hidden))
    assert not torch.allclose(partial, reference("hidden.1", perms))  # a term is missing
    moved = {**perms, "hidden.0": perms["hidden.0"].roll(1)}  # a neighbour moves too
    whole = matrices.matrix("hidden.1", moved)  # the missing term added, the other updated
    torch.testing.assert_close(whole, reference("hidden.1", moved))
    again = matrices.matrix("hidden.1", moved, hidden)  # hiding a present term: a rebuild
    torch.testing.assert_close(again, reference("hidden.1", moved, hidden))
