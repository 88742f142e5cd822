"""The server's work with many clients stays bounded: MergeMany's targets come from one running
sum (O(N) models averaged per pass, not O(N^2)), and the client -> merge path diagnostic
evaluates at most ``CLIENT_PATHS_MAX_CLIENTS`` paths, whatever N. Constructed cases, tiny MLPs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fedlmc.permutation.matching as matching
import fedlmc.study.barriers as barriers
import fedlmc.study.compare as compare
from fedlmc.analysis.paths import CLIENT_PATHS_MAX_CLIENTS, path_clients
from fedlmc.averaging import LeaveOneOutMean, average
from fedlmc.data.splits import DataSplits
from fedlmc.models.classifiers import build_model
from fedlmc.permutation import apply_permutation, permutation_spec
from fedlmc.permutation.matching import identity_permutations, merge_many, weight_matching


def states(count: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    out = []
    for i in range(count):
        torch.manual_seed(seed + i)
        out.append(build_model("mlp", width=0.125, depth=2, bias=False).state_dict())
    return out


def close(a: dict, b: dict) -> bool:
    return all(torch.allclose(a[k].double(), b[k].double(), atol=1e-6) for k in a)


def test_leave_one_out_mean_is_the_weighted_average_of_the_others():
    sds = states(5)
    for i, sd in enumerate(sds):  # an integer buffer takes the others' maximum
        sd["count"] = torch.tensor(10 * i)
    weights = [1.0, 2.0, 3.0, 0.0, 4.0]
    means = LeaveOneOutMean(sds, weights)
    for i in range(5):
        others = [j for j in range(5) if j != i]
        expected = average([sds[j] for j in others], [weights[j] for j in others])
        assert close(means.mean_without(i), expected), i
    assert int(means.mean_without(4)["count"]) == 30
    replacement = states(1, seed=99)[0] | {"count": torch.tensor(7)}
    means.replace(2, replacement)
    sds[2] = replacement
    expected = average([sds[j] for j in (0, 1, 2, 4)], [1.0, 2.0, 3.0, 4.0])
    assert close(means.mean_without(3), expected)


def test_leave_one_out_mean_of_weightless_others_is_their_plain_mean():
    sds = states(3)
    means = LeaveOneOutMean(sds, [1.0, 0.0, 0.0])
    assert close(means.mean_without(0), average(sds[1:]))


def textbook_merge_many(spec, sds, weights, seed: int, max_iter: int = 100):
    """MergeMany with every target averaged afresh from the N - 1 others (the quadratic way)."""
    w = np.asarray(weights) / sum(weights)
    perms = [identity_permutations(spec, sd) for sd in sds]
    aligned = [dict(sd) for sd in sds]
    rng = np.random.default_rng(seed)
    for sweep in range(max_iter):
        changed = False
        for i in rng.permutation(len(sds)):
            others = [j for j in range(len(sds)) if j != i]
            target = average([aligned[j] for j in others], [w[j] for j in others])
            new = weight_matching(spec, target, sds[i], max_iter, seed + sweep, init_perms=perms[i])
            if any(not torch.equal(new[g], perms[i][g]) for g in new):
                perms[i] = dict(new)
                aligned[i] = apply_permutation(spec, perms[i], sds[i])
                changed = True
        if not changed:
            break
    return average(aligned, list(w)), perms


def test_merge_many_averages_each_model_once_and_matches_the_textbook_algorithm(monkeypatch):
    sds = states(6)
    spec = permutation_spec(build_model("mlp", width=0.125, depth=2, bias=False))
    weights = [1.0, 2.0, 1.0, 3.0, 1.0, 2.0]
    expected, expected_perms = textbook_merge_many(spec, sds, weights, seed=0)
    averaged: list[int] = []

    def counting_average(state_dicts, weights=None):
        averaged.append(len(state_dicts))
        return average(state_dicts, weights)

    monkeypatch.setattr(matching, "average", counting_average)
    merged, perms = merge_many(spec, sds, weights=weights, seed=0)
    assert averaged == [6]  # only the final merge; the targets come from the running sum
    assert close(merged, expected)
    for found, want in zip(perms, expected_perms, strict=True):
        assert all(torch.equal(found[g], want[g]) for g in want)


@pytest.mark.parametrize("count", [1, 5, 16, 17, 64, 1000])
def test_path_clients_are_all_clients_up_to_the_cap_then_evenly_spread(count):
    chosen = path_clients(count)
    assert len(chosen) == min(count, CLIENT_PATHS_MAX_CLIENTS)
    assert chosen == sorted(set(chosen))  # distinct, in partition order
    assert chosen[0] == 0 and chosen[-1] == count - 1
    if count > CLIENT_PATHS_MAX_CLIENTS:
        steps = np.diff(chosen)
        assert steps.max() - steps.min() <= 1  # evenly spaced


def test_client_path_diagnostic_evaluates_at_most_the_cap(monkeypatch):
    """20 clients, one merge with diagnostics: 16 client -> merge paths, no pairwise matrix."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(60, 1, 28, 28, generator=generator)
    y = torch.arange(60) % 10
    splits = DataSplits(
        name="constructed",
        train=(x[:20], y[:20]),
        server=(x[20:40], y[20:40]),
        test=(x[40:], y[40:]),
        num_classes=10,
        in_shape=(1, 28, 28),
    )
    count = CLIENT_PATHS_MAX_CLIENTS + 4
    template = build_model("mlp", width=0.125, depth=2, bias=False)
    paths: list[int] = []
    real_curve = barriers.interpolation_curve

    def counting_curve(*args, **kwargs):
        paths.append(1)
        return real_curve(*args, **kwargs)

    monkeypatch.setattr(barriers, "interpolation_curve", counting_curve)
    rows = compare.compare_methods(
        template, states(count), None, splits, ["average"], lambdas=3
    ).rows
    assert len(paths) == CLIENT_PATHS_MAX_CLIENTS
    row = rows[0]
    worst = row["client_to_merge_path_loss_barrier_max_worst"]
    assert worst >= row["client_to_merge_path_loss_barrier_max_mean"] - 1e-12
    assert "pairwise_loss_barrier_half" not in row or row["pairwise_loss_barrier_half"] == ""
