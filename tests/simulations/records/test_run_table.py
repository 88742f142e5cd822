"""What ``fedlmc run`` prints under its rows: why a column is left out, what ran, warnings."""

from __future__ import annotations

import pandas as pd

from fedlmc.simulations.records.run_table import show_rows, shown_columns
from fedlmc.study.method_policy import EVALUATIONS, register_evaluation


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


def test_a_barrier_left_out_names_the_merge_methods_it_applies_to_from_the_registry():
    """Two clients give NaN barriers to median and regmean_t (no path reaches their merge):
    the note says where the column applies as the registry knows it, not "every merge method";
    a method registered later with ``on_path = False`` joins the methods it names."""
    from fedlmc.merging.merge_job import Alignment
    from fedlmc.merging.method_registry import METHODS, register_method

    rows = pd.DataFrame(
        {"method": ["median", "regmean_t"], "accuracy": [0.9, 0.9], "loss_barrier_half": [None] * 2}
    )
    _, (line,) = shown_columns(rows, {"secure-aggregation": "off"})
    cells, _, methods = line.partition("; merge methods whose merge lies on the path")
    assert cells == (
        "not shown: loss_barrier_half (no value in any row; applies to: two-client cells, "
        "diagnostics on"
    )
    left_out = methods.partition("every merge method but ")[2].partition(" (nor")[0].split(", ")
    assert {"median", "regmean", "random_direction", "preserve_first"} <= set(left_out)
    assert not {"average", "weight_matching", "merge_many", "ot_fusion"} & set(left_out)
    assert "every merge method)" not in line and "nor their `_t` rows" in line

    @register_method("s53_off_path", description="a control off the path")
    def off_path(job) -> Alignment:
        return Alignment(list(job.states))

    register_evaluation("s53_off_path", on_path=False)
    try:
        _, (line,) = shown_columns(rows, {"secure-aggregation": "off"})
        assert "s53_off_path" in line.partition("every merge method but ")[2]
    finally:
        METHODS.remove("s53_off_path")
        EVALUATIONS.remove("s53_off_path")
