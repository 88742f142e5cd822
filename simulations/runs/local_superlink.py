"""Flower's local SuperLink, started and stopped by fedlmc (``fedlmc superlink start|stop``).

``flwr run .`` on the default ``local`` connection first asks
``http://127.0.0.1:PORT/health`` whether a local SuperLink runs; if none answers it starts
``flower-superlink --insecure --simulation ...`` itself and gives up after **15 s** ("Failed to
start local SuperLink within 15s"): ``LOCAL_SUPERLINK_STARTUP_TIMEOUT`` in Flower 1.42's
``flwr/cli/constant.py``, a constant that no option, configuration key or environment
variable changes. On a busy machine the SuperLink takes longer than that to start.

:func:`start_local_superlink` starts the very SuperLink Flower would (the same command, ports,
database and log file: ``$FLWR_HOME/local-superlink/``; the ports from Flower's own
``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT`` and ``FLWR_LOCAL_CONTROL_API_PORT``, default 39091 and
39093), with runtime dependency installation disabled, detached from the terminal, and waits for
its health endpoint for up to ``timeout`` seconds, telling the wait; ``flwr run .`` then finds it
running and uses it. Its process id is kept in :data:`PID_FILE`. :func:`stop_local_superlink`
stops the local SuperLink of this ``FLWR_HOME``, whoever started it (fedlmc, or ``flwr run .``,
recognised by its ``--log-file``), by process id: SIGTERM, then SIGKILL after
:data:`STOP_SECONDS`. The ``flower-superexec`` a SuperLink starts is stopped by it, or exits by
itself since it watches its parent. ``tests/simulations/runs/test_local_superlink.py`` checks
that the command and paths are Flower's, from Flower's source.

It listens on ``127.0.0.1`` only, but authenticates no caller: Flower 1.42's open-source
SuperLink has no authentication for its Control API (its only plugin besides the no-op one,
OIDC, is in Flower's enterprise package), so any local user can list, stop and start runs on it
while it runs (docs/reliability.md, "Other users of the same machine"). The Ray that Flower
starts for each ``flwr run .`` on it inherits :func:`ray_environment`: it listens on the loopback
interface only and requires a token made for this SuperLink (Flower's own local SuperLink:
every interface, no authentication).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SUPERLINK = "flower-superlink"
"""Flower's SuperLink executable (this Python's, else the one on ``PATH``)."""
START_SECONDS = 300.0
"""How long :func:`start_local_superlink` waits for the SuperLink by default (Flower: 15 s)."""
STOP_SECONDS = 15.0
"""How long :func:`stop_local_superlink` waits after SIGTERM before SIGKILL."""
PID_FILE = "fedlmc-superlink.pid"
"""The file (in :attr:`LocalSuperLink.runtime_dir`) holding the pid of the SuperLink fedlmc
started."""
STARTUP_LOG = "superlink.startup.log"
"""Where the SuperLink's own stdout and stderr go (a crash before its log file opens)."""


class SuperLinkError(RuntimeError):
    """The local SuperLink did not start, or did not stop."""


@dataclass(frozen=True)
class LocalSuperLink:
    """Where Flower's local SuperLink of this environment lives."""

    home: Path
    http_port: str
    control_port: str

    @property
    def runtime_dir(self) -> Path:
        """``$FLWR_HOME/local-superlink``: its database and logs (Flower's folder)."""
        return self.home / "local-superlink"

    @property
    def log_file(self) -> Path:
        return self.runtime_dir / "superlink.log"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/health"

    def command(self, executable: str) -> list[str]:
        """Flower's own command for its local SuperLink (``flwr/cli/local_superlink.py``), with
        ``--disable-runtime-dependency-installation``."""
        return [
            executable,
            "--insecure",
            "--simulation",
            "--isolation",
            "subprocess",
            "--control-api-address",
            f"127.0.0.1:{self.control_port}",
            "--host",
            "127.0.0.1",
            "--port",
            self.http_port,
            "--log-file",
            str(self.log_file),
            "--log-rotation-interval-hours",
            "24",
            "--log-rotation-backup-count",
            "7",
            "--database",
            str(self.runtime_dir / "state.db"),
            "--disable-runtime-dependency-installation",
        ]


def local_superlink(environ: os._Environ | dict[str, str] = os.environ) -> LocalSuperLink:
    """The local SuperLink that ``flwr run .`` would use in ``environ`` (``FLWR_HOME``, default
    ``~/.flwr``; the two port variables)."""
    home = environ.get("FLWR_HOME") or str(Path.home() / ".flwr")
    return LocalSuperLink(
        Path(home),
        environ.get("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "39091"),
        environ.get("FLWR_LOCAL_CONTROL_API_PORT", "39093"),
    )


def answers(link: LocalSuperLink) -> bool:
    """Whether the SuperLink's health endpoint answers (what ``flwr run .`` asks first)."""
    try:
        with urllib.request.urlopen(link.health_url, timeout=0.4) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError):
        return False


def superlink_pids(link: LocalSuperLink, ps_output: str | None = None) -> list[int]:
    """The processes of ``link``'s SuperLink: ``flower-superlink`` with its ``--log-file``
    (``ps -ww -eo pid=,args=`` output, read unless given)."""
    if ps_output is None:
        ps_output = subprocess.run(
            ["ps", "-ww", "-eo", "pid=,args="], capture_output=True, text=True, check=False
        ).stdout
    marker = f"--log-file {link.log_file}"
    pids = []
    for line in ps_output.splitlines():
        pid, _, args = line.strip().partition(" ")
        if SUPERLINK in args and marker in args and pid.isdigit():
            pids.append(int(pid))
    return pids


def start_local_superlink(
    link: LocalSuperLink | None = None,
    *,
    timeout: float = START_SECONDS,
    say: Callable[[str], None] = print,
) -> int | None:
    """Start ``link`` (default: this environment's) and wait until it answers; returns its pid,
    or ``None`` when one already answered. :class:`SuperLinkError` when it exits or does not
    answer within ``timeout`` seconds (then it is stopped)."""
    link = link or local_superlink()
    if answers(link):
        pids = ", ".join(map(str, superlink_pids(link))) or "unknown"
        say(f"a local SuperLink already answers on 127.0.0.1:{link.http_port} (pid {pids})")
        return None
    link.runtime_dir.mkdir(parents=True, exist_ok=True)
    process = _launch(link)
    (link.runtime_dir / PID_FILE).write_text(f"{process.pid}\n")
    say(f"starting Flower's local SuperLink on 127.0.0.1:{link.http_port} (pid {process.pid})")
    _wait_until_it_answers(link, process, timeout, say)
    say(
        f"local SuperLink ready on 127.0.0.1:{link.http_port} (log: {link.log_file}); "
        "`flwr run .` uses it; stop it with `fedlmc superlink stop`"
    )
    return process.pid


def ray_environment() -> dict[str, str]:
    """What the SuperLink passes on to the Ray that Flower starts for each ``flwr run .``
    (``flower-superexec`` -> ``flwr-simulation`` -> ``ray.init``, each inheriting its
    parent's environment; fedlmc's code runs only after that Ray is up, so the environment is
    the one way in): Ray's node address ``127.0.0.1`` (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
    read when Ray is imported: its servers listen on the loopback interface only, not on every
    interface) and Ray's token authentication with a random 256-bit token made for this
    SuperLink (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN``; never in a file or a log), as a
    ``fedlmc run``'s own Ray (:mod:`fedlmc.simulations.engine.ray_runtime`)."""
    return {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }


def _launch(link: LocalSuperLink) -> subprocess.Popen:
    """The SuperLink's process, detached, with this Python's scripts first on ``PATH`` (it
    starts ``flower-superexec`` by name) and :func:`ray_environment`."""
    scripts = Path(sys.executable).parent
    executable = scripts / SUPERLINK
    env = {
        **{k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN_PATH"},
        "PATH": f"{scripts}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        **ray_environment(),
    }
    command = link.command(str(executable) if executable.exists() else SUPERLINK)
    with open(link.runtime_dir / STARTUP_LOG, "w") as log:
        return subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_until_it_answers(
    link: LocalSuperLink, process: subprocess.Popen, timeout: float, say: Callable[[str], None]
) -> None:
    start = told = time.monotonic()
    while not answers(link):
        now = time.monotonic()
        if process.poll() is not None:
            tail = (link.runtime_dir / STARTUP_LOG).read_text(errors="replace")[-1500:]
            raise SuperLinkError(
                f"flower-superlink exited with status {process.returncode} before it answered; "
                f"its output: {tail.strip() or '(none)'}"
            )
        if now - start > timeout:
            _stop_pids([process.pid])
            raise SuperLinkError(
                f"the local SuperLink did not answer within {timeout:.0f} s (stopped again); "
                f"see {link.log_file} and {link.runtime_dir / STARTUP_LOG}, or give it longer: "
                "fedlmc superlink start --timeout SECONDS"
            )
        if now - told >= 5:
            told = now
            say(f"  waiting for the SuperLink: {now - start:.0f} s (up to {timeout:.0f} s)")
        time.sleep(0.2)


def stop_local_superlink(
    link: LocalSuperLink | None = None, *, say: Callable[[str], None] = print
) -> list[int]:
    """Stop the local SuperLink of ``link`` (default: this environment's), whoever started it;
    returns the pids stopped (empty: none ran)."""
    link = link or local_superlink()
    pids = superlink_pids(link)
    pid_file = link.runtime_dir / PID_FILE
    if not pids:
        pid_file.unlink(missing_ok=True)
        say(f"no local SuperLink of {link.home} runs")
        return []
    _stop_pids(pids)
    pid_file.unlink(missing_ok=True)
    say(
        f"stopped flower-superlink (pid {', '.join(map(str, pids))}); its flower-superexec "
        "exits with it"
    )
    return pids


def _stop_pids(pids: list[int]) -> None:
    """SIGTERM each pid, SIGKILL those still alive after :data:`STOP_SECONDS`."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_SECONDS
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.2)
    left = [pid for pid in pids if _alive(pid)]
    for pid in left:
        _signal(pid, signal.SIGKILL)
    if any(_alive(pid) for pid in left):
        raise SuperLinkError(f"flower-superlink (pid {left}) did not stop")


def _signal(pid: int, number: int) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a child of this process that exited is reaped first)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
