"""The ``fedlmc`` command line: a real one-federation ``run``, ``validate`` listings, and
one-line errors with exit status 2."""

from __future__ import annotations

import ipaddress
import os
import re
import signal
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


def process_tree(root: int) -> set[int]:
    """``root`` and every process below it (``/proc/*/stat``'s parent ids)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rpartition(")")[2].split()[1])
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += parents.get(pid, [])
    return found


def socket_inodes(pids: set[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        inodes |= {link[8:-1] for link in links if link.startswith("socket:[")}
    return inodes


def tcp_address(hex_address: str) -> str:
    """A ``/proc/net/tcp[6]`` local address (host byte order words) as text."""
    host = bytes.fromhex(hex_address.partition(":")[0])
    words = b"".join(host[i : i + 4][::-1] for i in range(0, len(host), 4))
    return socket.inet_ntop(socket.AF_INET if len(words) == 4 else socket.AF_INET6, words)


def listening_sockets(pids: set[int]) -> set[tuple[str, int]]:
    """``(address, port)`` of each TCP socket of ``pids`` in state LISTEN."""
    inodes = socket_inodes(pids)
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # state LISTEN
                found.add((tcp_address(fields[1]), int(fields[1].partition(":")[2], 16)))
    return found


def listening_addresses(root: int) -> set[str]:
    """The addresses the TCP sockets of ``root`` and its children listen on."""
    return {address for address, _ in listening_sockets(process_tree(root))}


def gcs_of(root: int) -> tuple[int, dict[str, str]] | None:
    """``(port, environment)`` of the GCS server below ``root``, once it listens."""
    for pid in process_tree(root):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if not argv[0].endswith(b"gcs_server"):
                continue
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ports = sorted(port for _, port in listening_sockets({pid}))
        flags = dict(a.decode().partition("=")[::2] for a in argv[1:] if a.startswith(b"--"))
        env = dict(e.decode().partition("=")[::2] for e in environ if b"=" in e)
        return (ports[0], {**env, "logs": flags["--log_dir"]}) if ports else None
    return None


INTRUDER = """
import os, sys, ray

@ray.remote
def whoami():
    return os.getuid()

ray.init(address=sys.argv[1], logging_level="ERROR")
print("task ran as uid", ray.get(whoami.remote()), flush=True)
"""


def as_another_user() -> list[str]:
    """``runuser -u nobody --`` where this process may switch users and ``nobody`` can run this
    interpreter; else nothing (the intruder is then this user without the token)."""
    if os.geteuid() != 0:
        return []
    probe = ["runuser", "-u", "nobody", "--", sys.executable, "-c", "import ray"]
    try:
        done = subprocess.run(probe, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return probe[:4] if done.returncode == 0 else []


REFUSED = "Authentication token is missing or incorrect"
"""What Ray's GCS answers a client without the cluster's token (the intruder logs it on its first
try, then retries until it gives up)."""


def intrude(port: int, home: Path, seconds: float = 120) -> tuple[str, str, int]:
    """A second local process that knows the GCS port only (no token in its environment or
    its home, ``~/.ray/auth_token``) joins that Ray and submits a task: its stdout, stderr and
    exit status once it ran a task, exited, or logged the GCS's refusal (:data:`REFUSED`; it
    is then killed: Ray retries a refused connection, and after the run's Ray has gone a
    connection that never answers, for minutes)."""
    home.mkdir(mode=0o777, exist_ok=True)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "OMP_NUM_THREADS": "1"}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep 127.0.0.1 (else the machine's IP)
    out, err = home / "stdout.txt", home / "stderr.txt"
    with out.open("w") as stdout, err.open("w") as stderr:
        intruder = subprocess.Popen(
            [*as_another_user(), sys.executable, "-c", INTRUDER, f"127.0.0.1:{port}"],
            stdout=stdout,
            stderr=stderr,
            text=True,
            cwd=home,
            env=env,
        )
    deadline = time.monotonic() + seconds
    try:
        while intruder.poll() is None and REFUSED not in err.read_text(errors="replace"):
            assert "task ran" not in out.read_text(), out.read_text()
            assert time.monotonic() < deadline, f"no answer to the intruder in {seconds} s"
            time.sleep(0.2)
    finally:
        if intruder.poll() is None:
            intruder.kill()
        intruder.wait(timeout=60)
    return out.read_text(), err.read_text(errors="replace"), intruder.returncode


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


@pytest.mark.slow
def test_run_prints_one_row_per_method_and_listens_on_loopback_only(tmp_path):
    """Three clients: the rows, the stages on stderr, where the rows went (nowhere on disk:
    no out-dir) and no column that has no value for the run (the barriers). While it runs,
    every TCP socket that it and its children (Ray's GCS, raylet, agents, the client actors)
    listen on is on the loopback interface: a local Ray is not reachable from the network. A
    ``RAY_ADDRESS`` in the shell (here one where nothing listens) is not joined: a run without
    ``--ray-address`` starts a Ray of its own (``ray.init(address="local")``). Nor can another
    local process use it: one that knows the GCS port but not the run's token (``nobody``
    where the machine lets it run this interpreter) is refused and runs no task, and the token
    is in no output, results or Ray log. Partition 1 fails (``inject-failure=raise:1``): the
    table's ``clients_survived`` and the last line say two of three were merged and name the
    dropped one, and the output (pipes, not a terminal, as a log file) is plain: no colour
    codes, no carriage-return frames, no "Manually terminating ClientAppActor" warning."""
    csv = tmp_path / "rows.csv"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env["RAY_ADDRESS"] = "127.0.0.1:9"  # the discard port: no Ray answers there
    args = ["epochs=1", "width=0.125", "num-clients=3", "lambdas=3", "diagnostics=false"]
    args += ["min-clients=2", "inject-failure=raise:1"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fedlmc.simulations.cli",
            "run",
            *args,
            "methods=average,average_t,ensemble",
            "--csv",
            str(csv),
        ],  # fmt: skip
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
        start_new_session=True,
    )
    listening: set[str] = set()
    gcs, intruder = None, None
    deadline = time.monotonic() + 300
    try:
        while proc.poll() is None:
            assert time.monotonic() < deadline, "fedlmc run did not exit within 300 s"
            listening |= listening_addresses(proc.pid)
            gcs = gcs or gcs_of(proc.pid)
            if gcs and intruder is None:
                # the run's driver waits while the intruder tries its Ray (its GCS, raylet and
                # actors go on): a short run's Ray is otherwise gone before the intruder, which
                # imports ray first, reaches it
                os.kill(proc.pid, signal.SIGSTOP)
                try:
                    intruder = intrude(gcs[0], tmp_path / "intruder")
                finally:
                    os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.5)
        out, err = proc.communicate(timeout=60)
        assert intruder is not None, "the GCS server was never seen"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    intruder_out, intruder_err, intruder_status = intruder
    assert proc.returncode == 0, err
    assert listening and all(is_loopback(a) for a in listening), sorted(listening)
    assert "task ran" not in intruder_out and intruder_status != 0, intruder_out
    assert REFUSED in intruder_err, intruder_err[-2000:]
    token = gcs[1].get("RAY_AUTH_TOKEN", "")
    assert gcs[1].get("RAY_AUTH_MODE") == "token" and len(token) == 64, sorted(gcs[1])
    ray_logs = Path(gcs[1]["logs"])
    assert token not in out + err + csv.read_text()
    assert not [p for p in ray_logs.rglob("*") if p.is_file() and token in p.read_text("latin-1")]
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["method", "accuracy"])
    methods = [line.split()[0] for line in lines[header + 1 : header + 4]]
    assert methods == ["average", "average_t", "ensemble"]
    assert "loss_barrier_half" not in lines[header] and "lewc_cos_mean" not in lines[header]
    left_out = "not shown: loss_barrier_half (no value in any row; applies to: two-client"
    assert left_out in out
    told = [line for line in err.splitlines() if line.startswith("fedlmc run: [")]
    replies = [line.split("] training: ")[1] for line in told if "] training: " in line]
    heard = [r for r in replies if not r.startswith("0/3")]  # 0/3: a 30 s heartbeat (load)
    assert heard[0].startswith("1/3 client(s) replied after"), replies  # the first reply
    assert heard[-1].startswith("3/3 client(s) replied after"), replies  # and the last
    stages = [line for line in told if "] training: " not in line]
    assert "waiting for 3 clients to train (1 epoch(s) each)" in stages[0]
    assert "2 client model(s) received" in stages[1]
    assert "merge and evaluation 1/1: average" in stages[2]
    assert "evaluation done: 3 row(s)" in stages[3]
    assert "fedlmc run: out-dir is empty: the rows were not written to disk" in err
    assert "\x1b[" not in out + err and "\r" not in out + err, repr((out + err)[-2000:])
    assert "Manually terminating" not in out + err, err[-2000:]
    assert lines[header].split()[-1] == "clients_survived"
    assert [line.split()[-1] for line in lines[header + 1 : header + 4]] == ["2", "2", "2"]
    last = re.fullmatch(
        r"clients: 2 of 3 merged; dropped: node \d+ \(partition 1\): (.*)", lines[-1]
    )
    assert last is not None and "injected failure on partition 1" in last.group(1), lines[-1]
    assert "dropped reply from node" in err  # the server's warning, in plain text
    import pandas as pd

    rows = pd.read_csv(csv)
    assert list(rows["method"]) == methods and rows["accuracy"].between(0, 1).all()


def test_validate_lists_every_cell(tmp_path, capsys):
    code = main(["validate", str(REPO / "configs" / "quick.toml"), "seed=[3]"])
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
