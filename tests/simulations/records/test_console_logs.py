"""Log lines without colour codes where the output is not a terminal, and without Flower's
warning at the end of every run (:mod:`fedlmc.simulations.records.console_logs`)."""

from __future__ import annotations

import io
import logging
import sys

from flwr.supercore import log
from flwr.supercore.logger import console_handler

from fedlmc.simulations.records.console_logs import PLAIN, plain_logs, quiet_client_actor


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_client_actor_of_a_plain_driver_logs_no_colour_and_no_termination(monkeypatch):
    assert plain_logs(io.StringIO()) and not plain_logs(Terminal())
    monkeypatch.setenv(PLAIN, "0")  # what the driver sets when its output is not a terminal
    assert plain_logs(Terminal())
    logger = logging.getLogger("flwr")
    # none of the filters an earlier test of this worker left (importing the ClientApp adds it)
    monkeypatch.setattr(logger, "filters", [])
    coloured, stream = console_handler.colored, io.StringIO()
    console_handler.setStream(stream)
    try:
        quiet_client_actor()
        quiet_client_actor()  # once only
        log(logging.WARNING, "Manually terminating %s", "ClientAppActor")
        log(logging.WARNING, "a client warning")
    finally:
        added = list(logger.filters)
        console_handler.setStream(sys.stderr)
        console_handler.colored = coloured
    assert len(added) == 1
    assert stream.getvalue().splitlines() == ["WARNING :   a client warning"]
