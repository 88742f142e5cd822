"""Sweeps through the real ``fedlmc`` command and the sweep engine (tiny cells, one Flower
simulation per sweep, several cells in flight).

A sweep killed with SIGKILL right after its first cell is appended (the other cells in flight or
waiting), then rerun, must end with exactly the rows of an uninterrupted sweep (same cell ids,
same metric values: CPU runs are deterministic and a cell's numbers do not depend on its
neighbours), with no duplicates; a changed config is refused without ``--force``.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedlmc.simulations.config import (
    ConfigError,
    cell_id,
    expand_grid,
    load_sweep_config,
    row_methods,
    run_schema,
)
from fedlmc.simulations.records.out_dir_lock import out_dir_lock
from fedlmc.simulations.records.results_file import finished_cells, read_results
from fedlmc.simulations.records.training_file import read_training
from fedlmc.simulations.runs.sweep import run_sweep
from fedlmc.study.rows import ROUND_COLUMNS, row_columns
from fedlmc.training_columns import TRAINING_COLUMNS

REPO = Path(__file__).resolve().parents[3]

TINY = """
name = "tiny"
description = "three tiny MLP cells"
[run]
epochs = 1
lambdas = 3
batch-size = 256
diagnostics = true
methods = "average,average_t,weight_matching,ensemble"
[grid]
width = [0.125, 0.25, 0.5]
"""
WIDTHS = [0.125, 0.25, 0.5]

# the lead and run-config columns, then every row and round column of the column table
# (fedlmc.columns, the merge methods' own columns included)
REQUIRED = (
    *("cell_id", "status", "error", "width", "num-clients", "seed", "weight-decay"),
    *row_columns(),
    *ROUND_COLUMNS,
)
# timings and host-dependent byte counts differ between runs; everything else must not
VOLATILE = ("seconds", "bytes")


def cli(*args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "fedlmc.simulations.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    )


def finish(proc: subprocess.Popen, timeout: float = 400) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def tiny_config(tmp: Path) -> Path:
    path = tmp / "tiny.toml"
    if not path.exists():
        path.write_text(TINY)
    return path


def shared_sweep(tmp_path_factory) -> Path:
    """The uninterrupted tiny sweep, run once per test run and read by test_sweep, test_build
    and test_tracking: under pytest-xdist the workers share it (in their base temp's parent,
    the first to take the lock runs it, the others wait for it), as pytest-xdist's docs advise
    for a session fixture that must run once."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    out, done = base / "shared-sweep", base / "shared-sweep.done"
    track = ("--track", "tensorboard")  # test_tracking reads its runs back
    with open(base / "shared-sweep.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            code, _out, err = finish(
                cli("sweep", str(tiny_config(base)), "--out", str(out), "--quiet", *track)
            )
            assert code == 0, err
            done.touch()
    return out


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory) -> Path:
    return shared_sweep(tmp_path_factory)


def stable_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if not any(v in c for v in VOLATILE)]


def sorted_rows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["cell_id", "method"]).reset_index(drop=True)[stable_columns(frame)]


def wait_while_running(proc: subprocess.Popen, ready, what: str, seconds: float = 300) -> None:
    """Poll ``ready()`` until it holds; fail naming ``what`` if ``proc`` exits first or
    ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while not ready():
        assert proc.poll() is None, f"the sweep exited ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after {seconds:g} s"
        time.sleep(0.05)


def descendants(root: int) -> dict[int, bytes]:
    """``root``'s processes below it: pid -> ``/proc/PID/stat``'s start time (a pid reused by a
    later process is not the same process)."""
    stats: dict[int, list[bytes]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stats[int(entry)] = Path(f"/proc/{entry}/stat").read_bytes().rpartition(b")")[2].split()
        except OSError:
            continue
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        children = [p for p, stat in stats.items() if int(stat[1]) == pid]
        found.update({c: stats[c][19] for c in children})
        todo += children
    return found


def alive(processes: dict[int, bytes]) -> list[str]:
    """The processes of ``processes`` still running (not zombies), as ``pid name``."""
    running = []
    for pid, started in processes.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        fields = stat.rpartition(b")")[2].split()
        if fields[19] == started and fields[0] != b"Z":
            running.append(f"{pid} {stat.partition(b' (')[2].partition(b')')[0].decode()}")
    return running


def environment(pid: int) -> set[bytes]:
    """The start-up environment of process ``pid`` (empty when it is gone or a zombie)."""
    try:
        return set(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"))
    except OSError:
        return set()


def run_tokens(processes: dict[int, bytes]) -> set[bytes]:
    """The ``RAY_AUTH_TOKEN=...`` entries of ``processes``' environments: the local Ray's."""
    return {v for pid in processes for v in environment(pid) if v.startswith(b"RAY_AUTH_TOKEN=")}


def holders(tokens: set[bytes]) -> list[str]:
    """Every running process of this machine (any parent) whose environment holds one of
    ``tokens``, as ``pid name``."""
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            started = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[19]
        except OSError:
            continue
        if environment(pid) & tokens:
            found += alive({pid: started})
    return found


def kill_after_first_cell(config: Path, out: Path) -> int:
    """Start the sweep, SIGKILL it (by pid, as ``kill -9 PID`` does) as soon as results.csv
    holds a cell; the number of cells written when it died. Every process of its local Ray
    (GCS, raylet, agents, client workers: all below the sweep, and any process started with its
    token) ends within 20 s of it (Ray alone leaves its two agents running for 60 s)."""
    proc = cli("sweep", str(config), "--out", str(out), "--quiet", "--no-report")
    results = out / "results.csv"
    ray_processes: dict[int, bytes] = {}
    tokens: set[bytes] = set()

    def first_cell_written() -> bool:
        nonlocal ray_processes, tokens
        ray_processes = descendants(proc.pid)  # taken before each look: killed at once after
        tokens = run_tokens(ray_processes)
        return results.exists() and len(read_results(out)) > 0

    try:
        wait_while_running(proc, first_cell_written, f"a cell in {results}")
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        deadline = time.monotonic() + 20
        while (alive(ray_processes) or holders(tokens)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(ray_processes) >= 4 and len(tokens) == 1
        assert not alive(ray_processes) and not holders(tokens), (
            alive(ray_processes),
            holders(tokens),
        )
    finally:
        # the sweep and the Ray processes it started share its new session: kill that group
        if proc.poll() is None or alive(ray_processes):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    return read_results(out)["cell_id"].nunique()


@pytest.mark.slow
def test_killed_and_resumed_sweep_equals_uninterrupted(tmp_path, uninterrupted):
    config = tiny_config(tmp_path)
    out = tmp_path / "killed"
    seen = kill_after_first_cell(config, out)
    assert 1 <= seen < len(WIDTHS)  # killed with cells still in flight or waiting
    partial = read_results(out)
    assert partial["cell_id"].nunique() == seen  # only whole cells are ever written

    code, stdout, err = finish(cli("sweep", str(config), "--out", str(out), "--no-report"))
    assert code == 0, err
    assert f"{seen} already done" in stdout

    resumed = read_results(out)
    full = read_results(uninterrupted)
    ids = [cell_id(c) for c in expand_grid(load_sweep_config(config))]
    assert sorted(full["cell_id"].unique()) == sorted(ids)
    assert sorted(resumed["cell_id"].unique()) == sorted(ids)
    assert not resumed.duplicated(["cell_id", "method"]).any()
    assert len(resumed) == len(full) == len(WIDTHS) * 4
    # the rows of the cells that were done before the kill were not rewritten
    first = partial["cell_id"].iloc[0]
    pd.testing.assert_frame_equal(
        sorted_rows(partial[partial["cell_id"] == first]),
        sorted_rows(resumed[resumed["cell_id"] == first]),
    )
    pd.testing.assert_frame_equal(sorted_rows(resumed), sorted_rows(full), check_exact=True)
    assert not list(out.glob(".*.tmp"))
    # training.csv too: the resumed file is byte for byte the uninterrupted one
    assert (out / "training.csv").read_bytes() == (uninterrupted / "training.csv").read_bytes()


@pytest.mark.slow
def test_ctrl_c_exits_130_at_once_and_a_rerun_resumes(tmp_path, uninterrupted):
    """SIGINT to the sweep's process group (what Ctrl-C in a terminal sends) while cells are in
    flight: exit status 130 within seconds (no wait for the clients still training), one line
    saying how to resume, only whole cells written; the rerun ends with the uninterrupted rows."""
    config = tiny_config(tmp_path)
    out = tmp_path / "interrupted"
    proc = cli(
        "sweep",
        str(config),
        "--out",
        str(out),
        "--quiet",
        "--no-report",
        "--cells-in-flight",  # one cell at a time: the interrupt lands before the last one ends
        "1",
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    results = out / "results.csv"
    try:
        wait_while_running(
            proc, lambda: results.exists() and len(read_results(out)) > 0, f"a cell in {results}"
        )
        os.killpg(proc.pid, signal.SIGINT)
        code, _out, err = finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert code == 130, err
    assert err.strip().splitlines()[-1] == ("fedlmc: interrupted; rerun the same command to resume")
    written = read_results(out)
    assert 1 <= written["cell_id"].nunique() < len(WIDTHS)
    assert len(written) == 4 * written["cell_id"].nunique()  # whole cells only

    code, _out, err = finish(cli("sweep", str(config), "--out", str(out), "--no-report"))
    assert code == 0, err
    pd.testing.assert_frame_equal(
        sorted_rows(read_results(out)), sorted_rows(read_results(uninterrupted)), check_exact=True
    )
    assert (out / "training.csv").read_bytes() == (uninterrupted / "training.csv").read_bytes()


@pytest.mark.slow
def test_sigint_to_the_main_pid_alone_exits_130_without_a_traceback(tmp_path):
    """``kill -INT PID`` (the main process only, not its group as Ctrl-C) while a cell is in
    flight (a client hangs in it; its folder exists once its ServerApp runs): exit status 130,
    the resume line last, no traceback, nothing written."""
    out = tmp_path / "interrupted"
    config = tmp_path / "hang.toml"
    hang = '[run]\ntimeout = 150.0\ninject-failure = "hang:1"\n'
    config.write_text(TINY.replace("[run]\n", hang).replace("0.125, 0.25, 0.5", "0.125"))
    proc = cli("sweep", str(config), "--out", str(out), "--no-report")
    cells = out / "cells"
    try:
        started = lambda: cells.is_dir() and any(cells.iterdir())  # noqa: E731
        wait_while_running(proc, started, f"a cell in {cells}")
        os.kill(proc.pid, signal.SIGINT)
        code, _out, err = finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert code == 130, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == "fedlmc: interrupted; rerun the same command to resume"
    assert read_results(out).empty  # the hanging cell was abandoned, not recorded


@pytest.mark.slow
def test_results_schema(uninterrupted):
    frame = read_results(uninterrupted)
    for column in REQUIRED:
        assert column in frame, column
    assert list(frame.columns[:3]) == ["cell_id", "status", "error"]
    assert (frame["status"] == "ok").all()
    assert frame["cell_id"].str.fullmatch(r"[0-9a-f]{12}").all()
    assert frame["width"].dtype == np.float64 and frame["num-clients"].dtype == np.int64
    for column in ("accuracy", "nll", "temperature", "endpoint_acc_mean", "ensemble_acc"):
        assert frame[column].dtype == np.float64, column
        assert frame[column].notna().all(), column
    assert frame["accuracy"].between(0, 1).all()
    assert set(frame["method"]) == {"average", "average_t", "weight_matching", "ensemble"}
    for cell in json.loads((uninterrupted / "config.json").read_text())["cells"]:
        methods = frame.loc[frame["cell_id"] == cell["cell_id"], "method"].tolist()
        assert methods == row_methods(cell["config"])  # what makes a cell count as done
    # a temperature never changes the argmax; the raw rows carry T = 1
    by = frame.set_index(["cell_id", "method"])
    for cid in frame["cell_id"].unique():
        assert by.loc[(cid, "average"), "accuracy"] == by.loc[(cid, "average_t"), "accuracy"]
        assert by.loc[(cid, "average"), "temperature"] == 1.0
    record = json.loads((uninterrupted / "config.json").read_text())
    assert record["name"] == "tiny" and record["grid"] == {"width": WIDTHS}
    assert {"fedlmc", "flwr", "torch", "device"} <= set(record["versions"])
    assert {c["cell_id"] for c in record["cells"]} == set(frame["cell_id"])

    # training.csv: cell_id, the run-config columns as results.csv has them, the declared ones;
    # one row per cell x client x epoch (epochs = 1), sorted by cell
    training = read_training(uninterrupted)
    config_names = [c for c in frame.columns if c in run_schema()]
    declared = [c.name for c in TRAINING_COLUMNS]
    assert list(training.columns) == ["cell_id", *config_names, *declared]
    assert training["cell_id"].tolist() == sorted(frame["cell_id"].unique().tolist() * 2)
    assert (training["phase"] == "client_epoch").all() and (training["step"] == 1).all()
    assert training["client"].tolist() == [0, 1] * len(WIDTHS)
    assert training["train_loss"].gt(0).all() and training["train_accuracy"].between(0, 1).all()
    assert training["calibration_loss"].isna().all()  # no held-out share in these cells
    by_cell = frame.drop_duplicates("cell_id").set_index("cell_id")
    expected = by_cell.loc[training["cell_id"], config_names].reset_index(drop=True)
    pd.testing.assert_frame_equal(training[config_names], expected, check_dtype=False)


@pytest.mark.slow
def test_changed_config_is_refused_without_force(tmp_path, uninterrupted):
    out = tmp_path / "copy"
    out.mkdir()
    for name in ("results.csv", "config.json", "training.csv"):
        (out / name).write_bytes((uninterrupted / name).read_bytes())
    config = tiny_config(tmp_path)
    before = (out / "results.csv").read_bytes()
    curves = (out / "training.csv").read_bytes()

    code, _out, err = finish(cli("sweep", str(config), "epochs=2", "--out", str(out)))
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "holds a different sweep" in err and "changed keys: epochs" in err
    assert (out / "results.csv").read_bytes() == before

    # --force with a grid that keeps one old cell (width 0.125) and drops the others:
    # the kept cell's rows carry over, nothing new has to run for it
    sweep = load_sweep_config(config, ["width=[0.125]"])
    kept = cell_id(expand_grid(sweep)[0])
    result = run_sweep(
        sweep,
        out,
        force=True,
        progress=False,
        runner=lambda _config: pytest.fail("a carried-over cell was rerun"),
    )
    assert list(result["cell_id"].unique()) == [kept]
    assert (out / "results.previous.csv").read_bytes() == before
    assert (out / "config.previous.json").exists()
    assert (out / "training.previous.csv").read_bytes() == curves
    assert read_training(out)["cell_id"].unique().tolist() == [kept]


@pytest.mark.slow
def test_failed_cell_is_recorded_and_the_sweep_goes_on(tmp_path):
    """A client that raises leaves 1 of 2 clients, below min-clients = 2: that cell fails with
    its reason recorded, and the next cell still runs."""
    config = tmp_path / "fail.toml"
    config.write_text(
        TINY.replace(
            "width = [0.125, 0.25, 0.5]",
            'width = [0.125]\ninject-failure = ["raise:1", "none"]',
        )
    )
    out = tmp_path / "out"
    sweep = load_sweep_config(config)
    results = run_sweep(sweep, out, progress=False)
    failed = results[results["status"] == "failed"]
    assert len(failed) == 1 and failed["inject-failure"].iloc[0] == "raise:1"
    reason = failed["error"].iloc[0]
    assert "min-clients" in reason and "\n" not in reason and "Traceback" not in reason
    assert failed["method"].isna().all()
    ok = results[results["status"] == "ok"]
    assert ok["cell_id"].nunique() == 1 and len(ok) == 4
    # training curves of the ok cell only (a failed cell has none)
    assert read_training(out)["cell_id"].unique().tolist() == ok["cell_id"].unique().tolist()

    # a rerun retries the failed cell only (retry_failed=True, the default); with
    # retry_failed=False it leaves the failed row as it is and runs nothing
    expected = {cell_id(c): row_methods(c) for c in expand_grid(sweep)}
    assert finished_cells(results, expected) == set(ok["cell_id"])
    assert finished_cells(results, expected, retry_failed=False) == set(results["cell_id"])
    again = run_sweep(
        sweep,
        out,
        progress=False,
        retry_failed=False,
        runner=lambda _config: pytest.fail("a finished cell was rerun"),
    )
    pd.testing.assert_frame_equal(again, results)


@pytest.mark.slow
def test_a_folder_in_use_is_refused(tmp_path):
    """While another process holds the folder (its lock), a sweep on it is refused at once
    (tests/simulations/records/test_out_dir_lock.py starts the real commands against each other)."""
    out = tmp_path / "busy"
    sweep = load_sweep_config(tiny_config(tmp_path))
    hold = "import sys; from fedlmc.simulations.records.out_dir_lock import out_dir_lock\n"
    hold += "with out_dir_lock(sys.argv[1], 'fedlmc sweep'):\n    print(1, flush=True); input()\n"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", hold, str(out)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "1"
        with pytest.raises(ConfigError, match=rf"in use by fedlmc sweep \(pid {child.pid}\)"):
            run_sweep(
                sweep,
                out,
                progress=False,
                runner=lambda _config: pytest.fail("a cell ran in a busy folder"),
            )
    finally:
        child.communicate("\n", timeout=30)
    assert not (out / "results.csv").exists()
    with out_dir_lock(out, "test"):  # freed when its holder ended
        pass
