"""Shared fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture
def task_identity():
    """The task identity Flower's Message constructor reads (set by the engine in a real run)."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    keys = ("_task_id", "_run_id", "_node_id")
    saved = {k: getattr(TaskIdentity, k) for k in keys}
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 7, SUPERLINK_NODE_ID
    yield
    for key, value in saved.items():
        setattr(TaskIdentity, key, value)
