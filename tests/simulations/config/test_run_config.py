"""A run config is validated once, where it enters: :func:`validate_run_config` returns a
read-only :class:`RunConfig` and takes one back as it is when it was checked enough."""

from __future__ import annotations

import pytest

from fedlmc.simulations.config import ConfigError, RunConfig, absolute_paths, validate_run_config
from fedlmc.simulations.task import client_run_config

FEDAVG_ROUND = {"strategy": "fedavg", "fedavg-rounds": 5, "epochs": 2}
"""A client's one-round config: valid alone, refused as a whole run (5 rounds of 2 epochs)."""


def test_validation_returns_a_read_only_run_config_with_defaults():
    config = validate_run_config({"width": 2.0}, check_devices=False)
    assert isinstance(config, RunConfig)
    assert config["width"] == 2.0 and config["num-clients"] == 2  # a default filled in
    with pytest.raises(TypeError):
        config["width"] = 4.0  # type: ignore[index]
    assert dict(config) == dict(validate_run_config({"width": 2.0}, check_devices=False))


def test_a_validated_config_is_taken_as_it_is():
    config = validate_run_config({"width": 2.0}, check_devices=False)
    assert validate_run_config(config, check_devices=False) is config
    assert validate_run_config(config, check_devices=False, whole_run=False) is config


def test_a_config_checked_for_one_round_is_checked_again_for_the_whole_run():
    one_round = validate_run_config(FEDAVG_ROUND, check_devices=False, whole_run=False)
    assert not one_round.covers(check_devices=False, whole_run=True)
    with pytest.raises(ConfigError, match="fedavg-rounds = 5"):
        validate_run_config(one_round, check_devices=False)


def test_absolute_paths_keep_a_validated_config_validated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    config = validate_run_config({"data-root": "data"}, check_devices=False)
    moved = absolute_paths(config)
    assert isinstance(moved, RunConfig) and moved["data-root"] == str(tmp_path / "data")
    assert validate_run_config(moved, check_devices=False) is moved
    assert absolute_paths({"data-root": "data"}) == {"data-root": str(tmp_path / "data")}
    with pytest.raises(KeyError, match="'width' is not a path key"):
        config.with_paths({"width": "2"})


def test_a_client_validates_each_distinct_config_once():
    first = client_run_config({"width": 2.0}, {"epochs": 3})
    assert client_run_config({"width": 2.0}, {"epochs": 3}) is first  # cached, shared read-only
    other = client_run_config({"width": 2.0}, {"epochs": 4})
    assert other is not first and other["epochs"] == 4 and first["epochs"] == 3
    with pytest.raises(ConfigError, match="epochs"):
        client_run_config({}, {"epochs": -1})
