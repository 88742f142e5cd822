"""Block-structured permutation groups (``fedlmc.permutation.blocks``): the structure is read
back, drawn, enforced when applied, and matched exactly (the joint block assignment against a
brute force, weight matching recovering a known structured permutation)."""

from __future__ import annotations

import itertools

import pytest
import torch

from fedlmc.permutation import (
    apply_permutation,
    invert_permutation,
    random_permutations,
    reference_weight_matching,
    restrict_spec,
    spec_from_groups,
    weight_matching,
)
from fedlmc.permutation.blocks import (
    Blocks,
    block_permutation,
    coordinates,
    random_block_permutation,
    solve_block_assignment,
)


def attention_like(dim: int = 6, heads: int = 3, head_dim: int = 2, seed: int = 0):
    """State and spec of a q/k/v/out layer (no bias): ``stream`` plain, ``qk`` and ``vo``
    block-structured in one family."""
    gen = torch.Generator().manual_seed(seed)
    inner = heads * head_dim
    state = {
        "embed.weight": torch.randn(dim, 4, generator=gen),
        "q.weight": torch.randn(inner, dim, generator=gen),
        "k.weight": torch.randn(inner, dim, generator=gen),
        "v.weight": torch.randn(inner, dim, generator=gen),
        "out.weight": torch.randn(dim, inner, generator=gen),
        "head.weight": torch.randn(3, dim, generator=gen),
    }
    groups = {
        "stream": [("embed.weight", 0), ("q.weight", 1), ("k.weight", 1), ("v.weight", 1)]
        + [("out.weight", 0), ("head.weight", 1)],
        "qk": [("q.weight", 0), ("k.weight", 0)],
        "vo": [("v.weight", 0), ("out.weight", 1)],
    }
    blocks = {"qk": Blocks("heads", head_dim), "vo": Blocks("heads", head_dim)}
    return state, spec_from_groups(groups, {}, state, blocks=blocks)


def test_block_permutation_reads_the_block_order_and_refuses_a_split_block():
    perm = torch.tensor([5, 4, 0, 1, 3, 2])  # blocks of 2: (2, 0, 1), inside: swap, keep, swap
    assert torch.equal(block_permutation(perm, 2), torch.tensor([2, 0, 1]))
    assert block_permutation(torch.tensor([1, 2, 0, 3, 4, 5]), 2) is None
    assert block_permutation(torch.arange(6), 4) is None  # not whole blocks


def test_random_block_permutation_keeps_the_given_block_order():
    sigma = torch.tensor([2, 0, 1])
    perm = random_block_permutation(sigma, 3, torch.Generator().manual_seed(1))
    assert torch.equal(torch.sort(perm).values, torch.arange(9))
    assert torch.equal(block_permutation(perm, 3), sigma)


def test_a_family_is_one_coordinate_at_its_first_group():
    blocks = {"b": Blocks("f", 2), "d": Blocks("f", 2)}
    assert coordinates(["a", "b", "c", "d"], blocks) == [("a",), ("b", "d"), ("c",)]


def _structured(blocks: int, size: int):
    """Every block-structured permutation of ``blocks`` blocks of ``size``, with its order."""
    inner = list(itertools.permutations(range(size)))
    for sigma in itertools.permutations(range(blocks)):
        for taus in itertools.product(inner, repeat=blocks):
            yield sigma, [sigma[b] * size + t for b in range(blocks) for t in taus[b]]


def test_the_joint_block_assignment_is_the_brute_force_optimum():
    gen = torch.Generator().manual_seed(3)
    costs = [torch.randn(6, 6, generator=gen) for _ in range(2)]  # 3 blocks of 2, two groups
    found = solve_block_assignment(costs, 2)
    orders = [block_permutation(p, 2) for p in found]
    assert torch.equal(orders[0], orders[1])  # one block order for the family
    value = sum(float(c[torch.arange(6), p].sum()) for c, p in zip(costs, found, strict=True))
    best = -float("inf")
    per_order: dict[tuple, list[float]] = {}
    for sigma, perm in _structured(3, 2):
        for c, cost in enumerate(costs):
            scores = per_order.setdefault((sigma, c), [])
            scores.append(float(cost[torch.arange(6), torch.tensor(perm)].sum()))
    for sigma in itertools.permutations(range(3)):
        best = max(best, sum(max(per_order[sigma, c]) for c in range(2)))
    assert value == pytest.approx(best, abs=1e-9)


def test_a_random_structured_permutation_is_a_symmetry_and_a_split_one_is_refused():
    state, spec = attention_like()
    perms = random_permutations(spec, state, seed=2)
    assert torch.equal(block_permutation(perms["qk"], 2), block_permutation(perms["vo"], 2))
    permuted = apply_permutation(spec, {g: perms[g] for g in ("qk", "vo")}, state)
    x = torch.randn(5, 6, generator=torch.Generator().manual_seed(4))

    def head_scores(sd):  # Q_h K_h^T of each head on x, and each head's values
        q, k, v = (x @ sd[f"{n}.weight"].T for n in "qkv")
        q, k, v = (t.reshape(5, 3, 2).transpose(0, 1) for t in (q, k, v))
        return q @ k.transpose(1, 2), v

    (scores, values), (moved, moved_values) = head_scores(state), head_scores(permuted)
    order = block_permutation(perms["qk"], 2)
    assert torch.allclose(moved, scores[order], atol=1e-5)  # head h is old head order[h]
    assert not torch.allclose(moved_values, values[order])  # its value dims are permuted...
    assert torch.allclose(  # ...as the out projection's columns
        permuted["out.weight"] @ moved_values.transpose(0, 1).reshape(5, 6).T,
        state["out.weight"] @ values.transpose(0, 1).reshape(5, 6).T,
        atol=1e-5,
    )
    with pytest.raises(ValueError, match="splits a block of 2"):
        apply_permutation(spec, {"qk": torch.tensor([1, 2, 0, 3, 4, 5])}, state)
    other = {"qk": torch.tensor([2, 3, 0, 1, 4, 5]), "vo": torch.tensor([4, 5, 2, 3, 0, 1])}
    with pytest.raises(ValueError, match="differently; allowed: one block order per family"):
        apply_permutation(spec, other, state)
    with pytest.raises(ValueError, match="differently"):  # vo left out: the identity order
        apply_permutation(spec, {"qk": other["qk"]}, state)
    apply_permutation(spec, {"qk": torch.tensor([1, 0, 3, 2, 4, 5])}, state)  # inside blocks


def test_a_family_is_restricted_whole_or_not_at_all():
    _, spec = attention_like()
    assert restrict_spec(spec, ["qk", "vo"]).blocks == {k: spec.blocks[k] for k in ("qk", "vo")}
    assert restrict_spec(spec, ["stream"]).blocks == {}
    with pytest.raises(ValueError, match="share one block permutation"):
        restrict_spec(spec, ["stream", "qk"])


@pytest.mark.parametrize(
    ("blocks", "text"),
    [
        ({"qk": Blocks("heads", 4)}, "not whole blocks of 4"),
        ({"qk": Blocks("heads", 2), "vo": Blocks("heads", 3)}, "3 and 2 blocks"),
        ({"qk": Blocks("heads", 2), "stream": Blocks("heads", 2)}, "share tensor 'q.weight'"),
        ({"nope": Blocks("heads", 2)}, "'nope', not in the spec"),
    ],
)
def test_an_inconsistent_block_structure_is_refused(blocks, text):
    state, spec = attention_like()
    with pytest.raises(ValueError, match=text):
        spec_from_groups(spec.perm_to_axes, {}, state, blocks=blocks)


@pytest.mark.parametrize("matcher", [weight_matching, reference_weight_matching])
def test_weight_matching_recovers_a_known_structured_permutation(matcher):
    state, spec = attention_like(dim=8, heads=4, head_dim=3, seed=5)
    perms = random_permutations(spec, state, seed=9)
    moved = apply_permutation(spec, perms, state)
    found = matcher(spec, state, moved, seed=1)
    for group, perm in perms.items():
        assert torch.equal(found[group], invert_permutation(perm)), group
    back = apply_permutation(spec, found, moved)
    assert all(torch.equal(back[k], state[k]) for k in state)
