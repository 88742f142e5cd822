"""The ``fedlmc`` command line: ``validate`` listings, one-line errors with exit status 2, and
a Ray address that does not answer (a real one-federation ``run`` and its Ray:
tests/simulations/test_cli_run.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedlmc.simulations.cli import build_parser, main
from fedlmc.simulations.config import cell_id, expand_grid, load_sweep_config

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "fedlmc.simulations.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )


def test_validate_lists_every_cell(tmp_path, capsys):
    # its own --out: the default, results/quick under the working directory, holds the
    # README's quick sweep once a user has run it, which validate rightly refuses
    quick = str(REPO / "configs" / "quick.toml")
    code = main(["validate", quick, "seed=[3]", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0
    cells = expand_grid(load_sweep_config(REPO / "configs" / "quick.toml", ["seed=[3]"]))
    assert all(c["strategy"] == "compare" and "fedavg" not in c["methods"] for c in cells)
    work = sum(c["num-clients"] * c["epochs"] for c in cells)  # one training round each
    assert out.splitlines()[0] == (
        f"quick: {len(cells)} cell(s), {work:,} client-epochs of training; grid axes: bias, "
        "seed, width"
    )
    for cell in cells:
        assert cell_id(cell) in out


@pytest.mark.slow  # one subprocess: the check imports neither torch nor pandas
def test_validate_out_refuses_what_sweep_would_refuse(tmp_path, capsys):
    quick = str(REPO / "configs" / "quick.toml")
    out = tmp_path / "out"
    from fedlmc.simulations.runs.out_dir import prepare_out_dir, sweep_record

    sweep = load_sweep_config(quick, ["seed=[3]"], check_devices=False)
    prepare_out_dir(out, sweep_record(sweep, expand_grid(sweep)), force=False)
    assert main(["validate", quick, "seed=[3]", "--out", str(out)]) == 0  # the same sweep
    capsys.readouterr()
    assert main(["validate", quick, "seed=[4]", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedlmc: error: out dir {str(out)!r} holds a different sweep (")
    assert err.count("\n") == 1
    (out / "config.json").write_text("{truncated")
    assert main(["validate", quick, "seed=[3]", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "config.json is unreadable" in err and "--force" in err and err.count("\n") == 1
    check = (  # the folder is checked before torch or pandas are imported
        "import sys; from fedlmc.simulations.cli import main; code = main(sys.argv[1:]); "
        "print([m for m in ('torch', 'pandas') if m in sys.modules]); sys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", check, "validate", quick, "seed=[3]", "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == "[]\n", done


def test_errors_exit_2_with_one_line(tmp_path, capsys):
    cases = [
        (["run", "widht=1"], "did you mean 'width'"),
        (["run", "methods=averag"], "unknown method 'averag' (did you mean 'average'"),
        (["run", "num-clients=2", "min-clients=3"], "min-clients = 3"),
        (["run", "partition=pathological", "classes-per-client=11"], "classes-per-client = 11"),
        (["report", str(tmp_path)], "no results.csv"),
        (["validate", str(tmp_path / "none.toml")], "cannot read"),
    ]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("fedlmc: error: ") and err.count("\n") == 1, err
        assert needle in err


@pytest.mark.slow
def test_console_script_and_usage_errors(tmp_path):
    done = run_cli("validate", str(REPO / "configs" / "quick.toml"), "width=0", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "fedlmc: error: run.width = 0.0: allowed: a number in (0, 1024] (1024 x the base widths "
        "is beyond any machine's memory)"
    ]
    parser = build_parser()
    assert parser.prog == "fedlmc"
    # a config mistake is answered before torch, Ray, Flower or pandas are imported
    check = (
        "import sys; from fedlmc.simulations.cli import main; code = main(sys.argv[1:]); "
        "heavy = [m for m in ('torch', 'ray', 'flwr', 'pandas') if m in sys.modules]; "
        "print('imported:', heavy); sys.exit(code)"
    )
    quick = str(REPO / "configs" / "quick.toml")
    for argv in (["run", "methods=averag,ensemble"], ["sweep", quick, "methods=weight_matchng"]):
        done = subprocess.run(
            [sys.executable, "-c", check, *argv],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            timeout=120,
        )
        assert done.returncode == 2 and done.stdout == "imported: []\n", (argv, done)
        assert "(did you mean 'average'" in done.stderr or "'weight_matching'" in done.stderr
        assert len(done.stderr) < 400 and "average_repair_t" not in done.stderr, done.stderr
    done = run_cli("frobnicate", cwd=tmp_path)
    assert done.returncode == 2 and "invalid choice" in done.stderr


TWO_CELLS = """
name = "two"
[run]
epochs = 1
methods = "average"
[grid]
width = [0.125, 0.25]
"""


@pytest.mark.slow
def test_an_unreachable_ray_address_is_refused_at_once_and_keeps_the_results(tmp_path):
    """One cell done, one failed: the rerun that would retry it names a Ray address where
    nothing listens. One line, exit status 2, results.csv untouched, no minutes of retries."""
    import pandas as pd

    from fedlmc.simulations.runs.sweep import run_sweep

    config = tmp_path / "two.toml"
    config.write_text(TWO_CELLS)
    out = tmp_path / "out"

    def runner(cell):
        if cell["width"] == 0.25:
            raise RuntimeError("a failure to retry")
        return pd.DataFrame([{"method": "average", "accuracy": 0.5}])

    run_sweep(load_sweep_config(config), out, runner=runner, progress=False)
    before = (out / "results.csv").read_bytes()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    address = f"127.0.0.1:{port}"
    start = time.monotonic()
    done = run_cli("sweep", str(config), "--out", str(out), "--ray-address", address, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"fedlmc: error: --ray-address {address}: no Ray cluster")
    assert (out / "results.csv").read_bytes() == before

    done = run_cli("run", "epochs=1", "--ray-address", address, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "no Ray cluster answers" in done.stderr
    assert time.monotonic() - start < 120  # refused at once, not after ray.init's retries


def test_run_progress_numbers_merges_with_the_time_left_and_says_where_rows_went():
    from fedlmc.simulations.records.progress import RunProgress, rows_destination

    now = [0.0]
    lines: list[str] = []
    progress = RunProgress(lines.append, clock=lambda: now[0])
    on_message = progress.merging(["average", "weight_matching", "merge_many"])
    on_message("predicting client 1/2")  # not a merge: not told
    for seconds, method in ((10.0, "average"), (20.0, "weight_matching"), (30.0, "merge_many")):
        now[0] = seconds
        on_message(f"merging: {method}")
    assert lines == [
        "[   10 s] merge and evaluation 1/3: average",
        "[   20 s] merge and evaluation 2/3: weight_matching, about 20 s left",
        "[   30 s] merge and evaluation 3/3: merge_many, about 10 s left",
    ]
    assert rows_destination({"out-dir": ""}).startswith("out-dir is empty: the rows were not")
    assert rows_destination({"out-dir": "/tmp/run"}).startswith(
        "rows written to /tmp/run/results.csv"
    )


# ----------------------------------------------------------------------------- issue 39
# Bad input that used to escape the checks: each is one line, exit status 2, before any work
# (nothing written, no Ray). A guard `--ray-address` where nothing listens keeps a case that
# slipped through from starting a federation here (it would then fail on the address instead).
GUARD = ["--ray-address", "127.0.0.1:9"]
GOOD_SWEEP = 'name = "good"\n[run]\nepochs = 1\nmethods = "average"\n'
DEEP = "[" * 5000 + "]" * 5000
THOUSAND = ", ".join(str(i) for i in range(1000))
DECAYS = ", ".join(f"{i / 1e4:g}" for i in range(1000))


def issue_39_inputs(root: Path, sweep_dir: Path, run_dir: Path) -> list[tuple[str, list, str]]:
    """(case id, argv, what the line must say) of every bad input of this list."""
    (root / "good.toml").write_text(GOOD_SWEEP)
    (root / "dotdot.toml").write_text(GOOD_SWEEP.replace('"good"', '".."'))
    (root / "dot.toml").write_text(GOOD_SWEEP.replace('"good"', '"."'))
    (root / "deep.toml").write_text(GOOD_SWEEP + f"seed = {DEEP}\n")
    foreign = root / "copied"
    foreign.mkdir()
    (foreign / "results.csv").write_bytes((sweep_dir / "results.csv").read_bytes())
    million = [f"grid.seed=[{THOUSAND}]", f"grid.weight-decay=[{DECAYS}]"]
    return [
        ("sweep name ..", ["sweep", "dotdot.toml", *GUARD], "name = '..'"),
        ("sweep name .", ["sweep", "dot.toml", *GUARD], "name = '.'"),
        ("name=.. override", ["sweep", "good.toml", "name=..", *GUARD], "name = '..'"),
        ("validate name ..", ["validate", "dotdot.toml"], "name = '..'"),
        ("sweep --out with a newline", ["sweep", "good.toml", "--out", "a\nb", *GUARD], "--out"),
        ("validate --out with a newline", ["validate", "good.toml", "--out", "a\nb"], "--out"),
        ("run out-dir with a newline", ["run", "out-dir=a\nb", *GUARD], "out-dir"),
        ("run out-dir with an escape", ["run", "out-dir=a\x1b[2Jb", *GUARD], "out-dir"),
        ("run --csv with a newline", ["run", "--csv", "rows\n.csv", *GUARD], "--csv"),
        ("TOML nested 5000 deep", ["validate", "deep.toml"], "nested too deep"),
        ("override nested 5000 deep", ["validate", "good.toml", f"seed={DEEP}"], "too deep"),
        ("sweep of 1e6 cells", ["sweep", "good.toml", *million, *GUARD], "1,000,000 cells"),
        ("validate of 1e6 cells", ["validate", "good.toml", *million], "--max-cells"),
        ("methods=os:system", ["validate", "good.toml", "methods=os:system"], "'os:system'"),
        (
            "align=os:system",
            ["validate", "good.toml", "strategy=aligned", "align=os:system"],
            "'os:system'",
        ),
        ("model=os:system", ["validate", "good.toml", "model=os:system"], "'os:system'"),
        ("methods=json:dumps", ["validate", "good.toml", "methods=json:dumps"], "job"),
        ("model=json:dumps", ["validate", "good.toml", "model=json:dumps"], "width, num_classes"),
        ("run model=os:system", ["run", "model=os:system", *GUARD], "'os:system'"),
        (
            "--csv onto a sweep's results.csv",
            ["run", "--csv", str(sweep_dir / "results.csv"), *GUARD],
            "a sweep's",
        ),
        (
            "--csv onto a copy of a sweep's rows",
            ["run", "--csv", str(foreign / "results.csv"), *GUARD],
            "a sweep's rows",
        ),
        (
            "--csv onto another run's results.csv",
            ["run", "--csv", str(run_dir / "results.csv"), *GUARD],
            "a fedlmc run's",
        ),
        (
            "--csv onto the run's own results.csv",
            ["run", f"out-dir={root / 'own'}", "--csv", str(root / "own" / "results.csv"), *GUARD],
            "writes it itself",
        ),
    ]


def finished_folders(root: Path) -> tuple[Path, Path]:
    """A finished sweep's out dir (a plain runner, no Flower) and a run's out dir."""
    import pandas as pd

    from fedlmc.simulations.config import sweep_from_mapping
    from fedlmc.simulations.runs.sweep import run_sweep

    sweep_dir, run_dir = root / "sweep", root / "run"
    rows = pd.DataFrame([{"method": "average", "accuracy": 0.5}])
    sweep = sweep_from_mapping(
        {"name": "s", "run": {"methods": "average"}, "grid": {"seed": [0, 1]}}
    )
    run_sweep(sweep, sweep_dir, runner=lambda _config: rows, progress=False)
    run_dir.mkdir()
    rows.assign(fedlmc_version="0").to_csv(run_dir / "results.csv", index=False)
    return sweep_dir, run_dir


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() if p.is_file() else b"" for p in sorted(root.rglob("*"))}


def test_issue_39_bad_inputs_give_one_line_and_exit_2_before_any_work(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    sweep_dir, run_dir = finished_folders(tmp_path / "folders")
    cases = issue_39_inputs(tmp_path, sweep_dir, run_dir)
    failures = []
    for case, argv, needle in cases:
        before = snapshot(tmp_path)
        try:
            code = main(argv)
        except (Exception, SystemExit) as escaped:  # noqa: BLE001 - listed as a failure
            code = f"{type(escaped).__name__} raised"
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        ok = code == 2 and len(lines) == 1 and lines[0].startswith("fedlmc: error: ")
        if not (ok and needle in err and "Traceback" not in err and snapshot(tmp_path) == before):
            failures.append(f"{case}: exit {code}, {err[-300:]!r}")
    assert failures == []
    assert len(cases) == 23  # the count the closing note of issue 39 reports


def test_track_is_refused_while_another_command_holds_the_folder(tmp_path, capsys):
    import fcntl

    from fedlmc.simulations.records.out_dir_lock import LOCK

    sweep_dir, _run_dir = finished_folders(tmp_path)
    fd = os.open(sweep_dir / LOCK, os.O_RDWR | os.O_CREAT)  # as a running sweep holds it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(fd, b"fedlmc sweep (pid 4242)\n", 0)
        assert main(["track", str(sweep_dir), "--to", "tensorboard"]) == 2
    finally:
        os.close(fd)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "in use by fedlmc sweep (pid 4242)" in err
    assert not (sweep_dir / "tensorboard").exists()


# ----------------------------------------------------------------------------- issue 52
# Numbers that escaped the checks (trained until killed, failed after Ray started, a MemoryError
# traceback): each is one line naming the key, the value and its range, exit 2, before any work.
HUGE = "4611686018427387904"  # 2**62


def issue_52_inputs(root: Path) -> list[tuple[str, list, str]]:
    """(case id, argv, what the line must say) of every out-of-range number of this list."""
    (root / "good.toml").write_text(GOOD_SWEEP)
    (root / "dpi.toml").write_text(GOOD_SWEEP + "[report]\ndpi = 100000\n")
    integer = "allowed: an integer"
    return [
        ("epochs=2**62", ["run", f"epochs={HUGE}", *GUARD], f"epochs = {HUGE}: {integer} 1 .. "),
        ("lr=1e300", ["run", "lr=1e300", *GUARD], "lr = 1e+300: allowed: a number in (0, 10]"),
        ("server-cpus=1e300", ["run", "server-cpus=1e300", *GUARD], "server-cpus = 1e+300: "),
        ("num-cpus=1e300", ["run", "num-cpus=1e300", *GUARD], "num-cpus = 1e+300: allowed: "),
        ("depth=2**62", ["run", f"depth={HUGE}", *GUARD], f"depth = {HUGE}: {integer} 1 .. 1000"),
        ("validate depth=2**62", ["validate", "good.toml", f"depth={HUGE}"], "1 .. 1000"),
        ("sweep grid epochs", ["sweep", "good.toml", f"grid.epochs=[1, {HUGE}]", *GUARD], HUGE),
        ("timeout=1e9", ["run", "timeout=1e9", *GUARD], "(0, 604800] (one week)"),
        ("weight-decay=5", ["run", "weight-decay=5", *GUARD], "weight-decay = 5.0: allowed: "),
        ("batch-size=2**62", ["run", f"batch-size={HUGE}", *GUARD], "batch-size = "),
        ("a client width of 1e6", ["run", "client-widths=1,1e6", *GUARD], "'1e6' is over 1024"),
        ("num-clients=10**6", ["run", "num-clients=1000000", *GUARD], "2 .. 100000"),
        ("report dpi=100000", ["validate", "dpi.toml"], "report.dpi = 100000: "),
    ]


def test_issue_52_out_of_range_numbers_give_one_line_and_exit_2_before_any_work(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    cases = issue_52_inputs(tmp_path)
    failures = []
    for case, argv, needle in cases:
        before = snapshot(tmp_path)
        try:
            code = main(argv)
        except (Exception, SystemExit) as escaped:  # noqa: BLE001 - listed as a failure
            code = f"{type(escaped).__name__} raised"
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        ok = code == 2 and len(lines) == 1 and lines[0].startswith("fedlmc: error: ")
        if not (ok and needle in err and "Traceback" not in err and snapshot(tmp_path) == before):
            failures.append(f"{case}: exit {code}, {err[-300:]!r}")
    assert failures == []
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
    assert len(cases) == 13  # the count the closing note of issue 52 reports
