"""Tests of the Hugging Face path, load_dataset("hf:..."): small image data sets written here
with `datasets` (save_to_disk, parquet files) and read back through the real loaders."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
from PIL import Image as PILImage

from fedlmc.data.hf import HF_TEST_FRACTION, detect_columns
from fedlmc.data.loading import label_counts, load_dataset, partition

if TYPE_CHECKING:
    from datasets import Dataset

CLASS_NAMES = ["cat", "dog", "frog", "ship", "unused"]  # 5 classes, the last never occurs


def rgb_split(rng, n: int) -> tuple[np.ndarray, np.ndarray, Dataset]:
    """n random 8x8 RGB images, labels 0..3 balanced, a ClassLabel of 5 names and an extra
    integer column ``coarse`` (= label // 2)."""
    from datasets import ClassLabel, Dataset, Features, Image, Value

    pixels = rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8)
    labels = rng.permutation(np.arange(n) % 4)
    features = Features(
        {"img": Image(), "label": ClassLabel(names=CLASS_NAMES), "coarse": Value("int64")}
    )
    ds = Dataset.from_dict(
        {
            "img": [PILImage.fromarray(p) for p in pixels],
            "label": labels.tolist(),
            "coarse": (labels // 2).tolist(),
        },
        features=features,
    )
    return pixels, labels, ds


@pytest.fixture(scope="module")
def rgb(tmp_path_factory):
    """A DatasetDict (160 train / 40 test) saved to disk and as parquet files."""
    from datasets import DatasetDict

    folder = tmp_path_factory.mktemp("hf-rgb")
    rng = np.random.default_rng(0)
    x_tr, y_tr, train = rgb_split(rng, 160)
    x_te, y_te, test = rgb_split(rng, 40)
    DatasetDict(train=train, test=test).save_to_disk(str(folder / "disk"))
    (folder / "parquet").mkdir()
    train.to_parquet(str(folder / "parquet" / "train.parquet"))
    test.to_parquet(str(folder / "parquet" / "test.parquet"))
    train.to_parquet(str(folder / "train-only.parquet"))
    return {"folder": folder, "train": (x_tr, y_tr), "test": (x_te, y_te)}


def standardised(pixels_nhwc: np.ndarray, reference_nhwc: np.ndarray) -> torch.Tensor:
    """(pixels - mean_c) / std_c with the reference images' per-channel statistics."""
    ref = reference_nhwc.astype(np.float64)
    mean, std = ref.mean(axis=(0, 1, 2)), ref.std(axis=(0, 1, 2))
    x = (pixels_nhwc.astype(np.float64) - mean) / std
    return torch.from_numpy(x.transpose(0, 3, 1, 2))


def test_save_to_disk_folder_loads_normalised_splits(rgb):
    name = f"hf:{rgb['folder'] / 'disk'}"
    splits = load_dataset(name, server_fraction=0.25, seed=0)

    x_tr, y_tr = rgb["train"]
    x_te, y_te = rgb["test"]
    assert (splits.name, splits.in_shape, splits.num_classes, splits.augment) == (
        name,
        (3, 8, 8),
        5,  # from the ClassLabel, not max(label) + 1
        None,
    )
    assert (len(splits.train[1]), len(splits.server[1]), len(splits.test[1])) == (120, 40, 40)
    assert splits.train[0].dtype == torch.float32 and splits.train[1].dtype == torch.int64
    # test keeps its order; standardised with the training split's mean and std
    assert torch.equal(splits.test[1], torch.from_numpy(y_te))
    expected = standardised(x_te, x_tr)
    torch.testing.assert_close(splits.test[0].double(), expected, rtol=0, atol=1e-5)
    pool = torch.cat([splits.train[0], splits.server[0]]).double()
    torch.testing.assert_close(
        pool.mean(dim=(0, 2, 3)), torch.zeros(3, dtype=torch.float64), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        pool.std(dim=(0, 2, 3), correction=0), torch.ones(3, dtype=torch.float64), atol=1e-5, rtol=0
    )
    # the server split is stratified: 40 per class in the pool, a quarter held out
    assert torch.bincount(splits.server[1], minlength=5).tolist() == [10, 10, 10, 10, 0]
    assert sorted(torch.cat([splits.train[1], splits.server[1]]).tolist()) == sorted(y_tr.tolist())

    parts = partition(splits.train, 4, "pathological", classes_per_client=2, seed=0)
    counts = label_counts(parts, splits.num_classes)
    assert counts.sum() == 120 and ((counts > 0).sum(axis=1) == 2).all()
    assert sum(len(py) for _, py in partition(splits.train, 3, "iid")) == 120


def test_parquet_folder_and_file(rgb, tmp_path):
    disk = load_dataset(f"hf:{rgb['folder'] / 'disk'}", server_fraction=0.25, seed=0)
    cache = tmp_path / "hf-cache"
    parquet = load_dataset(f"hf:{rgb['folder'] / 'parquet'}", cache, server_fraction=0.25, seed=0)
    for a, b in zip(
        disk.train + disk.server + disk.test,
        parquet.train + parquet.server + parquet.test,
        strict=True,
    ):
        assert torch.equal(a, b)
    assert parquet.num_classes == 5  # the ClassLabel travels in the parquet metadata
    assert any(cache.iterdir())  # datasets' own Arrow cache went to root

    # one parquet file: the training split only; a stratified 20 % becomes the test set
    single = f"hf:{rgb['folder'] / 'train-only.parquet'}"
    a = load_dataset(single, cache, server_fraction=0.0, seed=0)
    b = load_dataset(single, cache, server_fraction=0.5, seed=1)
    held = round(HF_TEST_FRACTION * 160)
    assert (len(a.train[1]), len(a.test[1])) == (160 - held, held)
    assert torch.bincount(a.test[1], minlength=5).tolist() == [8, 8, 8, 8, 0]
    assert torch.equal(a.test[0], b.test[0])  # the held-out test set does not depend on seed
    assert len(b.train[1]) + len(b.server[1]) == 160 - held
    train_keys = {r.numpy().tobytes() for r in a.train[0]}
    assert not train_keys & {r.numpy().tobytes() for r in a.test[0]}


def test_grayscale_images_and_named_columns(tmp_path):
    from datasets import Dataset, DatasetDict, Features, Image, Value

    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 256, size=(60, 28, 28), dtype=np.uint8)
    digits = rng.permutation(np.arange(60) % 3)
    ds = Dataset.from_dict(
        {"picture": [PILImage.fromarray(p, mode="L") for p in pixels], "digit": digits.tolist()},
        features=Features({"picture": Image(), "digit": Value("int64")}),
    )
    path = tmp_path / "gray"
    DatasetDict(train=ds.select(range(45)), test=ds.select(range(45, 60))).save_to_disk(str(path))
    name = f"hf:{path}"

    # the image column is found by its Image feature; no label column can be told apart
    with pytest.raises(
        ValueError,
        match=r"holds the labels; columns: picture \(Image\), digit \(Value\); pass label_key",
    ):
        load_dataset(name)

    splits = load_dataset(name, label_key="digit", server_fraction=0.0)
    assert (splits.in_shape, splits.num_classes) == ((1, 28, 28), 3)  # max label + 1
    assert torch.equal(splits.test[1], torch.from_numpy(digits[45:]))
    expected = standardised(pixels[45:, :, :, None], pixels[:45, :, :, None])
    torch.testing.assert_close(splits.test[0].double(), expected, rtol=0, atol=1e-5)


def test_explicit_keys_and_bad_names(rgb):
    name = f"hf:{rgb['folder'] / 'disk'}"
    coarse = load_dataset(name, image_key="img", label_key="coarse", server_fraction=0.0)
    assert coarse.num_classes == 2
    assert torch.equal(coarse.test[1], torch.from_numpy(rgb["test"][1] // 2))

    with pytest.raises(
        ValueError,
        match=r"image_key='pixels' is not a column of hf:.*; "
        r"columns: img \(Image\), label \(ClassLabel\), coarse \(Value\)",
    ):
        load_dataset(name, image_key="pixels")
    with pytest.raises(ValueError, match="label_key='fine_label' is not a column"):
        load_dataset(name, label_key="fine_label")
    with pytest.raises(ValueError, match="no such file or folder"):
        load_dataset("hf:./no/such/folder")
    text_file = rgb["folder"] / "notes.txt"
    text_file.write_text("not images")
    with pytest.raises(ValueError, match=r"is a '\.txt' file; allowed: \.parquet or \.arrow"):
        load_dataset(f"hf:{text_file}")
    with pytest.raises(ValueError, match="image_key='img' applies to 'hf:' data sets only"):
        load_dataset("mnist5k", image_key="img")
    with pytest.raises(ValueError, match="'hf:' names no data set"):
        load_dataset("hf:")


def test_string_labels_share_one_class_mapping(tmp_path):
    from datasets import Dataset, DatasetDict

    rng = np.random.default_rng(2)
    pixels = rng.integers(0, 256, size=(30, 4, 4, 3), dtype=np.uint8)
    train = Dataset.from_dict(
        {"image": [PILImage.fromarray(p) for p in pixels[:20]], "label": ["b", "c"] * 10}
    )
    test = Dataset.from_dict(
        {"image": [PILImage.fromarray(p) for p in pixels[20:]], "label": ["a", "c"] * 5}
    )
    DatasetDict(train=train, test=test).save_to_disk(str(tmp_path / "s"))
    splits = load_dataset(f"hf:{tmp_path / 's'}", server_fraction=0.0)
    assert splits.num_classes == 3  # a, b, c over both splits
    assert torch.bincount(splits.train[1]).tolist() == [0, 10, 10]  # train order is shuffled
    assert splits.test[1].tolist() == [0, 2] * 5


def test_detect_columns_preferences():
    from datasets import ClassLabel, Features, Image, Value

    features = Features(
        {
            "img": Image(),
            "fine_label": ClassLabel(num_classes=100),
            "coarse_label": ClassLabel(num_classes=20),
        }
    )
    assert detect_columns(features) == ("img", "fine_label")  # CIFAR-100's columns
    assert detect_columns(features, label_key="coarse_label") == ("img", "coarse_label")
    assert detect_columns(Features({"x": Value("float32"), "y": Value("int64")})) == ("x", "y")
    with pytest.raises(ValueError, match=r"holds the images; columns: a \(Value\)"):
        detect_columns(Features({"a": Value("int64"), "label": Value("int64")}))


def test_an_hf_data_set_reaches_the_clients_through_the_run_config(rgb):
    """``dataset = "hf:PATH"`` with ``image-key``/``label-key``: what a client and the server
    load (fedlmc.simulations.task) is the same as load_dataset's, partitioned by the run config."""
    from fedlmc.simulations.config import absolute_paths, validate_run_config
    from fedlmc.simulations.task import client_data, load_splits

    folder = rgb["folder"] / "disk"
    config = validate_run_config(
        {
            "dataset": f"hf:{folder}",
            "image-key": "img",
            "label-key": "label",
            "num-clients": 2,
            "partition": "dirichlet",
            "alpha": 1.0,
        }
    )
    config = absolute_paths(config)
    splits = load_splits(config)
    direct = load_dataset(f"hf:{folder}", image_key="img", label_key="label")
    assert torch.equal(splits.train[0], direct.train[0])
    parts = [client_data(config, i, 2) for i in range(2)]
    assert sum(len(y) for _, y in parts) == len(splits.train[1])
