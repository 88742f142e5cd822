"""What every data set becomes: :class:`DataSplits`, with a stratified held-out server split.

Held-out splits are stratified: to hold out a fraction ``f`` of ``N`` examples, class ``k``
(with ``n_k`` examples) gives ``floor(f * n_k)`` examples plus one more for the classes with the
largest remainders ``f * n_k - floor(f * n_k)``, so exactly ``round(f * N)`` are held out and
every class keeps its share. Which examples are held out is a seeded random choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = ["Data", "DataSplits", "stratified_split", "with_server_split"]

Data = tuple[Tensor, Tensor]


@dataclass(eq=False, repr=False)
class DataSplits:
    """A dataset ready for federated experiments.

    ``train`` is the clients' pool, ``server`` is held out from the training data (temperature
    calibration, BatchNorm re-estimation), ``test`` is the evaluation set.
    """

    name: str
    train: Data
    server: Data
    test: Data
    num_classes: int
    in_shape: tuple[int, int, int]
    augment: str | None = None

    def summary(self) -> str:
        """One line with the split sizes, e.g. ``mnist5k: train 3600, server 400, ...``."""
        return (
            f"{self.name}: train {len(self.train[1])}, server {len(self.server[1])}, "
            f"test {len(self.test[1])}, classes {self.num_classes}, "
            f"in_shape {self.in_shape}, augment {self.augment}"
        )

    def __repr__(self) -> str:
        return f"DataSplits({self.summary()})"


def stratified_split(
    labels: np.ndarray, fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(keep, held)`` index arrays: ``round(fraction * N)`` examples held out, stratified by
    label (largest-remainder rounding per class, see the module docstring). Both arrays are in a
    seeded random order (never sorted by label)."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    quota = fraction * counts
    held_per_class = np.floor(quota).astype(np.int64)
    missing = int(round(fraction * len(labels))) - int(held_per_class.sum())
    by_remainder = np.argsort(-(quota - held_per_class), kind="stable")
    held_per_class[by_remainder[:missing]] += 1
    keep, held = [], []
    for k, n_held in zip(classes, held_per_class, strict=True):
        members = rng.permutation(np.flatnonzero(labels == k))
        held.append(members[:n_held])
        keep.append(members[n_held:])
    keep_idx = rng.permutation(np.concatenate(keep))
    held_idx = rng.permutation(np.concatenate(held))
    return keep_idx.astype(np.int64), held_idx.astype(np.int64)


def with_server_split(
    name: str,
    train: Data,
    test: Data,
    *,
    num_classes: int,
    server_fraction: float,
    seed: int,
    augment: str | None,
) -> DataSplits:
    """A :class:`DataSplits` whose ``server`` part is a stratified ``server_fraction`` of
    ``train`` (:func:`stratified_split` with ``seed``); ``ValueError`` if no example is left."""
    x, y = train
    keep, held = (torch.from_numpy(i) for i in stratified_split(y.numpy(), server_fraction, seed))
    if len(keep) == 0:
        raise ValueError(
            f"server_fraction={server_fraction} leaves no training example out of {len(y)}"
        )
    return DataSplits(
        name=name,
        train=(x[keep], y[keep]),
        server=(x[held], y[held]),
        test=test,
        num_classes=num_classes,
        in_shape=tuple(int(d) for d in x.shape[1:]),
        augment=augment,
    )
