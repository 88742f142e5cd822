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


RAY_STARTER = textwrap.dedent(
    """
    import os, time
    import ray
    from fedlmc.simulations.engine import ray_runtime

    ray_runtime.start_local_ray(
        {"address": "local", "num_cpus": 1, "include_dashboard": False,
         "_system_config": dict(ray_runtime.LOCAL_SYSTEM_CONFIG)}, 1,
    )

    @ray.remote
    class Echo:
        def value(self):
            return os.getpid()

    print(ray.get(Echo.remote().value.remote(), timeout=120), flush=True)  # a worker runs
    time.sleep(600)
    """
)


def processes_below(root: int) -> dict[int, tuple[bytes, str]]:
    """``root``'s live processes below it: pid -> (start time, name)."""
    stats = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        name = stat.partition(b" (")[2].rpartition(b")")[0].decode(errors="replace")
        stats[int(entry)] = (stat.rpartition(b")")[2].split(), name)
    found, todo = {}, [root]
    while todo:
        parent = todo.pop()
        children = [p for p, (fields, _) in stats.items() if int(fields[1]) == parent]
        found.update({c: (stats[c][0][19], stats[c][1]) for c in children})
        todo += children
    return found


def still_running(processes: dict[int, tuple[bytes, str]]) -> list[str]:
    alive = []
    for pid, (started, name) in processes.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()
        except OSError:
            continue
        if fields[19] == started and fields[0] != b"Z":
            alive.append(f"{pid} {name}")
    return alive


@pytest.mark.slow
def test_a_killed_process_takes_every_process_of_its_local_ray():
    """A real local Ray (``start_local_ray``): every process of it (GCS, raylet, the dashboard
    and runtime-env agents, the worker) holds the token in a readable ``/proc/PID/environ``
    (before, the agents' title overwrote its first few hundred bytes: 503 zero bytes here, and
    with them the token where it fell there); after a ``kill -9`` of the process that started
    it, none of them is left within 20 s (Ray alone keeps the agents 60 s)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "SPT_"))}
    env["HOME"] = "/nonexistent"  # no ~/.ray/auth_token
    starter = subprocess.Popen(
        [sys.executable, "-c", RAY_STARTER],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    ray_processes = {}
    try:
        assert int(starter.stdout.readline())  # the worker answered
        ray_processes = {
            pid: found
            for pid, found in processes_below(starter.pid).items()
            if "-I -S -c"
            not in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        }
        names = " ".join(name for _, name in ray_processes.values())
        assert "raylet" in names and "gcs_server" in names and "ray::Dashboar" in names, names
        environments = {pid: Path(f"/proc/{pid}/environ").read_bytes() for pid in ray_processes}
        tokens = {
            v
            for e in environments.values()
            for v in e.split(b"\0")
            if v.startswith(b"RAY_AUTH_TOKEN=")
        }
        assert len(tokens) == 1
        for pid, environ in environments.items():
            assert not environ.startswith(b"\0"), f"{ray_processes[pid][1]}: environ overwritten"
            assert tokens <= set(environ.split(b"\0")), ray_processes[pid][1]
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(timeout=10)
        deadline = time.monotonic() + 20
        while still_running(ray_processes) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not still_running(ray_processes)
    finally:
        if starter.poll() is None or still_running(ray_processes):
            os.killpg(starter.pid, signal.SIGKILL)
        starter.wait(timeout=10)
        starter.stdout.close()
