"""Reading a file a user names as configuration, bounded: a sweep's TOML file, the
``pyproject.toml`` that ``fedlmc keys --write-pyproject`` rewrites.

:func:`read_config_text` refuses, with one line naming the path and what is allowed, anything
but a regular file of at most :data:`MAX_CONFIG_BYTES` (1 MiB) of UTF-8 text: a device
(``/dev/zero`` would be read until memory runs out), a FIFO (opening it for reading blocks
until a writer comes), a folder, a socket. The path is looked at with ``os.stat`` before it is
opened, opened without blocking, checked again on the open file (it may have been replaced in
between), and at most ``MAX_CONFIG_BYTES + 1`` bytes are read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fedlmc.simulations.config.schema import ConfigError

__all__ = ["MAX_CONFIG_BYTES", "file_kind", "read_config_text"]

MAX_CONFIG_BYTES = 1 << 20
"""The largest configuration file read: 1 MiB (the shipped sweeps are under 4 KiB)."""
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


def allowed_file() -> str:
    return f"allowed: a regular file of at most {MAX_CONFIG_BYTES:,} bytes (1 MiB)"


def check_config_stat(path: str | os.PathLike, found: os.stat_result, what: str) -> None:
    """:class:`ConfigError` unless ``found`` (``path``'s stat) is a regular file within the
    limit."""
    if not stat.S_ISREG(found.st_mode):
        raise ConfigError(f"{what} {str(path)!r} is {file_kind(found.st_mode)}; {allowed_file()}")
    if found.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"{what} {str(path)!r} has {found.st_size:,} bytes; {allowed_file()}")


def read_config_text(path: str | os.PathLike, what: str = "config file") -> str:
    """The UTF-8 text of the configuration file at ``path`` (module docstring); ``what`` names
    it in the error line."""
    file = Path(path).expanduser()
    try:
        check_config_stat(path, os.stat(file), what)
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        raise ConfigError(f"{what} {str(path)!r}: cannot read it ({err.strerror})") from None
    try:
        check_config_stat(path, os.fstat(fd), what)
        data = b""
        while len(data) <= MAX_CONFIG_BYTES and (
            chunk := os.read(fd, MAX_CONFIG_BYTES + 1 - len(data))
        ):
            data += chunk
    except OSError as err:
        raise ConfigError(f"{what} {str(path)!r}: cannot read it ({err.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{what} {str(path)!r} has more than {MAX_CONFIG_BYTES:,} bytes; {allowed_file()}"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{what} {str(path)!r}: not UTF-8 text ({err.reason} at byte "
            f"{err.start}); allowed: a UTF-8 text file"
        ) from None
