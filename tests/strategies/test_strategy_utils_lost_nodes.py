"""A node lost mid-round, on Flower's real SuperLink state: Flower's in-memory ``LinkState`` and
``InMemoryGrid`` (what ``flower-superlink`` and the simulation run on), three "SuperNodes" as
threads that heartbeat, pull their messages from the state and store their replies, one of
which stops (no heartbeat, no reply) at a given message, the way a killed SuperNode does. The
SuperLink then answers that node's message itself, "Node Unavailable" from its own node id, once
the node's heartbeats are overdue (here 2 x 0.5 s). The strategies must name exactly one failure
for it, by its node and (where known) its partition, and close the round on Flower's report,
long before the round's ``timeout``. tests/project/test_deployment.py kills a real SuperNode."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable

import pytest
import torch
from flwr.app import Message, MetricRecord, RecordDict
from flwr.common.constant import NOOP_ACCOUNT_NAME, NOOP_FLWR_AID
from flwr.proto.task_pb2 import Task  # pylint: disable=E0611
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID

from fedlmc.models.classifiers import build_model
from fedlmc.strategies import FedAvgBaseline, OneShotAverage, StrategyOptions
from fedlmc.strategies.protocol import state_to_record
from fedlmc.strategies.queries import ClientRounds

HEARTBEAT = 0.5  # seconds: the SuperLink reports a silent node after 2 x this
TIMEOUT = 60.0  # the round's timeout, never reached
RUN_ID = 7  # the run id of the shared task_identity fixture


@pytest.fixture(autouse=True)
def _messages_need_a_task_identity(task_identity):
    yield


def in_memory_grid(assigned: bool = False) -> type:
    """Flower's ``InMemoryGrid``; ``assigned``: plus what fedlmc's sweep engine adds, the
    partition of each node. Imported here, not at collection (Flower's link state: 0.8 s of
    each pytest worker)."""
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    class AssignedGrid(InMemoryGrid):
        def assigned_partitions(self) -> dict[int, int]:
            return {node: index for index, node in enumerate(sorted(self.get_node_ids()))}

    return AssignedGrid if assigned else InMemoryGrid


class Federation:
    """Flower's in-memory SuperLink state with three nodes run by threads (module docstring);
    ``answer(partition, message)`` is each live node's reply content; the node of partition
    ``dies[0]`` stops at its ``dies[1]``-th message (1-based)."""

    def __init__(self, answer, dies: tuple[int, int], assigned: bool = False) -> None:
        from flwr.server.superlink.linkstate import LinkStateFactory
        from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
        from flwr.supercore.object_store import ObjectStoreFactory
        from flwr.supercore.run import Run
        from flwr.superlink.federation import NoOpFederationManager

        factory = LinkStateFactory(
            FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()
        )
        self.state = factory.state()
        run = Run.create_empty(run_id=RUN_ID)
        run.primary_task_id, run.federation_id = 1, NOOP_FEDERATION_ID
        self.state.run_ids[RUN_ID] = RunRecord(run=run)
        self.state.task_store[1] = Task(task_id=1, run_id=RUN_ID)
        self.grid = in_memory_grid(assigned)(state_factory=factory)
        self.grid.set_run(run)
        self.nodes = sorted(self._register() for _ in range(3))
        self.dead = self.nodes[dies[0]]
        self.answer, self.dies_at = answer, dies[1]
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._serve, args=(n, p), daemon=True)
            for p, n in enumerate(self.nodes)
        ]

    def _register(self) -> int:
        node = self.state.create_node(
            NOOP_FLWR_AID, NOOP_ACCOUNT_NAME, secrets.token_bytes(32), heartbeat_interval=HEARTBEAT
        )
        self.state.acknowledge_node_heartbeat(node_id=node, heartbeat_interval=HEARTBEAT)
        return node

    def _serve(self, node: int, partition: int) -> None:
        received = 0
        while not self.stop.is_set():
            self.state.acknowledge_node_heartbeat(node_id=node, heartbeat_interval=HEARTBEAT)
            for message in self.state.get_message_ins(node_id=node, limit=None):
                received += 1
                if node == self.dead and received >= self.dies_at:
                    return  # killed: no heartbeat, no reply from here on
                reply = Message(self.answer(partition, message), reply_to=message)
                reply.metadata.__dict__["_message_id"] = reply.object_id
                self.state.store_message_res(reply)
            time.sleep(0.02)

    def __enter__(self) -> Federation:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=5)


def tiny():
    torch.manual_seed(0)
    return build_model("mlp", width=1.0, in_shape=(1, 4, 4), depth=2, base_hidden=8)


def trained(template) -> Callable[[int, Message], RecordDict]:
    """Each partition "trains" to the constant ``partition + 1`` (10 examples)."""

    def answer(partition: int, message: Message) -> RecordDict:
        state = {
            k: torch.full_like(v, partition + 1.0) if v.is_floating_point() else v
            for k, v in template.state_dict().items()
        }
        metrics = MetricRecord({"num-examples": 10, "partition-id": partition})
        return RecordDict({"arrays": state_to_record(state), "metrics": metrics})

    return answer


def one_shot(federation: Federation, template):
    strategy = OneShotAverage(
        template, StrategyOptions(num_clients=3, min_clients=2, calibration="none")
    )
    start = time.monotonic()
    result = strategy.start(
        grid=federation.grid,
        initial_arrays=state_to_record(template.state_dict()),
        num_rounds=1,
        timeout=TIMEOUT,
    )
    return result, time.monotonic() - start


def merged_value(arrays) -> float:
    return float(arrays.to_torch_state_dict()["classifier.weight"].mean())


def test_a_node_lost_in_a_simulation_is_one_failure_named_by_its_assigned_partition():
    template = tiny()
    with Federation(trained(template), dies=(1, 1), assigned=True) as federation:
        result, seconds = one_shot(federation, template)
    (failure,) = result.report.failures
    assert failure.node_id == federation.dead and failure.partition_id == 1 and failure.lost
    assert failure.reason.startswith("SuperLink error: Error: Node Unavailable")
    assert result.report.dropped_nodes == [federation.dead]
    assert result.report.survivor_ids == [0, 2]
    assert merged_value(result.arrays) == pytest.approx((1.0 + 3.0) / 2)
    assert seconds < TIMEOUT / 4  # closed on the SuperLink's report, not at the timeout


def test_a_node_lost_in_a_deployment_is_one_failure_named_by_its_node():
    """Without an assignment (a deployment) the server has never heard the lost node's
    partition: one failure, its node id, "partition not known" (not a second, invented one)."""
    template = tiny()
    with Federation(trained(template), dies=(0, 1)) as federation:
        result, seconds = one_shot(federation, template)
    (failure,) = result.report.failures
    assert failure.node_id == federation.dead and failure.partition_id is None
    assert failure.describe().startswith(f"node {federation.dead} (partition not known): ")
    assert "Node Unavailable" in failure.reason and "timeout" not in failure.reason
    assert result.report.survivor_ids == [1, 2] and seconds < TIMEOUT / 4


def test_fedavg_names_a_node_lost_in_round_two_by_the_partition_it_sent_in_round_one():
    """A deployment's FedAvg: the node answers round 1 (claiming partition 2) and is lost in
    round 2; round 2's failure carries partition 2, and round 3 trains the two live nodes
    without waiting for the lost one."""
    template = tiny()
    with Federation(trained(template), dies=(2, 2)) as federation:
        strategy = FedAvgBaseline(
            StrategyOptions(num_clients=3, min_clients=2), total_epochs=3, num_rounds=3
        )
        start = time.monotonic()
        result = strategy.start(
            grid=federation.grid,
            initial_arrays=state_to_record(template.state_dict()),
            num_rounds=3,
            timeout=TIMEOUT,
        )
        seconds = time.monotonic() - start
    assert result.reports[1].failures == []
    (failure,) = result.reports[2].failures
    assert failure.node_id == federation.dead and failure.partition_id == 2
    assert failure.describe().startswith(f"node {federation.dead} (partition 2): SuperLink error")
    assert result.reports[3].failures == [] and result.reports[3].survivor_ids == [0, 1]
    assert seconds < TIMEOUT / 4


def test_a_node_lost_in_a_query_round_is_one_failure_named_by_its_partition():
    """After training (the node's partition is known from its train reply) the node is lost
    before its query answer: one failure, at the query's stage, named by node and partition."""
    template = tiny()

    def answer(partition: int, message: Message) -> RecordDict:
        return RecordDict({"metrics": MetricRecord({"count": partition + 1})})

    with Federation(answer, dies=(1, 1)) as federation:
        result_of_training = [
            _update(node, partition) for partition, node in enumerate(federation.nodes)
        ]
        rounds = ClientRounds(
            federation.grid,
            result_of_training,
            {},
            template=template,
            device="cpu",
            timeout=TIMEOUT,
            min_clients=2,
        )
        start = time.monotonic()
        answers = rounds.ask("temperature", state_to_record(template.state_dict()))
        seconds = time.monotonic() - start
    assert [u.partition_id for u, _ in answers] == [0, 2]
    (failure,) = rounds.dropped
    assert failure.node_id == federation.dead and failure.partition_id == 1
    assert failure.stage == "temperature" and "Node Unavailable" in failure.reason
    assert seconds < TIMEOUT / 4


def _update(node: int, partition: int):
    from fedlmc.strategies.strategy_utils import ClientUpdate

    return ClientUpdate(partition, node, {}, 10, {}, 0)
