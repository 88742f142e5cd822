"""The sweep engine (:mod:`fedlmc.simulations.engine.cells`): many cells in one Flower simulation.

- The Grid view and the slot broker against a scripted in-process Grid (no Ray, fast): each cell
  sees its own nodes and partitions, a message is pushed only when a client slot is free, a
  reply reaches only its own cell, a late reply (after a timeout) keeps its slot busy until it
  arrives and is then dropped.
- Through Flower's simulation engine (Ray): three cells in one simulation, one of them with a
  client that hangs past the timeout: only that cell fails, and a cell run beside it (after
  another cell on the same warm actors) gives exactly the numbers it gives alone.
- A real Ray cluster: a head started on 127.0.0.1 with its own temp dir; ``fedlmc sweep`` and
  ``fedlmc run`` join it through ``--ray-address``; the test stops only the processes it
  started (the head's process group).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pandas as pd
import pytest

from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.engine.cells import EngineStats, run_cells
from fedlmc.simulations.engine.grid_view import PARTITION_RECORD, CellGrid
from fedlmc.simulations.engine.slots import Broker
from fedlmc.simulations.engine.sweep_server import CellJob, CellResult
from fedlmc.simulations.records.results_file import read_results
from fedlmc.simulations.runs.federation import run_federation_outcome
from fedlmc.strategies import NotEnoughClientsError

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent

# ----------------------------------------------------------------------------- scripted Grid


class ScriptedGrid:
    """An in-process Grid: each pushed message is answered after ``delay(message)`` seconds by
    a reply echoing the destination node and the message's config; it records when each
    message was pushed and answered and how many were outstanding at once."""

    def __init__(self, nodes: list[int], delay) -> None:
        self.nodes = list(nodes)
        self.delay = delay
        self.lock = threading.Lock()
        self.replies: dict[str, object] = {}
        self.pushed: dict[str, float] = {}
        self.answered: dict[str, float] = {}
        self.outstanding = 0
        self.most_outstanding = 0

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def push_messages(self, messages: Iterable) -> list[str]:
        ids = []
        for message in messages:
            mid = uuid.uuid4().hex
            message.metadata.__dict__["_message_id"] = mid
            with self.lock:
                self.pushed[mid] = time.time()
                self.outstanding += 1
                self.most_outstanding = max(self.most_outstanding, self.outstanding)
            threading.Timer(self.delay(message), self._answer, args=(message,)).start()
            ids.append(mid)
        return ids

    def _answer(self, message) -> None:
        from flwr.app import Message, MetricRecord, RecordDict

        values = {}
        for record in message.content.config_records.values():
            values.update(record)
        metrics = MetricRecord(
            {
                "node": int(message.metadata.dst_node_id),
                "partition-id": int(values.get("partition-id", -1)),
                "num-partitions": int(values.get("num-partitions", -1)),
                "cell": int(values["cell"]),
                "created-at": float(message.metadata.created_at),
            }
        )
        reply = Message(RecordDict({"metrics": metrics}), reply_to=message)
        with self.lock:
            mid = message.metadata.message_id
            self.replies[mid] = reply
            self.answered[mid] = time.time()
            self.outstanding -= 1

    def pull_messages(self, message_ids: Iterable[str]) -> list:
        with self.lock:
            return [self.replies.pop(m) for m in list(message_ids) if m in self.replies]


def shared_messages(cell: int, nodes: list[int]) -> tuple[list, object]:
    """One message per node, all sharing one RecordDict (as Flower's strategies do)."""
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

    content = RecordDict({"arrays": ArrayRecord(), "config": ConfigRecord({"cell": cell})})
    return [Message(content, dst_node_id=n, message_type="train") for n in nodes], content


def metrics_of(replies) -> list[dict]:
    return sorted(
        (dict(next(iter(r.content.metric_records.values()))) for r in replies),
        key=lambda m: m["partition-id"],
    )


@pytest.fixture
def broker_factory() -> Iterator:
    made: list[Broker] = []

    def make(grid, slots: int, pool_size: int) -> Broker:
        broker = Broker(grid, slots, pool_size, threading.Event()).start()
        made.append(broker)
        return broker

    yield make
    for broker in made:
        broker.close()


def test_each_cell_sees_its_nodes_and_partitions_and_only_its_replies(
    task_identity, broker_factory
):
    grid = ScriptedGrid([30, 10, 20], delay=lambda _m: 0.05)
    broker = broker_factory(grid, slots=2, pool_size=3)
    narrow, wide = CellGrid(broker, 2, priority=0), CellGrid(broker, 3, priority=1)
    assert narrow.get_node_ids() == [10, 20] and wide.get_node_ids() == [10, 20, 30]

    results: dict[int, list] = {}

    def cell(view: CellGrid, number: int) -> None:
        messages, content = shared_messages(number, view.get_node_ids())
        results[number] = view.send_and_receive(messages, timeout=10)
        assert PARTITION_RECORD not in content  # the strategies' RecordDict is left alone

    threads = [threading.Thread(target=cell, args=(v, n)) for v, n in ((narrow, 0), (wide, 1))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)

    got = {n: metrics_of(replies) for n, replies in results.items()}
    assert [(m["node"], m["partition-id"], m["num-partitions"]) for m in got[0]] == [
        (10, 0, 2),
        (20, 1, 2),
    ]
    assert [(m["node"], m["partition-id"], m["num-partitions"]) for m in got[1]] == [
        (10, 0, 3),
        (20, 1, 3),
        (30, 2, 3),
    ]
    assert all(m["cell"] == n for n, ms in got.items() for m in ms)  # no stolen replies
    assert grid.most_outstanding == 2  # never more messages out than client slots


def test_a_cell_reports_its_client_replies_as_they_arrive(task_identity, broker_factory):
    """The sweep's progress inside a cell of many clients: each reply is heard once, as it
    arrives, while the cell is still pushing its other messages (one slot: one at a time)."""
    grid = ScriptedGrid(list(range(1, 7)), delay=lambda _m: 0.02)
    broker = broker_factory(grid, slots=1, pool_size=6)
    heard: list[float] = []
    view = CellGrid(broker, 6, priority=0, on_reply=lambda n: heard.extend([time.time()] * n))
    messages, _content = shared_messages(0, view.get_node_ids())
    replies = view.send_and_receive(messages, timeout=10)
    assert len(replies) == 6 and len(heard) == 6
    assert heard[0] < max(grid.pushed.values())  # heard before the last message went out


def test_nodes_are_shown_once_the_whole_pool_registered(broker_factory):
    grid = ScriptedGrid([5], delay=lambda _m: 0.0)
    broker = broker_factory(grid, slots=1, pool_size=2)
    view = CellGrid(broker, 2, priority=0)
    assert view.get_node_ids() == []  # a half-registered pool could map partitions wrongly
    grid.nodes = [7, 5]
    assert view.get_node_ids() == [5, 7]


def test_a_late_reply_keeps_its_slot_until_it_arrives_and_is_then_dropped(
    task_identity, broker_factory
):
    """One client slot. Cell 0's message answers after 2 s but the cell waits 0.2 s: it gets
    no reply. Cell 1's message is pushed only once that late reply has freed the slot, its
    clock (``created_at``) starts then, and it receives its own reply, never cell 0's."""
    grid = ScriptedGrid([1, 2], delay=lambda m: 2.0 if m.metadata.dst_node_id == 1 else 0.05)
    broker = broker_factory(grid, slots=1, pool_size=2)
    first, second = CellGrid(broker, 2, priority=0), CellGrid(broker, 2, priority=1)

    slow, _ = shared_messages(0, [1])
    start = time.time()
    assert first.send_and_receive(slow, timeout=0.2) == []
    assert not grid.answered  # it stopped waiting at its timeout, before the reply came

    fast, _ = shared_messages(1, [2])
    replies = second.send_and_receive(fast, timeout=10)
    (late_id,) = [m for m in grid.answered if grid.pushed[m] < start + 0.1]
    (fast_id,) = [m for m in grid.pushed if m != late_id]
    assert grid.pushed[fast_id] >= grid.answered[late_id]  # the slot was busy until then
    (metrics,) = metrics_of(replies)
    assert metrics["cell"] == 1 and metrics["node"] == 2
    assert metrics["created-at"] >= grid.answered[late_id]  # the timeout counts from the push
    time.sleep(3 * 0.02)
    assert broker.take([late_id]) == [] and grid.replies == {}  # pulled and dropped
    assert grid.most_outstanding == 1


def node_intervals(
    grid: ScriptedGrid, cells: dict[str, int]
) -> list[tuple[int, int, float, float]]:
    """(node, cell, pushed, answered) of every message, from the grid's records."""
    return [(cells[m][0], cells[m][1], grid.pushed[m], grid.answered[m]) for m in grid.answered]


def test_exclusive_cells_never_share_a_node_with_another_message(task_identity, broker_factory):
    """Cells whose clients keep state in the node's context send exclusive messages: with 4
    slots and 2 nodes, two ordinary cells overlap on each node, but no message overlaps an
    exclusive one on its node, and every cell still gets all its replies."""
    where: dict[str, tuple[int, int]] = {}
    grid = ScriptedGrid([1, 2], delay=lambda _m: 0.15)
    original_push = grid.push_messages

    def recording_push(messages):
        messages = list(messages)
        ids = original_push(messages)
        for mid, message in zip(ids, messages, strict=True):
            cell = int(next(iter(message.content.config_records.values()))["cell"])
            where[mid] = (int(message.metadata.dst_node_id), cell)
        return ids

    grid.push_messages = recording_push
    broker = broker_factory(grid, slots=4, pool_size=2)
    exclusive = {0: False, 1: False, 2: True, 3: True}
    views = {n: CellGrid(broker, 2, priority=n, exclusive=exclusive[n]) for n in exclusive}
    results: dict[int, list] = {}

    def cell(number: int) -> None:
        for _ in range(2):  # two rounds, as train + align
            messages, _ = shared_messages(number, views[number].get_node_ids())
            results.setdefault(number, []).extend(
                views[number].send_and_receive(messages, timeout=20)
            )

    threads = [threading.Thread(target=cell, args=(n,)) for n in exclusive]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert {n: len(r) for n, r in results.items()} == {0: 4, 1: 4, 2: 4, 3: 4}
    spans = node_intervals(grid, where)
    overlapping = [
        (a, b)
        for a in spans
        for b in spans
        if a is not b and a[0] == b[0] and a[2] < b[3] and b[2] < a[3]
    ]
    assert overlapping  # ordinary cells do share nodes (4 slots, 2 nodes)
    assert all(not exclusive[a[1]] and not exclusive[b[1]] for a, b in overlapping)


# ----------------------------------------------------------------------------- Flower + Ray

TINY = {
    "dataset": "mnist5k",
    "model": "mlp",
    "width": 0.125,
    "depth": 2,
    "base-hidden": 64,
    "epochs": 1,
    "batch-size": 128,
    "lambdas": 3,
    "diagnostics": False,
    "methods": "average,average_t,weight_matching,ensemble",
    "timeout": 120.0,
}
HANG_TIMEOUT = 10.0
VOLATILE = ("seconds", "bytes")


def stable(frame: pd.DataFrame) -> pd.DataFrame:
    columns = [c for c in frame.columns if not any(v in c for v in VOLATILE)]
    return frame[columns].reset_index(drop=True)


@pytest.mark.slow
def test_cells_in_one_simulation_fail_alone_and_give_their_own_numbers(tmp_path):
    """Three cells in one simulation (2 client slots, 2 cells in flight): ``first`` runs, then
    ``hung`` (a client sleeps past its 10 s timeout, min-clients 2) and ``probe`` run beside
    each other on the actors ``first`` used. Only ``hung`` fails; ``probe`` gives exactly the
    rows it gives alone, in a simulation of its own."""
    first = validate_run_config({**TINY, "width": 0.25, "seed": 1})
    hung = validate_run_config(
        {**TINY, "strategy": "average", "inject-failure": "hang:1", "timeout": HANG_TIMEOUT}
    )
    probe = validate_run_config({**TINY, "out-dir": str(tmp_path / "probe")})
    jobs = [CellJob("first", first), CellJob("hung", hung), CellJob("probe", probe)]
    results: dict[str, CellResult] = {}
    stats = EngineStats()
    run_cells(jobs, lambda r: results.__setitem__(r.key, r), stats=stats)

    assert stats.simulations == 1 and stats.slots == 2 and stats.max_in_flight == 2
    assert set(results) == {"first", "hung", "probe"}
    assert isinstance(results["hung"].error, NotEnoughClientsError)
    assert "no reply before the timeout" in str(results["hung"].error)
    assert results["first"].error is None and results["probe"].error is None
    together = results["probe"].outcome.table()
    assert list(together["method"]) == ["average", "average_t", "weight_matching", "ensemble"]
    assert (together["clients_survived"] == 2).all()
    assert (tmp_path / "probe" / "results.csv").exists()

    alone = run_federation_outcome({**probe, "out-dir": ""}).table()
    pd.testing.assert_frame_equal(stable(together), stable(alone), check_exact=True)
    survivors = results["probe"].outcome.reports["compare"].survivors
    assert [u.partition_id for u in survivors] == [0, 1]


# ----------------------------------------------------------------------------- a Ray cluster

TWO_CELLS = """
name = "cluster"
[run]
epochs = 1
width = 0.125
depth = 2
base-hidden = 64
lambdas = 3
diagnostics = false
methods = "average,average_t,ensemble"
[grid]
seed = [0, 1]
"""


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM (then SIGKILL) the process group this test started; nothing else."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=20)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def ray_head() -> Iterator[dict]:
    """A Ray head on 127.0.0.1 with free ports, 2 CPUs and its own temp dir, in its own
    process group (``ray start --block``); stopped by that group id afterwards."""
    temp = Path(tempfile.mkdtemp(prefix="fedlmc-ray-"))  # short: Ray's socket paths are limited
    gcs, client, agent_listen, agent_grpc, metrics, node, objects, env_agent, dash = free_ports(9)
    log = open(temp / "head.log", "w")  # noqa: SIM115 - closed in the finaliser
    command = [
        str(BIN / "ray"),
        "start",
        "--head",
        "--block",
        "--node-ip-address=127.0.0.1",
        f"--port={gcs}",
        f"--ray-client-server-port={client}",
        f"--dashboard-agent-listen-port={agent_listen}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--metrics-export-port={metrics}",
        f"--node-manager-port={node}",
        f"--object-manager-port={objects}",
        f"--runtime-env-agent-port={env_agent}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dash}",
        "--include-dashboard=false",
        "--num-cpus=2",
        "--num-gpus=0",
        f"--temp-dir={temp}",
        "--disable-usage-stats",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 90
        while "Ray runtime started" not in (temp / "head.log").read_text():
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start failed: {(temp / 'head.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield {"address": f"127.0.0.1:{gcs}", "temp": temp, "env": env}
    finally:
        stop_group(head)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def fedlmc(*args: str, env: dict, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedlmc.simulations.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def actor_logs(temp: Path) -> list[Path]:
    """Worker logs of ClientApp actors in the cluster's temp dir."""
    return [
        path
        for path in temp.glob("session_2*/logs/worker-*.out")  # not the session_latest link
        if "ClientAppActor" in path.read_text(errors="replace")
    ]


@pytest.mark.slow
def test_a_sweep_and_a_run_join_an_existing_ray_cluster(tmp_path, ray_head):
    config = tmp_path / "cluster.toml"
    config.write_text(TWO_CELLS)
    out = tmp_path / "out"
    assert actor_logs(ray_head["temp"]) == []
    done = fedlmc(
        "sweep",
        str(config),
        "--out",
        str(out),
        "--ray-address",
        ray_head["address"],
        "--quiet",
        "--no-report",
        env=ray_head["env"],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_results(out)
    assert len(rows) == 2 * 3 and (rows["status"] == "ok").all()
    assert sorted(rows["seed"].unique()) == [0, 1]
    assert rows.groupby("cell_id")["method"].apply(list).map(tuple).unique().tolist() == [
        ("average", "average_t", "ensemble")
    ]
    assert rows["accuracy"].between(0, 1).all()
    assert len(actor_logs(ray_head["temp"])) == 2  # the clients ran on the cluster's node

    csv = tmp_path / "run.csv"
    done = fedlmc(
        "run",
        "epochs=1",
        "width=0.125",
        "depth=2",
        "base-hidden=64",
        "diagnostics=false",
        "methods=average,ensemble",
        "--ray-address",
        ray_head["address"],
        "--csv",
        str(csv),
        env=ray_head["env"],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert list(pd.read_csv(csv)["method"]) == ["average", "ensemble"]
    assert len(actor_logs(ray_head["temp"])) == 4
