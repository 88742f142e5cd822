"""A process that can exit after an interrupted simulation (:func:`exit_even_if_stuck`) and
one that exits without the interpreter's teardown (:func:`exit_without_teardown`)."""

from __future__ import annotations

import atexit
import os
import sys
import threading

from fedlmc.simulations.engine.compat import join_threads_as_at_exit, register_before_thread_join

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


def exit_without_teardown(code: int) -> None:
    """Exit with ``code`` as the interpreter would, less its teardown of the modules.

    After a simulation the interpreter's last step (``Py_FinalizeEx``: clearing every module
    and a full garbage collection of what torch, Ray, gRPC and Flower left behind) took
    6.6 s of a 32 s ``fedlmc run`` on a quiet 2-core machine, after the last line was printed.
    Everything that can matter runs first, in the interpreter's order: the callbacks before the
    thread join and the join of the non-daemon threads
    (:func:`~fedlmc.simulations.engine.compat.join_threads_as_at_exit`), then the ``atexit``
    handlers (logging's flush, Ray's and torch's own), then the streams are flushed. Results
    are never at stake: every file fedlmc writes is written atomically and closed before.
    """
    join_threads_as_at_exit()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # what the interpreter returns when it cannot flush stdout
    os._exit(code)
