"""Paths a user names that fedlmc writes: never replace a file fedlmc did not write.

Every check here runs before any work (before Ray starts, before training) and looks at a path
with ``os.lstat`` only, so a device or a FIFO is recognised without being opened (opening a
FIFO for reading blocks until a writer comes):

- :func:`check_own_files`: the files fedlmc writes into an out dir (:data:`OUT_DIR_FILES`:
  ``results.csv``, ``training.csv``, ``config.json``, the report, ``figures/``, the lock, ...)
  are each absent or a regular file (``figures/`` a real folder), never a symbolic link, a
  device, a FIFO or a socket; ``results.csv`` and ``training.csv`` must hold fedlmc's tables
  (a header with ``method`` or ``cell_id``, with ``phase``), not a user's file of that name.
- :func:`check_csv_file`: ``fedlmc run --csv FILE`` writes a new file, or appends to a file
  that already holds a ``fedlmc run --csv`` table with the same columns (its first line is
  exactly :func:`run_csv_columns`); anything else is refused.
- :func:`append_csv_rows`: the write itself. It opens the file without following a link and
  without blocking, checks again that it is a regular file, holds an exclusive ``flock`` on it
  (two runs appending to one file take turns), checks the header again, then appends the rows
  (the header first in a new file) and ``fsync``\\ s. No lock file or temporary is created
  beside it.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedlmc.simulations.config.config_file import file_kind
from fedlmc.simulations.config.schema import ConfigError

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "OUT_DIR_FILES",
    "append_csv_rows",
    "check_csv_file",
    "check_csv_kind",
    "check_own_files",
    "run_csv_columns",
]

OUT_DIR_FILES = (
    "results.csv",
    "training.csv",
    "config.json",
    "report.md",
    "report_full.md",
    "results.rejected.csv",
    "training.rejected.csv",
    "results.previous.csv",
    "config.previous.json",
    ".lock",
)
"""The files fedlmc writes into a sweep's or a run's out dir under fixed names."""
TABLE_MARKERS = {"results.csv": ("method", "cell_id"), "training.csv": ("phase",)}
"""A column a header of fedlmc's tables holds (a sweep's ``results.csv`` of failed cells only
has ``cell_id`` but no ``method``)."""
FOLDERS = ("figures", "tensorboard")
"""The folders fedlmc writes into an out dir."""
MAX_HEADER = 64 * 1024  # bytes of a --csv file read to find its first line


def lstat_or_none(path: Path) -> os.stat_result | None:
    """``os.lstat(path)`` (a link itself, not its target); ``None`` when nothing is there."""
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):  # a parent that is a file: said elsewhere
        return None


def check_own_files(folder: str | os.PathLike, key: str) -> None:
    """:class:`ConfigError` when one of the names fedlmc writes in the out dir ``folder``
    (:data:`OUT_DIR_FILES`, :data:`FOLDERS`) is taken by anything but a regular file (a real
    folder for :data:`FOLDERS`): a link, a device, a FIFO, a socket. ``key`` names the option
    (``"out-dir"``, ``"--out"``, ``"dir"``)."""
    base = Path(folder).expanduser()
    for name in (*OUT_DIR_FILES, *FOLDERS):
        found = lstat_or_none(base / name)
        if found is None:
            continue
        wanted = stat.S_ISDIR if name in FOLDERS else stat.S_ISREG
        if not wanted(found.st_mode):
            allowed = "a folder" if name in FOLDERS else "a regular file"
            raise ConfigError(
                f"{key} = {str(folder)!r}: {name} there is {file_kind(found.st_mode)}; fedlmc "
                f"writes that name itself; allowed: {allowed} fedlmc wrote, or no {name}"
            )
        if name in TABLE_MARKERS and not holds_table(base / name, TABLE_MARKERS[name]):
            raise ConfigError(
                f"{key} = {str(folder)!r}: {name} there is not a fedlmc table (no header "
                f"holding {' or '.join(TABLE_MARKERS[name])}); fedlmc would replace it; "
                f"allowed: a folder without {name}, or one where fedlmc wrote it"
            )


def holds_table(path: Path, markers: Sequence[str]) -> bool:
    """Whether the regular file ``path`` is empty or one of its lines in the first
    :data:`MAX_HEADER` bytes is a CSV header holding a column of ``markers`` (junk lines or a
    byte order mark above it allowed: they are read as damage, not as another file)."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_HEADER)
    except OSError:
        return True  # unreadable: the reader that needs it says so
    if not data.strip():
        return True
    for line in data.decode("utf-8", errors="replace").splitlines():
        fields = header_of(line.encode("utf-8")) or []
        if set(markers) & {f.removeprefix("\ufeff") for f in fields}:
            return True
    return False


def run_csv_columns() -> tuple[str, ...]:
    """The columns of a ``fedlmc run --csv`` file, in order: every results column
    (:func:`fedlmc.study.rows.column_table`) but the provenance ones (the run's out dir has
    those), so that the rows of any run can be appended to the file of another."""
    from fedlmc.study.rows import column_table

    return tuple(c.name for c in column_table() if c.source != "provenance")


def header_of(data: bytes) -> list[str] | None:
    """The fields of the first line of ``data`` (``None`` when it is not one CSV line)."""
    import csv

    line = data.split(b"\n", 1)[0].removesuffix(b"\r").decode("utf-8", errors="replace")
    try:
        return next(csv.reader([line.removeprefix("\ufeff")], strict=True), [])
    except csv.Error:
        return None


def header_problem(header: Sequence[str] | None, columns: Sequence[str]) -> str | None:
    """Why a file whose first line is ``header`` is not a ``fedlmc run --csv`` table of
    ``columns``; ``None`` when it is one."""
    if header is not None and list(header) == list(columns):
        return None
    if not header or "method" not in header:
        return "is not a fedlmc results table"
    if "cell_id" in header:
        return "holds a sweep's rows"
    missing = [c for c in columns if c not in header]
    extra = [c for c in header if c not in columns]
    what = f"lacks {missing[0]!r}" if missing else f"has {extra[0]!r}" if extra else "orders"
    return f"holds a fedlmc table with other columns ({len(header)} columns; it {what} ...)"


def refuse_csv(path: str | os.PathLike, why: str) -> ConfigError:
    return ConfigError(
        f"--csv {str(path)!r} {why}; allowed: a new file, or a fedlmc run --csv file with the "
        "same columns (the rows are appended)"
    )


def check_csv_kind(path: str | os.PathLike) -> bool:
    """:class:`ConfigError` when ``path`` is there but is no regular file (a link, a device, a
    FIFO, a folder, a socket: ``lstat`` only, nothing opened); whether a regular file is."""
    found = lstat_or_none(Path(path).expanduser())
    if found is not None and not stat.S_ISREG(found.st_mode):
        raise refuse_csv(path, f"is {file_kind(found.st_mode)}")
    return found is not None


def check_csv_file(path: str | os.PathLike) -> None:
    """Before any work: :class:`ConfigError` unless ``path`` is new or a regular file whose
    first line is :func:`run_csv_columns` (a link, a device, a FIFO, a folder, another file
    or a fedlmc table with other columns are refused; the file is read only when regular)."""
    if not check_csv_kind(path):
        return
    try:
        with Path(path).expanduser().open("rb") as handle:
            data = handle.read(MAX_HEADER)
    except OSError as err:
        raise refuse_csv(path, f"cannot be read ({err.strerror})") from None
    if not data:
        return  # empty: written as a new file (the header first)
    problem = header_problem(header_of(data), run_csv_columns())
    if problem is not None:
        raise refuse_csv(path, problem)


def append_csv_rows(path: str | os.PathLike, rows: pd.DataFrame) -> bool:
    """Append ``rows`` (as :func:`run_csv_columns`, a missing column empty) to the ``--csv``
    file ``path``, the header first when it is new or empty (module docstring); whether the
    file held rows before. :class:`ConfigError` when it is no longer a file this may write
    (something replaced it since the first check)."""
    columns = run_csv_columns()
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(Path(path).expanduser(), flags, 0o644)
    except OSError as err:
        raise refuse_csv(path, f"cannot be opened for appending ({err.strerror})") from None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise refuse_csv(path, f"is {file_kind(found.st_mode)}")
        fcntl.flock(fd, fcntl.LOCK_EX)  # another run appending waits for this one
        size = os.fstat(fd).st_size
        if size:
            problem = header_problem(header_of(os.pread(fd, MAX_HEADER, 0)), columns)
            if problem is not None:
                raise refuse_csv(path, problem)
        body = rows.reindex(columns=list(columns)).to_csv(index=False, header=not size)
        ends_well = not size or os.pread(fd, 1, size - 1) == b"\n"
        write_all(fd, (("" if ends_well else "\n") + body).encode("utf-8"))
        os.fsync(fd)
        return size > 0
    finally:
        os.close(fd)  # closing the file frees its flock


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` at ``fd`` (``os.write`` may write part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
