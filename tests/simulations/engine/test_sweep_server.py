"""The ServerApp of one engine simulation
(:class:`fedlmc.simulations.engine.sweep_server.SweepServer`) on a scripted in-process Grid
(``conftest.py``; no Ray, no training): every cell is reported once as a :class:`CellResult` (a
failed cell as its error, the others go on), at most ``max_in_flight`` cells run at once, a
stopped cell is not reported, and a report that cannot be written stops everything."""

from __future__ import annotations

import threading
import time

from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.engine.slots import EngineStopped
from fedlmc.simulations.engine.sweep_server import CellJob, CellResult, SweepServer


def jobs(count: int) -> list[CellJob]:
    return [
        CellJob(f"cell-{i}", validate_run_config({"seed": i}, check_devices=False))
        for i in range(count)
    ]


def server(work: list, on_start, on_done, max_in_flight: int = 2, stop=None) -> SweepServer:
    return SweepServer(
        work,
        slots=2,
        pool_size=2,
        max_in_flight=max_in_flight,
        on_done=on_done,
        on_start=on_start,
        stop=stop or threading.Event(),
    )


def test_every_cell_is_reported_once_with_its_error_and_the_others_go_on(scripted_grid):
    running, most, lock = [0], [0], threading.Lock()

    def start(job: CellJob) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        raise ValueError(f"{job.key} has no data")

    done: list[CellResult] = []
    sweep = server(jobs(5), start, done.append, max_in_flight=2)
    sweep.main(scripted_grid([1, 2], delay=lambda _m: 0.0), None)
    assert sorted(r.key for r in done) == [f"cell-{i}" for i in range(5)]
    assert sweep.finished == {r.key for r in done} and sweep.fatal is None
    assert all(str(r.error) == f"{r.key} has no data" and r.outcome is None for r in done)
    assert all(r.config["seed"] == int(r.key[-1]) and r.seconds >= 0.1 for r in done)
    assert most[0] == 2  # never more than max_in_flight at once


def test_a_cell_stopped_by_the_engine_is_not_reported(scripted_grid):
    def start(job: CellJob) -> None:
        if job.key == "cell-1":
            raise EngineStopped("the simulation is stopping")
        raise ValueError("failed")

    done: list[CellResult] = []
    sweep = server(jobs(3), start, done.append)
    sweep.main(scripted_grid([1, 2], delay=lambda _m: 0.0), None)
    assert sorted(r.key for r in done) == ["cell-0", "cell-2"]


def test_a_report_that_cannot_be_written_stops_everything(scripted_grid):
    def start(job: CellJob) -> None:
        time.sleep(0.05)
        raise ValueError("failed")

    def done(result: CellResult) -> None:
        raise OSError("results.csv: disk full")

    stop = threading.Event()
    sweep = server(jobs(6), start, done, max_in_flight=1, stop=stop)
    sweep.main(scripted_grid([1, 2], delay=lambda _m: 0.0), None)
    assert isinstance(sweep.fatal, OSError) and stop.is_set()
    assert sweep.finished == set()


def test_a_stopped_simulation_starts_no_cell(scripted_grid):
    stop = threading.Event()
    stop.set()
    started: list[str] = []
    sweep = server(jobs(3), lambda job: started.append(job.key), lambda r: None, stop=stop)
    sweep.main(scripted_grid([1, 2], delay=lambda _m: 0.0), None)
    assert started == []


def test_a_cell_whose_plan_fails_is_reported_with_its_error_and_frees_its_slot(scripted_grid):
    """A cell config that cannot be planned (here a plain dict with a bad value, which planning
    validates) is that cell's error; its slot is released, so every later cell still runs."""
    bad = CellJob("cell-bad", {"seed": -1})
    started: list[str] = []

    def start(job: CellJob) -> None:
        started.append(job.key)
        raise ValueError("failed")

    done: list[CellResult] = []
    sweep = server([bad, *jobs(3)], start, done.append, max_in_flight=1)
    sweep.main(scripted_grid([1, 2], delay=lambda _m: 0.0), None)
    assert sorted(r.key for r in done) == ["cell-0", "cell-1", "cell-2", "cell-bad"]
    failed = next(r for r in done if r.key == "cell-bad")
    assert "seed" in str(failed.error) and failed.outcome is None
    assert sorted(started) == ["cell-0", "cell-1", "cell-2"]  # the bad cell never started
