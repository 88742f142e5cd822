"""Partitions kept on disk (fedlmc.data.partition_cache): the same parts as computing them, read
back without flwr-datasets, and a file that is not a valid partition is computed again."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from fedlmc.data import partition_cache
from fedlmc.data.partition_cache import cached_partition_indices, partition_key
from fedlmc.data.partitions import partition_indices

LABELS = np.random.default_rng(3).integers(0, 10, size=600).astype(np.int64)
SCHEMES = [
    ("iid", {}),
    ("dirichlet", {"alpha": 0.3}),
    ("pathological", {"classes_per_client": 2}),
    ("shard", {"classes_per_client": 2}),
]


def no_computing(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("computed although the cache holds the partition")

    monkeypatch.setattr(partition_cache, "partition_indices", refuse)


def same_parts(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(("scheme", "args"), SCHEMES)
def test_a_cached_partition_is_the_computed_one_and_is_read_back(
    scheme, args, tmp_path, monkeypatch
):
    expected = partition_indices(LABELS, 4, scheme, seed=5, **args)
    first = cached_partition_indices(LABELS, 4, scheme, seed=5, cache=tmp_path, **args)
    assert same_parts(first, expected)
    assert len(list(tmp_path.glob("*.npz"))) == 1
    no_computing(monkeypatch)
    again = cached_partition_indices(LABELS, 4, scheme, seed=5, cache=tmp_path, **args)
    assert same_parts(again, expected) and all(p.dtype == np.int64 for p in again)


def test_every_argument_and_the_labels_are_in_the_key():
    base = dict(alpha=0.5, classes_per_client=2, seed=0)
    key = partition_key(LABELS, 4, "dirichlet", **base)
    assert partition_key(LABELS.copy(), 4, "dirichlet", **base) == key
    flipped = LABELS.copy()
    flipped[0] = (flipped[0] + 1) % 10
    others = [
        partition_key(flipped, 4, "dirichlet", **base),
        partition_key(LABELS, 5, "dirichlet", **base),
        partition_key(LABELS, 4, "pathological", **base),
        partition_key(LABELS, 4, "dirichlet", **{**base, "alpha": 0.5000001}),
        partition_key(LABELS, 4, "dirichlet", **{**base, "classes_per_client": 3}),
        partition_key(LABELS, 4, "dirichlet", **{**base, "seed": 1}),
    ]
    assert len({key, *others}) == 1 + len(others)


def broken_files(good: Path) -> dict[str, bytes]:
    """Files that must not be taken for the partition saved at ``good``."""
    import io

    with np.load(good) as f:
        indices, sizes = f["indices"], f["sizes"]

    def npz(**arrays) -> bytes:
        out = io.BytesIO()
        np.savez(out, **arrays)
        return out.getvalue()

    overlapping = indices.copy()
    overlapping[1] = overlapping[0]
    return {
        "truncated": good.read_bytes()[:100],
        "not an npz": b"indices,sizes\n1,2\n",
        "pickled objects": npz(indices=np.array([object()] * 3), sizes=sizes),
        "overlapping parts": npz(indices=overlapping, sizes=sizes),
        "out of range": npz(indices=indices + len(LABELS), sizes=sizes),
        "wrong count of parts": npz(indices=indices, sizes=np.append(sizes[:-2], sizes[-2:].sum())),
        "an empty part": npz(indices=indices, sizes=np.append(sizes[:-1], [0])),
        "sizes not summing": npz(indices=indices[:-1], sizes=sizes),
        "float indices": npz(indices=indices.astype(np.float64), sizes=sizes),
        "missing sizes": npz(indices=indices),
        # int64 sizes whose sum wraps around to the index count: 3 empty parts
        "sizes wrapping around": npz(
            indices=indices, sizes=np.array([2**62] * 3 + [2**62 + len(indices)], np.int64)
        ),
        "a negative size": npz(
            indices=indices, sizes=np.array([-1, sizes[0] + 1, sizes[1], sizes[2] + sizes[3]])
        ),
    }


@pytest.mark.parametrize(
    "broken",
    [
        "truncated",
        "not an npz",
        "pickled objects",
        "overlapping parts",
        "out of range",
        "wrong count of parts",
        "an empty part",
        "sizes not summing",
        "float indices",
        "missing sizes",
        "sizes wrapping around",
        "a negative size",
    ],
)
def test_a_file_that_is_not_a_valid_partition_is_computed_again(broken, tmp_path):
    expected = partition_indices(LABELS, 4, "dirichlet", alpha=0.3, seed=2)
    cached_partition_indices(LABELS, 4, "dirichlet", alpha=0.3, seed=2, cache=tmp_path)
    (path,) = tmp_path.glob("*.npz")
    path.write_bytes(broken_files(path)[broken])
    assert partition_cache.read_partition(path, len(LABELS), 4) is None
    again = cached_partition_indices(LABELS, 4, "dirichlet", alpha=0.3, seed=2, cache=tmp_path)
    assert same_parts(again, expected)
    assert same_parts(partition_cache.read_partition(path, len(LABELS), 4), expected)  # rewritten


def test_a_cache_folder_that_cannot_be_written_only_costs_the_computation(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    parts = cached_partition_indices(LABELS, 3, "iid", seed=1, cache=blocked / "partitions")
    assert same_parts(parts, partition_indices(LABELS, 3, "iid", seed=1))


def test_classes_held_by_no_client_are_warned_of_from_the_cache_too(tmp_path):
    args = dict(classes_per_client=1, seed=0, cache=tmp_path)
    with pytest.warns(UserWarning, match="examples of classes held by no client are dropped"):
        first = cached_partition_indices(LABELS, 2, "pathological", **args)
    with pytest.warns(UserWarning, match="examples of classes held by no client are dropped"):
        again = cached_partition_indices(LABELS, 2, "pathological", **args)
    assert same_parts(first, again)


def test_the_full_scheme_is_not_written(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parts = cached_partition_indices(LABELS, 3, "full", seed=4, cache=tmp_path)
    assert same_parts(parts, partition_indices(LABELS, 3, "full", seed=4))
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


@pytest.mark.slow
def test_a_fresh_process_reads_a_cached_partition_without_importing_flwr_datasets(tmp_path):
    """What the cache is for: a ClientApp process (one per message a SuperNode answers) gets its
    client's partition without the flwr-datasets and ``datasets`` imports."""
    script = f"""
import sys
import numpy as np
from fedlmc.data.partition_cache import cached_partition_indices
labels = np.random.default_rng(3).integers(0, 10, size=600).astype(np.int64)
parts = cached_partition_indices(labels, 4, "dirichlet", alpha=0.3, seed=5, cache={str(tmp_path)!r})
print(sum(len(p) for p in parts), "flwr_datasets" in sys.modules, "datasets" in sys.modules)
"""
    runs = [
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    assert runs[0].stdout.split() == ["600", "True", "True"], runs[0].stderr
    assert runs[1].stdout.split() == ["600", "False", "False"], runs[1].stderr
