"""A real Flower deployment on loopback, **as docs/federation.md prints it**: one SuperLink, three
SuperNodes for runs of two clients (the lowest node ids train; the third stays idle),
``flwr run . loopback``.

The page's loopback blocks (the ``toml`` connection and the ``bash`` commands after the ``<!--
deployment-test: ... -->`` marker) are parsed and run as written, with six documented
substitutions: every port becomes a free one (the same page port, the same free port), the
``out-dir`` a temporary folder, the run config gets a tiny model's keys (:data:`TINY_MODEL`, none of
which the page sets), the SuperNodes heartbeat every :data:`NODE_HEARTBEAT` s, so that a killed one
is reported unavailable sooner, and look for messages every :data:`NODE_POLL` s, and ``flwr run``
runs in a copy of the project without its ``.venv`` (:func:`app_copy`). ``export`` lines set the
processes' environment, ``&`` lines start the SuperLink and the SuperNodes, the ``flwr run`` line is
the first run; ``kill`` is what the fixture's finaliser does (by process group, also when a test
fails). Everything binds 127.0.0.1 and uses a temporary ``FLWR_HOME``. The other runs reuse the
page's SuperLink and SuperNodes. The page's local-simulation block runs in
tests/project/test_deployment_local.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "federation.md"
MARKER = "<!-- deployment-test:"
BIN = Path(sys.executable).parent
RUN_TIMEOUT = 420  # runs took 175-240 s on the 2-core machine under a load average of 25-35
TINY_MODEL = (
    'dataset="mnist5k" model="mlp" width=0.25 depth=2 base-hidden=64 epochs=1 '
    "lambdas=3 diagnostics=false timeout=120.0"
)
TINY = f"{TINY_MODEL} num-clients=2 min-clients=2"
NODE_HEARTBEAT = 10
NODE_POLL = 0.5
"""Seconds a SuperNode waits before it asks the SuperLink again for a message, when it had none
(Flower's is a fixed 3 s, ``time.sleep(3)`` in ``flwr.supernode.start_client_internal``): each
message of a run waited up to 3 s, 1.5 s on average, at every node before its ClientApp started
(a run of the page's average with federated calibration sends three: train and two temperature
queries). Set by :data:`SUPERNODE_SITE`, in the ``flower-supernode`` processes only."""
"""The SuperNodes' heartbeat interval in these tests (Flower's least, ``HEARTBEAT_MIN_INTERVAL``;
its default is 30 s): the SuperLink tells a killed node "Node Unavailable" once two intervals
pass without a heartbeat, 16-20 s after the kill instead of 36-60 s. Set in the
``flower-supernode`` processes only, and there only for the node's heartbeat to the SuperLink
(:data:`SUPERNODE_SITE`)."""
SUPERNODE_SITE = f"""import sys
if sys.argv and sys.argv[0].endswith("flower-supernode"):
    import flwr.supercore.heartbeat
    import flwr.supernode.fleet_http_connection
    flwr.supercore.heartbeat.HEARTBEAT_DEFAULT_INTERVAL = {NODE_HEARTBEAT}
    flwr.supernode.fleet_http_connection.HEARTBEAT_DEFAULT_INTERVAL = {NODE_HEARTBEAT}
    import time
    import flwr.supernode.start_client_internal

    class NodeTime:  # the SuperNode loop's time module, its idle wait shortened

        def __getattr__(self, name):
            return getattr(time, name)

        @staticmethod
        def sleep(seconds):
            time.sleep(min(seconds, {NODE_POLL}))

    flwr.supernode.start_client_internal.time = NodeTime()
"""
"""A ``sitecustomize`` on the deployment's ``PYTHONPATH``: Flower's SuperNode has no flag for its
heartbeat interval or its poll, so the two modules that send the node's heartbeat (its period, and
the interval it tells the SuperLink) are given :data:`NODE_HEARTBEAT`, and the loop that pulls
messages waits :data:`NODE_POLL` s instead of 3 s when there was none. Flower's heartbeat constant
itself is left alone: the SuperNode also times its ClientApps' task tokens by it (a ClientApp must
start within one interval and heartbeat within two), and the ClientApp processes heartbeat at the
default period; a 10 s token there expired under load ("ClientApp stopped responding")."""
SUPEREXEC_POLL = "0.2"
"""Seconds between a SuperExec's polls for a task to launch (Flower's
``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, default 1 s), in the SuperLink's and SuperNodes'
environment: every message a SuperNode answers is a ClientApp process its SuperExec launches, and
every ``flwr run`` a ServerApp process, each up to one poll after the task is there."""
TEST_BOUND = RUN_TIMEOUT + 60
"""Each test's wall bound (pytest-timeout; docs/development.md, "Bounds"): one run's bound plus
the deployment's start; 3 to 7 times a test's quiet duration (64-105 s)."""

pytestmark = [pytest.mark.slow, pytest.mark.timeout(TEST_BOUND)]


@dataclass(frozen=True)
class PageDeployment:
    """The loopback blocks of docs/federation.md, parsed."""

    connection: str  # the toml block
    env: dict[str, str]  # export lines
    background: list[list[str]]  # `&` lines: the SuperLink, then the SuperNodes
    run: list[str]  # the flwr run line


def page_deployment(text: str) -> PageDeployment:
    """The ``toml`` and ``bash`` blocks after the page's marker, each line split as a shell
    would (comments dropped)."""
    after = text[text.index(MARKER) :]
    toml = re.search(r"^```toml\n(.*?)^```", after, flags=re.S | re.M).group(1)
    bash = re.search(r"^```bash\n(.*?)^```", after, flags=re.S | re.M).group(1)
    env, background, run = {}, [], []
    for line in bash.splitlines():
        words = shlex.split(line, comments=True)
        if not words or words[0] == "kill":
            continue
        if words[0] == "export":
            env.update(word.split("=", 1) for word in words[1:])
        elif words[-1] == "&":
            background.append(words[:-1])
        elif words[:2] == ["flwr", "run"]:
            run = words
        else:
            raise AssertionError(f"docs/federation.md: unexpected deployment line {line!r}")
    return PageDeployment(toml, env, background, run)


PORT = re.compile(r"(?<=127\.0\.0\.1:)\d+|(?<=--port )\d+")


def with_free_ports(text: str, ports: dict[str, str]) -> str:
    """``text`` with every port replaced by its free port (one is taken for each new port)."""
    return PORT.sub(lambda m: ports.setdefault(m.group(0), str(free_port())), text)


def with_test_run_config(run: list[str], out: Path) -> list[str]:
    """The page's ``flwr run``: its ``out-dir`` replaced by ``out``, :data:`TINY_MODEL` added."""
    at = run.index("--run-config") + 1
    page_keys = {item.split("=", 1)[0] for item in shlex.split(run[at])}
    assert not page_keys & {item.split("=", 1)[0] for item in shlex.split(TINY_MODEL)}
    config = re.sub(r'out-dir="[^"]*"', f'out-dir="{out}"', run[at])
    return [*run[:at], f"{config} {TINY_MODEL}", *run[at + 1 :]]


APP_COPY_LEAVES = (".venv", ".git", "__pycache__", ".pytest_cache", ".ruff_cache", "results")
"""What :func:`app_copy` leaves out: folders ``.gitignore`` keeps out of the app bundle anyway."""


def app_copy(folder: Path) -> Path:
    """This project copied into ``folder / "app"`` without :data:`APP_COPY_LEAVES`, where the
    tests' ``flwr run .`` runs. Flower's bundle builder (``flwr.cli.utils.collect_files``) walks
    and resolves every file under the app folder before it applies ``.gitignore``: with CI's
    ``.venv`` in the project (76,000 files) each ``flwr run`` spent 4.5 to 8 s on it; the
    bundle is the same (the copy keeps ``.gitignore``, so the same files are left out)."""
    app = folder / "app"
    shutil.copytree(REPO, app, ignore=shutil.ignore_patterns(*APP_COPY_LEAVES), symlinks=True)
    return app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, log: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"process exited with {process.returncode}: {log.read_text()[-2000:]}"
            )
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} ({log.stem}) after {seconds} s")


def stop(process: subprocess.Popen) -> None:
    """Terminate the process group this test started (leader pid = group id)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)
    else:
        try:  # the leader exited; its children may still hold the group
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> Iterator[dict]:
    """The page's SuperLink and three SuperNodes (partitions 0..2 of 3) for runs of
    ``num-clients = 2``: every run also checks that exactly ``num-clients`` nodes train and are
    merged, never all connected ones."""
    yield from start_deployment(tmp_path_factory, page_deployment(PAGE.read_text()))


def start_deployment(tmp_path_factory, page: PageDeployment) -> Iterator[dict]:
    """The page's background commands on free ports; stopped when the caller ends."""
    home = tmp_path_factory.mktemp("flwr-home")
    logs = tmp_path_factory.mktemp("logs")
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(SUPERNODE_SITE)
    path = os.environ.get("PYTHONPATH")
    env = {
        **os.environ,
        **page.env,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": SUPEREXEC_POLL,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(site), *([path] if path else [])]),
    }
    ports: dict[str, str] = {}
    (home / "config.toml").write_text(with_free_ports(page.connection, ports))
    processes: list[subprocess.Popen] = []

    def start(name: str, args: list[str]) -> tuple[subprocess.Popen, Path]:
        log = logs / f"{name}.log"
        handle = log.open("w")
        process = subprocess.Popen(
            args, env=env, cwd=home, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
        processes.append(process)
        return process, log

    try:
        for i, words in enumerate(page.background):
            args = shlex.split(with_free_ports(shlex.join(words), ports))
            process, log = start(f"{i}-{args[0]}", [str(BIN / args[0]), *args[1:]])
            wait_for_port(int(args[args.index("--port") + 1]), process, log)
        app = app_copy(tmp_path_factory.mktemp("project"))
        yield {
            "app": app, "env": env, "logs": logs, "page": page, "ports": ports,
            "processes": processes,
        }  # fmt: skip
    finally:
        for process in reversed(processes):
            stop(process)


def flwr_run(deployment: dict, overrides: str, base: str = TINY) -> subprocess.CompletedProcess:
    return run_flwr(
        deployment,
        [
            str(BIN / "flwr"),
            "run",
            ".",
            "loopback",
            "--run-config",
            f"{base} {overrides}",
            "--stream",
        ],
    )


def run_flwr(deployment: dict, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        args,
        cwd=deployment["app"],
        env=deployment["env"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )


def check_run(run: subprocess.CompletedProcess, out: Path, methods: list[str]) -> pd.DataFrame:
    detail = f"stdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"
    assert run.returncode == 0, detail
    assert (out / "results.csv").exists(), detail
    rows = pd.read_csv(out / "results.csv")
    assert list(rows["method"]) == methods
    assert (rows["clients_survived"] == 2).all()  # 2 of the 3 SuperNodes: num-clients
    assert (rows["num_clients"] == 2).all() and (rows["clients_dropped"] == 0).all()
    idle = "3 nodes connected, training the 2 with the lowest node ids" in run.stdout + run.stderr
    print(f"\ndeployment: the idle SuperNode was logged: {idle}")
    assert rows["accuracy"].between(0, 1).all()
    return rows


def test_the_pages_deployment_blocks_are_parsed_as_written():
    """What the fixture runs: the page's three SuperNodes, each on its own port (one port for
    two fails with [Errno 98]), the SuperLink's port in the connection, runtime dependency
    installation disabled, and the page's run of two clients."""
    page = page_deployment(PAGE.read_text())
    link, *nodes = page.background
    assert link[0] == "flower-superlink" and "--disable-runtime-dependency-installation" in link
    assert [n[0] for n in nodes] == ["flower-supernode"] * 3
    node_ports = [n[n.index("--port") + 1] for n in nodes]
    assert len(set(node_ports)) == 3
    link_port = link[link.index("--port") + 1]
    assert f'address = "127.0.0.1:{link_port}"' in page.connection
    assert all(n[n.index("--superlink") + 1] == f"127.0.0.1:{link_port}" for n in nodes)
    assert page.env == {"FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    assert page.run[:4] == ["flwr", "run", ".", "loopback"] and "--stream" in page.run
    ports: dict[str, str] = {}
    moved = with_free_ports(shlex.join(link + nodes[0]), ports)
    assert set(ports) == {link_port, node_ports[0]} and link_port not in moved.split()


def test_the_pages_run_one_shot_average_with_federated_calibration(deployment, tmp_path):
    """The page's ``flwr run`` line (average, federated calibration), with a tiny model."""
    out = tmp_path / "average"
    args = with_test_run_config(deployment["page"].run, out)
    run = run_flwr(deployment, [str(BIN / args[0]), *args[1:]])
    rows = check_run(run, out, ["average", "average_t"])
    # the ServerApp logs its stages and where the rows went (issue 30)
    log = run.stdout + run.stderr
    assert "fedlmc: [" in log and "client model(s) received" in log
    assert f"fedlmc: rows written to {out / 'results.csv'}" in log
    temperature = rows.loc[rows.method == "average_t", "temperature"].item()
    assert 0 < temperature < 1000 and temperature != 1.0
    assert (out / "merged-average.safetensors").exists()
    # the per-epoch histories crossed the deployment: one row per client and epoch, each with
    # its loss on the client's held-out calibration share
    curves = pd.read_csv(out / "training.csv")
    assert (curves["phase"] == "client_epoch").all()
    steps = curves.groupby("client")["step"].apply(list)  # 2 of the 3 SuperNodes, any two
    assert len(steps) == 2 and set(steps.index) <= {0, 1, 2}
    assert all(s == list(range(1, len(s) + 1)) for s in steps) and steps.map(len).nunique() == 1
    assert curves["calibration_loss"].gt(0).all() and curves["train_loss"].gt(0).all()
    check_the_pages_load_merged_block(out, rows)


def check_the_pages_load_merged_block(out: Path, rows: pd.DataFrame) -> None:
    """The page's "Loading a merged model back" block, run on this run's out dir (the page's
    out-dir path replaced), prints the rows' numbers: the loaded model is the merge."""
    text = PAGE.read_text()
    after = text[text.index("<!-- load-merged-test:") :]
    code = re.search(r"^```python\n(.*?)^```", after, flags=re.S | re.M).group(1)
    page_out = re.search(r'out-dir="([^"]*)"', shlex.join(page_deployment(text).run)).group(1)
    assert f'"{page_out}"' in code  # the block loads what the page's run wrote
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code.replace(f'"{page_out}"', repr(str(out))), {})
    words = printed.getvalue().split()
    assert words[:2] == ["average", "temperature"], printed.getvalue()
    temperature, accuracy, nll = (float(words[i]) for i in (2, 4, 6))
    calibrated = rows[rows.method == "average_t"].iloc[0]
    assert temperature == pytest.approx(calibrated["temperature"], rel=1e-9)
    assert accuracy == pytest.approx(rows[rows.method == "average"]["accuracy"].item(), abs=1e-3)
    assert nll == pytest.approx(calibrated["nll"], abs=1e-3)


def test_client_side_activation_matching_keeps_state_in_the_supernodes(deployment, tmp_path):
    """Each SuperNode keeps its trained model in its context between the train and the align
    round; only permutations come back, and the temperature is fitted on held-out shares."""
    out = tmp_path / "activation_federated"
    run = flwr_run(
        deployment,
        f'strategy="aligned" align="activation_federated" calibration="federated" out-dir="{out}"',
    )
    rows = check_run(run, out, ["activation_federated", "activation_federated_t"])
    assert (rows["rounds"] >= 1 + 1 + 2).all()  # train, align, temperature grid + Newton
    calibrated = rows[rows.method == "activation_federated_t"].iloc[0]
    assert 0 < calibrated["temperature"] < 1000 and calibrated["temperature"] != 1.0
    assert 0 < calibrated["temperature_server_split"] < 1000
    assert (out / "merged-activation_federated.safetensors").exists()


def node_id_of(log: Path) -> int:
    """The node id a SuperNode logs when it connects (``SuperNode ID: N``)."""
    for line in log.read_text().splitlines():
        if "SuperNode ID:" in line:
            return int(line.rsplit(":", 1)[1])
    raise AssertionError(f"no node id in {log}:\n{log.read_text()[-2000:]}")


def replies_sent(log: Path) -> int:
    """How many replies a SuperNode's ``log`` shows sent."""
    return log.read_text().count("Sent successfully")


def wait_for_replies(log: Path, count: int, run: subprocess.Popen, seconds: float) -> None:
    """Until the SuperNode's ``log`` shows its ``count``-th reply sent."""
    deadline = time.monotonic() + seconds
    while replies_sent(log) < count:
        if run.poll() is not None or time.monotonic() > deadline:
            why = f"flwr run exited with {run.returncode}" if run.poll() is not None else "timeout"
            raise AssertionError(
                f"no reply {count} in {log} after {seconds} s ({why}):\n{log.read_text()[-3000:]}"
            )
        time.sleep(0.1)


def test_supernodes_of_different_widths_are_merged_and_a_lost_one_named_once(deployment, tmp_path):
    """All three SuperNodes train, each its partition's width (``client-widths``: 16, 32 and 16
    hidden units); the server checks each reply against its partition's shapes and merges them
    at the widest client's width. Partition 2's SuperNode is killed (``SIGKILL``, its process
    group) as soon as its train reply is sent: the federated calibration's first query then
    gets the SuperLink's "Node Unavailable" for it (once its heartbeats are overdue), which
    is one dropped client, named by its node and the partition its train reply claimed, and
    the round closes on that report. The last test of this module to use the SuperNodes."""
    out = tmp_path / "widths"
    base = f"{TINY_MODEL} num-clients=3 min-clients=2"
    victim = deployment["processes"][1 + 2]  # after the SuperLink: partition 2's SuperNode
    log = deployment["logs"] / "3-flower-supernode.log"
    before = replies_sent(log)
    overrides = (
        'client-widths="0.25,0.5,0.25" strategy="aligned" align="embed_weight_matching" '
        f'calibration="federated" out-dir="{out}"'
    )
    args = [str(BIN / "flwr"), "run", ".", "loopback", "--run-config", f"{base} {overrides}"]
    run = subprocess.Popen(
        [*args, "--stream"], cwd=deployment["app"], env=deployment["env"], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for_replies(log, before + 1, run, RUN_TIMEOUT)
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(timeout=15)
        output, _ = run.communicate(timeout=RUN_TIMEOUT)
    finally:
        if run.poll() is None:  # a failed wait: stop the flwr run we started
            run.kill()
            run.wait(timeout=15)
    assert run.returncode == 0 and (out / "results.csv").exists(), output[-4000:]
    rows = pd.read_csv(out / "results.csv")
    assert list(rows["method"]) == ["embed_weight_matching", "embed_weight_matching_t"]
    assert (rows["clients_survived"] == 3).all()  # all three trained and were merged
    assert (rows["clients_dropped"] == 1).all(), rows["clients_dropped_reasons"].tolist()
    reason = rows["clients_dropped_reasons"].iloc[0]
    assert reason.startswith(f"node {node_id_of(log)} (partition 2): "), reason
    assert "SuperLink error: Error: Node Unavailable" in reason and ";" not in reason, reason
    assert (rows["client_widths"] == "0.25,0.5,0.25").all() and (rows["server_width"] == 0.5).all()
    assert rows["accuracy"].between(0, 1).all()
    merged = load_file(str(out / "merged-embed_weight_matching.safetensors"))
    assert merged["hidden.0.linear.weight"].shape[0] == 32  # base-hidden 64 at width 0.5


def test_pyproject_run_config_lists_every_schema_key_with_its_default():
    import tomllib

    from fedlmc.simulations.config import run_schema, validate_run_config

    flwr = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert flwr["components"] == {
        "serverapp": "fedlmc.simulations.server_app:app",
        "clientapp": "fedlmc.simulations.client_app:app",
    }
    config = flwr["config"]
    assert list(config) == list(run_schema())
    assert validate_run_config(config, check_devices=False) == {
        k: spec.default for k, spec in run_schema().items()
    }
