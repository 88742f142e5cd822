"""The robust rules and the client check in the run config
(:mod:`fedlmc.simulations.config.defences`): a Krum cell with too few clients is refused in one
line before any work, the keys reach the merge methods, ``client-check = "auto"`` resolves by
the partition, and the keys only where they apply are part of a cell's identity."""

from __future__ import annotations

import pytest

from fedlmc.simulations.config import ConfigError, validate_run_config
from fedlmc.simulations.config.cell_identity import cell_id
from fedlmc.simulations.config.defences import client_check, robust_method_options
from fedlmc.simulations.config.run_plan import plan_run

ALIGNED = {"strategy": "aligned", "dataset": "mnist5k"}


def validated(**values):
    return validate_run_config({**ALIGNED, **values}, check_devices=False)


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"align": "krum"}, r"'krum' with 2 clients: allowed: at least 3 clients \(2 x krum_"),
        (
            {"align": "krum", "num-clients": 5, "min-clients": 4, "krum-byzantine": 1},
            r"'krum' with as few as 4 clients: allowed: at least 5 .*krum_byzantine = 1\)",
        ),
        (  # a round of one client is its own merge, but min-clients = 1 lets two merge
            {"align": "krum", "num-clients": 3, "min-clients": 1},
            r"'krum' with as few as 2 clients: allowed: at least 3 clients",
        ),
        (
            {"align": "multi_krum", "num-clients": 4, "min-clients": 4, "krum-select": 5},
            r"'multi_krum' with 4 clients: allowed: at least 5 clients \(krum_select \+ krum_",
        ),
        ({"align": "trimmed_mean", "trim-fraction": 0.5}, r"allowed: a number in \[0, 0.5\)"),
        ({"client-check": "always"}, "allowed: auto, server-split, copies, off"),
    ],
)
def test_a_bad_robust_setting_is_one_line_before_any_work(values, words):
    with pytest.raises(ConfigError, match=words) as caught:
        validated(**values)
    assert "\n" not in str(caught.value)


def test_krum_at_enough_clients_for_its_options_is_accepted():
    five = {"num-clients": 5, "min-clients": 5, "krum-byzantine": 1}
    assert validated(align="krum", **five)["krum-byzantine"] == 1
    assert validated(align="multi_krum", **five, **{"krum-select": 4})["krum-select"] == 4
    with pytest.raises(ConfigError, match="'multi_krum' with 5 clients: allowed: at least 6"):
        validated(align="multi_krum", **five, **{"krum-select": 5})


def test_the_compare_strategy_is_checked_as_the_aligned_one():
    with pytest.raises(ConfigError, match="merge method 'multi_krum'"):
        validate_run_config(
            {"strategy": "compare", "methods": "average,multi_krum_t"}, check_devices=False
        )


def test_the_keys_reach_the_merge_methods():
    config = validated(
        align="multi_krum",
        **{"num-clients": 5, "min-clients": 5, "krum-byzantine": 1, "krum-select": 3},
    )
    assert robust_method_options(config) == {
        "trim_fraction": 0.2,
        "krum_byzantine": 1,
        "krum_select": 3,
    }
    assert plan_run(config).method_options["krum_select"] == 3


def test_auto_checks_accuracy_only_where_clients_data_are_alike():
    assert client_check(validated()) == "server-split"  # iid by default
    assert client_check(validated(partition="dirichlet")) == "copies"
    assert client_check(validated(partition="dirichlet", **{"client-check": "off"})) == "off"


def test_a_krum_option_is_part_of_a_cell_only_where_krum_runs():
    five = {"num-clients": 5, "min-clients": 5}
    krum = {**ALIGNED, "align": "krum", **five}
    assert cell_id({**krum, "krum-byzantine": 1}) != cell_id(krum)
    average = {**ALIGNED, "align": "weight_matching", **five}
    assert cell_id({**average, "krum-byzantine": 1}) == cell_id(average)
    assert cell_id({**average, "client-check": "off"}) == cell_id(average)  # a runtime key
