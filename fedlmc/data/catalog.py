"""Names and sizes of the data sets, importable without torch (for config validation and the CLI).

- ``DATASETS``: the built-in names :func:`fedlmc.data.load_dataset` accepts; besides them any
  ``"hf:NAME"`` (:func:`is_hf_name`) loads an image-classification data set through Hugging Face
  ``datasets`` (a hub name or a local path, see :mod:`fedlmc.data.hf`).
- ``DOWNLOADABLE``: the names :func:`fedlmc.data.download.fetch_dataset` can fetch (torchvision's
files).
- ``PARTITION_SCHEMES``: the client partition schemes of :func:`fedlmc.data.partitions.partition`.
- ``NUM_CLASSES``, ``TRAIN_SIZES`` (training-set sizes before the server split),
  ``DATA_FOLDERS`` (where under ``root`` torchvision's loaders read each data set's files).

An ``"hf:"`` data set's class count and size are known only once it is loaded.
"""

from __future__ import annotations

import os

__all__ = [
    "DATASETS",
    "DATA_FOLDERS",
    "DOWNLOADABLE",
    "HF_PREFIX",
    "NUM_CLASSES",
    "PARTITION_SCHEMES",
    "TRAIN_SIZES",
    "absolute_hf_name",
    "check_dataset_name",
    "is_hf_name",
    "is_known_dataset",
]

DATASETS: tuple[str, ...] = ("mnist5k", "mnist", "fashion_mnist", "cifar10", "cifar100")
DOWNLOADABLE: tuple[str, ...] = ("mnist", "fashion_mnist", "cifar10", "cifar100")
PARTITION_SCHEMES: tuple[str, ...] = ("iid", "dirichlet", "pathological", "shard", "full")
NUM_CLASSES: dict[str, int] = {
    "mnist5k": 10,
    "mnist": 10,
    "fashion_mnist": 10,
    "cifar10": 10,
    "cifar100": 100,
}
TRAIN_SIZES: dict[str, int] = {
    "mnist5k": 4000,
    "mnist": 60000,
    "fashion_mnist": 60000,
    "cifar10": 50000,
    "cifar100": 50000,
}
DATA_FOLDERS: dict[str, str] = {
    "mnist": "MNIST/raw",
    "fashion_mnist": "FashionMNIST/raw",
    "cifar10": "cifar-10-batches-py",
    "cifar100": "cifar-100-python",
}
HF_PREFIX = "hf:"


def is_hf_name(name: object) -> bool:
    """True for ``"hf:NAME"`` with a non-empty ``NAME`` (a Hugging Face data set)."""
    return isinstance(name, str) and name.startswith(HF_PREFIX) and bool(name[len(HF_PREFIX) :])


def is_known_dataset(name: object) -> bool:
    """True for a name ``load_dataset`` accepts: one of ``DATASETS`` or ``hf:NAME``."""
    return name in DATASETS or is_hf_name(name)


def check_dataset_name(name: object) -> str:
    """``name`` if :func:`is_known_dataset`, else ``ValueError`` saying what is allowed."""
    if is_known_dataset(name):
        return name  # type: ignore[return-value]
    if name == HF_PREFIX:
        raise ValueError(
            "dataset 'hf:' names no data set; allowed: 'hf:NAME' with a hub name or a local path"
        )
    raise ValueError(
        f"unknown dataset {name!r}; allowed: {', '.join(DATASETS)}, "
        f"or 'hf:NAME' (a Hugging Face hub name or local path)"
    )


def absolute_hf_name(name: str) -> str:
    """``"hf:PATH"`` with ``PATH`` made absolute when it is an existing local file or folder
    (clients may run in another working directory); any other name is returned unchanged."""
    if not is_hf_name(name):
        return name
    path = os.path.expanduser(name[len(HF_PREFIX) :])
    return HF_PREFIX + os.path.abspath(path) if os.path.exists(path) else name
