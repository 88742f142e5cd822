"""The sweep engine (:mod:`fedlmc.simulations.engine.cells`): many cells in one Flower simulation.

(The Grid view and the slot broker against a scripted in-process Grid, no Ray:
``test_grid_view.py`` and ``test_slots.py``.)
- Through Flower's simulation engine (Ray): three cells in one simulation, one of them with a
  client that hangs past the timeout: only that cell fails, and a cell run beside it (after
  another cell on the same warm actors) gives exactly the numbers it gives alone.
- A real Ray cluster: a head started on 127.0.0.1 with its own temp dir; ``fedlmc sweep`` and
  ``fedlmc run`` join it through ``--ray-address``; the test stops only the processes it
  started (the head's process group).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.engine.cells import EngineStats, run_cells
from fedlmc.simulations.engine.sweep_server import CellJob, CellResult
from fedlmc.simulations.records.results_file import read_results
from fedlmc.simulations.runs.federation import run_federation_outcome
from fedlmc.strategies import NotEnoughClientsError

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent

# ----------------------------------------------------------------------------- Flower + Ray

TINY = {
    "dataset": "mnist5k",
    "model": "mlp",
    "width": 0.125,
    "depth": 2,
    "base-hidden": 64,
    "epochs": 1,
    "batch-size": 128,
    "lambdas": 3,
    "diagnostics": False,
    "methods": "average,average_t,weight_matching,ensemble",
    "timeout": 120.0,
}
HANG_TIMEOUT = 10.0
VOLATILE = ("seconds", "bytes")


def stable(frame: pd.DataFrame) -> pd.DataFrame:
    columns = [c for c in frame.columns if not any(v in c for v in VOLATILE)]
    return frame[columns].reset_index(drop=True)


@pytest.mark.slow
def test_cells_in_one_simulation_fail_alone_and_give_their_own_numbers(tmp_path):
    """Three cells in one simulation (2 client slots, 2 cells in flight): ``first`` runs, then
    ``hung`` (a client sleeps past its 10 s timeout, min-clients 2) and ``probe`` run beside
    each other on the actors ``first`` used. Only ``hung`` fails; ``probe`` gives exactly the
    rows it gives alone, in a simulation of its own."""
    first = validate_run_config({**TINY, "width": 0.25, "seed": 1})
    hung = validate_run_config(
        {**TINY, "strategy": "average", "inject-failure": "hang:1", "timeout": HANG_TIMEOUT}
    )
    probe = validate_run_config({**TINY, "out-dir": str(tmp_path / "probe")})
    jobs = [CellJob("first", first), CellJob("hung", hung), CellJob("probe", probe)]
    results: dict[str, CellResult] = {}
    stats = EngineStats()
    run_cells(jobs, lambda r: results.__setitem__(r.key, r), stats=stats)

    assert stats.simulations == 1 and stats.slots == 2 and stats.max_in_flight == 2
    assert set(results) == {"first", "hung", "probe"}
    assert isinstance(results["hung"].error, NotEnoughClientsError)
    assert "no reply before the timeout" in str(results["hung"].error)
    assert results["first"].error is None and results["probe"].error is None
    together = results["probe"].outcome.table()
    assert list(together["method"]) == ["average", "average_t", "weight_matching", "ensemble"]
    assert (together["clients_survived"] == 2).all()
    assert (tmp_path / "probe" / "results.csv").exists()

    alone = run_federation_outcome({**probe, "out-dir": ""}).table()
    pd.testing.assert_frame_equal(stable(together), stable(alone), check_exact=True)
    survivors = results["probe"].outcome.reports["compare"].survivors
    assert [u.partition_id for u in survivors] == [0, 1]


# ----------------------------------------------------------------------------- a Ray cluster

TWO_CELLS = """
name = "cluster"
[run]
epochs = 1
width = 0.125
depth = 2
base-hidden = 64
lambdas = 3
diagnostics = false
methods = "average,average_t,ensemble"
[grid]
seed = [0, 1]
"""


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM (then SIGKILL) the process group this test started; nothing else."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=20)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def ray_head() -> Iterator[dict]:
    """A Ray head on 127.0.0.1 with free ports, 2 CPUs and its own temp dir, in its own
    process group (``ray start --block``); stopped by that group id afterwards."""
    temp = Path(tempfile.mkdtemp(prefix="fedlmc-ray-"))  # short: Ray's socket paths are limited
    gcs, client, agent_listen, agent_grpc, metrics, node, objects, env_agent, dash = free_ports(9)
    log = open(temp / "head.log", "w")  # noqa: SIM115 - closed in the finaliser
    command = [
        str(BIN / "ray"),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={gcs}",
        f"--ray-client-server-port={client}",
        f"--dashboard-agent-listen-port={agent_listen}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--metrics-export-port={metrics}",
        f"--node-manager-port={node}",
        f"--object-manager-port={objects}",
        f"--runtime-env-agent-port={env_agent}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dash}",
        "--include-dashboard=false",
        "--num-cpus=2",
        "--num-gpus=0",
        f"--temp-dir={temp}",
        "--disable-usage-stats",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 90
        while "Ray runtime started" not in (temp / "head.log").read_text():
            if head.poll() is not None or time.monotonic() > deadline:
                why = f"exited with {head.returncode}" if head.poll() is not None else "after 90 s"
                text = (temp / "head.log").read_text()[-2000:]
                raise RuntimeError(f"no 'Ray runtime started' from ray start ({why}): {text}")
            time.sleep(0.5)
        yield {"address": f"127.0.0.1:{gcs}", "temp": temp, "env": env}
    finally:
        stop_group(head)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def fedlmc(*args: str, env: dict, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedlmc.simulations.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def actor_logs(temp: Path) -> list[Path]:
    """Worker logs of ClientApp actors in the cluster's temp dir."""
    return [
        path
        for path in temp.glob("session_2*/logs/worker-*.out")  # not the session_latest link
        if "ClientAppActor" in path.read_text(errors="replace")
    ]


@pytest.mark.slow
def test_a_sweep_and_a_run_join_an_existing_ray_cluster(tmp_path, ray_head):
    config = tmp_path / "cluster.toml"
    config.write_text(TWO_CELLS)
    out = tmp_path / "out"
    assert actor_logs(ray_head["temp"]) == []
    done = fedlmc(
        "sweep",
        str(config),
        "--out",
        str(out),
        "--ray-address",
        ray_head["address"],
        "--quiet",
        "--no-report",
        env=ray_head["env"],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_results(out)
    assert len(rows) == 2 * 3 and (rows["status"] == "ok").all()
    assert sorted(rows["seed"].unique()) == [0, 1]
    assert rows.groupby("cell_id")["method"].apply(list).map(tuple).unique().tolist() == [
        ("average", "average_t", "ensemble")
    ]
    assert rows["accuracy"].between(0, 1).all()
    assert len(actor_logs(ray_head["temp"])) == 2  # the clients ran on the cluster's node

    csv = tmp_path / "run.csv"
    done = fedlmc(
        "run",
        "epochs=1",
        "width=0.125",
        "depth=2",
        "base-hidden=64",
        "diagnostics=false",
        "methods=average,ensemble",
        "--ray-address",
        ray_head["address"],
        "--csv",
        str(csv),
        env=ray_head["env"],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(pd.read_csv(csv)["method"]) == ["average", "ensemble"]
    assert len(actor_logs(ray_head["temp"])) == 4
