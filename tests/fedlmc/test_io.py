"""The one atomic file writer: old or new file, never half of one, no temporaries left."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fedlmc.io import atomic_write, atomic_write_json, atomic_write_npz, remove_stale_temporaries


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path):
    target = tmp_path / "sub" / "results.csv"
    atomic_write(target, lambda tmp: Path(tmp).write_text("a,b\n1,2\n"))
    assert target.read_text() == "a,b\n1,2\n"
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)
    atomic_write_json(tmp_path / "c.json", {"x": [1, 2]})
    assert json.loads((tmp_path / "c.json").read_text()) == {"x": [1, 2]}
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["c.json", "results.csv"]


def test_a_failing_writer_keeps_the_old_file(tmp_path: Path):
    target = tmp_path / "results.csv"
    target.write_text("old\n")

    def half_then_fail(tmp: str) -> None:
        Path(tmp).write_text("new but incompl")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, half_then_fail)
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]


def test_stale_temporaries_of_a_killed_writer_are_removed(tmp_path: Path):
    (tmp_path / ".results.csv.abc123.tmp").write_text("half")
    (tmp_path / "results.csv").write_text("whole")
    (tmp_path / "notes.tmp").write_text("not ours: no leading dot")
    removed = remove_stale_temporaries(tmp_path)
    assert [p.name for p in removed] == [".results.csv.abc123.tmp"]
    assert sorted(os.listdir(tmp_path)) == ["notes.tmp", "results.csv"]


def test_only_fedlmc_temporaries_of_the_named_targets_are_removed(tmp_path: Path):
    (tmp_path / ".results.csv.k2j_x9qa.tmp").write_text("half")  # as mkstemp names them
    (tmp_path / ".notes.tmp").write_text("a user's file")
    (tmp_path / ".mine.txt.k2j_x9qa.tmp").write_text("not a target fedlmc writes")
    (tmp_path / ".x.tmp").mkdir()  # a folder: never removed, no IsADirectoryError
    (tmp_path / ".config.json.abcd1234.tmp").symlink_to(tmp_path / ".notes.tmp")
    removed = remove_stale_temporaries(tmp_path, ("results.csv", "config.json"))
    assert [p.name for p in removed] == [".results.csv.k2j_x9qa.tmp"]
    assert sorted(os.listdir(tmp_path)) == [
        ".config.json.abcd1234.tmp",
        ".mine.txt.k2j_x9qa.tmp",
        ".notes.tmp",
        ".x.tmp",
    ]


def test_atomic_write_npz_writes_the_arrays_at_the_path_itself(tmp_path):
    import numpy as np

    path = tmp_path / "deep" / "cache.npz"
    arrays = {"indices": np.arange(5, dtype=np.int64), "sizes": np.array([2, 3])}
    assert atomic_write_npz(path, **arrays) == path
    assert sorted(p.name for p in path.parent.iterdir()) == ["cache.npz"]  # no .npz.npz, no .tmp
    with np.load(path, allow_pickle=False) as f:
        assert all(np.array_equal(f[k], v) for k, v in arrays.items())
