"""The suite sends no telemetry (``tests/conftest.py``, ``send_no_telemetry``): Flower reads
``FLWR_TELEMETRY_ENABLED`` once, when it is imported, so the variable must be set before any
test imports Flower; the processes the suite starts inherit it from the environment."""

from __future__ import annotations

import os


def test_flower_telemetry_is_off_in_the_suite_and_in_the_processes_it_starts():
    from flwr.supercore import telemetry

    assert os.environ["FLWR_TELEMETRY_ENABLED"] == "0"  # what the processes it starts inherit
    assert telemetry.FLWR_TELEMETRY_ENABLED == "0"  # what Flower read at its import here
