"""Clients' partitions kept on disk: :func:`cached_partition_indices`.

A partition is a pure function of the labels and the scheme's arguments
(:func:`fedlmc.data.partitions.partition_indices`), but computing one imports flwr-datasets and
Hugging Face ``datasets`` (about 3 s of a fresh process on a 2-core machine, where the indexing
itself takes milliseconds). A Flower SuperNode starts a new ClientApp process for every message
it answers (the training, each temperature query, each statistics request), and each of them
needs its client's partition again, so the partitions are written once to
``$FEDLMC_CACHE/partitions/`` (:func:`fedlmc.data.cache_dir`) and read back without that import.

The file's name is a SHA-256 of everything the partition depends on: the labels' bytes, the
scheme and its arguments, and the versions of flwr-datasets and numpy that compute it (so an
upgrade computes it again). A file is read with ``allow_pickle=False`` and used only when it
holds what a partition must be (one non-empty part per client, disjoint indices into the
labels); anything else (a truncated, foreign or hand-edited file) is ignored and the partition
computed again. A cache folder that cannot be written costs the computation, never an error.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import zipfile
from pathlib import Path

import numpy as np

from fedlmc.data.partitions import invalid_parts, partition_indices, warn_dropped
from fedlmc.io import atomic_write_npz

FORMAT = "fedlmc-partition-v1"
"""Changes when the file's layout or the key's fields change."""


def cached_partition_indices(
    labels: np.ndarray,
    num_clients: int,
    scheme: str = "iid",
    *,
    alpha: float = 0.5,
    classes_per_client: int = 2,
    seed: int = 0,
    cache: str | Path | None = None,
) -> list[np.ndarray]:
    """:func:`~fedlmc.data.partitions.partition_indices` of the same arguments, read from
    ``cache`` (default ``$FEDLMC_CACHE/partitions``) when computed there before, else computed
    and written there (module doc)."""
    y = np.ascontiguousarray(np.asarray(labels), dtype=np.int64)
    args = dict(alpha=alpha, classes_per_client=classes_per_client, seed=seed)
    if scheme == "full":  # no partitioner: nothing to save
        return partition_indices(y, num_clients, scheme, **args)
    if cache is None:
        from fedlmc.data.loading import cache_dir

        cache = cache_dir() / "partitions"
    path = Path(cache) / f"{partition_key(y, num_clients, scheme, **args)}.npz"
    parts = read_partition(path, len(y), num_clients)
    if parts is not None:
        warn_dropped(parts, len(y), scheme, stacklevel=3)
        return parts
    parts = partition_indices(y, num_clients, scheme, **args)
    try:
        write_partition(path, parts)
    except OSError:  # a read-only or full cache folder: computed each time
        pass
    return parts


def partition_key(
    labels: np.ndarray,
    num_clients: int,
    scheme: str,
    *,
    alpha: float,
    classes_per_client: int,
    seed: int,
) -> str:
    """Hex SHA-256 of the int64 ``labels`` and every argument and version the partition
    depends on."""
    fields = (
        FORMAT,
        _version("flwr-datasets"),
        np.__version__,
        scheme,
        int(num_clients),
        float(alpha).hex(),
        int(classes_per_client),
        int(seed),
        len(labels),
    )
    digest = hashlib.sha256(repr(fields).encode())
    digest.update(np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    return digest.hexdigest()


def write_partition(path: Path, parts: list[np.ndarray]) -> None:
    """Save ``parts`` as one ``indices`` array and the parts' ``sizes`` (atomically)."""
    indices = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    atomic_write_npz(path, indices=indices, sizes=sizes)


def read_partition(path: Path, n: int, num_clients: int) -> list[np.ndarray] | None:
    """The parts saved at ``path``, or ``None`` when the file is missing, unreadable or does not
    hold ``num_clients`` non-empty, disjoint parts of indices in ``[0, n)``."""
    try:
        with np.load(path, allow_pickle=False) as f:
            indices, sizes = f["indices"], f["sizes"]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # pickles: ValueError
        return None
    valid = (
        indices.dtype == np.int64
        and sizes.dtype == np.int64
        and indices.ndim == 1
        and sizes.shape == (num_clients,)
        and bool(((sizes >= 0) & (sizes <= len(indices))).all())
        and int(sizes.sum()) == len(indices)
    )
    if not valid:
        return None
    parts = list(np.split(indices, np.cumsum(sizes)[:-1]))
    return None if invalid_parts(parts, n) else parts


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "none"
