"""docs/federation.md's local-simulation block, **as the page prints it**: ``fedlmc superlink
start``, ``flwr run .`` on Flower's local simulation (its own SuperLink, the clients on Ray),
``fedlmc superlink stop``, with the substitutions of tests/project/test_deployment.py (free ports,
a temporary ``FLWR_HOME`` and ``out-dir``, a tiny model's keys, ``flwr run`` in a copy of the
project without its ``.venv``). Its own module, so that pytest-xdist runs it beside the loopback
deployment's tests instead of after them."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from tests.project.test_deployment import (
    BIN,
    PAGE,
    REPO,
    RUN_TIMEOUT,
    TEST_BOUND,
    TINY_MODEL,
    app_copy,
    free_port,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TEST_BOUND)]


LOCAL_MARKER = "<!-- local-simulation-test:"


def local_simulation_block(text: str) -> list[list[str]]:
    """The ``bash`` block after the page's local-simulation marker, each line split as a shell
    would (comments dropped)."""
    after = text[text.index(LOCAL_MARKER) :]
    bash = re.search(r"^```bash\n(.*?)^```", after, flags=re.S | re.M).group(1)
    return [words for line in bash.splitlines() if (words := shlex.split(line, comments=True))]


def test_the_pages_local_simulation_with_fedlmc_superlink(tmp_path):
    """The page's ``flwr run .`` on Flower's local simulation, as written: ``fedlmc superlink
    start`` (Flower's own SuperLink, waited for longer than Flower's 15 s), the ``flwr run``
    line (its model keys replaced by :data:`TINY_MODEL`, ``out-dir`` by a temporary folder),
    ``fedlmc superlink stop``. Every port is a free one (Flower's own variables), ``FLWR_HOME``
    temporary. The run's log tells each client's reply and cuts the train config; the stop
    leaves no SuperLink or SuperExec of this ``FLWR_HOME`` behind."""
    from fedlmc.simulations.runs.local_superlink import local_superlink, superlink_pids

    lines = local_simulation_block(PAGE.read_text())
    assert [words[:3] for words in lines][1:] == [
        ["fedlmc", "superlink", "start"],
        ["flwr", "run", "."],
        ["fedlmc", "superlink", "stop"],
    ]
    env = {
        **os.environ,
        **dict(word.split("=", 1) for word in lines[0][1:]),  # the export line
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": str(tmp_path / "flwr-home"),
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }
    link = local_superlink(env)
    out = tmp_path / "run1"
    app = app_copy(tmp_path)

    def run(words: list[str]) -> subprocess.CompletedProcess:
        if words[0] == "fedlmc":  # this checkout's command
            words = [sys.executable, "-m", "fedlmc.simulations.cli", *words[1:]]
        else:
            words = [str(BIN / words[0]), *words[1:]]
        return subprocess.run(
            words, cwd=app, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT
        )

    try:
        started = run(lines[1])
        assert started.returncode == 0, started.stdout + started.stderr
        assert "local SuperLink ready on 127.0.0.1:" in started.stdout
        pids = superlink_pids(link)
        assert len(pids) == 1
        flwr = local_run_line(lines[2], out)
        with watching_ray(env["FLWR_HOME"]) as ray_seen:
            done = run(flwr)
        rows = check_local_run(done, out)
        check_local_ray(ray_seen)
        assert set(rows["method"]) >= {"average", "weight_matching_t", "ensemble"}
        stopped = run(lines[3])
        assert stopped.returncode == 0 and f"stopped flower-superlink (pid {pids[0]})" in (
            stopped.stdout
        ), stopped.stdout + stopped.stderr
        assert superlink_pids(link) == []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and f"--parent-pid {pids[0]}" in ps_text():
            time.sleep(0.5)
        # its flower-superexec exited too
        assert f"--parent-pid {pids[0]}" not in ps_text(), "flower-superexec still up after 30 s"
    finally:
        from fedlmc.simulations.runs.local_superlink import stop_local_superlink

        stop_local_superlink(link, say=lambda _line: None)


Seen = dict[int, tuple[str, set[bytes] | None, set[str]]]
"""pid -> (name, its ``RAY_AUTH_*`` variables or ``None``, the addresses it listens on)."""
RAY_NAMES = (b"gcs_server", b"raylet", b"ray::")


def ray_auth(environ: list[bytes]) -> set[bytes] | None:
    """The ``RAY_AUTH_*`` variables of a start-up environment (the token's value left out);
    ``None`` where the process's title overwrote it (Ray's agents without ``SPT_NOENV``:
    :mod:`fedlmc.simulations.engine.ray_reaper`)."""
    if not environ[0]:
        return None
    found = {v for v in environ if v.startswith(b"RAY_AUTH")}
    return {v if v == b"RAY_AUTH_MODE=token" else v.partition(b"=")[0] for v in found}


@contextlib.contextmanager
def watching_ray(flwr_home: str) -> Iterator[Seen]:
    """While the block runs, every 0.5 s: the processes started with ``FLWR_HOME=flwr_home``
    whose command is Ray's GCS or raylet or a Ray worker or agent (:data:`Seen`)."""
    import threading

    from tests.simulations.test_cli_run import listening_sockets

    marker = f"FLWR_HOME={flwr_home}".encode()
    seen: Seen = {}
    stop = threading.Event()

    def look() -> None:
        while not stop.wait(0.5):
            for entry in filter(str.isdigit, os.listdir("/proc")):
                try:
                    command = Path(f"/proc/{entry}/cmdline").read_bytes()[:200]
                    environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                    name = next((n for n in RAY_NAMES if n in command), None)
                    if name is None or marker not in environ:
                        continue
                    addresses = {address for address, _ in listening_sockets({int(entry)})}
                except OSError:
                    continue
                before = seen.get(int(entry), ("", None, set()))[2]
                seen[int(entry)] = (name.decode(), ray_auth(environ), before | addresses)

    watcher = threading.Thread(target=look, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join()


def check_local_ray(seen: Seen) -> None:
    """The Ray that Flower started for the run (:func:`watching_ray`): token mode with a token
    in each of its processes whose environment can be read, and listening on the loopback
    interface only (before: no authentication, and its GCS and raylet listening on every
    interface)."""
    from tests.simulations.test_cli_run import is_loopback

    names = {name for name, _, _ in seen.values()}
    assert {"gcs_server", "raylet"} <= names, names
    readable = {pid: auth for pid, (_, auth, _) in seen.items() if auth is not None}
    assert len(readable) >= 2
    assert all(a == {b"RAY_AUTH_MODE=token", b"RAY_AUTH_TOKEN"} for a in readable.values()), seen
    listening = set().union(*(addresses for _, _, addresses in seen.values()))
    assert listening and all(is_loopback(address) for address in listening), seen


def local_run_line(words: list[str], out: Path) -> list[str]:
    """The page's ``flwr run``: its keys that :data:`TINY_MODEL` sets dropped, the tiny model's
    keys added, ``out-dir`` replaced by ``out``."""
    at = words.index("--run-config") + 1
    tiny = shlex.split(TINY_MODEL)
    tiny_keys = {item.split("=", 1)[0] for item in tiny}
    kept = [item for item in shlex.split(words[at]) if item.split("=", 1)[0] not in tiny_keys]
    kept = [f'out-dir="{out}"' if item.startswith("out-dir=") else item for item in kept]
    return [*words[:at], " ".join([*kept, TINY_MODEL]), *words[at + 1 :]]


def check_local_run(run: subprocess.CompletedProcess, out: Path) -> pd.DataFrame:
    log = run.stdout + run.stderr
    assert run.returncode == 0 and (out / "results.csv").exists(), log[-4000:]
    rows = pd.read_csv(out / "results.csv")
    assert (rows["clients_survived"] == 3).all() and rows["accuracy"].between(0, 1).all()
    assert "client(s) replied after" in log  # each reply told while the clients train
    assert "3/3 client(s) replied" in log
    assert "keys: the run config; `fedlmc keys` lists every key)" in log  # not 50+ on a line
    assert "calibration none (this round only collects the client models" in log
    return rows


def ps_text() -> str:
    return subprocess.run(["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True).stdout
