"""CIFAR batches that fail torchvision's md5 check, read through the real loader
(``load_dataset("cifar10", root)``) by the unpickler that admits only the format's data: crafted
files run nothing and allocate nothing, and are one ``ValueError`` line naming the file, its md5
and the fix; files written in torchvision's own format by every pickle protocol still load."""

from __future__ import annotations

import builtins
import hashlib
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlmc.data.loading import load_dataset
from tests.fedlmc.data.test_loading import (
    assert_rows_recovered,
    balanced_labels,
    normalised,
    random_pixels,
    write_cifar10,
)


def official_md5(name: str) -> str:
    """torchvision's md5 of the official CIFAR-10 batch ``name`` (imported here, not at
    collection: torchvision.datasets costs each pytest worker 1.4 s)."""
    from torchvision.datasets import CIFAR10

    return dict(CIFAR10.train_list + CIFAR10.test_list)[name]


class ShellCommand:
    """Unpickles as ``os.system(command)`` (``posix.system``)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class OpenFile:
    """Unpickles as ``open(path, "w")``: creates ``path`` without a shell."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (builtins.open, (self.path, "w"))


class Raw:
    """Unpickles as ``function(*args)`` for any global ``function``."""

    def __init__(self, function, *args) -> None:
        self.function, self.args = function, args

    def __reduce__(self):
        return (self.function, self.args)


def cifar_root(tmp_path: Path) -> Path:
    """A CIFAR-10 folder of 10 training and 5 test images in torchvision's format."""
    rng = np.random.default_rng(0)
    x_tr, y_tr = random_pixels(rng, 10, (3, 32, 32)), balanced_labels(10, 10, rng)
    x_te, y_te = random_pixels(rng, 5, (3, 32, 32)), balanced_labels(5, 10, rng)
    write_cifar10(tmp_path, (x_tr, y_tr), (x_te, y_te))
    return tmp_path


def load_refused(root: Path) -> str:
    """The one-line error of loading ``root``'s CIFAR-10 files."""
    with pytest.warns(UserWarning, match="md5"), pytest.raises(ValueError) as error:
        load_dataset("cifar10", root=root, server_fraction=0.0)
    return str(error.value)


def crafted_batches(marker: Path) -> dict[str, object]:
    """Every crafted ``data_batch_1`` tried, by what it does when ``pickle.load`` reads it."""
    pixels = np.zeros((2, 3072), np.uint8)
    huge = (10**10,)
    multiarray = np.ndarray.__reduce__(pixels)[0]  # numpy._core.multiarray._reconstruct
    return {
        "a shell command": ShellCommand(f"touch {marker}"),
        "a shell command in 'data'": {"data": ShellCommand(f"touch {marker}"), "labels": [0]},
        "open() of a new file": {"data": pixels, "labels": [0, 1], "x": OpenFile(marker)},
        "eval": Raw(eval, f"open({str(marker)!r}, 'w')"),
        "ndarray(shape) uninitialised": {"data": Raw(np.ndarray, huge, "u1"), "labels": []},
        "an object array of 10^10 Nones": Raw(multiarray, np.ndarray, huge, "O"),
        "one array 10^4 times (61 MB from 66 kB)": {
            "data": [pixels] * 10**4,
            "labels": [0] * 20_000,
        },
        "labels that are no ints": {"data": pixels, "labels": ["a", "b"]},
        "the wrong label count": {"data": pixels, "labels": [0]},
        "no dict": [pixels, [0, 1]],
    }


@pytest.mark.parametrize("what", list(crafted_batches(Path("m"))))
def test_a_crafted_batch_runs_nothing_and_is_one_line_naming_the_file_and_the_fix(tmp_path, what):
    root = cifar_root(tmp_path / "data")
    marker = tmp_path / "marker"
    batch = root / "cifar-10-batches-py" / "data_batch_1"
    batch.write_bytes(pickle.dumps(crafted_batches(marker)[what]))
    message = load_refused(root)
    assert not marker.exists()  # nothing ran
    assert "\n" not in message
    assert message.startswith(f"cannot read CIFAR batch {batch}: ")
    assert f"run 'fedlmc data fetch cifar10 --root {root}' for the official files" in message
    assert f"torchvision's for the official file {official_md5('data_batch_1')}" in message


def test_the_refusal_names_the_global_and_the_files_md5(tmp_path):
    root = cifar_root(tmp_path / "data")
    batch = root / "cifar-10-batches-py" / "test_batch"
    batch.write_bytes(pickle.dumps(ShellCommand("true")))
    md5 = hashlib.md5(batch.read_bytes()).hexdigest()
    message = load_refused(root)
    assert "it names posix.system, which a CIFAR batch never holds" in message
    official = official_md5("test_batch")
    assert f"its md5 is {md5}, torchvision's for the official file {official}" in message


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_batches_in_torchvisions_format_load_by_every_protocol(tmp_path, protocol):
    """Python 2's pickles (protocol 2, bytes as ``_codecs.encode``), NumPy scalars in the
    labels, the ``batch_label`` and ``filenames`` entries: all load, the pixels and labels as
    written."""
    rng = np.random.default_rng(protocol)
    x = random_pixels(rng, 12, (3, 32, 32))
    y = balanced_labels(12, 10, rng)
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name, rows in zip(names, np.array_split(np.arange(12), 6), strict=True):
        entry = {
            "batch_label": f"{name} of 6",
            "data": x[rows].reshape(len(rows), -1),
            "labels": list(y[rows]),  # NumPy int64 scalars
            "filenames": [f"img_{i}.png".encode() for i in rows],
        }
        (folder / name).write_bytes(pickle.dumps(entry, protocol=protocol))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": list("abcdefghij")}))
    with pytest.warns(UserWarning, match="md5"):
        splits = load_dataset("cifar10", root=tmp_path, server_fraction=0.0)
    assert_rows_recovered(splits, normalised(x[:10], "cifar10"), y[:10])
    torch.testing.assert_close(
        splits.test[0].double(), normalised(x[10:], "cifar10"), rtol=0, atol=1e-5
    )
    assert torch.equal(splits.test[1], torch.from_numpy(y[10:]))


class WithState:
    """Unpickles as ``function(*args)``, then pickle's BUILD with ``state``."""

    def __init__(self, function, args, state) -> None:
        self.function, self.args, self.state = function, args, state

    def __reduce__(self):
        return (self.function, self.args, self.state)


def arrays_numpy_would_fill_from_the_file():
    """Arrays whose pickled state NumPy's ``ndarray.__setstate__`` trusts: an object dtype
    sizes the array from the claimed shape and fills pointers from the file (on NumPy 2.4 a
    segmentation fault: the interpreter dies, no exception)."""
    reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]
    empty = (np.ndarray, (0,), b"b")
    return {
        "an object array claiming 10 pointers, given 1": WithState(
            reconstruct, empty, (1, (10,), np.dtype("O"), False, [None])
        ),
        "a structured dtype with an object field": WithState(
            reconstruct, empty, (1, (10,), np.dtype([("a", "O")]), False, [None])
        ),
        "an object array in a key nobody reads": {
            "data": np.zeros((1, 3072), np.uint8),
            "labels": [0],
            "extra": WithState(reconstruct, empty, (1, (10,), np.dtype("O"), False, [None])),
        },
    }


@pytest.mark.slow
@pytest.mark.parametrize("what", list(arrays_numpy_would_fill_from_the_file()))
def test_an_object_array_is_refused_before_numpy_builds_it(tmp_path, what):
    """Loaded in a subprocess, so that a crash is a failed test, not a dead worker: the load
    ends in the one line, exit status 1, never a signal."""
    import subprocess
    import sys

    root = cifar_root(tmp_path / "data")
    crafted = arrays_numpy_would_fill_from_the_file()[what]
    entry = crafted if isinstance(crafted, dict) else {"data": crafted, "labels": [0] * 10}
    (root / "cifar-10-batches-py" / "data_batch_1").write_bytes(pickle.dumps(entry))
    load = f"from fedlmc.data.loading import load_dataset; load_dataset('cifar10', {str(root)!r})"
    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-c", load],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert done.returncode == 1, (done.returncode, done.stderr[-500:])
    last = done.stderr.strip().splitlines()[-1]
    assert "cannot read CIFAR batch" in last and "allowed: numbers and fixed-size strings" in last
