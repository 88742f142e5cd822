"""Reading a file a user names as configuration, bounded: a sweep's TOML file, the
``pyproject.toml`` that ``fedlmc keys --write-pyproject`` rewrites.

:func:`read_config_text` refuses, with one line naming the path and what is allowed, anything
but a regular file of at most :data:`MAX_CONFIG_BYTES` (1 MiB) of UTF-8 text: a device
(``/dev/zero`` would be read until memory runs out), a FIFO (opening it for reading blocks
until a writer comes), a folder, a socket. The path is looked at with ``os.stat`` before it is
opened, opened without blocking, checked again on the open file (it may have been replaced in
between), and at most ``MAX_CONFIG_BYTES + 1`` bytes are read. :func:`read_bounded` is that
reader with another limit (a results folder's ``results.csv``,
:func:`fedlmc.simulations.runs.merged_file.load_merged`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fedlmc.simulations.config.schema import ConfigError

__all__ = ["MAX_CONFIG_BYTES", "file_kind", "read_bounded", "read_config_text"]

MAX_CONFIG_BYTES = 1 << 20
"""The largest configuration file read: 1 MiB (the shipped sweeps are under 4 KiB)."""
CHUNK = 1 << 20
"""Bytes read at a time."""
KINDS = {
    stat.S_ISLNK: "a symbolic link",
    stat.S_ISDIR: "a folder",
    stat.S_ISCHR: "a character device",
    stat.S_ISBLK: "a block device",
    stat.S_ISFIFO: "a FIFO (named pipe)",
    stat.S_ISSOCK: "a socket",
}


def file_kind(mode: int) -> str:
    """What a ``stat``/``lstat`` mode says a path is, in words (``"a regular file"``,
    ``"a FIFO (named pipe)"``, ``"a character device"``, ...)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((word for test, word in KINDS.items() if test(mode)), "not a regular file")


def allowed_file(limit: int = MAX_CONFIG_BYTES) -> str:
    return f"allowed: a regular file of at most {limit:,} bytes ({limit / (1 << 20):g} MiB)"


def check_config_stat(
    path: str | os.PathLike, found: os.stat_result, what: str, limit: int = MAX_CONFIG_BYTES
) -> None:
    """:class:`ConfigError` unless ``found`` (``path``'s stat) is a regular file of at most
    ``limit`` bytes."""
    if not stat.S_ISREG(found.st_mode):
        raise ConfigError(
            f"{what} {str(path)!r} is {file_kind(found.st_mode)}; {allowed_file(limit)}"
        )
    if found.st_size > limit:
        raise ConfigError(
            f"{what} {str(path)!r} has {found.st_size:,} bytes; {allowed_file(limit)}"
        )


def read_bounded(path: str | os.PathLike, what: str, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them (module docstring:
    stat, open without blocking, fstat, read at most ``limit + 1``); :class:`ConfigError` with
    one line naming ``what``, the path and what is allowed otherwise."""
    file = Path(path).expanduser()
    try:
        check_config_stat(path, os.stat(file), what, limit)
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise ConfigError(f"{what} {str(path)!r}: cannot read it ({err.strerror})") from None
    try:
        check_config_stat(path, os.fstat(fd), what, limit)
        data = bytearray()
        while len(data) <= limit and (chunk := os.read(fd, min(CHUNK, limit + 1 - len(data)))):
            data += chunk
    except OSError as err:
        raise ConfigError(f"{what} {str(path)!r}: cannot read it ({err.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ConfigError(
            f"{what} {str(path)!r} has more than {limit:,} bytes; {allowed_file(limit)}"
        )
    return bytes(data)


def read_config_text(path: str | os.PathLike, what: str = "config file") -> str:
    """The UTF-8 text of the configuration file at ``path`` (module docstring); ``what`` names
    it in the error line."""
    data = read_bounded(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{what} {str(path)!r}: not UTF-8 text ({err.reason} at byte "
            f"{err.start}); allowed: a UTF-8 text file"
        ) from None
