"""Image-classification data sets through Hugging Face ``datasets`` (Flower's data path).

:func:`load_hf_dataset` backs ``fedlmc.data.load_dataset("hf:NAME", root, ...)``. ``NAME`` is

- a local path (checked first): a ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``
  folder (read with ``datasets.load_from_disk``), a ``.parquet`` file (the training split), or
  a folder of data files that ``datasets.load_dataset(folder)`` understands (parquet files named
  by split, e.g. ``train.parquet`` / ``test.parquet``; an image folder ...);
- otherwise a hub name (``"hf:uoft-cs/cifar10"``, ``"hf:ylecun/mnist"``), read with
  ``datasets.load_dataset(NAME)`` as ``flwr_datasets.FederatedDataset`` does.

``root`` is ``datasets``' ``cache_dir`` for hub names and data-file folders (``None``: its
default, ``$HF_DATASETS_CACHE`` or ``~/.cache/huggingface/datasets``); nothing else is cached.

Columns: ``image_key`` / ``label_key`` name them; otherwise the image column is the one
``Image`` feature (else the first of ``IMAGE_COLUMNS`` present) and the label column the one
``ClassLabel`` feature (else the first of ``LABEL_COLUMNS`` present, e.g. CIFAR-100's
``fine_label``). String labels are encoded as classes (sorted, the same mapping for all splits).
Images must all have one size: ``Image`` features are decoded with PIL (grayscale modes as
``"L"``, one channel; everything else as ``"RGB"``); array columns may hold ``(H, W)`` or
``(H, W, C)`` examples.

Splits: ``"train"`` (or the only split) trains; ``"test"`` tests. Without a ``"test"`` split,
``HF_TEST_FRACTION`` (20 %) of the training split is held out as the test set (stratified, with
the fixed seed ``HF_TEST_SPLIT_SEED``, independent of ``seed``). Then, as for every data set,
``server_fraction`` of the rest (stratified, chosen with ``seed``) becomes ``server``.

Tensors: ``x`` float32 ``(N, C, H, W)`` standardised per channel with the mean and standard
deviation of the whole training split (train + server; a constant channel keeps std 1);
``y`` int64. ``num_classes`` is the ``ClassLabel``'s, else ``max(label) + 1`` over train and test.
``augment`` is ``None``.

Untrusted folders: nothing read here unpickles or runs code (``datasets`` 4.8, ``pyarrow`` 26,
checked in their sources and by ``tests/fedlmc/data/test_hf_untrusted.py``). A
``save_to_disk`` folder is JSON (``state.json``, ``dataset_info.json``, features included)
and Arrow files; a file is refused unless ``.parquet`` or ``.arrow``; a folder's builder is
picked by its data files' extensions (csv, json, parquet, arrow, text, images, webdataset
tars whose decoders load ``.npy`` without pickles and ``.pth`` with ``weights_only``, ...), and
no extension picks the ``pandas`` builder, the one that calls ``pd.read_pickle``; a folder with
a loading script (``NAME/NAME.py``) is refused by ``datasets`` (one ``ValueError`` line here).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedlmc.data.catalog import HF_PREFIX, is_hf_name
from fedlmc.data.splits import DataSplits, stratified_split, with_server_split

__all__ = [
    "HF_TEST_FRACTION",
    "HF_TEST_SPLIT_SEED",
    "IMAGE_COLUMNS",
    "LABEL_COLUMNS",
    "detect_columns",
    "load_hf_dataset",
    "load_hf_splits",
]

HF_TEST_FRACTION = 0.2
HF_TEST_SPLIT_SEED = 5000  # fixed: the held-out test set never depends on `seed`
IMAGE_COLUMNS: tuple[str, ...] = ("img", "image", "images", "pixel_values", "pixels", "x")
LABEL_COLUMNS: tuple[str, ...] = ("label", "labels", "fine_label", "class", "target", "y")
_GRAY_MODES = ("1", "L", "LA", "I", "I;16", "F")


def load_hf_dataset(
    name: str,
    root: str | os.PathLike | None = None,
    *,
    image_key: str | None = None,
    label_key: str | None = None,
    server_fraction: float = 0.1,
    seed: int = 0,
) -> DataSplits:
    """``"hf:NAME"`` as a normalised :class:`~fedlmc.data.DataSplits` (see the module doc)."""
    if not is_hf_name(name):
        raise ValueError(f"dataset {name!r} is not a Hugging Face name; allowed: 'hf:NAME'")
    splits = load_hf_splits(name[len(HF_PREFIX) :], root)
    train_ds, test_ds = _train_and_test(splits, name)
    image_key, label_key = detect_columns(train_ds.features, image_key, label_key, name=name)
    if test_ds is not None and {image_key, label_key} - set(test_ds.column_names):
        raise ValueError(
            f"{name} split 'test' lacks {image_key!r} or {label_key!r}; "
            f"its columns: {test_ds.column_names}"
        )
    train_ds, test_ds = _encode_string_labels(train_ds, test_ds, label_key)
    x_train, y_train = _arrays(train_ds, image_key, label_key, name)
    if test_ds is None:
        keep, held = stratified_split(y_train, HF_TEST_FRACTION, HF_TEST_SPLIT_SEED)
        x_test, y_test = x_train[held], y_train[held]
        x_train, y_train = x_train[keep], y_train[keep]
    else:
        x_test, y_test = _arrays(test_ds, image_key, label_key, name)
    if x_train.shape[1:] != x_test.shape[1:]:
        raise ValueError(
            f"{name}: train images are {x_train.shape[1:]} but test images {x_test.shape[1:]}"
        )
    num_classes = _num_classes(train_ds.features[label_key], y_train, y_test, name)
    x_train_t, x_test_t = (torch.from_numpy(x).to(torch.float32) for x in (x_train, x_test))
    mean, std = channel_statistics(x_train_t)
    train = (_standardise_(x_train_t, mean, std), torch.from_numpy(y_train))
    test = (_standardise_(x_test_t, mean, std), torch.from_numpy(y_test))
    return with_server_split(
        name,
        train,
        test,
        num_classes=num_classes,
        server_fraction=server_fraction,
        seed=seed,
        augment=None,
    )


def load_hf_splits(spec: str, cache_dir: str | os.PathLike | None = None):
    """``spec`` (a local path or a hub name) as a ``datasets.DatasetDict`` (a single
    ``Dataset`` becomes ``{"train": ...}``); errors become one-line ``ValueError`` s."""
    import datasets

    path = Path(spec).expanduser()
    cache = None if cache_dir is None else str(Path(cache_dir).expanduser())
    if not path.exists() and _looks_like_path(spec):
        raise ValueError(f"'hf:{spec}': no such file or folder {str(path)!r}")
    builder = _file_builder(path) if path.is_file() else None
    try:
        if _is_saved_to_disk(path):
            loaded = datasets.load_from_disk(str(path))
        elif path.is_file():
            loaded = datasets.load_dataset(
                builder, data_files={"train": str(path)}, cache_dir=cache
            )
        elif path.is_dir():
            loaded = datasets.load_dataset(str(path), cache_dir=cache)
        else:
            loaded = datasets.load_dataset(spec, cache_dir=cache)
    # RuntimeError: a folder with a loading script (datasets 4 runs none); ConnectionError is
    # an OSError
    except (OSError, ValueError, TypeError, KeyError, RuntimeError) as err:
        raise ValueError(f"cannot load 'hf:{spec}' with datasets: {_one_line(err)}") from err
    if isinstance(loaded, datasets.Dataset):
        loaded = datasets.DatasetDict(train=loaded)
    return loaded


def detect_columns(
    features: Any,
    image_key: str | None = None,
    label_key: str | None = None,
    *,
    name: str = "the data set",
) -> tuple[str, str]:
    """``(image_key, label_key)``: the given names, checked against ``features`` (a
    ``datasets.Features``), or detected as the module doc says; ``ValueError`` lists the columns."""
    from datasets import ClassLabel, Image

    columns = list(features)
    described = ", ".join(f"{c} ({type(features[c]).__name__})" for c in columns)
    for what, key in (("image_key", image_key), ("label_key", label_key)):
        if key is not None and key not in columns:
            raise ValueError(f"{what}={key!r} is not a column of {name}; columns: {described}")
    if image_key is None:
        image_key = _pick(
            columns, IMAGE_COLUMNS, [c for c in columns if isinstance(features[c], Image)]
        )
    if label_key is None:
        class_labels = [c for c in columns if isinstance(features[c], ClassLabel)]
        label_key = _pick(columns, LABEL_COLUMNS, class_labels)
    for what, key in (("image", image_key), ("label", label_key)):
        if key is None:
            raise ValueError(
                f"cannot tell which column of {name} holds the {what}s; columns: {described}; "
                f"pass {what}_key"
            )
    if image_key == label_key:
        raise ValueError(f"{name}: image and label column are both {image_key!r}")
    return image_key, label_key


def channel_statistics(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and standard deviation (float64, shape ``(C,)``) of ``(N, C, H, W)``
    values; a constant channel gets std 1 so that standardising it gives zeros."""
    means, stds = [], []
    for c in range(x.shape[1]):
        channel = x[:, c]
        mean = channel.mean(dtype=torch.float64)
        var = (channel - mean.to(channel.dtype)).square().mean(dtype=torch.float64)
        means.append(mean)
        stds.append(var.sqrt() if var > 0 else torch.tensor(1.0, dtype=torch.float64))
    return torch.stack(means), torch.stack(stds)


# --- helpers -----------------------------------------------------------------------------------


def _pick(columns: list[str], common: tuple[str, ...], typed: list[str]) -> str | None:
    """The typed column if there is exactly one, else the first common name among the typed
    columns, else the first common name among all columns."""
    if len(typed) == 1:
        return typed[0]
    for pool in (typed, columns):
        found = [c for c in common if c in pool]
        if found:
            return found[0]
    return None


def _train_and_test(splits, name: str):
    """(train, test or None) from a DatasetDict: ``"train"`` (or the only split) and ``"test"``."""
    keys = list(splits)
    if "train" in splits:
        train_key = "train"
    elif len(keys) == 1:
        train_key = keys[0]
    else:
        raise ValueError(f"{name} has no 'train' split; its splits: {keys}")
    return splits[train_key], splits["test"] if "test" in splits and train_key != "test" else None


def _arrays(ds, image_key: str, label_key: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """``(pixels (N, C, H, W), labels int64 (N,))`` as numpy arrays."""
    if len(ds) == 0:
        raise ValueError(f"{name}: a split is empty; at least one example is required")
    return _images(ds, image_key, name), _labels(ds, label_key, name)


def _images(ds, key: str, name: str) -> np.ndarray:
    from datasets import Image

    if isinstance(ds.features[key], Image):
        first = ds[0][key]
        mode = "L" if first.mode in _GRAY_MODES else "RGB"
        ds = ds.cast_column(key, Image(mode=mode))
    try:
        pixels = np.asarray(ds.with_format("numpy")[key])
    except ValueError as err:
        raise ValueError(f"{name}: column {key!r} does not hold images of one size: {err}") from err
    if pixels.dtype == object:
        shapes = sorted({np.shape(p) for p in pixels})[:3]
        raise ValueError(
            f"{name}: column {key!r} holds images of different sizes {shapes}; resize them first"
        )
    if pixels.ndim == 3:
        pixels = pixels[:, None]
    elif pixels.ndim == 4:
        pixels = pixels.transpose(0, 3, 1, 2)
    else:
        raise ValueError(
            f"{name}: column {key!r} has examples of shape {pixels.shape[1:]}; "
            f"allowed (H, W) or (H, W, C) images"
        )
    if not (np.issubdtype(pixels.dtype, np.number) or pixels.dtype == bool):
        raise ValueError(f"{name}: column {key!r} has dtype {pixels.dtype}; allowed numbers")
    return np.ascontiguousarray(pixels)


def _encode_string_labels(train_ds, test_ds, key: str):
    """Cast a string label column to one ``ClassLabel`` (sorted names of both splits)."""
    from datasets import ClassLabel

    if getattr(train_ds.features[key], "dtype", None) != "string":
        return train_ds, test_ds
    present = [ds for ds in (train_ds, test_ds) if ds is not None]
    names = sorted({str(v) for ds in present for v in ds.unique(key)})
    encoded = [ds.cast_column(key, ClassLabel(names=names)) for ds in present]
    return encoded[0], (encoded[1] if test_ds is not None else None)


def _labels(ds, key: str, name: str) -> np.ndarray:
    labels = np.asarray(ds.with_format("numpy")[key])
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"{name}: label column {key!r} has dtype {labels.dtype} and shape {labels.shape}; "
            f"allowed one integer (or class name) per example"
        )
    return labels.astype(np.int64)


def _num_classes(feature, y_train: np.ndarray, y_test: np.ndarray, name: str) -> int:
    from datasets import ClassLabel

    top = int(max(y_train.max(), y_test.max()))
    num_classes = feature.num_classes if isinstance(feature, ClassLabel) else top + 1
    low = int(min(y_train.min(), y_test.min()))
    if low < 0 or top >= num_classes:
        raise ValueError(f"{name} has labels in [{low}, {top}]; allowed [0, {num_classes})")
    return int(num_classes)


def _standardise_(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """``(x - mean_c) / std_c`` in place on a float32 ``(N, C, H, W)`` tensor; returns ``x``."""
    x.sub_(mean.to(x.dtype).view(1, -1, 1, 1)).div_(std.to(x.dtype).view(1, -1, 1, 1))
    return x


def _is_saved_to_disk(path: Path) -> bool:
    return path.is_dir() and any((path / f).is_file() for f in ("dataset_dict.json", "state.json"))


def _file_builder(path: Path) -> str:
    """``datasets``' packaged builder for a single data file, by its suffix."""
    builder = path.suffix.lstrip(".").lower()
    if builder not in ("parquet", "arrow"):
        raise ValueError(f"'hf:{path}' is a {path.suffix!r} file; allowed: .parquet or .arrow")
    return builder


def _looks_like_path(spec: str) -> bool:
    return spec.startswith(("/", "./", "../", "~")) or spec.endswith((".parquet", ".arrow"))


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__
