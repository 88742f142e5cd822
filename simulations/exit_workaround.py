"""A process that can exit after an interrupted simulation (:func:`exit_even_if_stuck`), and
SIGTERM handled like Ctrl-C (:func:`handle_sigterm`)."""

from __future__ import annotations

import os
import signal
import sys
import threading

from fedlmc.simulations.compat import register_before_thread_join

EXIT_GRACE_SECONDS = 3.0
INTERRUPTED = 130  # 128 + SIGINT
_exit_armed = False


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's ``KeyboardInterrupt``
    (:func:`handle_sigterm`): the same clean stop, exit status 143 (128 + SIGTERM)."""

    exit_status = 128 + signal.SIGTERM


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def handle_sigterm() -> None:
    """From now on SIGTERM raises :class:`Terminated` in the main thread (nothing when called
    from another thread: only the main thread can set a handler). ``ray.init`` replaces the
    handler with its own ``sys.exit``: the engine calls this again once Ray is up."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """130 for Ctrl-C (SIGINT), 143 for SIGTERM (:class:`Terminated`)."""
    return int(getattr(interrupt, "exit_status", INTERRUPTED))


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
