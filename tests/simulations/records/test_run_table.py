"""What ``fedlmc run`` prints under its rows: why a column is left out, what ran, warnings."""

from __future__ import annotations

import pandas as pd

from fedlmc.simulations.records.run_table import show_rows, shown_columns


def test_columns_left_out_say_why_and_a_secure_run_says_the_server_saw_only_the_sum():
    rows = pd.DataFrame(
        {"method": ["average", "average_t"], "accuracy": [0.9, 0.9], "ensemble_acc": [None] * 2}
    )
    shown, lines = shown_columns(rows, {"secure-aggregation": "off"})
    assert shown == ["method", "accuracy"]
    assert lines == [
        "not shown: ensemble_acc (no value in any row; applies to: every row (the same value "
        "on every row of a cell))"
    ]
    _, lines = shown_columns(rows, {"secure-aggregation": "off", "dp": "server-fixed"})
    assert lines == [
        "not shown: ensemble_acc (a DP run evaluates only the released noisy merge, not the "
        "clients' models)"
    ]
    _, lines = shown_columns(rows, {"secure-aggregation": "secagg+"})
    assert lines == [
        "not shown: ensemble_acc (under SecAgg+ the server never sees a client's model, only "
        "their sum)"
    ]


def test_a_secure_run_and_rows_a_reader_should_not_take_at_face_value_are_said(capsys):
    rows = pd.DataFrame(
        {
            "method": ["average", "average_t"],
            "accuracy": [0.082, 0.082],
            "temperature": [1.0, 1000.0],
            "temperature_at_bound": ["", "upper"],
            "at_chance": [1.0, 1.0],
            "rounds": [4, 4],
            "bytes_sent_by_clients": [473_680, 473_680],
        }
    )
    config = {"secure-aggregation": "secagg+", "strategy": "average", "methods": ""}
    show_rows(rows, config, None)
    out = capsys.readouterr().out.splitlines()
    assert (
        "SecAgg+ (secagg+): the server saw only the sum of the client models; 4 message "
        "rounds, 0.47 MB sent by the clients"
    ) in out
    warnings = [line for line in out if line.startswith("warning: ")]
    assert warnings == [
        "warning: average: accuracy 0.082 is no better than guessing (within two standard "
        "errors of 1 / the number of classes)",
        "warning: average_t: the temperature is the fit's upper bound 1000: its logits carry no "
        "usable information about the labels (near-uniform predictions fit best)",
        "warning: average_t: accuracy 0.082 is no better than guessing (within two standard "
        "errors of 1 / the number of classes)",
    ]
