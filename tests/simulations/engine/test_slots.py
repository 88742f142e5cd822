"""The slot broker (:class:`fedlmc.simulations.engine.slots.Broker`) seen through the cells'
Grid views, against a scripted in-process Grid (``conftest.py``; no Ray): a message is pushed
only when a client slot is free, a late reply (after a timeout) keeps its slot busy until it
arrives and is then dropped, and an exclusive cell never shares a node."""

from __future__ import annotations

import threading
import time

from fedlmc.simulations.engine.grid_view import CellGrid


def test_a_late_reply_keeps_its_slot_until_it_arrives_and_is_then_dropped(
    task_identity, broker_factory, scripted_grid, shared_messages, metrics_of
):
    """One client slot. Cell 0's message answers after 2 s but the cell waits 0.2 s: it gets
    no reply. Cell 1's message is pushed only once that late reply has freed the slot, its
    clock (``created_at``) starts then, and it receives its own reply, never cell 0's."""
    grid = scripted_grid([1, 2], delay=lambda m: 2.0 if m.metadata.dst_node_id == 1 else 0.05)
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


def node_intervals(grid, cells: dict[str, int]) -> list[tuple[int, int, float, float]]:
    """(node, cell, pushed, answered) of every message, from the grid's records."""
    return [(cells[m][0], cells[m][1], grid.pushed[m], grid.answered[m]) for m in grid.answered]


def test_exclusive_cells_never_share_a_node_with_another_message(
    task_identity, broker_factory, scripted_grid, shared_messages
):
    """Cells whose clients keep state in the node's context send exclusive messages: with 4
    slots and 2 nodes, two ordinary cells overlap on each node, but no message overlaps an
    exclusive one on its node, and every cell still gets all its replies."""
    where: dict[str, tuple[int, int]] = {}
    grid = scripted_grid([1, 2], delay=lambda _m: 0.15)
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
