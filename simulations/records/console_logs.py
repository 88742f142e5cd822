"""Log lines a person can read in a file: no colour codes where the output is not a terminal
(:func:`plain_logs`), and no warning for what happens at the end of every run (Flower ending
its client actors). The driver says "not a terminal" to the client actors Ray starts through
Ray's own switch, ``RAY_COLOR_PREFIX=0``, which they inherit
(:func:`fedlmc.simulations.engine.log_filters.quiet_flower` sets it)."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any


class _DropActorTermination(logging.Filter):
    """Hides the warning Flower's client actor logs when Flower ends it at the end of every
    simulation ("Manually terminating ClientAppActor"): expected, not a failure."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Manually terminating")


PLAIN = "RAY_COLOR_PREFIX"
"""The environment variable saying the output is not a terminal: Ray's own switch for the
colour of the prefix of worker lines (``0``: none), inherited by the client actors."""


def plain_logs(stream: Any = None) -> bool:
    """Whether log lines go without colour codes: ``stream`` (default ``sys.stderr``) is not a
    terminal, or ``RAY_COLOR_PREFIX=0`` says so (set by the driver for its client actors)."""
    stream = sys.stderr if stream is None else stream
    if os.environ.get(PLAIN) == "0":
        return True
    return not getattr(stream, "isatty", lambda: False)()


def colour_flower(coloured: bool) -> None:
    """Flower's console handler with or without its colour codes on the level names."""
    from flwr.supercore.logger import update_console_handler

    update_console_handler(colored=coloured)


def quiet_client_actor() -> None:
    """In a client actor (on import of the ClientApp): hide Flower's "Manually terminating"
    warning and log without colour codes where the driver's output is not a terminal."""
    logger = logging.getLogger("flwr")
    if not any(isinstance(f, _DropActorTermination) for f in logger.filters):
        logger.addFilter(_DropActorTermination())
    if os.environ.get(PLAIN) == "0":
        colour_flower(False)
