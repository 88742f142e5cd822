"""fedlmc.permutation.objective: the weight-matching objective J (identity, a planted
permutation's inverse, BatchNorm statistics left out), the maximising assignment and the checks
of a pair and of ``max_iter``."""

from __future__ import annotations

import pytest
import torch

from fedlmc.permutation import apply_permutation, permutation_spec, random_permutations
from fedlmc.permutation.objective import (
    Matching,
    assignment_value,
    check_max_iter,
    check_pair,
    is_scored,
    matching_objective,
    scored_keys,
    solve_max_assignment,
)
from tests.fedlmc.permutation.test_matching import MNIST, make


@pytest.mark.parametrize("kind", ["gaussian", "ties", "low_rank"])
def test_reduced_assignment_is_a_maximum_weight_assignment(kind):
    """Solving the row/column-reduced minimisation gives scipy's maximum value, also with ties."""
    from scipy.optimize import linear_sum_assignment

    generator = torch.Generator().manual_seed(0)
    n = 60
    if kind == "gaussian":
        cost = torch.randn(n, n, generator=generator, dtype=torch.float64)
    elif kind == "ties":
        cost = torch.randint(-3, 4, (n, n), generator=generator).double()
    else:
        cost = torch.randn(n, 3, generator=generator, dtype=torch.float64)
        cost = cost @ torch.randn(3, n, generator=generator, dtype=torch.float64)
    found = solve_max_assignment(cost)
    assert torch.equal(found.sort().values, torch.arange(n))
    rows, cols = linear_sum_assignment(cost.numpy(), maximize=True)
    best = cost.numpy()[rows, cols].sum()
    assert cost[torch.arange(n), found].sum().item() == pytest.approx(best, rel=0, abs=1e-9)


def test_the_objective_is_the_float64_inner_product_of_the_scored_tensors():
    model_a, model_b = (
        make("mlp", 0.25, MNIST, "bn", seed=0),
        make("mlp", 0.25, MNIST, "bn", seed=1),
    )
    spec = permutation_spec(model_a)
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    by_hand = sum(float((sd_a[k].double() * sd_b[k].double()).sum()) for k in scored_keys(spec))
    assert matching_objective(spec, sd_a, sd_b) == pytest.approx(by_hand, rel=1e-12)
    assert matching_objective(spec, sd_a, sd_b, {}) == matching_objective(spec, sd_a, sd_b)
    assert not any(k.endswith(("running_mean", "running_var")) for k in scored_keys(spec))


def test_undoing_a_planted_permutation_gives_the_self_objective():
    model = make("mlp", 0.25, MNIST, "none", seed=2)
    spec, sd = permutation_spec(model), model.state_dict()
    perms = random_permutations(spec, sd, seed=4)
    permuted = apply_permutation(spec, perms, sd)
    inverse = {g: torch.argsort(p) for g, p in perms.items()}
    best = matching_objective(spec, sd, sd)
    assert matching_objective(spec, sd, permuted, inverse) == pytest.approx(best, rel=1e-12)
    assert matching_objective(spec, sd, permuted) < best  # Cauchy-Schwarz: below ||W||^2


def test_assignment_value_sums_the_chosen_entries_and_a_planted_maximum_is_found():
    cost = torch.tensor([[1.0, 9.0, 0.0], [8.0, 0.0, 0.0], [0.0, 0.0, 7.0]])
    best = solve_max_assignment(cost)
    assert best.tolist() == [1, 0, 2]
    assert assignment_value(cost, best) == 24.0
    assert assignment_value(cost, torch.arange(3)) == 8.0


def test_is_scored_leaves_out_exactly_the_batchnorm_buffers():
    assert is_scored("layers.0.weight") and is_scored("bn.bias")
    for buffer in ("running_mean", "running_var", "num_batches_tracked"):
        assert not is_scored(f"features.1.{buffer}")


def test_the_checks_name_the_bad_value():
    assert check_max_iter(3) == 3 and check_max_iter(2.0) == 2
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match=f"max_iter must be an integer >= 1, got {bad!r}"):
            check_max_iter(bad)
    model = make("mlp", 0.25, MNIST, "none", seed=0)
    spec, sd = permutation_spec(model), model.state_dict()
    sizes = check_pair(spec, sd, sd)
    assert set(sizes) == set(spec.perm_to_axes) and all(n > 0 for n in sizes.values())
    wider = make("mlp", 0.5, MNIST, "none", seed=0).state_dict()
    with pytest.raises(ValueError, match="shape"):
        check_pair(spec, sd, wider)


def test_a_matching_is_its_permutations_with_float_objectives():
    found = Matching({"p": torch.arange(3)}, [1, 2.5])
    assert list(found) == ["p"] and found.objectives == [1.0, 2.5]
    assert Matching({}).objectives == []
