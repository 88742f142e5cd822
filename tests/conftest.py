"""Shared fixtures, and each pytest-xdist worker's share of the cores."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist, each worker process computes with its share of the cores:
    ``max(1, C // workers)`` torch and BLAS threads (:func:`use_threads`). torch's default is
    one thread per core in every process, so two workers on two cores ran four threads, and a
    test's many small parallel ops waited on a preempted thread (the compare fixture took 42 s
    beside another worker against 5.5 s alone). Processes a test starts and the server threads
    a run sets keep the project's own rule (:mod:`fedlmc.simulations.config.threads`)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        from fedlmc.simulations.config.threads import usable_cores, use_threads

        use_threads(max(1, usable_cores() // workers))


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
