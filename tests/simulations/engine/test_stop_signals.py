"""A stop signal caught by another thread still stops a main thread blocked in a join (the
relay of :mod:`fedlmc.simulations.engine.stop_signals`): what Flower's simulation does while a sweep
runs. A small child process, no Ray (tests/simulations/records/test_out_dir_lock.py and
tests/simulations/runs/test_sweep.py send the signals to real sweeps)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
CHILD = """
import signal, sys, threading, time
from fedlmc.simulations.engine.stop_signals import exit_status, handle_signals
handle_signals()
worker = threading.Thread(target=time.sleep, args=(60,), daemon=True)
worker.start()
def send():
    time.sleep(0.5)
    signal.pthread_kill(worker.ident, getattr(signal, sys.argv[1]))  # not the main thread
threading.Thread(target=send, daemon=True).start()
start = time.monotonic()
try:
    worker.join()
except KeyboardInterrupt as interrupt:
    print(f"{type(interrupt).__name__} {time.monotonic() - start:.1f}", flush=True)
    sys.exit(exit_status(interrupt))
"""


@pytest.mark.parametrize(
    "name, status, raised", [("SIGINT", 130, "KeyboardInterrupt"), ("SIGTERM", 143, "Terminated")]
)
@pytest.mark.slow
def test_a_signal_caught_by_another_thread_stops_the_blocked_main_thread(name, status, raised):
    done = subprocess.run(
        [sys.executable, "-c", CHILD, name],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == status, done.stderr
    kind, seconds = done.stdout.split()
    assert kind == raised and float(seconds) < 20  # not the worker's 60 s
    assert "Traceback" not in done.stderr


def test_exit_status_of_each_stop():
    from fedlmc.simulations.engine.stop_signals import Terminated, exit_status

    assert exit_status(KeyboardInterrupt()) == 128 + signal.SIGINT == 130
    assert exit_status(Terminated()) == 128 + signal.SIGTERM == 143
