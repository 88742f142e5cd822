"""The ServerApp inside an engine simulation (:class:`SweepServer`): runs every cell (a
:class:`CellJob`) in a thread of its own on a
:class:`~fedlmc.simulations.engine.grid_view.CellGrid`, several at once, and reports each as a
:class:`CellResult` (see
:mod:`fedlmc.simulations.engine.cells`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedlmc.simulations.config.run_plan import plan_run
from fedlmc.simulations.engine.grid_view import CellGrid
from fedlmc.simulations.engine.slots import Broker, EngineStopped
from fedlmc.simulations.records.server_outcome import ServerOutcome
from fedlmc.simulations.server_app import run_server


@dataclass
class CellJob:
    """One cell to run: ``key`` (e.g. the cell id) and its validated run config; ``say``
    receives its stages (:mod:`fedlmc.simulations.records.progress`; ``fedlmc run``), none in a
    sweep."""

    key: str
    config: dict[str, Any]
    say: Callable[[str], None] | None = None


@dataclass
class CellResult:
    """A finished cell: the ServerApp's outcome, or the exception that ended it."""

    key: str
    config: dict[str, Any]
    outcome: ServerOutcome | None = None
    error: BaseException | None = None
    seconds: float = 0.0


class SweepServer:
    """The ServerApp of one engine simulation: runs ``jobs`` on one Grid, several at once."""

    def __init__(
        self,
        jobs: Sequence[CellJob],
        *,
        slots: int,
        pool_size: int,
        max_in_flight: int,
        on_done: Callable[[CellResult], None],
        on_start: Callable[[CellJob], None] | None,
        stop: threading.Event,
        on_reply: Callable[[CellJob, int], None] | None = None,
    ) -> None:
        self.jobs = list(jobs)
        self.slots = slots
        self.pool_size = pool_size
        self.max_in_flight = max(1, int(max_in_flight))
        self.on_done = on_done
        self.on_start = on_start
        self.on_reply = on_reply
        self.stop = stop
        self.finished: set[str] = set()
        self.fatal: BaseException | None = None
        self._report_lock = threading.Lock()

    def app(self) -> ServerApp:
        server = ServerApp()
        server.main()(self.main)
        return server

    def main(self, grid: Grid, context: Context) -> None:
        broker = Broker(grid, self.slots, self.pool_size, self.stop).start()
        gate = threading.BoundedSemaphore(self.max_in_flight)
        threads = []
        try:
            for priority, job in enumerate(self.jobs):
                while not gate.acquire(timeout=0.2):
                    if self.stop.is_set():
                        return
                if self.stop.is_set():
                    gate.release()
                    return
                thread = threading.Thread(
                    target=self._run_cell,
                    args=(broker, job, priority, gate),
                    name=f"fedlmc-cell-{job.key}",
                    daemon=True,  # a cell busy computing must not hold the process at exit
                )
                thread.start()
                threads.append(thread)
            while any(t.is_alive() for t in threads) and not self.stop.is_set():
                time.sleep(0.05)
        finally:
            broker.close()

    def _run_cell(
        self, broker: Broker, job: CellJob, priority: int, gate: threading.BoundedSemaphore
    ) -> None:
        start = time.perf_counter()
        heard = None if self.on_reply is None else partial(self.on_reply, job)
        result = CellResult(job.key, job.config)
        grid: CellGrid | None = None
        try:
            try:
                plan = plan_run(job.config)  # a sweep's cell: validated already, planned once
                exclusive = bool(plan.client.queried_methods)  # clients keep trained models
                n = job.config["num-clients"]
                grid = CellGrid(broker, n, priority, exclusive, on_reply=heard)
                if self.on_start is not None:
                    self.on_start(job)
                result.outcome = run_server(grid, plan, simulated=True, say=job.say)
            except EngineStopped:
                return
            except Exception as err:  # noqa: BLE001 - a failed cell is a result, the others go on
                result.error = err
            finally:
                if grid is not None:
                    grid.close()
            result.seconds = time.perf_counter() - start
            self._report(result)
        finally:
            gate.release()  # after the report: the next cell starts once this one is counted

    def _report(self, result: CellResult) -> None:
        with self._report_lock:
            if self.stop.is_set():
                return
            try:
                self.on_done(result)
                self.finished.add(result.key)
            except BaseException as err:  # e.g. results.csv cannot be written: stop everything
                self.fatal = err
                self.stop.set()
