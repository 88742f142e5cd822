"""The suite sends no telemetry (``tests/conftest.py``, ``send_no_telemetry``): Flower reads
``FLWR_TELEMETRY_ENABLED`` once, when it is imported, so the variable must be set before any
test imports Flower, and the processes the suite starts inherit it."""

from __future__ import annotations

import os
import urllib.request

import pytest


def test_flower_posts_no_telemetry_event_from_the_suite(monkeypatch: pytest.MonkeyPatch):
    from flwr.supercore import telemetry

    def no_request(*args, **kwargs):
        raise AssertionError(f"a telemetry request: {args[0].full_url}")

    monkeypatch.setattr(urllib.request, "urlopen", no_request)
    assert os.environ["FLWR_TELEMETRY_ENABLED"] == "0"  # what the processes it starts inherit
    assert telemetry.FLWR_TELEMETRY_ENABLED == "0"  # what Flower read at its import
    assert telemetry.create_event(telemetry.EventType.RUN_SUPERNODE_ENTER, None) == "disabled"
