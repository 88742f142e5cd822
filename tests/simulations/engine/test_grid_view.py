""":class:`fedlmc.simulations.engine.grid_view.CellGrid` over the slot broker and a scripted
in-process Grid (``conftest.py``; no Ray): each cell sees its own nodes and partitions, a reply
reaches only its own cell and is heard as it arrives, and no node is shown before the whole pool
registered."""

from __future__ import annotations

import threading
import time

from fedlmc.simulations.engine.grid_view import PARTITION_RECORD, CellGrid


def test_each_cell_sees_its_nodes_and_partitions_and_only_its_replies(
    task_identity, broker_factory, scripted_grid, shared_messages, metrics_of
):
    grid = scripted_grid([30, 10, 20], delay=lambda _m: 0.05)
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


def test_a_cell_reports_its_client_replies_as_they_arrive(
    task_identity, broker_factory, scripted_grid, shared_messages
):
    """The sweep's progress inside a cell of many clients: each reply is heard once, as it
    arrives, while the cell is still pushing its other messages (one slot: one at a time)."""
    grid = scripted_grid(list(range(1, 7)), delay=lambda _m: 0.02)
    broker = broker_factory(grid, slots=1, pool_size=6)
    heard: list[float] = []
    view = CellGrid(broker, 6, priority=0, on_reply=lambda n: heard.extend([time.time()] * n))
    messages, _content = shared_messages(0, view.get_node_ids())
    replies = view.send_and_receive(messages, timeout=10)
    assert len(replies) == 6 and len(heard) == 6
    assert heard[0] < max(grid.pushed.values())  # heard before the last message went out


def test_nodes_are_shown_once_the_whole_pool_registered(broker_factory, scripted_grid):
    grid = scripted_grid([5], delay=lambda _m: 0.0)
    broker = broker_factory(grid, slots=1, pool_size=2)
    view = CellGrid(broker, 2, priority=0)
    assert view.get_node_ids() == []  # a half-registered pool could map partitions wrongly
    grid.nodes = [7, 5]
    assert view.get_node_ids() == [5, 7]
