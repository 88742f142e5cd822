r"""Square linear assignment with warm starts, compiled with numba.

Solves :math:`\min_\sigma \sum_i c_{i\sigma(i)}` (or ``max``) over permutations :math:`\sigma`,
exactly, and returns the optimal column prices with the assignment so that the next solve of a
slightly changed matrix can start from them. Weight matching solves the same group's cost matrix
again and again after small changes; :func:`scipy.optimize.linear_sum_assignment` and the other
solvers we found on PyPI (``lap``, ``lapjv``) always start from scratch, so they redo all the work.

The algorithm is Jonker & Volgenant's (1987) shortest augmenting path with dual variables
:math:`u_i` (rows) and :math:`v_j` (column prices), keeping the reduced costs
:math:`h_{ij} = c_{ij} - u_i - v_j \ge 0`, zero on assigned pairs:

1. **Warm start.** With the previous prices :math:`v`, a row keeps its previous column if that
   column still attains :math:`\min_j (c_{ij} - v_j)`; the other rows start free.
2. **Augmenting row reduction** (JV's auction-like phase): a free row ``i`` takes the column
   :math:`j_1` of its smallest :math:`c_{ij} - v_j`, lowering :math:`v_{j_1}` by the gap to its
   second smallest, and evicts that column's previous row. Every assigned row stays at the
   minimum of its row. Rows look only at their :math:`K` best columns (at the time they were
   listed) while the listed second best is no worse than the :math:`K`-th: prices only fall in
   this phase, so unlisted columns cannot have become better. The phase stops after a budget of
   steps (its price wars can be slow).
3. **Shortest augmenting paths** (Dijkstra on reduced costs, as in scipy's solver, Crouse 2016)
   assign the rows still free and update :math:`u, v`.

At the end every :math:`h_{ij} \ge 0` and :math:`h_{i\sigma(i)} = 0`, which certifies optimality
(up to floating-point rounding, as for scipy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

CANDIDATES = 8
"""Columns a row lists in the row-reduction phase (its best ones at listing time)."""

ROW_REDUCTION_STEPS = 64
"""Row-reduction steps allowed per initially free row before shortest paths take over."""


@dataclass
class WarmStart:
    """What the next solve of a similar matrix can start from: prices and the assignment."""

    prices: np.ndarray
    """Column prices :math:`v_j` in the minimisation form (float64, length n)."""
    columns: np.ndarray
    """Column of each row (int64, length n)."""


_jit = numba.njit(cache=True, nogil=True)


@_jit
def _row_min(cost, sign, v, i):
    """:math:`\\min_j (s\\,c_{ij} - v_j)`."""
    best = np.inf
    for j in range(cost.shape[1]):
        h = sign * cost[i, j] - v[j]
        if h < best:
            best = h
    return best


@_jit
def _list_candidates(cost, sign, v, i, cand, tau):
    """Put the ``K`` columns of smallest :math:`s c_{ij} - v_j` in ``cand[i]`` (any order) and
    the ``K``-th smallest value in ``tau[i]`` (infinite when every column is listed)."""
    n, k = cost.shape[1], cand.shape[1]
    vals = np.empty(k)
    for j in range(k):
        vals[j] = sign * cost[i, j] - v[j]
        cand[i, j] = j
    worst = 0
    for s in range(1, k):
        if vals[s] > vals[worst]:
            worst = s
    for j in range(k, n):
        h = sign * cost[i, j] - v[j]
        if h < vals[worst]:
            vals[worst] = h
            cand[i, worst] = j
            worst = 0
            for s in range(1, k):
                if vals[s] > vals[worst]:
                    worst = s
    tau[i] = vals[worst] if n > k else np.inf


@_jit
def _two_smallest(cost, sign, v, i, cand):
    """Smallest and second-smallest :math:`s c_{ij} - v_j` over ``cand[i]``, with columns."""
    umin, usub, j1, j2 = np.inf, np.inf, -1, -1
    for s in range(cand.shape[1]):
        j = cand[i, s]
        h = sign * cost[i, j] - v[j]
        if h < usub:
            if h < umin:
                usub, j2, umin, j1 = umin, j1, h, j
            else:
                usub, j2 = h, j
    return umin, usub, j1, j2


@_jit
def _row_reduction(cost, sign, v, col4row, row4col, queue, head, tail, budget):
    """JV's augmenting row reduction on the free rows ``queue[head:tail]`` (a ring buffer).

    Returns the new ``head, tail``. Keeps every assigned row at the minimum of its row.
    """
    n = cost.shape[0]
    k = min(CANDIDATES, n)
    cand = np.empty((n, k), np.int64)
    tau = np.empty(n)
    listed = np.zeros(n, np.bool_)
    cap = queue.shape[0]
    steps = 0
    while head != tail and steps < budget:
        steps += 1
        i = queue[head]
        head = (head + 1) % cap
        if not listed[i]:
            _list_candidates(cost, sign, v, i, cand, tau)
            listed[i] = True
        umin, usub, j1, j2 = _two_smallest(cost, sign, v, i, cand)
        if usub > tau[i]:  # an unlisted column may now be second best: list again
            _list_candidates(cost, sign, v, i, cand, tau)
            umin, usub, j1, j2 = _two_smallest(cost, sign, v, i, cand)
        evicted = row4col[j1]
        if umin < usub:
            v[j1] -= usub - umin
        elif evicted >= 0:
            j1 = j2
            evicted = row4col[j2]
        row4col[j1] = i
        col4row[i] = j1
        if evicted >= 0:
            col4row[evicted] = -1
            if umin < usub:  # the evicted row goes first, as in JV
                head = (head - 1) % cap
                queue[head] = evicted
            else:
                queue[tail] = evicted
                tail = (tail + 1) % cap
    return head, tail


@_jit
def _augment(cost, sign, v, u, col4row, row4col, start, spc, path, remaining, seen_r, seen_c):
    """Assign free row ``start`` along a shortest augmenting path (Crouse's Dijkstra)."""
    n = cost.shape[0]
    for j in range(n):
        remaining[j] = n - 1 - j
        spc[j] = np.inf
        seen_r[j] = False
        seen_c[j] = False
    num_remaining, min_val, i, sink = n, 0.0, start, -1
    while sink == -1:
        index, lowest = -1, np.inf
        seen_r[i] = True
        for it in range(num_remaining):
            j = remaining[it]
            r = min_val + sign * cost[i, j] - u[i] - v[j]
            if r < spc[j]:
                path[j] = i
                spc[j] = r
            if spc[j] < lowest or (spc[j] == lowest and row4col[j] == -1):
                lowest = spc[j]
                index = it
        min_val = lowest
        j = remaining[index]
        if row4col[j] == -1:
            sink = j
        else:
            i = row4col[j]
        seen_c[j] = True
        num_remaining -= 1
        remaining[index] = remaining[num_remaining]
    u[start] += min_val
    for r in range(n):
        if seen_r[r] and r != start:
            u[r] += min_val - spc[col4row[r]]
    for j in range(n):
        if seen_c[j]:
            v[j] -= min_val - spc[j]
    j = sink
    while True:
        i = path[j]
        row4col[j] = i
        col4row[i], j = j, col4row[i]
        if i == start:
            break


@_jit
def _solve(cost, sign, v, init):
    """Optimal ``col4row`` for :math:`\\min \\sum_i s\\,c_{i\\sigma(i)}`; ``v`` updated in place."""
    n = cost.shape[0]
    col4row = np.full(n, -1, np.int64)
    row4col = np.full(n, -1, np.int64)
    queue = np.empty(n + 1, np.int64)
    tail = 0
    for i in range(n):
        j = init[i]
        if j >= 0 and row4col[j] == -1 and sign * cost[i, j] - v[j] == _row_min(cost, sign, v, i):
            col4row[i] = j
            row4col[j] = i
        else:
            queue[tail] = i
            tail += 1
    _row_reduction(cost, sign, v, col4row, row4col, queue, 0, tail, ROW_REDUCTION_STEPS * tail)
    u = np.empty(n)
    for i in range(n):  # assigned rows sit at their row minimum: u_i = h_i(col(i))
        j = col4row[i]
        u[i] = sign * cost[i, j] - v[j] if j >= 0 else _row_min(cost, sign, v, i)
    spc, path, remaining = np.empty(n), np.empty(n, np.int64), np.empty(n, np.int64)
    seen_r, seen_c = np.empty(n, np.bool_), np.empty(n, np.bool_)
    for i in range(n):
        if col4row[i] == -1:
            _augment(cost, sign, v, u, col4row, row4col, i, spc, path, remaining, seen_r, seen_c)
    return col4row


def solve_assignment(
    cost: np.ndarray, maximize: bool = False, warm: WarmStart | None = None
) -> tuple[np.ndarray, WarmStart]:
    r"""Column of each row of the optimal assignment of the square matrix ``cost``.

    Same optimum as ``scipy.optimize.linear_sum_assignment(cost, maximize)[1]`` (ties may be
    broken differently). ``warm``: the :class:`WarmStart` returned by a previous solve of a matrix
    of the same size (any values; the closer the matrices, the faster). Returns the columns and
    the warm start for the next solve. A float32 ``cost`` is read as it is (no float64 copy:
    half the memory traffic); prices, reduced costs and sums are float64 either way.
    """
    dtype = np.float32 if np.asarray(cost).dtype == np.float32 else np.float64
    cost = np.ascontiguousarray(cost, dtype=dtype)
    if cost.ndim != 2 or cost.shape[0] != cost.shape[1]:
        raise ValueError(f"cost must be a square matrix, got shape {cost.shape}")
    with np.errstate(over="ignore"):
        total = cost.sum(dtype=np.float64)
    if not np.isfinite(total):  # the fast check: NaN and inf entries make the sum non-finite
        if not np.isfinite(cost).all():
            raise ValueError("cost must be finite; it has NaN or infinite entries")
        raise ValueError(f"cost entries up to {np.abs(cost).max():.3g} overflow float64 sums")
    n = cost.shape[0]
    if warm is None:
        prices, init = np.zeros(n), np.full(n, -1, np.int64)
    elif warm.prices.shape != (n,) or warm.columns.shape != (n,):
        raise ValueError(f"warm start is for size {len(warm.prices)}, the matrix is {n}x{n}")
    elif warm.columns.size and not (-1 <= warm.columns.min() and warm.columns.max() < n):
        raise ValueError(f"warm start columns must lie in [-1, {n - 1}]")
    elif not np.isfinite(warm.prices).all():
        raise ValueError("warm start prices must be finite; they have NaN or infinite entries")
    else:
        prices, init = warm.prices.astype(np.float64, copy=True), warm.columns.astype(np.int64)
    if n == 0:
        return np.zeros(0, np.int64), WarmStart(prices, init)
    columns = _solve(cost, -1.0 if maximize else 1.0, prices, init)
    return columns, WarmStart(prices, columns.copy())
