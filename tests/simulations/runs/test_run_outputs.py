"""A ``fedlmc run``'s outputs are guarded: its ``out-dir``, and the ``--csv`` file's folder when
that is a fedlmc out dir (it has a ``.lock``; none is made beside a user's file), are locked for
the whole federation (refused at once while another command holds either, naming it), and a
``--csv`` file is checked again under the lock (another command may have written it between
the first check and the lock). The other process is stood in for by a second open file
description of the lock file: ``flock`` refuses it within one process too."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from fedlmc.simulations.config import ConfigError
from fedlmc.simulations.records.out_dir_lock import LOCK
from fedlmc.simulations.records.written_paths import append_csv_rows
from fedlmc.simulations.runs.run_outputs import check_run_outputs, holding_outputs


@contextmanager
def held_by(folder: Path, holder: str):
    """``folder``'s lock held as another command (``holder``) would hold it."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(fd, f"{holder}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def test_a_csv_folder_in_use_is_refused_naming_its_holder(tmp_path):
    folder = tmp_path / "sweep"
    config = {"out-dir": ""}
    with held_by(folder, "fedlmc sweep (pid 4242)"):
        with pytest.raises(ConfigError, match=r"in use by fedlmc sweep \(pid 4242\)"):
            with holding_outputs(config, str(folder / "rows.csv")):
                pytest.fail("the block ran while another command held the folder")
    with holding_outputs(config, str(folder / "rows.csv")):  # free again
        assert (folder / LOCK).read_text().startswith("fedlmc run (pid ")


def test_the_csv_file_is_checked_again_under_the_lock(tmp_path):
    """A sweep's rows written there after the first check (the race a lock closes): refused
    under the lock, the sweep's file untouched."""
    folder = tmp_path / "shared"
    folder.mkdir()
    target = folder / "rows.csv"
    check_run_outputs({"out-dir": ""}, str(target))  # a new file: fine at first
    rows = "cell_id,status,error,method\n0123456789ab,ok,,average\n"
    target.write_text(rows)  # meanwhile, a sweep's rows
    with pytest.raises(ConfigError, match="holds a sweep's rows"):
        with holding_outputs({"out-dir": ""}, str(target)):
            pytest.fail("the block ran")
    assert target.read_text() == rows


def test_an_earlier_csv_of_a_run_may_be_appended_to_and_own_out_dir_files_not(tmp_path):
    own = tmp_path / "run"
    own.mkdir()
    earlier = tmp_path / "rows.csv"
    append_csv_rows(earlier, pd.DataFrame([{"method": "average", "accuracy": 0.5}]))
    check_run_outputs({"out-dir": str(own)}, str(earlier))  # a run's --csv of before: fine
    check_run_outputs({"out-dir": str(own)}, str(own / "rows.csv"))
    with pytest.raises(ConfigError, match="the run writes it itself"):
        check_run_outputs({"out-dir": str(own)}, str(own / "training.csv"))
    other = tmp_path / "other.csv"  # a table of two columns, not the run --csv table
    pd.DataFrame([{"method": "average", "accuracy": 0.5}]).to_csv(other, index=False)
    with pytest.raises(ConfigError, match="other columns"):
        check_run_outputs({"out-dir": str(own)}, str(other))


def test_no_lock_is_left_beside_a_csv_outside_any_out_dir(tmp_path):
    with holding_outputs({"out-dir": ""}, str(tmp_path / "rows.csv")):
        pass
    assert os.listdir(tmp_path) == []
