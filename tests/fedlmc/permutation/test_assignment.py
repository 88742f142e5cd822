"""Tests of fedlmc.permutation.assignment: the warm-startable solver finds scipy's optimum on every
kind of matrix, from any warm start, in threads, and rejects bad input with a clear message."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from fedlmc.permutation.assignment import CANDIDATES, WarmStart, solve_assignment


def matrix(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "gaussian":
        return rng.normal(size=(n, n))
    if kind == "ties":  # few distinct values: many optimal assignments and long price wars
        return rng.integers(-2, 3, size=(n, n)).astype(float)
    if kind == "low_rank":  # the structure of weight-matching cost matrices
        return rng.normal(size=(n, 3)) @ rng.normal(size=(3, n))
    if kind == "constant":
        return np.full((n, n), 7.0)
    if kind == "huge":
        return rng.normal(size=(n, n)) * 1e12
    raise AssertionError(kind)


def optimum(cost: np.ndarray, maximize: bool) -> float:
    rows, cols = linear_sum_assignment(cost, maximize=maximize)
    return float(cost[rows, cols].sum())


def value(cost: np.ndarray, columns: np.ndarray) -> float:
    return float(cost[np.arange(len(cost)), columns].sum())


def assert_optimal(cost: np.ndarray, columns: np.ndarray, maximize: bool) -> None:
    assert np.array_equal(np.sort(columns), np.arange(len(cost))), "not a permutation"
    best = optimum(cost, maximize)
    assert value(cost, columns) == pytest.approx(best, rel=1e-12, abs=1e-9)


@pytest.mark.parametrize("kind", ["gaussian", "ties", "low_rank", "constant", "huge"])
@pytest.mark.parametrize("n", [1, 2, 7, CANDIDATES, CANDIDATES + 1, 60, 200])
@pytest.mark.parametrize("maximize", [False, True])
def test_cold_solve_finds_scipys_optimum(kind, n, maximize):
    cost = matrix(kind, n, np.random.default_rng(n))
    columns, warm = solve_assignment(cost, maximize=maximize)
    assert_optimal(cost, columns, maximize)
    assert np.array_equal(warm.columns, columns)


def test_unique_optimum_is_scipys_assignment_exactly():
    cost = np.random.default_rng(0).normal(size=(300, 300))
    columns, _ = solve_assignment(cost, maximize=True)
    assert np.array_equal(columns, linear_sum_assignment(cost, maximize=True)[1])


@pytest.mark.parametrize("kind", ["gaussian", "ties", "low_rank"])
@pytest.mark.parametrize("maximize", [False, True])
def test_warm_started_sequence_stays_optimal(kind, maximize):
    """Matrices changing by low-rank steps, as in weight matching, each solved from the last."""
    rng = np.random.default_rng(1)
    n = 150
    cost = matrix(kind, n, rng)
    warm = None
    for step in range(12):
        columns, warm = solve_assignment(cost, maximize=maximize, warm=warm)
        assert_optimal(cost, columns, maximize)
        scale = 0.05 if step % 2 else 1.0
        update = rng.normal(size=(n, 4)) @ rng.normal(size=(4, n)) * scale
        cost = cost + (np.round(update) if kind == "ties" else update)


@pytest.mark.parametrize("seed", range(6))
def test_any_warm_start_gives_the_optimum(seed):
    """Prices and columns unrelated to the matrix (huge, duplicated, partly -1) are only hints."""
    rng = np.random.default_rng(seed)
    n = 80
    cost = matrix(["gaussian", "ties", "low_rank"][seed % 3], n, rng)
    columns = rng.integers(-1, n, size=n)  # duplicates and unassigned rows
    warm = WarmStart(rng.normal(size=n) * 10.0 ** rng.integers(-3, 9), columns)
    found, _ = solve_assignment(cost, maximize=bool(seed % 2), warm=warm)
    assert_optimal(cost, found, bool(seed % 2))


def test_resolving_the_same_matrix_returns_the_same_assignment():
    cost = matrix("low_rank", 120, np.random.default_rng(2))
    first, warm = solve_assignment(cost, maximize=True)
    again, _ = solve_assignment(cost, maximize=True, warm=warm)
    assert np.array_equal(first, again)


def test_warm_start_is_not_modified():
    cost = matrix("gaussian", 50, np.random.default_rng(3))
    warm = WarmStart(np.zeros(50), np.arange(50))
    solve_assignment(cost, warm=warm)
    assert np.array_equal(warm.prices, np.zeros(50)) and np.array_equal(warm.columns, np.arange(50))


def test_threads_give_the_sequential_results():
    rng = np.random.default_rng(4)
    costs = [matrix("low_rank", 300, rng) for _ in range(4)]
    sequential = [solve_assignment(c, maximize=True)[0] for c in costs]
    with ThreadPoolExecutor(4) as pool:
        threaded = [cols for cols, _ in pool.map(lambda c: solve_assignment(c, True), costs)]
    assert all(np.array_equal(a, b) for a, b in zip(sequential, threaded, strict=True))


@pytest.mark.parametrize("kind", ["gaussian", "ties", "low_rank"])
def test_float32_matrix_is_solved_as_its_float64_copy(kind):
    """float32 entries are read as they are and converted exactly: the float64 copy's solve,
    prices and assignment alike, cold and warm-started."""
    rng = np.random.default_rng(5)
    single = matrix(kind, 120, rng).astype(np.float32)
    warm32 = warm64 = None
    for step in range(3):
        if step:
            single = single + (0.1 * rng.normal(size=single.shape)).astype(np.float32)
        cols32, warm32 = solve_assignment(single, maximize=True, warm=warm32)
        cols64, warm64 = solve_assignment(single.astype(np.float64), maximize=True, warm=warm64)
        assert np.array_equal(cols32, cols64) and np.array_equal(warm32.prices, warm64.prices)
        assert_optimal(single.astype(np.float64), cols32, maximize=True)


def test_empty_matrix():
    columns, warm = solve_assignment(np.zeros((0, 0)))
    assert columns.shape == (0,) and warm.prices.shape == (0,)


@pytest.mark.parametrize(
    ("cost", "warm", "message"),
    [
        (np.zeros((3, 4)), None, r"square matrix, got shape \(3, 4\)"),
        (np.zeros(3), None, r"square matrix, got shape \(3,\)"),
        (np.array([[1.0, np.nan], [0.0, 1.0]]), None, "NaN or infinite"),
        (np.array([[1.0, -np.inf], [0.0, 1.0]]), None, "NaN or infinite"),
        (np.full((2, 2), 1e308), None, "entries up to 1e\\+308 overflow"),
        (np.zeros((2, 2)), WarmStart(np.array([0.0, np.nan]), np.arange(2)), "must be finite"),
        (np.zeros((2, 2)), WarmStart(np.zeros(3), np.arange(3)), "size 3, the matrix is 2x2"),
        (np.zeros((2, 2)), WarmStart(np.zeros(2), np.array([0, 2])), r"lie in \[-1, 1\]"),
        (np.zeros((2, 2)), WarmStart(np.zeros(2), np.array([0, -2])), r"lie in \[-1, 1\]"),
    ],
)
def test_bad_input_is_rejected(cost, warm, message):
    with pytest.raises(ValueError, match=message):
        solve_assignment(cost, warm=warm)
