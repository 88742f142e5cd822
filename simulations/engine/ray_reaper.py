"""The processes of a local Ray end with the process that started it, even a killed one.

A ``kill -9`` of ``fedlmc run`` leaves Ray's GCS and raylet to notice on their own (they do, in
about a second), but the raylet's dashboard agent and runtime-env agent then try to tell the
(now dead) GCS that their raylet died unexpectedly (Ray's ``process_watcher``:
``publish_error_to_driver`` with a fixed 60 s timeout) and outlive the run by 60 s or more.

:func:`reap_when_this_process_dies` starts one small watcher per process (the first call); it
holds the read end of a pipe whose write end only this process holds (Python's pipes are not
inherited across ``exec``, and a forked child closes its copy), so its read returns end-of-file
the moment this process exits, however it exits.
Then it sends SIGKILL to every process whose start-up environment (``/proc/PID/environ``) holds
one of the tokens it was given: the token of a local Ray
(:mod:`fedlmc.simulations.engine.ray_runtime`: 256 random bits, in the environment of that
Ray's every process and of nothing else), so it reaches that Ray's processes only, whatever
their pids and parents are by then. It scans again until a scan finds none (a process started
while it scanned is found by the next scan), for at most :data:`REAP_SECONDS`. A Ray already
shut down leaves nothing for it to do.

``/proc/PID/environ`` is the memory the environment was placed in at ``exec``, and a process
may write over it: Ray's agents name themselves (``ray::DashboardAgent``, Ray's copy of
``setproctitle``), which by default uses the environment's memory for a long title and zeroes
its first few hundred bytes (503 here). Where the token fell there (the order of the variables
is the raylet's), the watcher could not see it, and the two agents lived 60 s on (3 runs of 4
of a killed sweep). :func:`findable_processes` sets ``SPT_NOENV=1`` for the processes Ray
starts, setproctitle's own switch to leave the environment as it was (the title is then at
most as long as the command line, which Ray's are).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["REAP_SECONDS", "WATCHER", "findable_processes", "reap_when_this_process_dies"]

REAP_SECONDS = 20.0
"""How long the watcher goes on scanning for the run's processes after the run ended."""

WATCHER = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the run; the watcher stays
tokens = set()
for line in sys.stdin.buffer:  # until end-of-file: the process that started it is gone
    tokens.add(b"RAY_AUTH_TOKEN=" + line.strip())

def kill_holders():
    found = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as environ:
                variables = set(environ.read().split(b"\0"))  # empty for a zombie
            if tokens & variables:
                os.kill(int(pid), signal.SIGKILL)
                found += 1
        except OSError:
            pass  # gone already, or not this user's
    return found

deadline = time.monotonic() + float(sys.argv[1])
while tokens and kill_holders() and time.monotonic() < deadline:
    time.sleep(0.1)  # again: one started while it scanned, or not yet ended
"""
"""The watcher's program (``python -I -S -c WATCHER SECONDS``): one token a line on its stdin."""

SPT_NOENV = "SPT_NOENV"
"""setproctitle's switch (Ray's copy honours it): a title never overwrites the environment."""


@contextmanager
def findable_processes() -> Iterator[None]:
    """While the block runs (``ray.init`` of a local node), the processes started from this one
    (the node's, and those they start) keep their environment readable in
    ``/proc/PID/environ`` when they set their title (``SPT_NOENV=1``; module docstring). Put
    back afterwards."""
    before = os.environ.get(SPT_NOENV)
    os.environ[SPT_NOENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SPT_NOENV, None)
        else:
            os.environ[SPT_NOENV] = before


_pipe: list[int] = []
"""The write end of the watcher's pipe (kept open for as long as this process lives)."""
_watcher: list[subprocess.Popen] = []
"""The watcher (kept, so that no ``ResourceWarning`` says it still runs)."""


def reap_when_this_process_dies(token: str) -> None:
    """When this process exits (or is killed), SIGKILL every process started with
    ``RAY_AUTH_TOKEN=token`` in its environment (module docstring; start them inside
    :func:`findable_processes`). Linux only (``/proc``); elsewhere a no-op."""
    if not os.path.isdir("/proc"):
        return
    if not _pipe:
        read_end, write_end = os.pipe()  # neither end is inherited by later children
        environment = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        watcher = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", WATCHER, str(REAP_SECONDS)],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=environment,
            start_new_session=True,  # no terminal signal; it lives until this process ends
        )
        os.close(read_end)
        _pipe.append(write_end)
        _watcher.append(watcher)
        os.register_at_fork(after_in_child=_close_in_child)
    os.write(_pipe[0], token.encode() + b"\n")


def _close_in_child() -> None:
    """A forked child (e.g. a data loader's worker) lets go of the pipe: the watcher then sees
    end-of-file when this process ends, not when its last child does."""
    while _pipe:
        os.close(_pipe.pop())
