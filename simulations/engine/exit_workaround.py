"""A process that can exit after an interrupted simulation (:func:`exit_even_if_stuck`)."""

from __future__ import annotations

import os
import sys
import threading

from fedlmc.simulations.engine.compat import register_before_thread_join

EXIT_GRACE_SECONDS = 3.0
_exit_armed = False


def exit_even_if_stuck(code: int, grace: float = EXIT_GRACE_SECONDS) -> None:
    """Make sure the process can exit after an interrupted simulation.

    When the simulation stops early (Ctrl-C), Flower shuts Ray down while its worker threads
    still wait in ``ray.get`` for the running clients; those threads never return and the
    interpreter would wait for them forever at exit. This arms a timer at the start of the
    interpreter's shutdown (after the caller has printed and flushed what it had to say):
    if the process has not exited ``grace`` seconds later, it exits with ``code``. With
    ``grace = 0`` (Ctrl-C) it exits at once: the cells' threads still running would otherwise
    be torn down by the interpreter's finalisation, which can abort the process (SIGABRT from a
    thread killed inside torch) instead of exiting with ``code``. Results are safe: every
    cell's rows were written atomically when it finished, and Ray is already shut down.
    """
    global _exit_armed
    if _exit_armed:
        return
    _exit_armed = True

    def leave() -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)

    def arm() -> None:
        if grace <= 0:
            leave()
        timer = threading.Timer(grace, leave)
        timer.daemon = True
        timer.start()

    # runs before concurrent.futures joins its worker threads (registered later, called first)
    register_before_thread_join(arm)
