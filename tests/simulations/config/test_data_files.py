"""A torchvision data set without its files is refused at validation (issue 54 item 3)."""

from __future__ import annotations

import pytest

from fedlmc.simulations.config import ConfigError, validate_run_config
from fedlmc.simulations.config.data_files import needs_files


def test_only_torchvision_data_sets_need_files():
    assert needs_files("cifar10") and needs_files("mnist") and needs_files("fashion_mnist")
    assert not needs_files("mnist5k") and not needs_files("hf:some/data")


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100", "mnist", "fashion_mnist"])
def test_a_data_set_read_from_files_without_data_root_is_refused(dataset):
    for check_devices in (True, False):  # not a machine check: refused for any machine
        with pytest.raises(ConfigError) as refused:
            validate_run_config({"dataset": dataset}, check_devices=check_devices)
        message = str(refused.value)
        assert "\n" not in message and f"dataset = '{dataset}'" in message
        for way in ("data-root=DIR", "download=true", f"fedlmc data fetch {dataset} --root DIR"):
            assert way in message, message


def test_a_data_root_without_the_data_sets_folder_is_refused_on_this_machine(tmp_path):
    config = {"dataset": "cifar10", "data-root": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"data-root = .*: no .cifar-10-batches-py. folder"):
        validate_run_config(config)
    assert validate_run_config(config, check_devices=False)["data-root"] == str(tmp_path)
    (tmp_path / "cifar-10-batches-py").mkdir()
    assert validate_run_config(config)["dataset"] == "cifar10"
    empty = tmp_path / "empty"
    fetched = validate_run_config({"dataset": "mnist", "data-root": str(empty), "download": True})
    assert fetched["download"] is True  # fetched into data-root first: allowed here
