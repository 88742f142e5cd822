"""The merge-gap-by-initialisation figures (issue 29) on constructed rows: each row's setting,
the two gaps, where the IID cells sit, when the figures are drawn."""

from __future__ import annotations

import math

import pandas as pd

from fedlmc.simulations.report.data import init_setting, setting_order
from fedlmc.simulations.report.figure_table import FIGURE_TABLE, FigureInputs
from fedlmc.simulations.report.init_figures import (
    gap_rows,
    has_init_panels,
    line_groups,
    line_keys,
    panel_lines,
    panel_width,
    what_was_run,
    x_positions,
)

SETTINGS = {"dpi": 40, "error-bars": "std", "title": ""}


def drawn(rows: pd.DataFrame, folder) -> set[str]:
    """The files the registered figures write from ``rows``, of the init figures and
    ``accuracy_vs_clients`` only (the others are tested elsewhere)."""
    inputs = FigureInputs.of(rows, SETTINGS)
    names = ("merge_gap_by_init_vs_clients", "merge_gap_by_init_vs_alpha", "accuracy_vs_clients")
    figures = [FIGURE_TABLE.get(n) for n in names]
    paths = [f.draw(inputs, folder / f.file) for f in figures if f.drawn_when(inputs)]
    return {p.name for p in paths if p is not None and p.stat().st_size > 0}


def client_rows() -> pd.DataFrame:
    """Two settings x two client counts x two widths x two methods; accuracy, endpoints and
    ensemble chosen so that each gap is a known number."""
    rows = []
    for init, base in (("shared", 0.9), ("independent", 0.2)):
        for n in (2, 4):
            for width in (0.5, 4.0):
                for method, drop in (("average_t", 0.0), ("merge_many_t", 0.1)):
                    accuracy = base - drop - 0.01 * n
                    rows.append(
                        {
                            "cell_id": f"{init}-{n}-{width}",
                            "method": method,
                            "init": init,
                            "warmup-rounds": 0,
                            "num-clients": n,
                            "width": width,
                            "seed": 0,
                            "dataset": "mnist5k",
                            "model": "mlp",
                            "partition": "iid",
                            "epochs": 12,
                            "bias": False,
                            "accuracy": accuracy,
                            "endpoint_acc_mean": 0.85,
                            "merge_gap_accuracy": 0.85 - accuracy,
                            "ensemble_acc": 0.95,
                        }
                    )
    return pd.DataFrame(rows)


def test_settings_are_labelled_and_ordered_shared_warm_up_independent():
    rows = pd.DataFrame({"init": ["independent", "shared", "shared", "shared"]})
    rows["warmup-rounds"] = [0, 0, 2, 1]
    labels = init_setting(rows)
    assert list(labels) == [
        "independent",
        "shared",
        "shared + 2 warm-up rounds",
        "shared + 1 warm-up round",
    ]
    assert setting_order(labels) == [
        "shared",
        "shared + 1 warm-up round",
        "shared + 2 warm-up rounds",
        "independent",
    ]
    assert list(init_setting(pd.DataFrame({"width": [1.0]}))) == ["independent"]  # the default


def test_the_two_gaps_are_endpoints_minus_merged_and_ensemble_minus_merged():
    data = gap_rows(client_rows())
    row = data[(data["init"] == "independent") & (data["method"] == "merge_many_t")].iloc[0]
    assert math.isclose(row["merge_gap_accuracy"], 0.85 - row["accuracy"])
    assert math.isclose(row["_gap_to_ensemble"], 0.95 - row["accuracy"])
    assert row["_gap_to_ensemble"] > row["merge_gap_accuracy"] > 0  # merge worse than both


def test_iid_cells_sit_right_of_the_largest_alpha_and_other_partitions_are_left_out():
    data = pd.DataFrame(
        {
            "partition": ["dirichlet", "dirichlet", "iid", "pathological"],
            "alpha": [0.1, 100, 0.5, 1],
        }
    )
    assert list(x_positions(data, "alpha"))[:3] == [0.1, 100.0, 1000.0]
    assert math.isnan(x_positions(data, "alpha").iloc[3])


def test_figures_are_drawn_only_when_the_initialisation_and_the_axis_vary(tmp_path):
    rows = client_rows()
    assert has_init_panels(rows, "num-clients")
    assert not has_init_panels(rows, "alpha")  # no alpha column
    assert not has_init_panels(rows[rows["init"] == "shared"], "num-clients")
    assert not has_init_panels(rows[rows["num-clients"] == 2], "num-clients")
    assert what_was_run(rows, "num-clients") == "mnist5k, mlp, IID, 12 local epochs, bias-free"
    names = drawn(rows, tmp_path)
    assert names == {"merge_gap_by_init_vs_clients.png", "accuracy_vs_clients.png"}
    assert [f.name for f in FIGURE_TABLE].index("merge_gap_by_init_vs_clients") > [
        f.name for f in FIGURE_TABLE
    ].index("accuracy_vs_clients")


def test_the_skew_figure_is_drawn_from_dirichlet_and_iid_cells(tmp_path):
    rows = []
    for partition, alpha in (("dirichlet", 0.1), ("dirichlet", 10.0), ("iid", 0.5)):
        frame = client_rows()
        frame = frame[frame["num-clients"] == 4].assign(partition=partition, alpha=alpha)
        frame["cell_id"] = frame["cell_id"] + f"-{partition}-{alpha}"
        rows.append(frame)
    rows = pd.concat(rows, ignore_index=True)
    assert has_init_panels(rows, "alpha")
    assert what_was_run(rows, "alpha") == "mnist5k, mlp, 4 clients, 12 local epochs, bias-free"
    assert drawn(rows, tmp_path) == {"merge_gap_by_init_vs_alpha.png"}


def test_keys_vary_only_where_they_apply_and_methods_never_split_rows():
    from fedlmc.simulations.config import validate_run_config
    from fedlmc.simulations.records.row_groups import split_labels, varying_keys

    shared = validate_run_config(
        {"init": "shared", "methods": "average,fedavg", "fedavg-rounds": 4}, check_devices=False
    )
    independent = validate_run_config({"methods": "average"}, check_devices=False)
    rows = pd.DataFrame(
        [
            {**config, "method": method, "client-widths": float("nan")}  # "" read back as NaN
            for config in (shared, independent)
            for method in ("average", "fedavg")
            if method in config["methods"]
        ]
    )
    assert list(rows["fedavg-rounds"]) == [4, 4, 5]  # the default where FedAvg does not run
    assert varying_keys(rows) == ["init"]
    assert list(split_labels(rows, [])) == ["init=shared"] * 2 + ["init=independent"]
    rows["width"] = [1.0, 1.0, 2.0]  # width applies: client-widths is empty (NaN in the file)
    assert varying_keys(rows) == ["width", "init"]


def skew_by_clients_rows(widths=(4.0,)) -> pd.DataFrame:
    """The label-skew study over N: both settings, N = 2 and 8, IID and Dirichlet alpha 0.1, the
    given widths; the plain average's gap to the endpoints is a known number per cell (0.01 N,
    + 0.3 under Dirichlet 0.1, + 0.2 if independent, + 0.001 x width), to the ensemble that
    plus 0.05."""
    rows = []
    for frame_width in widths:
        for init in ("shared", "independent"):
            for n in (2, 8):
                for partition, alpha, skew in (("dirichlet", 0.1, 0.3), ("iid", 0.1, 0.0)):
                    gap = 0.01 * n + skew + (0.2 if init == "independent" else 0.0)
                    gap += 0.001 * frame_width
                    rows.append(
                        {
                            "cell_id": f"{init}-{n}-{partition}-{frame_width}",
                            "method": "average_t",
                            "init": init,
                            "warmup-rounds": 0,
                            "num-clients": n,
                            "width": frame_width,
                            "base-hidden": 128,
                            "partition": partition,
                            "alpha": alpha,
                            "seed": 0,
                            "accuracy": 0.9 - gap,
                            "endpoint_acc_mean": 0.9,
                            "merge_gap_accuracy": gap,
                            "ensemble_acc": 0.95,
                        }
                    )
    return pd.DataFrame(rows)


def test_the_skew_figure_draws_one_line_per_number_of_clients(tmp_path):
    data = gap_rows(skew_by_clients_rows())
    data["_x"] = x_positions(data, "alpha")
    assert line_keys(data, "alpha") == ["num-clients"]
    assert line_keys(data, "num-clients") == ["width"]  # N on the axis: lines per width
    assert line_groups(data, ["num-clients"]) == [(2.0,), (8.0,)]
    panel = data[data["init"] == "independent"]
    lines = panel_lines(panel, data, ["num-clients"], (8.0,))
    assert [line.label for line in lines] == [
        "N = 8: endpoints' mean - merged",
        "N = 8: ensemble - merged",
    ]
    to_endpoints, to_ensemble = (line.means for line in lines)
    assert list(to_endpoints.index) == [0.1, 1.0]  # Dirichlet 0.1, then IID at 10 x 0.1
    assert [round(v, 9) for v in to_endpoints] == [0.584, 0.284]  # 0.08 + skew + 0.2 + 0.004
    assert [round(v, 9) for v in to_ensemble] == [0.634, 0.334]
    assert what_was_run(data, "alpha") == "width 4 (512 units)"  # N varies: not in the title
    assert panel_width(data, data, ["num-clients"]) == "\nwidth 4 (512 units)"
    assert panel_width(data, data, ["width", "num-clients"]) == ""  # the lines name it
    assert drawn(skew_by_clients_rows(), tmp_path) == {  # N varies: the clients figures too
        "merge_gap_by_init_vs_alpha.png",
        "merge_gap_by_init_vs_clients.png",
        "accuracy_vs_clients.png",
    }


def test_where_width_and_clients_both_vary_there_is_one_line_per_pair():
    data = gap_rows(skew_by_clients_rows(widths=(0.5, 4.0)))
    data["_x"] = x_positions(data, "alpha")
    keys = line_keys(data, "alpha")
    assert keys == ["width", "num-clients"]
    assert line_groups(data, keys) == [(0.5, 2.0), (0.5, 8.0), (4.0, 2.0), (4.0, 8.0)]
    panel = data[data["init"] == "shared"]
    lines = panel_lines(panel, data, keys, (0.5, 2.0))
    assert lines[0].label == "width 0.5 (64 units), N = 2: endpoints' mean - merged"
    assert [round(v, 9) for v in lines[0].means] == [0.3205, 0.0205]
