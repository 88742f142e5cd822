"""report.md, the short report: one row per distinct quantity, widths with their hidden units,
constants stated once, the rows to read with care counted, every table behind a link."""

from __future__ import annotations

import pandas as pd

from fedlmc.simulations.report.summary import (
    FULL_REPORT,
    merged_rows,
    summary_markdown,
    table_or_constant,
    width_units,
)

SETTINGS = {"dpi": 60, "error-bars": "std", "title": ""}


def hand_built_rows() -> pd.DataFrame:
    rows = []
    for width in (0.25, 4.0):
        for seed in (0, 1, 2):
            cid = f"c{width}{seed}"
            plain = 0.5 + 0.1 * width + 0.01 * seed
            for method, accuracy, temperature in (
                ("average", plain, 1.0),
                ("average_t", plain, 0.001 if width == 4.0 else 0.2),
                ("weight_matching", 0.9 + 0.001 * seed, 1.0),
                ("ensemble", 0.95, 1.0),
            ):
                rows.append(
                    {
                        "cell_id": cid,
                        "status": "ok",
                        "method": method,
                        "width": width,
                        "seed": seed,
                        "model": "mlp",
                        "base-hidden": 128,
                        "accuracy": accuracy,
                        "temperature": temperature,
                        "temperature_at_bound": "lower" if temperature == 0.001 else "",
                        "at_chance": 0.0,
                        "bytes_sent_by_clients": 1000.0 * width,
                        "rounds": 1,
                        "lewc_temperature_ratio": 0.125,
                    }
                )
    return pd.DataFrame(rows)


def test_identical_rows_are_shown_once_and_constants_as_a_sentence():
    table = pd.DataFrame(
        {1: ["0.5", "0.5", "0.9"], 4: ["0.6", "0.6", "0.9"]},
        index=pd.Index(["average", "average_t", "weight_matching"], name="method"),
    )
    merged, joined = merged_rows(table)
    assert list(merged.index) == ["average = average_t", "weight_matching"]
    assert joined == ["average = average_t"]
    constant = pd.DataFrame({1: ["0.1250 ± 0.0000"] * 3, 4: ["0.1250 ± 0.0000"] * 3})
    assert table_or_constant("LEWC's T ratio", constant, "method") == [
        "**LEWC's T ratio**: 0.1250 ± 0.0000 in every cell.",
        "",
    ]
    assert table_or_constant("accuracy", table, "method")[0] == "## accuracy"


def test_widths_are_headed_with_their_hidden_units():
    rows = hand_built_rows()
    assert width_units(rows) == {0.25: "0.25x (32 units)", 4.0: "4x (512 units)"}
    assert width_units(rows.assign(model="vgg11")) == {0.25: "0.25x", 4.0: "4x"}


def test_the_short_report_reads_top_to_bottom(tmp_path):
    rows = hand_built_rows()
    text = summary_markdown(rows, {"name": "tiny"}, [], tmp_path, SETTINGS)
    assert text.startswith("# tiny\n")
    assert f"[{FULL_REPORT}]({FULL_REPORT})" in text
    assert "Widths are multiples of 128 hidden units per layer" in text
    accuracy = text.split("## Merged test accuracy")[1].split("##")[0]
    assert "| method | 0.25x (32 units) | 4x (512 units) |" in accuracy
    assert "| average = average_t | 0.5350 ± 0.0100 | 0.9100 ± 0.0100 |" in accuracy
    assert accuracy.count("| average") == 1  # one row for the two
    sent = text.split("## Communication")[1].split("##")[0]
    assert "| every method | 0.2 kB / 1 | 4.0 kB / 1 |" in sent
    assert "**Note**: average_t has a temperature at the fit's lower bound 0.001 in 3 of 6" in text
    assert "lewc_temperature_ratio" not in text and "0.1250" not in text  # full report only


def test_the_main_accuracy_table_has_the_endpoints_the_gap_and_marks_a_gap_inside_the_spread(
    tmp_path,
):
    # endpoints 0.9 + 0.005 seed + 0.0025 width (std 0.005 over seeds 0, 1, 2), the average
    # 0.5 + 0.1 width + 0.01 seed (std 0.01), weight matching 0.9 + 0.001 seed (std 0.001)
    rows = hand_built_rows()
    rows["endpoint_acc_mean"] = 0.9 + 0.005 * rows["seed"] + 0.0025 * rows["width"]
    text = summary_markdown(rows, {"name": "tiny"}, [], tmp_path, SETTINGS)
    accuracy = text.split("## Merged test accuracy")[1].split("##")[0]
    assert "| endpoints (clients' mean) | 0.9056 ± 0.0050 | 0.9150 ± 0.0050 |" in accuracy
    # gap = endpoints - merge, mean over seeds: the average's 0.0050 at 4x is inside
    # max(0.01, 0.005), its 0.3706 at 0.25x is not; weight matching's 0.0046 at 0.25x is inside
    # max(0.001, 0.005), its 0.0140 at 4x is not
    assert (
        "| average = average_t | 0.5350 ± 0.0100; gap +0.3706 | 0.9100 ± 0.0100; gap +0.0050† |"
        in accuracy
    )
    assert (
        "| weight_matching | 0.9010 ± 0.0010; gap +0.0046† | 0.9010 ± 0.0010; gap +0.0140 |"
        in accuracy
    )
    assert "gap to the endpoints' mean (endpoints − merge" in accuracy
    assert "†: the gap is inside the seed spread" in accuracy
    # one seed: the spread is undefined, no gap is marked and the note says so
    single = summary_markdown(rows[rows["seed"] == 0], {}, [], tmp_path, SETTINGS)
    accuracy = single.split("## Merged test accuracy")[1].split("##")[0]
    assert "| weight_matching | 0.9000 (n=1); gap +0.0006 | 0.9000 (n=1); gap +0.0100 |" in accuracy
    assert "†" not in accuracy.split("\n\n")[1]  # the table
    assert "With one seed the spread is undefined and no gap is marked" in accuracy
    # without the endpoints' column: the accuracies alone
    plain = summary_markdown(rows.drop(columns="endpoint_acc_mean"), {}, [], tmp_path, SETTINGS)
    assert "gap" not in plain.split("## Merged test accuracy")[1].split("##")[0]
