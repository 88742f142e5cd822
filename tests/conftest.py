"""Shared fixtures, and each pytest-xdist worker's share of the cores."""

from __future__ import annotations

import atexit
import gc
import os
import sys

import pytest


def write_bytecode() -> None:
    """The suite and every process it starts write Python's bytecode caches (``__pycache__``,
    ignored by git), even where the caller's shell sets ``PYTHONDONTWRITEBYTECODE``. The suite
    starts hundreds of Python processes (ClientApps, SuperNodes' apps, ``fedlmc`` and ``flwr``
    commands), and without the caches each one compiled fedlmc's modules again and each worker
    rewrote every test module: ``tests/simulations/test_client_app.py`` took 39.6 s with the
    variable set against 28.6 s with the caches written (37.2 s on the run that writes them;
    2026-12-07, 2 cores). Speed only: what a test computes is the same either way."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


def send_no_telemetry() -> None:
    """Flower sends no telemetry from the suite or any process it starts
    (``FLWR_TELEMETRY_ENABLED=0``, whatever the caller's shell says, set before Flower is
    imported: Flower reads it once, at import). Otherwise the Flower processes the suite starts
    post their events to ``telemetry.flower.ai``, and the SuperLinks, SuperNodes and ServerApp
    processes wait up to 4 s for the post before they exit
    (``flwr.supercore.exit.flwr_exit``): a test run is not a user's run to report, and where
    outbound connections hang instead of failing (a firewalled CI runner) each of those exits
    would wait the 4 s. What a test computes is unchanged."""
    os.environ["FLWR_TELEMETRY_ENABLED"] = "0"


def pytest_configure(config: pytest.Config) -> None:
    """Bytecode caches on (:func:`write_bytecode`) and Flower's telemetry off
    (:func:`send_no_telemetry`), both before pytest-xdist starts its workers, so that they
    inherit them. The objects the run made are frozen at the process's exit, after the
    ``atexit`` handlers its tests register and all of pytest's own clean-up (its collection of
    unraisable exceptions included, whatever pytest's version), so that the interpreter's
    last garbage collections skip them: at exit CPython collects every generation more than
    once while it tears the modules down, over all that torch, Flower, Ray, matplotlib and
    a thousand tests left, and each pytest-xdist worker's exit took seconds after its last
    test while the run waited for it (``benchmarks/suite_time.py``). Every ``atexit``
    handler still runs, the modules are still cleared and the streams flushed; only
    garbage in reference cycles is left to the operating system. Under pytest-xdist, each
    worker process computes with its share of the cores:
    ``max(1, C // workers)`` torch and BLAS threads (:func:`use_threads`), and the processes
    its tests start inherit that share as ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ... (a
    plain script such as ``examples/merge_two_mlps.py`` reads them; fedlmc's own processes keep
    their rule, :mod:`fedlmc.simulations.config.threads`, which does not read them). torch's
    default is one thread per core in every process, so two workers on two cores ran four
    threads, and a test's many small parallel ops waited on a preempted thread (the compare
    fixture took 42 s beside another worker against 5.5 s alone)."""
    write_bytecode()
    send_no_telemetry()
    atexit.register(gc.freeze)  # before the tests' handlers: it runs after them
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep our order (below)
        config.option.loadscopereorder = False
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        from fedlmc.simulations.config.threads import thread_variables, usable_cores, use_threads

        share = max(1, usable_cores() // workers)
        os.environ.update(thread_variables(share))
        use_threads(share)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files with the most ``slow`` tests first, the others after them, each file's tests
    and files of the same count in the order collected. Under ``--dist loadfile`` pytest-xdist
    hands a worker the next file whenever it has at most two tests left, so the longest files
    should come first; its default order (most tests first, ``--loadscope-reorder``, turned off
    in :func:`pytest_configure`) put the long deployment and sweep files, which have few tests,
    last, and the last of them ran alone while the other worker waited. Every worker sorts the
    same collection the same way, as pytest-xdist requires."""
    files: dict[object, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.path, []).append(item)

    def slow_tests(tests: list[pytest.Item]) -> int:
        return sum(1 for test in tests if test.get_closest_marker("slow") is not None)

    ordered = sorted(files.values(), key=lambda tests: -slow_tests(tests))
    items[:] = [item for tests in ordered for item in tests]


def run_federations(configs: dict[str, dict]) -> dict:
    """Each run config's federation (``run_federation_outcome``'s ServerApp and ClientApp on
    Flower's simulation engine), all as the cells of one simulation: the sweep engine's
    ``run_cells``, so that Ray and the client actors start once for a test module's
    federations instead of once each (a cell's numbers are those it gives alone:
    ``tests/simulations/engine/test_cells.py``). The outcomes by key; a cell's error is raised."""
    from fedlmc.simulations.config import validate_run_config
    from fedlmc.simulations.engine.cells import run_cells
    from fedlmc.simulations.engine.sweep_server import CellJob

    jobs = [CellJob(key, validate_run_config(c, check_devices=True)) for key, c in configs.items()]
    results: dict = {}
    run_cells(jobs, lambda result: results.__setitem__(result.key, result))
    for key in configs:
        if results[key].error is not None:
            raise results[key].error
    return {key: results[key].outcome for key in configs}


@pytest.fixture(scope="session")
def federations():
    """:func:`run_federations`, for a test module's fixture."""
    return run_federations


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
