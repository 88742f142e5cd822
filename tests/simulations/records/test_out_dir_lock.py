"""One writer per out dir: ``fedlmc run``, ``fedlmc sweep`` and ``fedlmc report`` hold one lock
(:mod:`fedlmc.simulations.records.out_dir_lock`) while they write; the second command on a folder
fails at once with one line naming the holder, and the first one's rows stay intact.

The cheap tests hold the lock from a small child process; the two slow ones start the real
commands on one folder in both orders (a run, then a sweep; a sweep, then a run, which also
takes SIGTERM to its process group mid-sweep, which reaches the Ray workers too: exit status
143, whole cells only, no traceback and no error of the client actors that died with it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedlmc.simulations.cli import main
from fedlmc.simulations.config import ConfigError
from fedlmc.simulations.records.out_dir_lock import LOCK, out_dir_lock
from fedlmc.simulations.records.results_file import out_dir_kind, read_results

REPO = Path(__file__).resolve().parents[3]
TINY_RUN = ["epochs=1", "lambdas=3", "batch-size=256", "diagnostics=false", "width=0.125"]
SWEEP = """
name = "locked"
[run]
epochs = 1
lambdas = 3
batch-size = 256
diagnostics = false
methods = "average,average_t"
timeout = 150.0
[grid]
inject-failure = ["none", "hang:1"]
"""
# the second cell hangs (a client sleeps past the timeout): it is in flight when SIGTERM comes
HOLD = (
    "import sys; from fedlmc.simulations.records.out_dir_lock import out_dir_lock\n"
    "with out_dir_lock(sys.argv[1], sys.argv[2]):\n"
    "    print('held', flush=True); sys.stdin.read()\n"
)


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def cli(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "fedlmc.simulations.cli", *args],
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def holder(folder: Path, command: str) -> subprocess.Popen:
    """A child process holding ``folder``'s lock as ``command`` until its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder), command],
        env=env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def release(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=30)


def wait_for_holder(folder: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        lock = folder / LOCK
        if lock.exists() and text in lock.read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never held {folder} ({proc.poll()=})")


def refused_fast(proc: subprocess.Popen, holder_text: str) -> None:
    """The second command: exit status 2 within seconds, one line naming the holder."""
    start = time.monotonic()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert time.monotonic() - start < 45  # imports under load; no Ray, no training
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("fedlmc: error: out dir ") and f"in use by {holder_text}" in lines[0]


@pytest.mark.slow
def test_every_writing_command_is_refused_while_another_holds_the_folder(tmp_path, capsys):
    folder = tmp_path / "busy"
    config = tmp_path / "locked.toml"
    config.write_text(SWEEP)
    child = holder(folder, "fedlmc run")
    try:
        held_by = f"fedlmc run (pid {child.pid})"
        assert main(["sweep", str(config), "--out", str(folder), "--no-report"]) == 2
        assert f"in use by {held_by}; allowed: wait for it" in capsys.readouterr().err
        assert main(["run", *TINY_RUN, f"out-dir={folder}"]) == 2
        assert held_by in capsys.readouterr().err
        (folder / "results.csv").write_text("cell_id,status,error\n")
        assert main(["report", str(folder)]) == 2
        assert held_by in capsys.readouterr().err
        with pytest.raises(ConfigError, match=r"in use by fedlmc run \(pid"):
            with out_dir_lock(folder, "test"):
                pass
    finally:
        release(child)
    assert not (folder / "config.json").exists()  # the refused sweep wrote nothing
    with out_dir_lock(folder, "test"):  # freed when its holder ends
        assert (folder / LOCK).read_text() == f"test (pid {os.getpid()})\n"
        with out_dir_lock(folder, "nested"):  # re-entrant within one process
            pass
    assert not (folder / LOCK).exists()  # the holder deletes it before it lets go


def test_a_sweep_checks_what_the_folder_holds_under_the_lock(tmp_path):
    """A run's results written before the sweep takes the lock (after ``fedlmc validate``
    saw an empty folder) are seen under the lock: the sweep is refused, the file untouched."""
    from fedlmc.simulations.config import sweep_from_mapping
    from fedlmc.simulations.runs.sweep import run_sweep

    folder = tmp_path / "raced"
    folder.mkdir()
    sweep = sweep_from_mapping({"name": "s", "run": {"methods": "average"}})
    assert out_dir_kind(folder) == "empty"  # what the sweep saw first
    (folder / "results.csv").write_text("method,accuracy\naverage,0.9\n")  # the run, meanwhile
    with pytest.raises(ConfigError, match="holds the results of a fedlmc run"):
        run_sweep(sweep, folder, runner=lambda _c: pytest.fail("ran"), progress=False)
    assert (folder / "results.csv").read_text() == "method,accuracy\naverage,0.9\n"


@pytest.mark.slow
def test_a_sweep_started_while_a_run_trains_fails_fast_and_the_run_is_intact(tmp_path):
    folder = tmp_path / "shared"
    config = tmp_path / "locked.toml"
    config.write_text(SWEEP)
    run = cli("run", *TINY_RUN, "methods=average,average_t", f"out-dir={folder}")
    try:
        wait_for_holder(folder, "fedlmc run", run)
        second = cli("sweep", str(config), "--out", str(folder), "--quiet")
        refused_fast(second, f"fedlmc run (pid {run.pid})")
        out, err = run.communicate(timeout=400)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.communicate()
    assert run.returncode == 0, err
    assert out_dir_kind(folder) == "run" and not (folder / "config.json").exists()
    import pandas as pd

    rows = pd.read_csv(folder / "results.csv")
    assert list(rows["method"]) == ["average", "average_t"] and "cell_id" not in rows
    assert "cell_id" not in pd.read_csv(folder / "training.csv")


@pytest.mark.slow
def test_a_run_started_while_a_sweep_runs_fails_fast_and_sigterm_keeps_whole_cells(tmp_path):
    folder = tmp_path / "shared"
    config = tmp_path / "locked.toml"
    config.write_text(SWEEP)
    sweep = cli("sweep", str(config), "--out", str(folder), "--no-report", "--cells-in-flight", "1")
    try:
        wait_for_holder(folder, "fedlmc sweep", sweep)
        refused_fast(cli("run", *TINY_RUN, f"out-dir={folder}"), f"fedlmc sweep (pid {sweep.pid})")
        deadline = time.monotonic() + 300
        while not ((folder / "results.csv").exists() and len(read_results(folder)) > 0):
            assert sweep.poll() is None, "the sweep ended before SIGTERM"
            assert time.monotonic() < deadline, f"no cell in {folder / 'results.csv'} after 300 s"
            time.sleep(0.05)
        os.killpg(sweep.pid, signal.SIGTERM)  # the whole group, as a batch system's limit does
        _out, err = sweep.communicate(timeout=60)
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
            sweep.communicate()
    assert sweep.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "SIGABRT" not in err and "ERROR" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == (
        "fedlmc: terminated (SIGTERM); rerun the same command to resume"
    )
    written = read_results(folder)
    assert written["cell_id"].nunique() == 1 and len(written) == 2  # the whole first cell only
    assert (written["inject-failure"] == "none").all()
    assert out_dir_kind(folder) == "sweep" and not (folder / LOCK).exists()


def test_the_lock_file_is_gone_after_its_holder_and_a_deleted_one_is_never_held(tmp_path):
    from fedlmc.simulations.records.out_dir_lock import same_file

    folder = tmp_path / "out"
    folder.mkdir()
    with out_dir_lock(folder, "test"):
        fd = os.open(folder / LOCK, os.O_RDWR)  # a second command opened it meanwhile
        assert same_file(fd, folder / LOCK)
    try:
        assert not (folder / LOCK).exists() and not same_file(fd, folder / LOCK)
        with out_dir_lock(folder, "again"):  # a new lock file, not the deleted one
            assert not same_file(fd, folder / LOCK)
    finally:
        os.close(fd)
    assert os.listdir(folder) == []
