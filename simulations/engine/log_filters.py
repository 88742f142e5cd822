"""Flower's and Ray's console output during a sweep: Flower's logger at WARNING and its
deprecation notice of ``run_simulation`` hidden, unless ``verbose`` (:func:`quiet_flower`)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager


class _DropDeprecationNotice(logging.Filter):
    """Hides Flower's run_simulation deprecation notice (printed on every call otherwise)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "DEPRECATED FEATURE" not in record.getMessage()


@contextmanager
def quiet_flower(verbose: bool) -> Iterator[None]:
    """Flower's logger at WARNING (our strategies' warnings still show) unless ``verbose``."""
    logger = logging.getLogger("flwr")
    level, notice = logger.level, _DropDeprecationNotice()
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
