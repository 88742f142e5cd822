"""The suite writes bytecode caches, and so do the processes it starts (``tests/conftest.py``,
``write_bytecode``): with ``PYTHONDONTWRITEBYTECODE`` set by the caller's shell, every one of
the suite's Python processes compiled fedlmc's modules again."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_the_suite_and_the_processes_it_starts_write_bytecode():
    assert not sys.dont_write_bytecode
    probe = (
        "import os, sys; print(sys.dont_write_bytecode, 'PYTHONDONTWRITEBYTECODE' in os.environ)"
    )
    child = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert child.stdout.split() == ["False", "False"]
