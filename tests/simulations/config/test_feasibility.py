"""Whether a cell fits this machine (:mod:`fedlmc.simulations.config.feasibility`): the memory
estimate :math:`4 P (N + 6)` bytes, and a refusal naming the width key when it exceeds the
machine's memory."""

from __future__ import annotations

import pytest

from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.config.feasibility import (
    MEMORY_FACTOR_CLIENT,
    check_memory,
    machine_memory,
    memory_check_note,
    memory_estimate,
    model_parameters,
    width_key,
)
from fedlmc.simulations.config.schema import ConfigError


def config(**values) -> dict:
    return validate_run_config(values, check_devices=False)


def test_the_estimate_is_four_bytes_per_weight_per_copy():
    assert memory_estimate({"num-clients": 2}, 1000) == 4 * 1000 * (2 + 2 + MEMORY_FACTOR_CLIENT)
    assert memory_estimate({"num-clients": 5}, 10) - memory_estimate({"num-clients": 4}, 10) == 40


def test_the_parameter_count_grows_with_the_width():
    narrow, wide = model_parameters(config(width=0.5)), model_parameters(config(width=2.0))
    assert 0 < narrow < wide


def test_a_small_cell_fits_and_a_huge_one_is_refused_naming_its_width():
    small = config()
    check_memory(small)
    assert memory_check_note(small) is None
    huge = config(width=1000.0)
    assert memory_estimate(huge, model_parameters(huge)) > machine_memory()
    with pytest.raises(ConfigError) as error:
        check_memory(huge)
    message = str(error.value)
    assert message.startswith("width = 1000: the mlp at width 1000 has about ")
    assert "\n" not in message and message.endswith("allowed: a smaller width or fewer clients")


def test_the_width_key_is_the_one_that_sets_the_server_width():
    assert width_key(config()) == "width"
    assert width_key(config(**{"client-widths": "1,2"})) == "client-widths"
    assert width_key(config(**{"server-width": 2.0})) == "server-width"


def test_a_hub_data_set_skips_the_check_with_a_note():
    hub = {**config(), "dataset": "hf:someone/data"}
    assert model_parameters(hub) is None
    check_memory(hub)  # nothing to check
    assert "memory check skipped" in memory_check_note(
        hub
    ) and "'hf:someone/data'" in memory_check_note(hub)
