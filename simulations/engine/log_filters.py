"""Flower's and Ray's console output during a sweep: Flower's logger at WARNING and its
deprecation notice of ``run_simulation`` hidden, unless ``verbose`` (:func:`quiet_flower`), and
the traceback Flower's simulation worker logs for a client actor that died because this process,
its owner, is exiting (a stop signal: the actors go down with it) hidden always."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


class _DropDeprecationNotice(logging.Filter):
    """Hides Flower's run_simulation deprecation notice (printed on every call otherwise)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "DEPRECATED FEATURE" not in record.getMessage()


class _DropOwnerExitTraceback(logging.Filter):
    """Hides Flower's worker traceback for a ``ClientAppActor`` whose owner (this process) has
    died or is exiting: shutdown noise after SIGINT / SIGTERM, not a client failure (a client
    that fails while the sweep runs is reported by the strategy, by name)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("ActorDiedError" in text and "its owner has died" in text)


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
