"""A clean copy of a commit of this repository, for the benchmarks that time the code of a git
revision beside this tree (``evaluation_cost.py``, ``setup_costs.py``, ``suite_time.py``,
``weight_matching_speed.py``): ``git archive`` of the commit, unpacked with :mod:`tarfile`'s
``data`` filter (no links out of the folder, no device files)."""

from __future__ import annotations

import subprocess
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def exported_tree(ref: str, into: Path) -> Path:
    """The files of commit ``ref`` in the folder ``into`` (created if needed; it should be
    empty), which is returned."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref], check=True, capture_output=True
    ).stdout
    with tempfile.TemporaryFile() as handle:
        handle.write(archive)
        handle.seek(0)
        with tarfile.open(fileobj=handle) as tar:
            tar.extractall(into, filter="data")
    return into
