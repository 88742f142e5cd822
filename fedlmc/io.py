"""Crash-safe file writes: the one atomic writer every module uses.

:func:`atomic_write` hands a temporary path in the target's folder to a writer
(``DataFrame.to_csv``, ``safetensors.torch.save_file``, ``np.savez``, ...), flushes the result
to disk (``fsync``) and moves it over the target with ``os.replace``. A reader, or a process
killed at any moment, sees either the old file or the new one, never a half-written one; a
failed write leaves the old file and no temporary behind. Temporaries are named
``.<name>.<random>.tmp``, so :func:`remove_stale_temporaries` can clean those left by a killed
process.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "atomic_write",
    "atomic_write_csv",
    "atomic_write_json",
    "atomic_write_text",
    "remove_stale_temporaries",
]

TEMP_SUFFIX = ".tmp"


def _fsync_path(path: str | os.PathLike, *, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # e.g. directories cannot be opened on some platforms
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(
    path: str | os.PathLike, write: Callable[[str], Any], *, mode: int | None = 0o644
) -> Path:
    """Run ``write(tmp_path)``, fsync the file, then ``os.replace`` it onto ``path``.

    The folder of ``path`` is created if needed; ``mode`` sets the new file's permissions
    (``None`` keeps ``mkstemp``'s 0600). Returns ``Path(path)``. Any exception from ``write``
    removes the temporary file and propagates, leaving ``path`` as it was.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=TEMP_SUFFIX, dir=target.parent)
    os.close(fd)
    try:
        write(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        _fsync_path(tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_path(target.parent, directory=True)
    return target


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """:func:`atomic_write` of a UTF-8 text."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_write_csv(path: str | os.PathLike, frame: Any) -> Path:
    """:func:`atomic_write` of a pandas DataFrame as CSV without its index (pandas is not
    imported here: ``frame`` brings its own ``to_csv``)."""
    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def atomic_write_npz(path: str | os.PathLike, **arrays: Any) -> Path:
    """:func:`atomic_write` of numpy ``arrays`` as an uncompressed ``.npz`` (``np.savez``, given
    a file object: given a path it would append ``.npz``), so that concurrent readers never
    see a half-written file."""
    import numpy as np

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)

    return atomic_write(path, write)


def atomic_write_json(path: str | os.PathLike, data: Any) -> Path:
    """:func:`atomic_write` of ``data`` as indented JSON (``str`` for unknown types)."""
    return atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def remove_stale_temporaries(
    folder: str | os.PathLike, names: Sequence[str] | None = None
) -> list[Path]:
    """Delete the temporaries of :func:`atomic_write` left in ``folder`` by a killed process:
    regular files (not links, not folders) named ``.<name>.<random>.tmp`` as ``mkstemp`` names
    them, for a target ``<name>`` of ``names`` (any name when ``None``). Nothing else is
    touched: a user's ``.notes.tmp`` stays."""
    targets = "|".join(re.escape(n) for n in names) if names is not None else ".+"
    pattern = re.compile(rf"\.(?:{targets})\.[a-z0-9_]+{re.escape(TEMP_SUFFIX)}")
    removed = []
    for stale in Path(folder).glob(f".*{TEMP_SUFFIX}"):
        if not pattern.fullmatch(stale.name) or not stat.S_ISREG(os.lstat(stale).st_mode):
            continue
        stale.unlink(missing_ok=True)
        removed.append(stale)
    return removed
