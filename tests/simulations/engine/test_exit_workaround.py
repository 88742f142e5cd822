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


LEAVE = textwrap.dedent(
    """
    import atexit, sys, threading, time
    from fedlmc.simulations.engine.exit_workaround import exit_even_if_stuck, exit_without_teardown

    class Teardown:  # the module's teardown would print this; the early exit skips it
        def __del__(self):
            print("module teardown", flush=True)

    keep = Teardown()
    atexit.register(lambda: print("atexit ran", file=sys.stderr))
    def late():
        time.sleep(0.3)
        print("thread joined")  # stdout to a pipe: buffered until the exit flushes it
    threading.Thread(target=late).start()
    {stuck}
    sys.stdout.write("unflushed line\\n")  # flushed by the exit
    exit_without_teardown({code})
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("code", [0, 3])
def test_the_console_exit_keeps_the_shutdown_order_less_the_modules_teardown(code):
    """:func:`~fedlmc.simulations.engine.exit_workaround.exit_without_teardown` (the ``fedlmc``
    console script's exit): the non-daemon thread is joined, the ``atexit`` handler runs,
    buffered output is flushed and the code is the one given; only the teardown is skipped."""
    out = subprocess.run(
        [sys.executable, "-c", LEAVE.format(code=code, stuck="")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == code, out.stderr
    assert out.stdout.splitlines() == ["unflushed line", "thread joined"], out
    assert out.stderr.splitlines()[-1] == "atexit ran", out.stderr
    # the control: the same process left by sys.exit runs the teardown
    plain = LEAVE.format(code=code, stuck="").replace("exit_without_teardown(", "sys.exit(")
    control = subprocess.run([sys.executable, "-c", plain], capture_output=True, text=True)
    assert "module teardown" in control.stdout and control.returncode == code


@pytest.mark.slow
def test_the_console_exit_still_leaves_when_a_thread_is_stuck():
    """After an interrupted simulation a thread never returns: the exit armed by
    :func:`~fedlmc.simulations.engine.exit_workaround.exit_even_if_stuck` still fires inside
    the thread join that :func:`~fedlmc.simulations.engine.exit_workaround.exit_without_teardown`
    runs first."""
    stuck = (
        "threading.Thread(target=threading.Event().wait).start(); exit_even_if_stuck(5, grace=0.5)"
    )
    out = subprocess.run(
        [sys.executable, "-c", LEAVE.format(code=0, stuck=stuck)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 5, out.stderr
