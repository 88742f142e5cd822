"""Flower's and Ray's console output during a sweep: Flower's logger at WARNING and its
deprecation notice of ``run_simulation`` hidden, unless ``verbose`` (:func:`quiet_flower`), and
the errors and tracebacks Flower's simulation worker logs for a client actor that died because
this process is stopping hidden always: its owner (this process) exiting, or the stop signal
itself (SIGTERM or SIGINT sent to the process group reaches the Ray workers too, and each client
actor in the middle of a message dies with it: two tracebacks for two clients). Once
:func:`fedlmc.simulations.engine.stop_signals.stopping` says a stop signal was caught, every
error Flower's message-processing worker logs is such noise: the cells in flight are abandoned
and the command's one line says so. Ray's own deserializer logs such an actor's death as a
failed assertion with a traceback: hidden likewise once stopping (:data:`RAY_STOP_NOISE_LOGGERS`).

Into a file or a pipe (not a terminal: :func:`plain_logs`) the output carries no colour codes:
Flower's level names are left plain and Ray's ``(ClientAppActor pid=N)`` prefixes uncoloured
(``RAY_COLOR_PREFIX=0``, which Ray reads as it prints each line forwarded from a worker, and
which the client actors inherit: their own Flower logger goes plain with it,
:func:`fedlmc.simulations.records.console_logs.quiet_client_actor`, which also hides the
warning each client actor logs as Flower ends it, "Manually terminating ClientAppActor": every
run ends that way)."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from fedlmc.simulations.engine.stop_signals import stopping
from fedlmc.simulations.records.console_logs import PLAIN, colour_flower, plain_logs

FLOWER_WORKER_MODULES = ("vce_api", "raybackend")
"""Flower's modules that log a client actor's failure while processing a message (the
simulation engine's worker loop and its Ray backend)."""

RAY_STOP_NOISE_LOGGERS = ("ray._private.serialization",)
"""Ray's loggers that report a client actor killed by the stop signal as an error with a
traceback: reading the reply of an actor that died of SIGTERM, Ray's deserializer asserts that
the error carries an ``actor_died_error`` field and logs the failed assertion (Ray 2.x). Hidden
once the process is stopping, shown otherwise. The filter stays after the sweep: Ray's threads
may read a dead actor's reply while the process exits, after :func:`quiet_flower` has ended."""


class _DropDeprecationNotice(logging.Filter):
    """Hides Flower's run_simulation deprecation notice (printed on every call otherwise)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "DEPRECATED FEATURE" not in record.getMessage()


class _DropOwnerExitTraceback(logging.Filter):
    """Hides Flower's worker errors for a ``ClientAppActor`` whose owner (this process) has
    died or is exiting, and every error of Flower's message worker once a stop signal was
    caught: shutdown noise after SIGINT / SIGTERM, not a client failure (a client that fails
    while the sweep runs is reported by the strategy, by name)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "ActorDiedError" in text and "its owner has died" in text:
            return False
        return not (stopping() and record.module in FLOWER_WORKER_MODULES)


class _DropWhileStopping(logging.Filter):
    """Hides every record once a stop signal was caught (Ray's shutdown noise)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not stopping()


_RAY_STOP_NOISE = _DropWhileStopping()


@contextmanager
def quiet_flower(verbose: bool) -> Iterator[None]:
    """Flower's logger at WARNING (our strategies' warnings still show) unless ``verbose``;
    no colour codes into a file or a pipe (:func:`plain_logs`), for this process and the
    client actors Ray starts meanwhile."""
    logger = logging.getLogger("flwr")
    level, notice, shutdown = logger.level, _DropDeprecationNotice(), _DropOwnerExitTraceback()
    plain, before = plain_logs(), os.environ.get(PLAIN)
    if plain:
        os.environ[PLAIN] = "0"
        colour_flower(False)
    logger.addFilter(shutdown)
    for name in RAY_STOP_NOISE_LOGGERS:
        logging.getLogger(name).addFilter(_RAY_STOP_NOISE)  # once: a filter is added once
    if not verbose:
        logger.setLevel(logging.WARNING)
        logger.addFilter(notice)
    try:
        with warnings.catch_warnings():
            if not verbose:  # Ray's tip about CUDA_VISIBLE_DEVICES for num_gpus=0 actors
                warnings.filterwarnings("ignore", message="Tip: In future versions of Ray")
            yield
    finally:
        logger.setLevel(level)
        logger.removeFilter(notice)
        logger.removeFilter(shutdown)
        if plain:
            colour_flower(True)
            if before is None:
                os.environ.pop(PLAIN, None)
            else:
                os.environ[PLAIN] = before
