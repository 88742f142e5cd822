"""``fedlmc.simulations.report.data``: the per-layer mean of the rows' lists, where a residual
network's rows leave LEWC's lists empty."""

from __future__ import annotations

import math

import numpy as np

from fedlmc.simulations.report.data import mean_of_lists


def test_the_mean_of_lists_skips_missing_lists_and_nan_entries():
    assert np.array_equal(mean_of_lists([[1.0, 2.0, 9.0], [3.0, math.nan]]), [2.0, 2.0])
    assert np.array_equal(mean_of_lists([None, [1.0, 2.0], [3.0, 4.0]]), [2.0, 3.0])
    assert mean_of_lists([None, None]).size == 0  # LEWC's columns on a ViT: nothing to draw
