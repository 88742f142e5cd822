"""ForwardingGrid: every Grid call goes to the Grid underneath, a message is built as Flower's
own Grids build it, and a subclass overrides only what it changes."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from fedlmc.simulations.records.forwarding_grid import ForwardingGrid


@pytest.fixture(autouse=True)
def _messages_need_a_task_identity(task_identity):
    """Messages need a run id: what Flower sets for a ServerApp."""
    yield


class Recorder:
    """A Grid stand-in that answers each call with its name and arguments."""

    def __init__(self) -> None:
        self.run = "run-7"
        self.calls: list[tuple] = []

    def __getattr__(self, name: str):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return [name]

        return call


class Over(ForwardingGrid):
    def __init__(self, grid) -> None:
        self.grid = grid


def test_every_call_goes_to_the_grid_underneath():
    under = Recorder()
    grid = Over(under)
    assert grid.run == "run-7"
    grid.set_run("run-8")
    assert list(grid.get_node_ids()) == ["get_node_ids"]
    assert list(grid.get_nodes()) == ["get_nodes"]
    assert list(grid.push_messages(["m"])) == ["push_messages"]
    assert list(grid.pull_messages(["1"])) == ["pull_messages"]
    assert list(grid.send_and_receive(["m"], timeout=3.0)) == ["send_and_receive"]
    assert [name for name, _, _ in under.calls] == [
        "set_run",
        "get_node_ids",
        "get_nodes",
        "push_messages",
        "pull_messages",
        "send_and_receive",
    ]
    assert under.calls[-1][2] == {"timeout": 3.0}


def test_a_message_is_built_as_flowers_grids_build_it():
    grid = Over(Recorder())
    content = RecordDict({"c": ConfigRecord({"x": 1})})
    message = grid.create_message(content, "train", 12, "g1", ttl=30.0)
    assert isinstance(message, Message)
    assert message.metadata.dst_node_id == 12
    assert message.metadata.message_type == "train"
    assert message.metadata.group_id == "g1" and message.metadata.ttl == 30.0
    assert grid.grid.calls == []  # built here, not asked of the Grid underneath
