"""Splitting a training pool among federated clients, through flwr-datasets partitioners.

Only the example indices and labels go through a ``datasets.Dataset`` (built in memory with
``Dataset.from_dict``); the image tensors are then indexed once per client, so no pixels pass
through Arrow. Every scheme first permutes the pool with ``seed`` (flwr's ``IidPartitioner``
does not shuffle, and the order inside a class decides which examples a client gets).

Schemes (``PARTITION_SCHEMES``):

- ``"iid"``: ``IidPartitioner``; contiguous, near-equal slices of the shuffled pool.
- ``"dirichlet"``: ``DirichletPartitioner``; for every class ``k`` the proportions
  ``p_k ~ Dir(alpha * 1_K)`` split that class's examples over the ``K`` clients, with
  self-balancing (a client already above ``N / K`` examples gets no more classes, as in
  NIID-Bench) and resampling (at most 10 tries, then ``ValueError``)
  until every client holds at least ``min_partition_size`` examples, by default
  ``max(1, min(10, N // (10 K)))``. Small ``alpha`` = strong label skew; as ``alpha -> 0``
  each class goes to about one client, so more clients than classes cannot all be served.
- ``"pathological"``: ``PathologicalPartitioner``; each client sees exactly
  ``classes_per_client`` classes ("first-deterministic": client ``i`` gets class ``i mod C``
  plus random others, so every class is used when ``K >= C``); a class is split evenly among
  the clients that hold it. Classes held by no client (possible when ``K * c < C``) are dropped.
- ``"full"``: every client gets the whole pool (in the pool's seeded order); the clients differ
  only by their seeds. This is the paper's setting (Ito et al.; Git Re-Basin: two models trained
  on all the data from different initialisations), the reference point for the federated
  schemes, not federated learning itself.
- ``"shard"``: ``ShardPartitioner`` (McMahan et al. 2017): the pool is sorted by label, cut into
  ``K * classes_per_client`` shards of ``ceil(N / (K * classes_per_client))`` consecutive
  examples (the last one may be shorter, none is dropped), and shards are dealt out at random.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from fedlmc.data.catalog import PARTITION_SCHEMES

Data = tuple[Tensor, Tensor]


def partition(
    train: Data,
    num_clients: int,
    scheme: str = "iid",
    *,
    alpha: float = 0.5,
    classes_per_client: int = 2,
    seed: int = 0,
    min_partition_size: int | None = None,
) -> list[Data]:
    """Split ``train = (x, y)`` into ``num_clients`` parts (module doc): disjoint ones, or the
    whole pool for every client with ``scheme="full"``."""
    x, y = train
    if len(x) != len(y):
        raise ValueError(f"train x has {len(x)} rows but y has {len(y)}; they must match")
    parts = partition_indices(
        y,
        num_clients,
        scheme,
        alpha=alpha,
        classes_per_client=classes_per_client,
        seed=seed,
        min_partition_size=min_partition_size,
    )
    return [(x[idx], y[idx]) for idx in (torch.from_numpy(p) for p in parts)]


def partition_indices(
    labels: Tensor | np.ndarray,
    num_clients: int,
    scheme: str = "iid",
    *,
    alpha: float = 0.5,
    classes_per_client: int = 2,
    seed: int = 0,
    min_partition_size: int | None = None,
) -> list[np.ndarray]:
    """Indices (int64 arrays into ``labels``) of each client's examples; same arguments as
    :func:`partition`. Deterministic for a given ``seed``."""
    y = np.asarray(labels.cpu() if isinstance(labels, Tensor) else labels).astype(np.int64)
    _check_partition_args(y, num_clients, scheme, alpha, classes_per_client)
    num_clients, classes_per_client = int(num_clients), int(classes_per_client)
    if min_partition_size is None:
        min_partition_size = max(1, min(10, len(y) // (10 * num_clients)))
    elif not 1 <= min_partition_size <= len(y) // num_clients:
        raise ValueError(
            f"min_partition_size={min_partition_size} must be in [1, {len(y) // num_clients}]"
        )
    order = np.random.default_rng(seed).permutation(len(y))
    if scheme == "full":
        return [order.astype(np.int64) for _ in range(num_clients)]
    partitioner = _make_partitioner(
        scheme, num_clients, alpha, classes_per_client, seed, min_partition_size, len(y)
    )
    partitioner.dataset = _index_dataset(order, y[order])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # flwr's resampling / unused-class notes
            warnings.simplefilter("ignore", FutureWarning)  # pyarrow sort-option deprecation
            # flwr divides 0/0 at tiny alpha; the parts are validated below
            warnings.simplefilter("ignore", RuntimeWarning)
            parts = [
                np.asarray(partitioner.load_partition(i)["idx"], dtype=np.int64)
                for i in range(num_clients)
            ]
    except ValueError as err:
        msg = str(err).replace("\n", " ")
        raise ValueError(
            f"scheme={scheme!r} cannot split {len(y)} examples over num_clients={num_clients} "
            f"(alpha={alpha}, classes_per_client={classes_per_client}): {msg}"
        ) from err
    _check_valid_parts(parts, len(y), scheme)
    warn_dropped(parts, len(y), scheme, stacklevel=3)
    return parts


def warn_dropped(parts: list[np.ndarray], n: int, scheme: str, stacklevel: int = 2) -> None:
    """Warn when ``parts`` leave out some of the ``n`` examples (classes held by no client)."""
    dropped = n - sum(len(p) for p in parts)
    if dropped:
        warnings.warn(
            f"scheme={scheme!r}: {dropped} examples of classes held by no client are dropped",
            stacklevel=stacklevel,
        )


def invalid_parts(parts: list[np.ndarray], n: int) -> str | None:
    """What makes ``parts`` no partition of indices into ``n`` examples (and what to change in
    the scheme's arguments), or ``None`` when every part is non-empty and together they are
    distinct indices in ``[0, n)``."""
    flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    if len(np.unique(flat)) != len(flat) or (len(flat) and (flat.min() < 0 or flat.max() >= n)):
        return "produced overlapping or out-of-range parts; use a larger alpha or fewer clients"
    empty = [i for i, p in enumerate(parts) if len(p) == 0]
    if empty:
        return (
            f"leaves clients {empty} empty; use fewer clients, "
            f"a larger alpha or fewer classes_per_client"
        )
    return None


def label_counts(parts: Sequence[Data] | Sequence[Tensor], num_classes: int) -> np.ndarray:
    """``counts[i, k]`` = number of examples of class ``k`` held by client ``i`` (int64,
    shape ``(clients, num_classes)``). ``parts`` holds ``(x, y)`` pairs or label tensors."""
    if num_classes < 1:
        raise ValueError(f"num_classes={num_classes} must be >= 1")
    rows = []
    for i, part in enumerate(parts):
        y = np.asarray((part[1] if isinstance(part, tuple) else part).cpu()).astype(np.int64)
        if y.size and (y.min() < 0 or y.max() >= num_classes):
            raise ValueError(
                f"client {i} has labels in [{y.min()}, {y.max()}], outside [0, {num_classes})"
            )
        rows.append(np.bincount(y, minlength=num_classes))
    return np.stack(rows) if rows else np.zeros((0, num_classes), dtype=np.int64)


def label_skew(counts: np.ndarray) -> float:
    """Mean total-variation distance between each client's label distribution and the pooled one.

    ``skew = (1/K) sum_i (1/2) sum_k | n_ik / n_i - n_k / n |``; 0 for identical label mixes,
    approaching 1 when clients hold disjoint classes.
    """
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 2 or counts.shape[0] == 0 or (counts.sum(axis=1) <= 0).any():
        raise ValueError(
            f"counts must be a (clients, classes) array with no empty row, got {counts.shape}"
        )
    client = counts / counts.sum(axis=1, keepdims=True)
    pooled = counts.sum(axis=0) / counts.sum()
    return float(0.5 * np.abs(client - pooled).sum(axis=1).mean())


def plot_label_distribution(
    parts: Sequence[Data] | Sequence[Tensor], num_classes: int, path: str | Path
) -> Path:
    """Stacked bar chart (one bar per client, one colour per class) saved to ``path`` (PNG/PDF/SVG
    by suffix); returns the path. Uses matplotlib's Agg canvas, no pyplot state."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts = label_counts(parts, num_classes)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(max(4.0, 0.35 * len(counts) + 2.0), 3.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    cmap = _class_colours(num_classes)
    clients = np.arange(len(counts))
    bottom = np.zeros(len(counts))
    for k in range(num_classes):
        ax.bar(clients, counts[:, k], bottom=bottom, color=cmap(k), width=0.8, label=str(k))
        bottom += counts[:, k]
    ax.set_ylim(0, 1.05 * max(1, int(counts.sum(axis=1).max(initial=0))))
    ax.set_xlabel("client")
    ax.set_ylabel("examples")
    ax.set_xticks(clients if len(clients) <= 30 else clients[:: math.ceil(len(clients) / 30)])
    if num_classes <= 20:
        ax.legend(title="class", fontsize="small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.savefig(path, dpi=120)
    return path


def _class_colours(num_classes: int):
    from matplotlib import colormaps

    if num_classes <= 10:
        return colormaps["tab10"]
    if num_classes <= 20:
        return colormaps["tab20"]
    base = colormaps["viridis"]
    return lambda k: base(k / max(1, num_classes - 1))


def _check_partition_args(
    y: np.ndarray, num_clients: int, scheme: str, alpha: float, classes_per_client: int
) -> None:
    if scheme not in PARTITION_SCHEMES:
        raise ValueError(f"unknown partition scheme {scheme!r}; allowed: {PARTITION_SCHEMES}")
    if isinstance(num_clients, bool) or not isinstance(num_clients, numbers.Integral):
        raise ValueError(f"num_clients={num_clients!r} must be an integer >= 1")
    if num_clients < 1:
        raise ValueError(f"num_clients={num_clients!r} must be an integer >= 1")
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {y.shape}")
    if num_clients > len(y):
        raise ValueError(f"num_clients={num_clients} exceeds the {len(y)} examples to split")
    if scheme == "dirichlet" and not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha={alpha} must be a finite number > 0")
    if scheme == "pathological":
        present = len(np.unique(y))
        if not 1 <= classes_per_client <= present:
            raise ValueError(
                f"classes_per_client={classes_per_client} must be in [1, {present}] "
                f"(the number of classes present)"
            )
    if scheme == "shard" and not 1 <= classes_per_client <= len(y) // num_clients:
        raise ValueError(
            f"classes_per_client={classes_per_client} (shards per client) must be in "
            f"[1, {len(y) // num_clients}] for {len(y)} examples and {num_clients} clients"
        )


def _make_partitioner(
    scheme: str,
    num_clients: int,
    alpha: float,
    classes_per_client: int,
    seed: int,
    min_partition_size: int,
    n: int,
):
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        PathologicalPartitioner,
        ShardPartitioner,
    )

    if scheme == "iid":
        return IidPartitioner(num_partitions=num_clients)
    if scheme == "dirichlet":
        return DirichletPartitioner(
            num_partitions=num_clients,
            partition_by="label",
            alpha=float(alpha),
            min_partition_size=min_partition_size,
            self_balancing=True,
            shuffle=True,
            seed=seed,
        )
    if scheme == "pathological":
        return PathologicalPartitioner(
            num_partitions=num_clients,
            partition_by="label",
            num_classes_per_partition=classes_per_client,
            class_assignment_mode="first-deterministic",
            shuffle=True,
            seed=seed,
        )
    return ShardPartitioner(
        num_partitions=num_clients,
        partition_by="label",
        shard_size=math.ceil(n / (num_clients * classes_per_client)),
        keep_incomplete_shard=True,
        shuffle=True,
        seed=seed,
    )


def _index_dataset(idx: np.ndarray, labels: np.ndarray):
    """The ``(idx, label)`` table the partitioners split, in Arrow format: reading a column
    (the partitioner's labels, a partition's ``idx``) is then one Arrow array, where the default
    format iterated over its rows in Python (most of a split's 50 to 230 ms at 5,000 labels)."""
    from datasets import Dataset

    return Dataset.from_dict({"idx": idx, "label": labels}).with_format("arrow")


def _check_valid_parts(parts: list[np.ndarray], n: int, scheme: str) -> None:
    """Raise :func:`invalid_parts`'s reason, if any."""
    reason = invalid_parts(parts, n)
    if reason is not None:
        raise ValueError(f"scheme={scheme!r} {reason}")
