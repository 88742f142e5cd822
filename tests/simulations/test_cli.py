"""The ``fedlmc`` command line: a real one-federation ``run``, ``validate`` listings, and
one-line errors with exit status 2."""

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


@pytest.mark.slow
def test_run_prints_one_row_per_method(tmp_path):
    """Three clients: the rows, the stages on stderr, where the rows went (nowhere on disk:
    no out-dir) and no column that has no value for the run (the barriers)."""
    csv = tmp_path / "rows.csv"
    done = run_cli(
        "run",
        "epochs=1",
        "width=0.125",
        "num-clients=3",
        "lambdas=3",
        "diagnostics=false",
        "methods=average,average_t,ensemble",
        "--csv",
        str(csv),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["method", "accuracy"])
    methods = [line.split()[0] for line in lines[header + 1 : header + 4]]
    assert methods == ["average", "average_t", "ensemble"]
    assert "loss_barrier_half" not in lines[header] and "lewc_cos_mean" not in lines[header]
    left_out = "not shown: loss_barrier_half (no value in any row; applies to: two-client"
    assert left_out in done.stdout
    told = [line for line in done.stderr.splitlines() if line.startswith("fedlmc run: [")]
    replies = [line.split("] training: ")[1] for line in told if "] training: " in line]
    heard = [r for r in replies if not r.startswith("0/3")]  # 0/3: a 30 s heartbeat (load)
    assert heard[0].startswith("1/3 client(s) replied after"), replies  # the first reply
    assert heard[-1].startswith("3/3 client(s) replied after"), replies  # and the last
    stages = [line for line in told if "] training: " not in line]
    assert "waiting for 3 clients to train (1 epoch(s) each)" in stages[0]
    assert "3 client model(s) received" in stages[1]
    assert "merge and evaluation 1/1: average" in stages[2]
    assert "evaluation done: 3 row(s)" in stages[3]
    assert "fedlmc run: out-dir is empty: the rows were not written to disk" in done.stderr
    import pandas as pd

    rows = pd.read_csv(csv)
    assert list(rows["method"]) == methods and rows["accuracy"].between(0, 1).all()


def test_validate_lists_every_cell(tmp_path, capsys):
    code = main(["validate", str(REPO / "configs" / "quick.toml"), "seed=[3]"])
    out = capsys.readouterr().out
    assert code == 0
    cells = expand_grid(load_sweep_config(REPO / "configs" / "quick.toml", ["seed=[3]"]))
    assert out.splitlines()[0] == f"quick: {len(cells)} cell(s); grid axes: bias, seed, width"
    for cell in cells:
        assert cell_id(cell) in out


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
        "fedlmc: error: run.width = 0.0: allowed: a number > 0.0"
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
