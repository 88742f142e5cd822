"""The Hugging Face path reads no pickle and runs no script of a folder it is given:
``datasets.load_from_disk`` reads JSON (``state.json``, ``dataset_info.json``) and Arrow files,
and ``datasets.load_dataset(folder)`` picks its builder by the data files' extensions, none of
which unpickles (``.pkl`` is no data file to it), and refuses a folder with a loading script
(``datasets`` 4 runs none), which ``load_dataset("hf:...")`` reports on one line. Crafted
pickles and a loading script are placed beside real data written with ``datasets`` and read
back through the real loader: nothing of them runs."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from fedlmc.data.loading import load_dataset
from tests.fedlmc.data.test_hf import rgb_split


class ShellCommand:
    """Unpickles as ``os.system(command)``."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def plant(folder: Path, marker: Path, script: bool) -> None:
    """Crafted pickles under names a loader might read, and with ``script`` a loading script
    named after the folder (what ``datasets`` 2 ran), each creating ``marker``."""
    payload = pickle.dumps(ShellCommand(f"touch {marker}"))
    for name in ("train.pkl", "dataset.pickle", "cache-0.pkl", "state.pkl"):
        (folder / name).write_bytes(payload)
    if script:
        (folder / f"{folder.name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from datasets import DatasetDict

    folder = tmp_path_factory.mktemp("hf-untrusted")
    rng = np.random.default_rng(1)
    _, _, train = rgb_split(rng, 40)
    _, _, test = rgb_split(rng, 10)
    DatasetDict(train=train, test=test).save_to_disk(str(folder / "disk"))
    (folder / "files").mkdir()
    train.to_parquet(str(folder / "files" / "train.parquet"))
    test.to_parquet(str(folder / "files" / "test.parquet"))
    return folder


@pytest.mark.parametrize(("kind", "script"), [("disk", True), ("disk", False), ("files", False)])
def test_crafted_pickles_and_a_script_beside_the_data_never_run(saved, tmp_path, kind, script):
    folder = tmp_path / kind
    shutil.copytree(saved / kind, folder)
    marker = tmp_path / "marker"
    plant(folder, marker, script)
    splits = load_dataset(f"hf:{folder}", root=tmp_path / "cache", server_fraction=0.0)
    assert (len(splits.train[1]), len(splits.test[1])) == (40, 10)
    assert not marker.exists()


def test_a_data_folder_with_a_loading_script_is_one_line_and_runs_nothing(saved, tmp_path):
    folder = tmp_path / "files"
    shutil.copytree(saved / "files", folder)
    marker = tmp_path / "marker"
    plant(folder, marker, script=True)
    with pytest.raises(ValueError) as error:
        load_dataset(f"hf:{folder}", root=tmp_path / "cache")
    assert str(error.value) == (
        f"cannot load 'hf:{folder}' with datasets: Dataset scripts are no longer supported, "
        "but found files.py"
    )
    assert not marker.exists()


def test_a_folder_of_pickles_alone_is_refused_unread(tmp_path):
    folder = tmp_path / "pickles"
    folder.mkdir()
    marker = tmp_path / "marker"
    plant(folder, marker, script=False)
    with pytest.raises(ValueError, match=r"^cannot load 'hf:.*pickles' with datasets: ") as error:
        load_dataset(f"hf:{folder}", root=tmp_path / "cache")
    assert "\n" not in str(error.value)
    assert not marker.exists()
