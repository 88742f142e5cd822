"""The line saying which clients a run merged (:mod:`fedlmc.simulations.records.clients_line`),
as ``fedlmc run`` prints it last under its table (with the ``clients_survived`` column)."""

from __future__ import annotations

import pandas as pd

from fedlmc.simulations.records.run_table import show_rows

RUN = {"secure-aggregation": "off", "strategy": "average", "methods": "", "num-clients": 3}


def test_the_table_and_its_last_line_say_the_clients_merged_and_each_one_dropped(capsys):
    failed = "node 7 (partition 1): client error: injected failure on partition 1"
    rows = pd.DataFrame(
        {
            "method": ["average", "ensemble"],
            "accuracy": [0.8, 0.85],
            "clients_survived": [2, 2],
            "clients_failed": [failed, failed],
            "clients_dropped": [0, 0],
            "clients_dropped_reasons": [float("nan")] * 2,
        }
    )
    show_rows(rows, RUN, None)
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["method", "accuracy", "clients_survived"]
    assert out[1].split()[-1] == "2"
    assert out[-1] == f"clients: 2 of 3 merged; dropped: {failed}"
    screened = rows.assign(
        clients_survived=[3, 2],
        clients_failed=["", ""],
        clients_dropped_reasons=["", "node 9 (partition 2): weights out of range"],
    )
    show_rows(screened, RUN, None)
    assert capsys.readouterr().out.splitlines()[-1] == (
        "clients: 2 to 3 (per row: clients_survived) of 3 merged; dropped: node 9 "
        "(partition 2): weights out of range"
    )
    show_rows(rows.assign(clients_survived=3, clients_failed=""), RUN, None)
    assert capsys.readouterr().out.splitlines()[-1] == "clients: 3 of 3 merged; none dropped"
