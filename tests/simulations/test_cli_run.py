"""A real one-federation ``fedlmc run``: its table, stages and last line, and its Ray, which
listens on the loopback interface only and refuses a local process without the run's token."""

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

REPO = Path(__file__).resolve().parents[2]


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
