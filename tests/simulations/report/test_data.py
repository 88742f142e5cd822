"""``fedlmc.simulations.report.data``: the per-layer mean of the rows' lists, where a residual
network's rows leave LEWC's lists empty; the reference accuracies' table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from fedlmc.simulations.report.data import mean_of_lists, reference_table


def test_the_mean_of_lists_skips_missing_lists_and_nan_entries():
    assert np.array_equal(mean_of_lists([[1.0, 2.0, 9.0], [3.0, math.nan]]), [2.0, 2.0])
    assert np.array_equal(mean_of_lists([None, [1.0, 2.0], [3.0, 4.0]]), [2.0, 3.0])
    assert mean_of_lists([None, None]).size == 0  # LEWC's columns on a ViT: nothing to draw


def test_the_reference_table_has_every_ensemble_the_rows_carry():
    """report.md's reference accuracies: the equal-weight and the per-member calibrated
    ensemble beside the sample-count-weighted one, averaged over the seeds per width."""
    rows = pd.DataFrame(
        {
            "cell_id": ["a", "b"],
            "width": [1.0, 1.0],
            "endpoint_acc_mean": [0.5, 0.7],
            "ensemble_acc": [0.6, 0.8],
            "ensemble_equal_acc": [0.9, 0.7],
            "ensemble_calibrated_acc": [0.7, 0.9],
        }
    )
    table = reference_table(rows)
    assert list(table.index) == [
        "endpoint_acc_mean",
        "ensemble_acc",
        "ensemble_equal_acc",
        "ensemble_calibrated_acc",
    ]
    assert table[1.0].tolist() == pytest.approx([0.6, 0.7, 0.8, 0.8])
