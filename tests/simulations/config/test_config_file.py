"""A config file is read bounded (issue 52, item 4): a regular file of at most 1 MiB of UTF-8
text; a device, a FIFO, a folder or a larger file is refused with one line naming the path
and what is allowed, looked at with ``stat`` before it is opened (a FIFO is never opened)."""

from __future__ import annotations

import os

import pytest

from fedlmc.simulations.config import ConfigError
from fedlmc.simulations.config.config_file import MAX_CONFIG_BYTES, read_config_text
from fedlmc.simulations.config.sweep_file import read_toml

ALLOWED = "allowed: a regular file of at most 1,048,576 bytes (1 MiB)"


def test_a_regular_file_up_to_the_limit_is_read_whole(tmp_path):
    path = tmp_path / "sweep.toml"
    text = "# é\n" + "#" * (MAX_CONFIG_BYTES - 6) + "\n"
    path.write_text(text, encoding="utf-8")
    assert len(path.read_bytes()) == MAX_CONFIG_BYTES
    assert read_config_text(path) == text


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: p.symlink_to("/dev/zero"), "is a character device"),
        (os.mkfifo, "is a FIFO (named pipe)"),
        (os.mkdir, "is a folder"),
        (lambda p: p.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1)), "has 1,048,577 bytes"),
    ],
    ids=["dev-zero", "fifo", "folder", "over-1-MiB"],
)
def test_anything_else_is_refused_in_one_line_naming_the_path(tmp_path, make, needle):
    path = tmp_path / "sweep.toml"
    make(path)
    with pytest.raises(ConfigError) as refused:
        read_toml(path)
    text = str(refused.value)
    assert needle in text and ALLOWED in text and str(path) in text and "\n" not in text


def test_dev_zero_itself_is_refused_before_it_is_read():
    with pytest.raises(ConfigError, match=r"'/dev/zero' is a character device"):
        read_config_text("/dev/zero")


def test_text_that_is_not_utf8_is_refused_naming_the_byte(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"not UTF-8 text \(invalid continuation byte at byte"):
        read_toml(path)
