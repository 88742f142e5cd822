""":func:`fedlmc.simulations.engine.exit_workaround.exit_even_if_stuck`: a process whose
non-daemon thread never returns (Flower's worker threads in ``ray.get`` after an interrupted
simulation) still exits, with the code it was given, ``grace`` seconds into its shutdown. Each
test starts a Python process: ``slow``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

STUCK = textwrap.dedent(
    """
    import sys, threading
    from fedlmc.simulations.engine.exit_workaround import exit_even_if_stuck

    threading.Thread(target=threading.Event().wait).start()  # never returns
    exit_even_if_stuck({code}, grace={grace})
    exit_even_if_stuck(99, grace=0)  # armed once: the second call changes nothing
    print("main done", flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("grace", [0.0, 0.5])
def test_a_process_with_a_stuck_thread_exits_with_its_code(grace):
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", STUCK.format(code=7, grace=grace)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 7, out.stderr
    assert out.stdout == "main done\n"  # printed and flushed before the exit
    assert time.monotonic() - started >= grace


@pytest.mark.slow
def test_without_it_the_stuck_thread_keeps_the_process_alive():
    """The control: the same process without the workaround does not exit on its own."""
    code = "import threading; threading.Thread(target=threading.Event().wait).start()"
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=1.5)
