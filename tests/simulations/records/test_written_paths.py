"""fedlmc never replaces a file it did not write (issue 52, item 1): ``fedlmc run --csv`` takes
a new file or a ``fedlmc run --csv`` table of the same columns (and appends to it); every other
path (another file, a device, a FIFO, a link, a folder, a fedlmc table with other columns; an
unreadable file: ``tests/simulations/test_cli_hostile_paths.py``) is refused before any work,
unopened when it is not a regular file, with no lock or temporary file left beside it. The
names fedlmc writes in an out dir are checked the same way."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pandas as pd
import pytest

from fedlmc.simulations.config import ConfigError
from fedlmc.simulations.records.out_dir_lock import LOCK, out_dir_lock
from fedlmc.simulations.records.results_file import check_csv_target
from fedlmc.simulations.records.written_paths import (
    append_csv_rows,
    check_csv_file,
    check_own_files,
    run_csv_columns,
)

ROWS = pd.DataFrame(
    [{"method": "average", "accuracy": 0.5}, {"method": "ensemble", "accuracy": 0.7}]
)


def own_table(path: Path) -> bytes:
    """A ``fedlmc run --csv`` file as an earlier run left it: the header and one row."""
    append_csv_rows(path, ROWS.iloc[:1])
    return path.read_bytes()


def hostile_paths(root: Path) -> dict[str, tuple[Path, str]]:
    """(path, what the refusal says) of each path ``--csv`` must refuse, made under ``root``."""
    root.mkdir()
    notes = root / "notes.txt"
    notes.write_text("my notes\n")
    fifo = root / "pipe.csv"
    os.mkfifo(fifo)
    outside = root.parent / "outside.txt"
    outside.write_text("not fedlmc's\n")
    link = root / "link.csv"
    link.symlink_to(outside)
    own_link = root / "own-link.csv"
    own_table(root / "own.csv")
    own_link.symlink_to(root / "own.csv")
    training = root / "training-like.csv"
    training.write_text("phase,client,step,accuracy,method\nclient,0,1,0.5,average\n")
    fewer = root / "older.csv"
    pd.DataFrame([{"method": "average", "accuracy": 0.5}]).to_csv(fewer, index=False)
    sweep = root / "sweep-rows.csv"
    sweep.write_text("cell_id,status,error,method\n0123456789ab,ok,,average\n")
    (root / "folder.csv").mkdir()
    return {
        "another file": (notes, "is not a fedlmc results table"),
        "/dev/null": (Path("/dev/null"), "is a character device"),
        "a FIFO": (fifo, "is a FIFO"),
        "a symlink out of the folder": (link, "is a symbolic link"),
        "a symlink to a fedlmc table": (own_link, "is a symbolic link"),
        "a folder": (root / "folder.csv", "is a folder"),
        "a fedlmc table of other columns": (training, "other columns"),
        "an earlier table of fewer columns": (fewer, "other columns"),
        "a sweep's rows": (sweep, "a sweep's rows"),
    }


def test_every_hostile_csv_path_is_refused_in_one_line_and_left_as_it_was(tmp_path):
    cases = hostile_paths(tmp_path / "here")
    before = {
        p: (os.lstat(p).st_mode, p.read_bytes() if p.is_file() and os.access(p, os.R_OK) else b"")
        for p, _ in cases.values()
    }
    listing = sorted(os.listdir(tmp_path / "here"))
    failures = []
    for case, (path, needle) in cases.items():
        try:
            check_csv_target(str(path), "")
        except ConfigError as err:
            text = str(err)
            if needle not in text or "\n" in text or str(path) not in text:
                failures.append(f"{case}: {text}")
            continue
        failures.append(f"{case}: accepted")
    assert failures == []
    after = {
        p: (os.lstat(p).st_mode, p.read_bytes() if p.is_file() and os.access(p, os.R_OK) else b"")
        for p, _ in cases.values()
    }
    assert after == before
    assert sorted(os.listdir(tmp_path / "here")) == listing  # no lock, no temporary
    assert len(cases) == 9


def test_the_refusal_names_what_is_allowed(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ConfigError, match=r"allowed: a new file, or a fedlmc run --csv file"):
        check_csv_file(tmp_path / "pipe")


def test_a_new_file_gets_the_header_and_the_rows_then_a_second_run_appends(tmp_path):
    target = tmp_path / "rows.csv"
    check_csv_target(str(target), "")  # new: fine
    assert append_csv_rows(target, ROWS.iloc[:1]) is False
    check_csv_target(str(target), "")  # a run --csv table of the same columns: fine
    assert append_csv_rows(target, ROWS.iloc[1:]) is True
    read = pd.read_csv(target)
    assert list(read.columns) == list(run_csv_columns())
    assert list(read["method"]) == ["average", "ensemble"]
    assert read["accuracy"].tolist() == [0.5, 0.7]
    assert sorted(os.listdir(tmp_path)) == ["rows.csv"]  # no lock, no temporary beside it


def test_appending_after_a_line_cut_off_starts_a_new_line(tmp_path):
    target = tmp_path / "rows.csv"
    written = own_table(target)
    target.write_bytes(written + b"average,0.")  # a run killed mid-line
    append_csv_rows(target, ROWS.iloc[1:])
    lines = target.read_bytes().split(b"\n")
    assert lines[2] == b"average,0." and lines[3].startswith(b"ensemble,")


def test_a_file_replaced_after_the_check_is_refused_at_the_write(tmp_path):
    target = tmp_path / "rows.csv"
    check_csv_file(target)  # new at first
    target.write_text("my notes\n")  # meanwhile, someone else's file
    with pytest.raises(ConfigError, match="is not a fedlmc results table"):
        append_csv_rows(target, ROWS)
    assert target.read_text() == "my notes\n"
    target.unlink()
    target.symlink_to(tmp_path / "elsewhere.txt")
    with pytest.raises(ConfigError, match="cannot be opened"):
        append_csv_rows(target, ROWS)
    assert not (tmp_path / "elsewhere.txt").exists()


def test_two_runs_appending_at_once_keep_every_row_whole(tmp_path):
    target = tmp_path / "rows.csv"
    many = pd.DataFrame([{"method": f"m{i}", "accuracy": i / 1000} for i in range(400)])
    threads = [threading.Thread(target=append_csv_rows, args=(target, many)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    read = pd.read_csv(target)
    assert len(read) == 1600 and read["method"].value_counts().eq(4).all()


def out_dir_entries(root: Path) -> dict[str, tuple[Path, str]]:
    """(out dir, what the refusal says) whose names fedlmc writes are taken by the wrong kind."""
    cases = {}
    for case, name, make in [
        ("results.csv a FIFO", "results.csv", os.mkfifo),
        ("training.csv a symlink out", "training.csv", lambda p: p.symlink_to("/etc/passwd")),
        ("report.md a folder", "report.md", os.mkdir),
        ("figures a symlink", "figures", lambda p: p.symlink_to(root)),
        (".lock a symlink", LOCK, lambda p: p.symlink_to(root / "victim.txt")),
    ]:
        folder = root / case.replace(" ", "-")
        folder.mkdir(parents=True)
        make(folder / name)
        cases[case] = (folder, name)
    return cases


def test_an_out_dir_whose_names_are_taken_by_a_link_fifo_or_folder_is_refused(tmp_path):
    (tmp_path / "victim.txt").write_text("keep me\n")
    for folder, name in out_dir_entries(tmp_path).values():
        with pytest.raises(ConfigError, match=rf"{name} there is a "):
            check_own_files(folder, "out-dir")
    (tmp_path / "fine").mkdir()
    (tmp_path / "fine" / "results.csv").write_text("method\n")
    check_own_files(tmp_path / "fine", "out-dir")  # regular files: fine


def test_the_lock_never_truncates_a_file_through_a_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / LOCK).symlink_to(victim)
    with pytest.raises(ConfigError, match="is not a regular file"):
        with out_dir_lock(folder, "fedlmc run"):
            pytest.fail("the block ran")
    assert victim.read_text() == "keep me\n"


def test_an_out_dir_holding_a_users_file_under_fedlmcs_table_names_is_refused(tmp_path):
    for name in ("results.csv", "training.csv"):
        folder = tmp_path / name.replace(".", "-")
        folder.mkdir()
        (folder / name).write_text("my notes, not a table\n")
        with pytest.raises(ConfigError, match=rf"{name} there is not a fedlmc table"):
            check_own_files(folder, "out-dir")
        assert (folder / name).read_text() == "my notes, not a table\n"


def test_fedlmcs_tables_damaged_above_the_header_or_empty_are_its_own(tmp_path):
    """A junk line or a byte order mark above the header is damage the reader sets aside
    (``csv_lines``), not another file; an empty file holds nothing to lose."""
    cases = {
        "junk": b"garbage line\ncell_id,status,error\n",
        "bom": "\ufeffmethod,accuracy\naverage,0.5\n".encode(),
        "empty": b"",
    }
    for case, data in cases.items():
        folder = tmp_path / case
        folder.mkdir()
        (folder / "results.csv").write_bytes(data)
        (folder / "training.csv").write_bytes(b"cell_id,phase,client,step\n")
        check_own_files(folder, "--out")
