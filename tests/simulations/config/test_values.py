"""The allowed values of the run config (:mod:`fedlmc.simulations.config.values`): width lists,
near names, the method lists the checks read, and each check's refusal naming what is allowed."""

from __future__ import annotations

import pytest

from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.config.schema import ConfigError
from fedlmc.simulations.config.values import (
    FEDAVG,
    MAX_LAMBDAS,
    STRATEGIES,
    Mode,
    aligning_methods,
    cell_methods,
    dataset_names,
    nearest_names,
    option_key,
    parse_widths,
    server_split_share,
)


def test_parse_widths_reads_a_comma_separated_list_and_names_a_bad_item():
    assert parse_widths("0.5, 1,2") == (0.5, 1.0, 2.0)
    assert parse_widths("  ") == ()
    for bad, item in (("1,zero", "'zero'"), ("1,-2", "'-2'"), ("nan", "'nan'"), ("1,,2", "''")):
        with pytest.raises(ValueError, match=f"^width {item} is not a number > 0$"):
            parse_widths(bad)


def test_nearest_names_lists_up_to_n_close_choices():
    assert nearest_names("averge", ["average", "average_t", "ensemble"]) == (
        " (did you mean 'average', 'average_t'?)"
    )
    assert nearest_names("averge", ["average", "average_t"], n=1) == " (did you mean 'average'?)"
    assert nearest_names("qqq", ["average"]) == ""


def test_the_method_lists():
    cells, aligning = cell_methods(), aligning_methods()
    assert cells[-1] == FEDAVG and "average" in cells and "average_t" in cells
    assert "average" not in aligning and "weight_matching" in aligning
    assert dataset_names()[-1] == "hf:NAME"


def test_server_split_share_is_open_on_both_ends():
    assert server_split_share(0.5) is None
    assert "allowed: a number in (0, 1)" in server_split_share(0.0)
    assert server_split_share(1.0) == server_split_share(0.0)


def test_option_key_is_the_kebab_case_name():
    assert option_key("base_hidden") == "base-hidden"


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("methods", "average,averge", "unknown method 'averge' (did you mean 'average'"),
        ("align", "average", "unknown aligning method 'average'"),
        ("client-widths", "1,0", "width '0' is not a number > 0"),
        ("lambdas", 4, f"allowed: an integer 3 .. {MAX_LAMBDAS} (odd"),
        ("lambdas", MAX_LAMBDAS + 2, f"allowed: an integer 3 .. {MAX_LAMBDAS} (odd"),
        ("inject-failure", "explode:0", "allowed: none, or MODE:PARTITION-ID"),
        ("dataset", "cifar1000", "allowed: "),
        ("model", "resnet9000", "or a model factory"),
        ("out-dir", "a\x07b", "holds a control character"),
    ],
)
def test_a_value_outside_the_allowed_ones_is_refused_in_one_line(key, value, named):
    with pytest.raises(ConfigError) as error:
        validate_run_config({key: value}, check_devices=False)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{key} = ") and named in message


def test_the_strategies_are_the_modes_and_a_bad_one_is_refused_naming_them():
    assert STRATEGIES == tuple(Mode) == ("compare", "average", "aligned", "fedavg")
    config = validate_run_config({"strategy": "aligned"}, check_devices=False)
    assert Mode(config["strategy"]) is Mode.ALIGNED
    with pytest.raises(ConfigError) as error:
        validate_run_config({"strategy": "align"}, check_devices=False)
    assert "'align'" in str(error.value) and ", ".join(STRATEGIES) in str(error.value)
    assert "\n" not in str(error.value)
