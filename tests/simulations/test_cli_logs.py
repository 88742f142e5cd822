"""What a real ``fedlmc run`` leaves in a log file (its output not a terminal): no colour codes,
no carriage-return frames, no "Manually terminating ClientAppActor" shutdown warning, and a
table and a last line that say how many clients were merged and which one was dropped."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # one real federation: 3 clients, partition 1 raises
def test_a_run_logged_to_a_file_is_plain_and_names_the_dropped_client(tmp_path):
    log = tmp_path / "run.log"
    args = ["epochs=1", "width=0.125", "depth=2", "base-hidden=64", "num-clients=3"]
    args += ["min-clients=2", "inject-failure=raise:1", "diagnostics=false", "methods=average"]
    with log.open("w") as file:  # stdout and stderr into one file, as `> run.log 2>&1`
        done = subprocess.run(
            [sys.executable, "-m", "fedlmc.simulations.cli", "run", *args],
            stdout=file,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=300,
        )
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\x1b[" not in text and "\r" not in text, repr(text[-2000:])
    assert "Manually terminating" not in text, text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["method", "accuracy"])
    assert lines[header].split()[-1] == "clients_survived"
    assert lines[header + 1].split()[0] == "average" and lines[header + 1].split()[-1] == "2"
    last = re.fullmatch(
        r"clients: 2 of 3 merged; dropped: node \d+ \(partition 1\): (.*)", lines[-1]
    )
    assert last is not None and "injected failure on partition 1" in last.group(1), lines[-1]
    assert "dropped reply from node" in text  # the server's warning, in plain text
