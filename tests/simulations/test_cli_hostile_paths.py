"""Issue 52, items 1, 4 and 11: hostile paths on the command line. Each is answered with one
line and exit status 2 before any work (the guard ``--ray-address`` where nothing listens makes
a case that slipped through fail on the address instead of running a federation), and leaves
every file as it was, with no lock or temporary file beside it.

A command that could hang or read without end on today's main (``validate /dev/zero``, a FIFO)
runs in a subprocess with a time limit and a 2 GiB address-space limit. Where a case needs a
file or folder the command cannot read or write, the command runs as ``nobody`` when the suite
runs as root (root reads and writes anything: :func:`as_nobody`)."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest

from fedlmc.simulations.cli import main
from fedlmc.simulations.report.build import REPORT_MARKER

REPO = Path(__file__).resolve().parents[2]
GUARD = ["--ray-address", "127.0.0.1:9"]
NOBODY = 65534
ROOT = os.geteuid() == 0


def limited() -> None:
    """In the child: at most 2 GiB of address space (``/dev/zero`` read whole would take all)."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def fedlmc(args: list[str], cwd: Path, *, timeout: float = 60, limit: bool = True):
    """``fedlmc ARGS`` in a subprocess (``limit``: at most 2 GiB of address space); ``(exit
    status or "hung", stderr)``."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fedlmc.simulations.cli", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=limited if limit else None,
        )
    except subprocess.TimeoutExpired:
        return "hung", ""
    return done.returncode, done.stderr


@contextmanager
def as_nobody():
    """The block runs as user and group ``nobody`` (real and effective ids, no supplementary
    groups) when the suite runs as root, who reads and writes anything; root again after it.
    As-is otherwise."""
    if not ROOT:
        yield
        return
    groups = os.getgroups()
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, 0)
    os.setresuid(NOBODY, NOBODY, 0)
    try:
        yield
    finally:
        os.setresuid(0, 0, 0)
        os.setresgid(0, 0, 0)
        os.setgroups(groups)


@pytest.fixture
def shared_dir():
    """A folder ``nobody`` can enter (``tmp_path``'s parents are private to the suite's
    user)."""
    folder = Path(tempfile.mkdtemp(prefix="fedlmc-52-"))
    folder.chmod(0o755)
    yield folder
    for path in folder.rglob("*"):
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    shutil.rmtree(folder)


def give_away(path: Path) -> None:
    """``path`` owned by ``nobody`` when the suite runs as root (what it may then write)."""
    if ROOT:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)


def one_line_exit_2(code, err: str, needle: str) -> bool:
    lines = err.strip().splitlines()
    return (
        code == 2 and len(lines) == 1 and lines[0].startswith("fedlmc: error: ") and needle in err
    )


def snapshot(root: Path) -> dict[str, object]:
    """Every entry under ``root``: its kind and, for a readable regular file, its bytes."""
    found = {}
    for path in sorted(root.rglob("*")):
        mode = os.lstat(path).st_mode
        readable = path.is_file() and not path.is_symlink() and os.access(path, os.R_OK)
        found[str(path)] = (mode, path.read_bytes() if readable else None)
    return found


def csv_cases(root: Path) -> list[tuple[str, str, str]]:
    """(case, --csv path, what the line says) of item 1's hostile ``--csv`` paths."""
    (root / "notes.txt").write_text("my notes\n")
    os.mkfifo(root / "pipe.csv")
    (root.parent / f"{root.name}-outside.txt").write_text("keep me\n")
    (root / "link.csv").symlink_to(root.parent / f"{root.name}-outside.txt")
    (root / "folder.csv").mkdir()
    (root / "training.csv").write_text("cell_id,phase,client,step,loss\n")
    pd.DataFrame([{"method": "average", "accuracy": 0.5}]).to_csv(root / "old.csv", index=False)
    (root / "swept.csv").write_text("cell_id,status,error,method\n0123456789ab,ok,,average\n")
    return [
        ("a regular foreign file", "notes.txt", "is not a fedlmc results table"),
        ("/dev/null", "/dev/null", "is a character device"),
        ("a FIFO", "pipe.csv", "is a FIFO"),
        ("a symlink out of the folder", "link.csv", "is a symbolic link"),
        ("a folder", "folder.csv", "is a folder"),
        ("another fedlmc table (training.csv)", "training.csv", "not a fedlmc results table"),
        ("a fedlmc run table of other columns", "old.csv", "other columns"),
        ("a sweep's rows", "swept.csv", "a sweep's rows"),
    ]


def test_run_csv_refuses_every_path_but_a_new_file_or_its_own_table(tmp_path, capsys, monkeypatch):
    root = tmp_path / "here"
    root.mkdir()
    monkeypatch.chdir(root)
    cases = csv_cases(root)
    before = snapshot(tmp_path)
    failures = []
    for case, path, needle in cases:
        code = main(["run", "epochs=1", "--csv", path, *GUARD])
        err = capsys.readouterr().err
        if not one_line_exit_2(code, err, needle) or path not in err:
            failures.append(f"{case}: exit {code}, {err[-300:]!r}")
    assert failures == []
    assert snapshot(tmp_path) == before  # nothing replaced, no .lock, no temporary
    assert len(cases) == 8


def test_run_csv_accepts_its_own_table_for_appending(tmp_path, capsys, monkeypatch):
    """A ``fedlmc run --csv`` file of the same columns passes the checks: the command goes on
    to the (guard) Ray address, which is what refuses it."""
    from fedlmc.simulations.records.written_paths import append_csv_rows

    monkeypatch.chdir(tmp_path)
    append_csv_rows(tmp_path / "mine.csv", pd.DataFrame([{"method": "average"}]))
    before = snapshot(tmp_path)
    assert main(["run", "epochs=1", "--csv", "mine.csv", *GUARD]) == 2
    err = capsys.readouterr().err
    assert "--ray-address" in err and "--csv" not in err
    assert snapshot(tmp_path) == before


def test_run_csv_an_unreadable_file_is_refused(shared_dir, capsys, monkeypatch):
    monkeypatch.chdir(shared_dir)
    assert main(["run", "--csv", "new.csv", *GUARD]) == 2  # every import made, as root
    (shared_dir / "locked.csv").write_text("method,accuracy\n")
    (shared_dir / "locked.csv").chmod(0o200)
    give_away(shared_dir / "locked.csv")  # the command may write it but not read it
    give_away(shared_dir)
    capsys.readouterr()
    with as_nobody():
        code = main(["run", "--csv", "locked.csv", *GUARD])
    err = capsys.readouterr().err
    assert one_line_exit_2(code, err, "'locked.csv' cannot be read"), (code, err)
    assert sorted(os.listdir(shared_dir)) == ["locked.csv"]


def config_cases(root: Path) -> list[tuple[str, list[str], str]]:
    """(case, argv, what the line says) of item 4's config files that are no regular file of at
    most 1 MiB."""
    os.mkfifo(root / "pipe.toml")
    (root / "big.toml").write_bytes(b"#" * (1 << 20) + b"\nname = 'big'\n")
    (root / "zero.toml").symlink_to("/dev/zero")
    (root / "folder.toml").mkdir()
    return [
        ("validate /dev/zero", ["validate", "/dev/zero"], "is a character device"),
        ("validate a FIFO", ["validate", "pipe.toml"], "is a FIFO"),
        ("validate a file over 1 MiB", ["validate", "big.toml"], "1,048,590 bytes"),
        ("validate a link to /dev/zero", ["validate", "zero.toml"], "is a character device"),
        ("validate a folder", ["validate", "folder.toml"], "is a folder"),
        ("sweep /dev/zero", ["sweep", "/dev/zero", *GUARD], "is a character device"),
        ("sweep a FIFO", ["sweep", "pipe.toml", *GUARD], "is a FIFO"),
        ("keys --write-pyproject /dev/zero", ["keys", "--write-pyproject", "/dev/zero"], "device"),
    ]


@pytest.mark.slow
def test_config_files_are_regular_files_of_at_most_1_mib_read_bounded(tmp_path):
    cases = config_cases(tmp_path)
    failures = []
    for case, argv, needle in cases:
        code, err = fedlmc(argv, tmp_path, timeout=30)
        if not (one_line_exit_2(code, err, needle) and "allowed: a regular file" in err):
            failures.append(f"{case}: exit {code}, {err[-300:]!r}")
    assert failures == []
    assert not (tmp_path / "results").exists()
    assert len(cases) == 8


def finished_sweep(folder: Path) -> None:
    """A finished sweep's out dir (a plain runner, no Flower)."""
    from fedlmc.simulations.config import sweep_from_mapping
    from fedlmc.simulations.runs.sweep import run_sweep

    rows = pd.DataFrame([{"method": "average", "accuracy": 0.5}])
    sweep = sweep_from_mapping(
        {"name": "s", "run": {"methods": "average"}, "grid": {"seed": [0, 1]}}
    )
    run_sweep(sweep, folder, runner=lambda _config: rows, progress=False)


def test_report_on_a_read_only_folder_is_refused_naming_to_and_to_writes_elsewhere(
    shared_dir, capsys
):
    """Item 11: a read-only sweep folder is refused in one line before any work (not with an
    error about its lock); ``--to FOLDER`` builds the report there and leaves the sweep's
    folder as it was (no lock taken in it)."""
    sweep = shared_dir / "sweep"
    finished_sweep(sweep)
    for path in [sweep, *sweep.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    before = snapshot(sweep)
    import fedlmc.simulations.report.build  # noqa: F401 - imported as root (nobody cannot read Python's files here)

    with as_nobody():
        code = main(["report", str(sweep)])
    err = capsys.readouterr().err
    assert one_line_exit_2(code, err, "is not writable"), (code, err)
    assert "--to FOLDER" in err
    elsewhere = shared_dir / "elsewhere"
    assert main(["report", str(sweep), "--to", str(elsewhere)]) == 0
    assert (elsewhere / "report.md").is_file() and (elsewhere / "report_full.md").is_file()
    assert (elsewhere / "report.md").read_text().startswith(f"{REPORT_MARKER}\n# s")
    assert f"report: {elsewhere / 'report.md'}" in capsys.readouterr().out
    assert snapshot(sweep) == before


def test_report_to_a_folder_replaces_only_its_own_report_and_figures(tmp_path, capsys):
    """A user's hand-written report.md / report_full.md or figures/ in ``--to FOLDER`` is
    refused in one line before any work; fedlmc's own report there is written again."""
    sweep = tmp_path / "sweep"
    finished_sweep(sweep)
    capsys.readouterr()
    for name in ("report.md", "report_full.md", "figures/curves.png"):
        to = tmp_path / name.replace("/", "-")
        (to / name).parent.mkdir(parents=True)
        (to / name).write_text("mine\n")
        before = snapshot(to)
        code = main(["report", str(sweep), "--to", str(to)])
        err = capsys.readouterr().err
        assert one_line_exit_2(code, err, "was not written by fedlmc report"), (name, err)
        assert "allowed: " in err and snapshot(to) == before
    to = tmp_path / "mine"
    assert main(["report", str(sweep), "--to", str(to)]) == 0
    assert main(["report", str(sweep), "--to", str(to)]) == 0  # its own report: written again
    assert (to / "report.md").read_text().startswith(f"{REPORT_MARKER}\n")
    assert not (to / ".lock").exists()  # the lock lives only while the report is written


def test_a_refused_run_leaves_nothing_in_the_users_folder(tmp_path, capsys):
    """A run refused under its out dir's lock (no Ray at the address) leaves no ``.lock`` in a
    user's folder, and no folder it made itself."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    for out in (mine, tmp_path / "new"):
        assert main(["run", "epochs=1", f"out-dir={out}", *GUARD]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    assert sorted(os.listdir(mine)) == ["notes.txt"] and not (tmp_path / "new").exists()


@pytest.mark.slow
def test_report_and_track_refuse_a_fifo_results_file_without_reading_it(tmp_path):
    os.mkfifo(tmp_path / "results.csv")
    for argv in (["report", str(tmp_path)], ["track", str(tmp_path), "--to", "tensorboard"]):
        code, err = fedlmc(argv, tmp_path, timeout=30)
        assert one_line_exit_2(code, err, "results.csv there is a FIFO"), (argv, code, err)


def test_run_out_dir_with_its_results_file_a_link_out_is_refused(tmp_path, capsys):
    outside = tmp_path / "passwd"
    outside.write_text("root:x:0:0\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").symlink_to(outside)
    assert main(["run", f"out-dir={out}", *GUARD]) == 2
    err = capsys.readouterr().err
    assert "results.csv there is a symbolic link" in err and err.count("\n") == 1
    assert outside.read_text() == "root:x:0:0\n" and sorted(os.listdir(out)) == ["results.csv"]


def test_run_out_dir_holding_a_users_results_csv_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("my notes\n")
    assert main(["run", f"out-dir={out}", *GUARD]) == 2
    err = capsys.readouterr().err
    assert "results.csv there is not a fedlmc table" in err and err.count("\n") == 1
    assert (out / "results.csv").read_text() == "my notes\n"
    assert sorted(os.listdir(out)) == ["results.csv"]


@pytest.mark.slow
def test_data_fetch_refuses_a_fifo_where_a_data_file_goes(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    os.mkfifo(raw / "train-images-idx3-ubyte")
    argv = ["data", "fetch", "mnist", "--root", str(tmp_path)]
    code, err = fedlmc(argv, tmp_path, timeout=60, limit=False)
    assert one_line_exit_2(code, err, "train-images-idx3-ubyte' is not a regular file"), (code, err)
    assert sorted(os.listdir(tmp_path)) == ["MNIST"]  # no lock file made


def test_odd_csv_and_out_dir_paths_are_refused_in_one_line_naming_what_they_are(tmp_path, capsys):
    (tmp_path / "FILE").write_text("x\n")
    os.mkfifo(tmp_path / "fifo")
    cases = [
        (["--csv", "~nouser-52/x.csv"], "no user 'nouser-52' on this machine; allowed: "),
        (["--csv", str(tmp_path / "FILE" / "x.csv")], "is not a folder; allowed: "),
        (["out-dir=/dev/null"], "'/dev/null' is a character device; allowed: a folder"),
        ([f"out-dir={tmp_path / 'fifo'}"], "is a FIFO (named pipe); allowed: a folder"),
    ]
    for args, needle in cases:
        code = main(["run", "epochs=1", *args, *GUARD])
        err = capsys.readouterr().err
        assert one_line_exit_2(code, err, needle), (args, code, err)
    assert (tmp_path / "FILE").read_text() == "x\n"


def test_an_empty_csv_file_is_taken_as_new(tmp_path):
    from fedlmc.simulations.records.written_paths import check_csv_file

    (tmp_path / "empty.csv").write_bytes(b"")
    check_csv_file(tmp_path / "empty.csv")  # the writer puts the header first
