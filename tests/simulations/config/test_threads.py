"""Thread control: client slots and the server compute with the threads the rule gives them,
whatever OMP_NUM_THREADS / MKL_NUM_THREADS the caller's shell sets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedlmc.simulations.config.threads import (
    THREAD_VARIABLES,
    server_threads,
    slot_threads,
    thread_environment,
    usable_cores,
)

REPO = Path(__file__).resolve().parents[3]


def test_slot_and_server_thread_rule():
    assert [slot_threads(c) for c in (0.25, 0.5, 1.0, 1.5, 2.0, 4.0)] == [1, 1, 1, 1, 2, 4]
    assert server_threads(0.0, slots=2, num_cpus=1.0, cores=2) == 1  # nothing left: one thread
    assert server_threads(0.0, slots=4, num_cpus=2.0, cores=16) == 8  # what the slots leave
    assert server_threads(0.0, slots=1, num_cpus=1.0, cores=8) == 7
    assert server_threads(0.0, slots=0, cores=6) == 6  # a deployment: no slots beside it
    assert server_threads(0.0, slots=40, num_cpus=1.0, cores=4) == 1  # others on other nodes
    assert server_threads(3.0, slots=2, num_cpus=1.0, cores=2) == 3  # server-cpus wins


def test_thread_environment_sets_every_variable_and_restores_the_callers(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    with thread_environment(2) as values:
        assert all(os.environ[name] == "2" for name in THREAD_VARIABLES)
        assert values["OMP_NUM_THREADS"] == "2"
    assert os.environ["OMP_NUM_THREADS"] == "8"
    assert "MKL_NUM_THREADS" not in os.environ


PROBE = """
import json, numpy, torch
from fedlmc.simulations.config.threads import pool_threads, use_threads
before = [torch.get_num_threads(), pool_threads()]
use_threads(1)
print(json.dumps({"before": before, "after": [torch.get_num_threads(), pool_threads()]}))
"""


@pytest.mark.slow
def test_use_threads_overrides_the_shells_thread_variables():
    """A process started with OMP_NUM_THREADS = MKL_NUM_THREADS = OPENBLAS_NUM_THREADS = 2
    computes with 2 threads until use_threads(1); then torch and every BLAS/OpenMP pool use 1.
    (torch and OpenBLAS cap a larger value at the machine's cores.)"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.update({name: "2" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")})
    env["OPENBLAS_NUM_THREADS"] = "2"
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["before"][0] == min(2, usable_cores())  # the shell's value took effect
    assert probe["after"] == [1, 1]


@pytest.mark.slow
def test_client_slots_ignore_the_shells_omp_num_threads(monkeypatch):
    """A real simulation under OMP_NUM_THREADS=2: each client slot (num-cpus = 1) trains with
    one thread, and the caller's environment is left as it was."""
    from fedlmc.simulations.runs.federation import run_federation_outcome

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("MKL_NUM_THREADS", "2")
    config = {
        "dataset": "mnist5k",
        "model": "mlp",
        "width": 0.25,
        "depth": 2,
        "base-hidden": 64,
        "epochs": 1,
        "num-clients": 2,
        "num-cpus": 1.0,
        "strategy": "average",
        "calibration": "none",
        "lambdas": 3,
        "diagnostics": False,
        "timeout": 120.0,
    }
    outcome = run_federation_outcome(config)
    survivors = outcome.reports["average"].survivors
    assert len(survivors) == 2
    assert [u.metrics["torch-threads"] for u in survivors] == [1, 1]
    assert all(u.metrics["pool-threads"] <= 1 for u in survivors)
    assert os.environ["OMP_NUM_THREADS"] == "2" and os.environ["MKL_NUM_THREADS"] == "2"
