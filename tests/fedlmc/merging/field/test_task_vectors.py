"""Task Arithmetic, TIES-Merging and DARE (fedlmc.merging.field.task_vectors) against hand
computations: TA's scaled sum of task vectors (1/N: the plain average), TIES' trim, elected sign
and disjoint mean, DARE's seeded Bernoulli drop with its 1/(1-p) rescale (p = 0: TA; unbiased
over many masks), integer buffers as the average takes them, and a base that does not fit."""

from __future__ import annotations

import pytest
import torch

from fedlmc.averaging import average
from fedlmc.merging.field.task_vectors import dare_merge, task_arithmetic, ties_merge, trimmed

BASE = {"w": torch.tensor([1.0, 1.0, 1.0, 1.0]), "n": torch.tensor(0)}


def _states(*deltas, counts=(3, 5)):
    return [
        {"w": BASE["w"] + torch.tensor(d), "n": torch.tensor(c)}
        for d, c in zip(deltas, counts, strict=True)
    ]


def test_task_arithmetic_is_the_base_plus_the_scaled_sum():
    states = _states([1.0, 2.0, 0.0, -1.0], [3.0, -2.0, 1.0, 1.0])
    merged = task_arithmetic(states, [1, 1], BASE, scaling=0.3)
    torch.testing.assert_close(merged["w"], BASE["w"] + 0.3 * torch.tensor([4.0, 0.0, 1.0, 0.0]))
    assert int(merged["n"]) == 5  # the average's rule: the maximum
    weighted = task_arithmetic(states, [3, 1], BASE, scaling=0.3)  # N w = (1.5, 0.5)
    tau_a, tau_b = torch.tensor([1.0, 2.0, 0.0, -1.0]), torch.tensor([3.0, -2.0, 1.0, 1.0])
    torch.testing.assert_close(weighted["w"], BASE["w"] + 0.3 * (1.5 * tau_a + 0.5 * tau_b))
    plain = task_arithmetic(states, [3, 1], BASE, scaling=0.5)  # lambda = 1/N
    torch.testing.assert_close(plain["w"], average(states, [3, 1])["w"])


def test_ties_trims_elects_the_sign_and_takes_the_disjoint_mean():
    states = _states([3.0, -1.0, 0.5, 2.0], [-1.5, -2.0, 0.4, 1.0])
    # trimmed (top 2 of 4): a = [3, 0, 0, 2], b = [-1.5, -2, 0, 0]; signs of the sums: +, -, 0, +
    merged = ties_merge(states, [1, 1], BASE, density=0.5, scaling=1.0)
    torch.testing.assert_close(merged["w"], BASE["w"] + torch.tensor([3.0, -2.0, 0.0, 2.0]))
    agreeing = _states([2.0, 1.0, 0.0, 0.0], [4.0, 3.0, 0.0, 0.0])
    half = ties_merge(agreeing, [1, 3], BASE, density=0.5, scaling=0.5)  # weighted mean 3.5, 2.5
    torch.testing.assert_close(half["w"], BASE["w"] + 0.5 * torch.tensor([3.5, 2.5, 0.0, 0.0]))


def test_trim_keeps_the_largest_entries_over_every_key_together():
    kept = trimmed({"a": torch.tensor([0.1, -5.0]), "b": torch.tensor([3.0, 0.2, -0.3])}, 0.4)
    assert torch.equal(kept["a"], torch.tensor([0.0, -5.0]))
    assert torch.equal(kept["b"], torch.tensor([3.0, 0.0, 0.0]))
    with pytest.raises(ValueError, match="ties density = 0"):
        trimmed({"a": torch.ones(2)}, 0)


def test_dare_drops_with_rate_p_rescales_and_is_seeded():
    big = {"w": torch.zeros(20000)}
    states = [{"w": torch.full((20000,), 2.0)}, {"w": torch.full((20000,), 4.0)}]
    a = dare_merge(states, [1, 1], big, drop=0.5, scaling=1.0, seed=9)
    b = dare_merge(states, [1, 1], big, drop=0.5, scaling=1.0, seed=9)
    c = dare_merge(states, [1, 1], big, drop=0.5, scaling=1.0, seed=10)
    assert torch.equal(a["w"], b["w"]) and not torch.equal(a["w"], c["w"])
    # each entry: each client kept (x 2) or dropped: 0, 4, 8 or 12
    assert set(a["w"].unique().tolist()) <= {0.0, 4.0, 8.0, 12.0}
    assert abs(float(a["w"].mean()) - 6.0) < 0.15  # unbiased: the sum of the task vectors
    none = dare_merge(states, [1, 1], big, drop=0.0, scaling=0.3)
    torch.testing.assert_close(none["w"], task_arithmetic(states, [1, 1], big, 0.3)["w"])
    with pytest.raises(ValueError, match="dare drop = 1"):
        dare_merge(states, [1, 1], big, drop=1.0, scaling=0.3)


def test_a_base_that_does_not_fit_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="base model: key 'w' is missing or has another shape"):
        task_arithmetic(_states([0.0] * 4, [0.0] * 4), [1, 1], {"w": torch.zeros(3)}, 0.3)
