"""A client actor that dies (:mod:`fedlmc.simulations.engine.actor_pool`), through Flower's
simulation engine on a real local Ray: the test-only ``inject-failure = "exit:1"`` ends the
process of the actor that trains partition 1 (``os._exit``, as the kernel's OOM killer would).
That cell loses the client; the next cell, on the same simulation, gets both clients, on the
surviving actor and on the one that took the dead actor's place. Before the fix, Flower put
the dead actor back in its pool, first in line, and every later cell lost a client."""

from __future__ import annotations

import pytest

from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.engine.cells import EngineStats, run_cells
from fedlmc.simulations.engine.sweep_server import CellJob, CellResult
from fedlmc.strategies import NotEnoughClientsError
from tests.simulations.engine.test_cells import TINY

CELL = {**TINY, "methods": "average,ensemble"}  # test_cells' tiny cell, two methods


@pytest.mark.slow
def test_after_a_client_actor_died_the_next_cells_have_every_client():
    jobs = [
        CellJob("dies", validate_run_config({**CELL, "inject-failure": "exit:1"})),
        CellJob("after", validate_run_config({**CELL, "seed": 1})),
        CellJob("again", validate_run_config({**CELL, "seed": 2})),
    ]
    results: dict[str, CellResult] = {}
    stats = EngineStats()
    run_cells(jobs, lambda r: results.__setitem__(r.key, r), max_in_flight=1, stats=stats)

    assert stats.simulations == 1 and stats.slots == 2
    assert isinstance(results["dies"].error, NotEnoughClientsError)
    assert "partition 1" in str(results["dies"].error)
    for key in ("after", "again"):
        assert results[key].error is None, results[key].error
        table = results[key].outcome.table()
        assert (table["clients_survived"] == 2).all()
        assert [u.partition_id for u in results[key].outcome.reports["compare"].survivors] == [0, 1]
