"""The convergence rules of :mod:`fedlmc.analysis.convergence` on hand-built loss curves."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fedlmc.analysis.convergence import (
    curve_summary,
    judged,
    last_epochs_drop,
    settled_epoch,
    still_falling,
)


def test_convergence_rules_on_hand_built_curves():
    settling = [2.0, 1.0, 0.5, 0.498, 0.497, 0.4965]  # changes 50 %, 50 %, then below 1 %
    assert settled_epoch(settling) == 3.0 and not still_falling(settling)
    falling = [2.0, 1.5, 1.2, 1.0, 0.9, 0.8]  # 20 % over the last 2 epochs
    assert math.isnan(settled_epoch(falling)) and still_falling(falling)
    assert last_epochs_drop(falling) == pytest.approx(0.2)
    assert not still_falling([1.0, 1.0, 1.0, 0.96])  # 4 %: below the 5 % threshold
    assert settled_epoch([1.0, 0.999, 0.5, 0.4999]) == 3.0  # a late jump resets it


def test_a_two_epoch_curve_is_neither_converged_nor_not():
    """The still-falling rule measures the last 2 epochs' drop from epoch E-2: a 2-epoch curve
    has no epoch 0, so the rule is undefined. It must say so (``judged`` false) rather than
    count the curve as converged, however steeply it fell (2.3 -> 1.46 is a 37 % drop)."""
    steep = [2.3, 1.46]
    assert math.isnan(last_epochs_drop(steep)) and not judged(steep)
    assert not still_falling(steep) and math.isnan(settled_epoch(steep))
    assert judged([2.3, 1.46, 1.2]) and still_falling([2.3, 1.46, 1.2])
    curves = pd.DataFrame(
        {"client": [0, 0, 1, 1], "step": [1, 2, 1, 2], "train_loss": [2.3, 1.46, 2.2, 2.19]}
    )
    summary = curve_summary(curves, ["client"])
    assert summary["epochs"].tolist() == [2, 2]
    assert not summary["judged"].any() and not summary["not_converged"].any()
    # the settled rule is defined from 2 epochs on: 2.2 -> 2.19 changed by less than 1 %
    assert math.isnan(summary["settled_epoch"][0]) and summary["settled_epoch"][1] == 1.0
