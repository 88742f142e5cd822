"""Whether an out dir may receive a sweep (:mod:`fedlmc.simulations.runs.same_sweep`): an
unreadable ``config.json`` is said to be unreadable, with the way to recover, which works."""

from __future__ import annotations

import json

import pytest

from fedlmc.simulations.config import ConfigError, expand_grid, load_sweep_config
from fedlmc.simulations.runs.out_dir import prepare_out_dir, sweep_record


def record(tmp_path, seeds: list[int]) -> dict:
    path = tmp_path / f"sweep-{len(seeds)}.toml"
    path.write_text(
        f'name = "tiny"\n[run]\nepochs = 1\nmethods = "average"\n[grid]\nseed = {seeds}\n'
    )
    sweep = load_sweep_config(path, check_devices=False)
    return sweep_record(sweep, expand_grid(sweep))


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"cells": [{"id": 1}]}', '{"cells": 3}'])
def test_an_unreadable_config_json_is_named_with_the_way_to_recover(tmp_path, text):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text(text)
    first = record(tmp_path, [0, 1])
    with pytest.raises(ConfigError) as error:
        prepare_out_dir(out, first, force=False)
    message = str(error.value)
    assert message.startswith(f"out dir {str(out)!r}: config.json is unreadable (")
    assert "different sweep" not in message and message.endswith("or another --out")
    assert (out / "config.json").read_text() == text  # refused before anything is written
    prepare_out_dir(out, first, force=True)  # the recovery the message names
    assert (out / "config.previous.json").read_text() == text
    assert json.loads((out / "config.json").read_text())["cells"] == first["cells"]
