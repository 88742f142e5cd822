"""A real Flower deployment on loopback: one SuperLink, three SuperNodes for runs of two clients
(the lowest node ids train; the third stays idle), ``flwr run . <connection>``.

Everything binds 127.0.0.1 on free ports, uses a temporary ``FLWR_HOME`` and no runtime
dependency installation; the processes are stopped by their process-group id in a fixture
finaliser, also when a test fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
RUN_TIMEOUT = 240
TINY = (
    'dataset="mnist5k" model="mlp" width=0.25 depth=2 base-hidden=64 epochs=1 '
    "num-clients=2 min-clients=2 lambdas=3 diagnostics=false timeout=120.0"
)


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
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {seconds} s")


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
    """Three SuperNodes (partitions 0..2 of 3) for runs of ``num-clients = 2``: every run also
    checks that exactly ``num-clients`` nodes train and are merged, never all connected ones."""
    yield from start_deployment(tmp_path_factory, supernodes=3)


def start_deployment(tmp_path_factory, supernodes: int) -> Iterator[dict]:
    """One SuperLink and ``supernodes`` SuperNodes on loopback; stopped when the caller ends."""
    home = tmp_path_factory.mktemp("flwr-home")
    logs = tmp_path_factory.mktemp("logs")
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLWR_HOME": str(home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "OMP_NUM_THREADS": "1",
    }
    link_port = free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
        f'address = "127.0.0.1:{link_port}"\ninsecure = true\n'
    )
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
        link, link_log = start(
            "superlink",
            [
                str(BIN / "flower-superlink"),
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(link_port),
                "--disable-runtime-dependency-installation",
            ],
        )
        wait_for_port(link_port, link, link_log)
        for pid in range(supernodes):
            node_port = free_port()
            node, node_log = start(
                f"supernode-{pid}",
                [
                    str(BIN / "flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{link_port}",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(node_port),
                    "--node-config",
                    f"partition-id={pid} num-partitions={supernodes}",
                ],
            )
            wait_for_port(node_port, node, node_log)
        yield {"env": env, "logs": logs}
    finally:
        for process in reversed(processes):
            stop(process)


def flwr_run(deployment: dict, overrides: str, base: str = TINY) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            str(BIN / "flwr"),
            "run",
            ".",
            "loopback",
            "--run-config",
            f"{base} {overrides}",
            "--stream",
        ],
        cwd=REPO,
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


def test_one_shot_average_with_federated_calibration(deployment, tmp_path):
    out = tmp_path / "average"
    run = flwr_run(deployment, f'strategy="average" calibration="federated" out-dir="{out}"')
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


def test_permutation_aligned_average(deployment, tmp_path):
    out = tmp_path / "aligned"
    run = flwr_run(
        deployment,
        f'strategy="aligned" align="weight_matching" calibration="server" out-dir="{out}"',
    )
    check_run(run, out, ["weight_matching", "weight_matching_t"])
    assert (out / "merged-weight_matching.safetensors").exists()


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


def test_supernodes_of_different_widths_are_merged_at_the_server_width(deployment, tmp_path):
    """All three SuperNodes train, each its partition's width (``client-widths``: 16, 32 and 16
    hidden units); the server checks each reply against its partition's shapes and merges them
    at the widest client's width."""
    out = tmp_path / "widths"
    base = TINY.replace("num-clients=2 min-clients=2", "num-clients=3 min-clients=3")
    run = flwr_run(
        deployment,
        'client-widths="0.25,0.5,0.25" strategy="aligned" align="embed_weight_matching" '
        f'calibration="server" out-dir="{out}"',
        base=base,
    )
    detail = f"stdout:\n{run.stdout[-3000:]}\nstderr:\n{run.stderr[-3000:]}"
    assert run.returncode == 0 and (out / "results.csv").exists(), detail
    rows = pd.read_csv(out / "results.csv")
    assert list(rows["method"]) == ["embed_weight_matching", "embed_weight_matching_t"]
    assert (rows["clients_survived"] == 3).all() and (rows["clients_dropped"] == 0).all()
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
