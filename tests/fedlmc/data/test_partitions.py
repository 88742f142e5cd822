"""fedlmc.data.partitions: every scheme's parts are disjoint (or the whole pool for ``full``),
cover the pool, are seeded, and have the label structure the scheme promises."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlmc.data.catalog import PARTITION_SCHEMES
from fedlmc.data.partitions import label_counts, label_skew, partition, partition_indices

LABELS = np.repeat(np.arange(10), 40)  # 400 examples, 10 classes


@pytest.mark.parametrize("scheme", [s for s in PARTITION_SCHEMES if s != "full"])
def test_a_federated_scheme_gives_disjoint_parts_that_cover_the_pool(scheme):
    parts = partition_indices(LABELS, 10, scheme, alpha=1.0, classes_per_client=3, seed=0)
    assert len(parts) == 10 and all(len(p) > 0 for p in parts)
    flat = np.concatenate(parts)
    assert len(flat) == len(set(flat.tolist())) == len(LABELS)


def test_iid_parts_are_near_equal():
    sizes = [len(p) for p in partition_indices(LABELS, 3, "iid", seed=0)]
    assert sum(sizes) == 400 and max(sizes) - min(sizes) <= 1


def test_full_gives_every_client_the_whole_pool_in_one_seeded_order():
    parts = partition_indices(LABELS, 3, "full", seed=5)
    assert all(np.array_equal(p, parts[0]) for p in parts)
    assert sorted(parts[0].tolist()) == list(range(400))


def test_pathological_clients_see_exactly_their_classes_and_unheld_classes_are_dropped():
    parts = partition_indices(LABELS, 10, "pathological", classes_per_client=2, seed=1)
    assert [len(np.unique(LABELS[p])) for p in parts] == [2] * 10
    with pytest.warns(UserWarning, match="examples of classes held by no client are dropped"):
        few = partition_indices(LABELS, 2, "pathological", classes_per_client=2, seed=1)
    assert sum(len(p) for p in few) == 4 * 40


@pytest.mark.parametrize("scheme", ["iid", "dirichlet", "shard"])
def test_a_partition_is_deterministic_for_a_seed(scheme):
    a = partition_indices(LABELS, 4, scheme, seed=7)
    b = partition_indices(LABELS, 4, scheme, seed=7)
    c = partition_indices(LABELS, 4, scheme, seed=8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("scheme", [s for s in PARTITION_SCHEMES if s != "full"])
def test_the_split_is_flower_datasets_own_on_its_default_table(scheme):
    """The partitioners read an Arrow-formatted index table (one array per column read); the
    parts are exactly what the same partitioner gives on the default-format table, read row by
    row: the same indices in the same order."""
    import warnings

    from fedlmc.data.partitions import _index_dataset, _make_partitioner

    labels = np.random.default_rng(3).integers(0, 10, 600)
    order = np.random.default_rng(2).permutation(len(labels))
    flower = _make_partitioner(scheme, 4, 0.5, 3, 2, 10, len(labels))
    flower.dataset = _index_dataset(order, labels[order]).with_format(None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pathological: the classes held by no client
        ours = partition_indices(labels, 4, scheme, alpha=0.5, classes_per_client=3, seed=2)
        theirs = [np.asarray(flower.load_partition(i)["idx"]) for i in range(4)]
    assert len(ours) == 4
    for mine, reference in zip(ours, theirs, strict=True):
        assert mine.dtype == np.int64 and np.array_equal(mine, reference)


def test_partition_indexes_images_and_labels_together():
    x = torch.arange(400, dtype=torch.float32).reshape(400, 1)
    y = torch.from_numpy(LABELS)
    for px, py in partition((x, y), 3, "dirichlet", alpha=0.5, seed=0):
        assert torch.equal(y[px[:, 0].long()], py)


def test_label_counts_and_skew_of_hand_made_parts():
    parts = [torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1])]
    assert label_counts(parts, 2).tolist() == [[2, 2], [2, 2]]
    assert label_skew(label_counts(parts, 2)) == 0.0
    disjoint = label_counts([torch.tensor([0, 0]), torch.tensor([1, 1])], 2)
    assert label_skew(disjoint) == pytest.approx(0.5)  # each client is 1/2 away in TV distance
    with pytest.raises(ValueError, match=r"labels in \[0, 3\], outside \[0, 2\)"):
        label_counts([torch.tensor([0, 3])], 2)


def test_dirichlet_skew_grows_as_alpha_shrinks():
    def skew(alpha: float) -> float:
        parts = partition_indices(LABELS, 4, "dirichlet", alpha=alpha, seed=0)
        return label_skew(label_counts([torch.from_numpy(LABELS[p]) for p in parts], 10))

    assert skew(0.1) > skew(100.0)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"scheme": "random"}, "random"),
        ({"num_clients": 0}, "0"),
        ({"min_partition_size": 1000}, "min_partition_size=1000"),
    ],
)
def test_bad_arguments_are_refused_with_the_bad_value(kwargs, named):
    args = {"num_clients": 4, "scheme": "iid", **kwargs}
    with pytest.raises(ValueError, match=named):
        partition_indices(LABELS, args.pop("num_clients"), args.pop("scheme"), **args)
