"""The watcher of :mod:`fedlmc.simulations.engine.ray_reaper`: a ``kill -9`` of the process
that armed it ends the processes started with its token, and only those, even while a child it
forked lives on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

STARTER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from fedlmc.simulations.engine.ray_reaper import reap_when_this_process_dies

    reap_when_this_process_dies("a" * 64)
    forked = os.fork()  # a forked child (a data loader's worker) that outlives the starter
    if forked == 0:
        time.sleep(120)
        os._exit(0)
    print(forked, flush=True)
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    for token in ("a" * 64, "b" * 64):  # its own Ray's, another run's
        env = {**os.environ, "RAY_AUTH_TOKEN": token}
        child = subprocess.Popen(sleeper, env=env, start_new_session=True)
        print(child.pid, flush=True)
    time.sleep(120)
    """
)


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_a_killed_starter_takes_the_processes_with_its_token_and_no_other():
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    forked, mine, other = (int(starter.stdout.readline()) for _ in range(3))
    try:
        assert running(mine) and running(other)
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(timeout=10)
        deadline = time.monotonic() + 10
        while running(mine) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(mine), "the process with the run's token outlived it"
        assert running(other), "a process with another token was killed"
        assert running(forked)  # it held no copy of the pipe: the watcher did not wait for it
    finally:
        for pid in (forked, mine, other):
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        starter.stdout.close()
