"""Whether a run's data set has its files: a torchvision data set (``mnist``, ``cifar10``, ...)
is read from ``data-root``, so a run without one, or (on this machine) one whose ``data-root``
lacks the data set's folder, is refused at validation, before Ray starts, with the three ways
to supply the files: ``data-root``, ``download = true`` and ``fedlmc data fetch``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedlmc.data.catalog import DOWNLOADABLE, dataset_entry
from fedlmc.simulations.config.schema import ConfigError, shown


def needs_files(dataset: str) -> bool:
    """Whether ``dataset`` is read from torchvision's files under ``data-root`` (a registered
    data set with a torchvision class; ``mnist5k`` and ``hf:`` sources are not)."""
    return dataset in DOWNLOADABLE


def ways_to_supply(dataset: str) -> str:
    """The ``allowed:`` part of a refusal: the ways to give ``dataset`` its files."""
    return (
        f"allowed: data-root=DIR holding its files, with download=true to fetch them there "
        f"first, or fetch them once with `fedlmc data fetch {dataset} --root DIR`"
    )


def check_data_root_given(config: Mapping[str, Any]) -> None:
    """A data set read from files (:func:`needs_files`) needs a ``data-root``."""
    dataset = config["dataset"]
    if needs_files(dataset) and not config["data-root"]:
        raise ConfigError(
            f"dataset = {shown(dataset)} is read from torchvision's files and data-root is "
            f"empty; {ways_to_supply(dataset)}"
        )


def check_data_folder(config: Mapping[str, Any]) -> None:
    """On this machine, without ``download``: ``data-root`` holds the data set's folder (the
    catalog's ``folder``, e.g. ``cifar-10-batches-py``). Machine-dependent: skipped with
    ``check_devices=False``."""
    dataset, root = config["dataset"], config["data-root"]
    if not needs_files(dataset) or not root or config["download"]:
        return
    folder = dataset_entry(dataset).folder
    if not (Path(root).expanduser() / folder).is_dir():
        raise ConfigError(
            f"data-root = {shown(root)}: no {folder!r} folder there for dataset "
            f"{shown(dataset)}; {ways_to_supply(dataset)}"
        )
