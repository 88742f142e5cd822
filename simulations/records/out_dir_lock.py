"""One writer per out dir: the lock ``fedlmc run``, ``fedlmc sweep`` and ``fedlmc report`` hold.

:func:`out_dir_lock` holds an exclusive ``flock`` on ``DIR/.lock`` for as long as a command
writes into ``DIR`` (``fedlmc sweep``: its cells, then its report; ``fedlmc run`` and the
ServerApp under ``flwr run``: the whole federation, then its files; ``fedlmc report``: the
figures and ``report.md``). A second command on the same folder is refused at once with one
line naming the holder (``fedlmc run (pid 1234)``, written into the lock file by the holder),
never waits, and writes nothing. The kernel frees the lock when its holder dies, even on
SIGKILL, so a crashed command never blocks the next one. The lock file is opened without
following a symbolic link and without blocking on a FIFO, and must be a regular file
(:func:`open_lock_file`): a link named ``.lock`` never gets another file truncated.

The lock file lives only while its holder runs: the holder deletes it (and the folder, when
the lock made it and it is still empty) before it lets go, so a finished or refused command
leaves nothing in a user's folder. A command that locked a lock file just deleted by its holder
finds the name no longer naming its file (:func:`same_file`) and takes the lock again on the
new one, so two commands never both hold a folder.

Within one process the lock is re-entrant (a count per folder): ``fedlmc run`` holds it and its
ServerApp, in a thread of the same process, takes it again. Callers check what the folder holds
(:func:`fedlmc.simulations.records.results_file.refuse_mixing`) again once they hold the lock:
another command may have written there between their first check and the lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedlmc.simulations.config.schema import ConfigError

__all__ = ["LOCK", "holder_of", "out_dir_lock"]

LOCK = ".lock"
MAX_HOLDER = 200  # bytes of the holder's line read back
_held: dict[str, int] = {}  # folder -> how many times this process holds its lock
_guard = threading.Lock()


def holder_of(fd: int) -> str:
    """The holder's line written in the lock file open at ``fd`` (``another fedlmc command``
    when it has not written it yet)."""
    text = os.pread(fd, MAX_HOLDER, 0).decode("utf-8", errors="replace")
    line = " ".join(text.split())
    return line or "another fedlmc command"


def _enter_held(key: str) -> bool:
    """Count one more hold of ``key`` when this process holds it already."""
    with _guard:
        if key in _held:
            _held[key] += 1
            return True
        return False


def _leave_held(key: str) -> None:
    with _guard:
        _held[key] -= 1
        if _held[key] == 0:
            del _held[key]


def open_lock_file(path: Path) -> int:
    """The lock file at ``path`` opened (created if absent) for reading and writing, never
    through a symbolic link and never blocking on a FIFO; :class:`ConfigError` when the name is
    taken by anything but a regular file (its holder's line would be written into it)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise
        raise ConfigError(
            f"lock file {str(path)!r} is not a regular file ({err.strerror}); allowed: a "
            "regular file fedlmc wrote, or none"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(
            f"lock file {str(path)!r} is not a regular file; allowed: a regular file fedlmc "
            "wrote, or none"
        )
    return fd


@contextmanager
def out_dir_lock(out_dir: str | os.PathLike, command: str) -> Iterator[Path]:
    """Hold the lock of ``out_dir`` (created if needed) while the block runs, as ``command``
    (e.g. ``"fedlmc sweep"``); :class:`ConfigError` naming the holder when another process
    holds it. Yields the folder, resolved."""
    folder = Path(out_dir).expanduser().resolve()
    key = str(folder)
    if _enter_held(key):
        try:
            yield folder
        finally:
            _leave_held(key)
        return
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    fd = locked_file(folder / LOCK, key)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{command} (pid {os.getpid()})\n".encode(), 0)
        with _guard:
            _held[key] = 1
        try:
            yield folder
        finally:
            _leave_held(key)
            (folder / LOCK).unlink(missing_ok=True)  # still held: no one else has it
            if made:
                remove_if_empty(folder)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def locked_file(path: Path, key: str) -> int:
    """The lock file at ``path`` opened and ``flock``\\ ed; :class:`ConfigError` naming the
    holder when another process holds it. A file its holder deleted meanwhile is let go and
    the new one taken."""
    while True:
        fd = open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = holder_of(fd)
            os.close(fd)
            raise ConfigError(
                f"out dir {key!r} is in use by {holder}; allowed: wait for it to finish, or "
                "another out dir"
            ) from None
        if same_file(fd, path):
            return fd
        os.close(fd)


def same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open at ``fd``."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def remove_if_empty(folder: Path) -> None:
    """Delete ``folder`` when nothing is in it (a refused command's out dir)."""
    try:
        folder.rmdir()
    except OSError:
        pass
