"""Flower's and Ray's console output during a sweep: Flower's logger at WARNING and its
deprecation notice of ``run_simulation`` hidden, unless ``verbose`` (:func:`quiet_flower`), and
the errors and tracebacks Flower's simulation worker logs for a client actor that died because
this process is stopping hidden always: its owner (this process) exiting, or the stop signal
itself (SIGTERM or SIGINT sent to the process group reaches the Ray workers too, and each client
actor in the middle of a message dies with it: two tracebacks for two clients). Once
:func:`fedlmc.simulations.engine.stop_signals.stopping` says a stop signal was caught, every
error Flower's message-processing worker logs is such noise: the cells in flight are abandoned
and the command's one line says so."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

from fedlmc.simulations.engine.stop_signals import stopping

FLOWER_WORKER_MODULES = ("vce_api", "raybackend")
"""Flower's modules that log a client actor's failure while processing a message (the
simulation engine's worker loop and its Ray backend)."""


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


@contextmanager
def quiet_flower(verbose: bool) -> Iterator[None]:
    """Flower's logger at WARNING (our strategies' warnings still show) unless ``verbose``."""
    logger = logging.getLogger("flwr")
    level, notice, shutdown = logger.level, _DropDeprecationNotice(), _DropOwnerExitTraceback()
    logger.addFilter(shutdown)
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
