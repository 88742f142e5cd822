"""fedlmc.study.barriers: on a linear model the NLL is convex along any straight path in weight
space, so every raw loss barrier at lambda = 1/2 is <= 0 and its maximum over the path is 0; the
pairwise matrix is symmetric with a zero diagonal and agrees with the two-client curve; the merge
gap is the merge against the endpoints' mean."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from fedlmc.data.splits import DataSplits
from fedlmc.study.barriers import (
    client_barrier_columns,
    curve_columns,
    gap_columns,
    pairwise_barrier_columns,
)
from fedlmc.study.compare import study_context
from fedlmc.study.merge import merge_in_context


def splits() -> DataSplits:
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(90, 1, 4, 4, generator=g), torch.randint(0, 10, (90,), generator=g)
    return DataSplits(
        "constructed", (x[:30], y[:30]), (x[30:60], y[30:60]), (x[60:], y[60:]), 10, (1, 4, 4)
    )


def linear(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 10)).eval()


def averaged(seeds, lambdas: int = 5):
    states = [linear(s).state_dict() for s in seeds]
    context = study_context(
        linear(0),
        states,
        None,
        splits(),
        device=torch.device("cpu"),
        diagnostics=False,
        lambdas=lambdas,
    )
    return context, merge_in_context(context, "average")


def test_the_two_client_curve_of_a_linear_model_has_no_raw_loss_barrier():
    columns = curve_columns(*averaged((1, 2)))
    assert columns["loss_barrier_half"] < 0  # strictly convex NLL: below the chord
    assert columns["loss_barrier_max"] == pytest.approx(0.0, abs=1e-12)  # only at the endpoints
    curve = json.loads(columns["curve"])
    assert curve["lam"] == [0.0, 0.25, 0.5, 0.75, 1.0]
    chord = (curve["nll"][0] + curve["nll"][-1]) / 2
    assert columns["loss_barrier_half"] == pytest.approx(curve["nll"][2] - chord)
    assert len(json.loads(columns["temperature_path"])) == 5
    assert "temperature_path_lewc" not in columns  # no LEWC depth given


def test_client_paths_to_the_merge_of_a_linear_model_have_no_raw_loss_barrier():
    columns = client_barrier_columns(*averaged((1, 2, 3), lambdas=3))
    assert columns["client_to_merge_path_loss_barrier_half_worst"] <= 0
    assert columns["client_to_merge_path_loss_barrier_max_worst"] == pytest.approx(0, abs=1e-12)
    for key in ("half", "half_calibrated", "max", "max_calibrated"):
        mean = columns[f"client_to_merge_path_loss_barrier_{key}_mean"]
        assert mean <= columns[f"client_to_merge_path_loss_barrier_{key}_worst"] + 1e-12


def test_the_pairwise_matrix_is_symmetric_with_a_zero_diagonal_and_matches_the_curve():
    columns = pairwise_barrier_columns(*averaged((1, 2, 3)))
    for name in ("pairwise_loss_barrier_half", "pairwise_loss_barrier_half_calibrated"):
        matrix = json.loads(columns[name])
        assert [matrix[i][i] for i in range(3)] == [0.0, 0.0, 0.0]
        assert all(matrix[i][j] == matrix[j][i] for i in range(3) for j in range(3))
    raw = json.loads(columns["pairwise_loss_barrier_half"])
    assert all(raw[i][j] < 0 for i in range(3) for j in range(3) if i != j)
    pair = curve_columns(*averaged((1, 2), lambdas=3))  # clients 0 and 1 of the three, unaligned
    assert raw[0][1] == pytest.approx(pair["loss_barrier_half"], rel=1e-9)


def test_the_merge_gap_is_the_merge_against_the_endpoints_mean():
    endpoints = [
        {"accuracy": 0.9, "nll_raw": 0.3, "nll_calibrated": 0.25},
        {"accuracy": 0.7, "nll_raw": 0.5, "nll_calibrated": 0.35},
    ]
    merged = {"accuracy": 0.6, "nll_raw": 1.0, "nll_calibrated": 0.8}
    assert gap_columns(endpoints, merged) == pytest.approx(
        {"merge_gap_accuracy": 0.2, "merge_gap_loss": 0.6, "merge_gap_loss_calibrated": 0.5}
    )
