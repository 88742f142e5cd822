"""SIGINT and SIGTERM stop a command cleanly, whichever thread the kernel hands them to.

- :func:`handle_signals` (the ``fedlmc`` command calls it first): SIGTERM raises
  :class:`Terminated` (a ``KeyboardInterrupt``) in the main thread, as Ctrl-C raises
  ``KeyboardInterrupt``: the same clean stop (the cell in flight abandoned, the rows already
  written whole), exit status 143 (128 + 15) instead of 130 (:func:`exit_status`).
  ``ray.init`` replaces the SIGTERM handler with its own ``sys.exit``: the engine calls
  :func:`restore_signals` once Ray is up, which does nothing in a process that never called
  :func:`handle_signals` (a notebook keeps its own handlers).
- The relay: a signal sent to the process (``kill -INT PID``, ``kill PID``) goes to any of its
  threads that does not block it, and Python runs its handler only in the main thread, between
  two bytecodes. A main thread blocked in ``Thread.join`` (Flower's simulation waits so for its
  workers) is woken only by a signal delivered to that very thread; otherwise the handler
  waits until the whole sweep has run. Python writes every caught signal's number to a wakeup
  file descriptor (``signal.set_wakeup_fd``); a daemon thread counts them and, when the main
  thread has run the handler fewer times than the signal was caught :data:`RELAY_AFTER`
  seconds later, sends it again to the main thread alone (``signal.pthread_kill``), which
  interrupts the wait. A signal whose handler did run is never resent: a second one in the
  middle of the clean stop (Ray shutting down) would kill the process.
- :func:`stopping`: whether a stop signal was caught, known the moment it arrives (the relay
  reads it from the wakeup descriptor at once). A signal to the process group (Ctrl-C, a batch
  system's SIGTERM) also reaches the Ray workers, whose client actors die mid-message; Flower
  then logs each as an error with a traceback. Those are shutdown noise once the process is
  stopping, and :func:`fedlmc.simulations.engine.log_filters.quiet_flower` hides them.
"""

from __future__ import annotations

import os
import signal
import threading
import time

__all__ = [
    "RELAY_AFTER",
    "Terminated",
    "exit_status",
    "handle_signals",
    "restore_signals",
    "stopping",
]

INTERRUPTED = 128 + signal.SIGINT  # 130
RELAY_AFTER = 0.5  # seconds the main thread has to run a handler before the relay resends
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_handled = {signal.SIGINT: 0, signal.SIGTERM: 0}  # handler runs per signal (main thread)
_relay_started = False
_installed = False
_stopping = threading.Event()  # set as soon as a stop signal is caught, in any thread


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's ``KeyboardInterrupt``: the same clean
    stop, exit status 143 (128 + SIGTERM)."""

    exit_status = 128 + signal.SIGTERM


def stopping() -> bool:
    """Whether this process caught SIGINT or SIGTERM (it is stopping): set by the relay the
    moment the signal arrives, before the main thread's handler runs, so that the shutdown
    noise of the client actors that die with the process group can be told from a client
    failure (:mod:`fedlmc.simulations.engine.log_filters`)."""
    return _stopping.is_set()


def _on_signal(signum: int, frame: object) -> None:
    _stopping.set()
    _handled[signum] += 1
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def exit_status(interrupt: KeyboardInterrupt) -> int:
    """130 for Ctrl-C (SIGINT), 143 for SIGTERM (:class:`Terminated`)."""
    return int(getattr(interrupt, "exit_status", INTERRUPTED))


def handle_signals() -> None:
    """SIGINT and SIGTERM raise ``KeyboardInterrupt`` / :class:`Terminated` in the main thread,
    relayed there when another thread caught them (module docstring). Nothing when called
    from another thread (only the main thread can set handlers)."""
    global _installed
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_signal)
    _installed = True
    _start_relay()


def restore_signals() -> None:
    """:func:`handle_signals` again, when this process called it before (after ``ray.init``
    replaced the SIGTERM handler); nothing otherwise."""
    if _installed:
        handle_signals()


def _start_relay() -> None:
    global _relay_started
    if _relay_started:
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter
        os.close(read_end)
        os.close(write_end)
        return
    _relay_started = True
    main = threading.main_thread().ident
    thread = threading.Thread(
        target=_relay, args=(read_end, main), name="fedlmc-signal-relay", daemon=True
    )
    thread.start()


def _relay(read_end: int, main: int | None) -> None:
    """Resend a stop signal to the main thread when its handler has not run there, for every
    time the signal was caught, within :data:`RELAY_AFTER` seconds (never when it has: a
    second signal in the middle of the clean stop would break it)."""
    received = dict.fromkeys(_handled, 0)
    while True:
        data = os.read(read_end, 64)
        if not data:
            return
        for signum in data:
            if signum in received:
                received[signum] += 1
                _stopping.set()
        time.sleep(RELAY_AFTER)
        for signum, count in received.items():
            if _handled[signum] < count and main is not None:
                received[signum] = _handled[signum]  # the resent signal's own byte follows
                signal.pthread_kill(main, signum)
