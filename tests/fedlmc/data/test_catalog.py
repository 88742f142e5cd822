"""The data-set catalogue (``fedlmc/data/catalog.py``): torchvision is optional."""

from __future__ import annotations

import sys

import pytest

from fedlmc.data.catalog import torchvision_datasets


def test_a_torchvision_data_set_without_torchvision_says_how_to_install_it(monkeypatch):
    """torchvision is the optional ``vision`` extra (a CPU-only torch installs without it):
    asking for one of its data sets where it cannot be imported names the extra and the data
    set that needs none."""
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision now fails
    monkeypatch.delitem(sys.modules, "torchvision.datasets", raising=False)
    with pytest.raises(ValueError, match=r"dataset 'cifar10' is read by torchvision.*\[vision\]"):
        torchvision_datasets("cifar10")
