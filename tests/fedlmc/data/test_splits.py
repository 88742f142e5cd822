"""fedlmc.data.splits: the stratified held-out split holds out exactly ``round(f N)`` examples,
each class its largest-remainder share, disjoint from the kept ones and the same for a seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlmc.data.splits import DataSplits, stratified_split, with_server_split

LABELS = np.repeat([0, 1, 2], [50, 30, 7])  # 87 examples, unequal classes


def test_the_split_is_disjoint_complete_and_of_the_rounded_size():
    keep, held = stratified_split(LABELS, 0.1, seed=0)
    assert len(held) == round(0.1 * len(LABELS)) == 9
    assert sorted(np.concatenate([keep, held]).tolist()) == list(range(len(LABELS)))
    assert keep.dtype == held.dtype == np.int64


def test_each_class_gives_its_floor_share_plus_one_by_largest_remainder():
    _, held = stratified_split(LABELS, 0.1, seed=3)
    # quotas 5.0, 3.0, 0.7: floors 5, 3, 0 and the one missing example goes to class 2
    assert np.bincount(LABELS[held], minlength=3).tolist() == [5, 3, 1]


def test_the_split_is_deterministic_for_a_seed_and_differs_between_seeds():
    a = stratified_split(LABELS, 0.25, seed=1)
    b = stratified_split(LABELS, 0.25, seed=1)
    c = stratified_split(LABELS, 0.25, seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[1], c[1])
    assert not np.array_equal(np.sort(a[1]), a[1])  # a random order, not sorted


def test_with_server_split_moves_the_held_examples_to_the_server_part():
    x = torch.arange(len(LABELS), dtype=torch.float32).reshape(-1, 1, 1, 1)
    y = torch.from_numpy(LABELS)
    test = (x[:5], y[:5])
    splits = with_server_split(
        "toy", (x, y), test, num_classes=3, server_fraction=0.2, seed=0, augment=None
    )
    assert isinstance(splits, DataSplits) and splits.test is test
    assert len(splits.server[1]) == round(0.2 * len(LABELS))
    seen = torch.cat([splits.train[0], splits.server[0]]).flatten().long()
    assert sorted(seen.tolist()) == list(range(len(LABELS)))
    assert torch.equal(y[seen[: len(splits.train[1])]], splits.train[1])  # labels travel along
    assert splits.in_shape == (1, 1, 1)
    assert splits.summary().startswith("toy: train 70, server 17, test 5, classes 3")


def test_a_server_fraction_that_leaves_no_training_example_is_refused():
    x, y = torch.zeros(4, 1, 2, 2), torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match="server_fraction=1.0 leaves no training example out of 4"):
        with_server_split(
            "toy", (x, y), (x, y), num_classes=2, server_fraction=1.0, seed=0, augment=None
        )
