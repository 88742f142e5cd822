"""Provenance (:mod:`fedlmc.simulations.records.provenance`): the versions and the device that
produced a result, as a sweep's ``config.json`` and every results row record them."""

from __future__ import annotations

import importlib.metadata
import os
import sys

import torch

import fedlmc
from fedlmc.simulations.records.provenance import (
    device_description,
    package_version,
    version_columns,
    versions,
)


def test_package_versions_are_the_installed_ones():
    assert package_version("flwr") == importlib.metadata.version("flwr")
    assert package_version("no-such-distribution-fedlmc") == "not installed"


def test_the_cpu_is_described_with_its_core_count():
    text = device_description("cpu")
    assert text.startswith("cpu: ") and text.endswith(f"({os.cpu_count()} cores)")
    if not torch.cuda.is_available():
        assert device_description() == text  # the default device of a machine without a GPU


def test_versions_and_version_columns_name_the_same_code():
    found = versions()
    assert set(found) == {"fedlmc", "flwr", "torch", "python", "platform", "device"}
    assert found["fedlmc"] == fedlmc.__version__ and found["torch"] == torch.__version__
    assert found["python"] == sys.version.split()[0]
    columns = version_columns("cpu")
    assert columns == {
        "fedlmc_version": found["fedlmc"],
        "flwr_version": found["flwr"],
        "torch_version": found["torch"],
        "device_used": device_description("cpu"),
    }
