"""Tests of fedlmc.data.download: the real torchvision download path against a real HTTP server on
127.0.0.1 serving files written here in torchvision's formats, then read by load_dataset."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import re
import socket
import tarfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from fedlmc.data.download import (
    LOCK_NAME,
    ChecksumError,
    DownloadError,
    expected_files,
    fetch_dataset,
)
from fedlmc.data.loading import load_dataset
from tests.fedlmc.data.test_loading import (
    balanced_labels,
    normalised,
    random_pixels,
    write_cifar10,
    write_cifar100,
    write_idx,
    write_mnist_like,
)

# torchvision's MNIST.resources (test_default_checksums_are_torchvisions); named here so that
# collecting this file does not import torchvision.datasets (1.4 s of each pytest worker)
MNIST_GZ = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
]
MNIST_RAW = [f.removesuffix(".gz") for f in MNIST_GZ]


# --- a real file server ------------------------------------------------------------------------


class FileServer:
    """``http.server`` on 127.0.0.1 (port 0) in a thread, serving ``files`` (name -> bytes) at
    ``/name``; counts the requests per name; waits ``delay`` seconds before each answer."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.hits: Counter[str] = Counter()
        self.delay = 0.0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                name = self.path.lstrip("/")
                owner.hits[name] += 1
                time.sleep(owner.delay)
                body = owner.files.get(name)
                try:
                    if body is None:
                        self.send_error(404)
                        return
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # torchvision's redirect probe closes early

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # a short poll: shutdown() waits for the loop's next poll (0.5 s by default, per test)
        serve = functools.partial(self.httpd.serve_forever, poll_interval=0.02)
        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FileServer()
    yield s
    s.close()


@pytest.fixture
def dead_url():
    """A URL on a port that is bound but does not listen: connections are refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def no_temporaries(folder: Path) -> bool:
    return not [p for p in folder.rglob("*.tmp")]


# --- files in torchvision's formats ------------------------------------------------------------


def mnist_files(tmp_path: Path, seed: int = 0):
    """The four MNIST .gz files as bytes, and the arrays they hold."""
    rng = np.random.default_rng(seed)
    train = random_pixels(rng, 50, (28, 28)), balanced_labels(50, 10, rng)
    test = random_pixels(rng, 20, (28, 28)), balanced_labels(20, 10, rng)
    src = tmp_path / "source"
    for prefix, (x, y) in (("train", train), ("t10k", test)):
        write_idx(src / f"{prefix}-images-idx3-ubyte", x, gz=True)
        write_idx(src / f"{prefix}-labels-idx1-ubyte", y, gz=True)
    files = {name: (src / name).read_bytes() for name in MNIST_GZ}
    return files, train, test


def cifar_archive(tmp_path: Path, name: str):
    """(archive file name, archive bytes, md5 of the archive and of every member, train, test).

    The archive also holds a member that tries to escape the batch folder."""
    from torchvision.datasets import CIFAR10, CIFAR100

    cls = {"cifar10": CIFAR10, "cifar100": CIFAR100}[name]
    rng = np.random.default_rng(1)
    k = 10 if name == "cifar10" else 100
    train = random_pixels(rng, 2 * k, (3, 32, 32)), balanced_labels(2 * k, k, rng)
    test = random_pixels(rng, 10, (3, 32, 32)), rng.integers(0, k, 10)
    src = tmp_path / "source"
    (write_cifar10 if name == "cifar10" else write_cifar100)(src, train, test)
    folder = src / cls.base_folder
    sums = {f.name: md5(f.read_bytes()) for f in folder.iterdir()}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(folder, arcname=cls.base_folder)
        escape = tarfile.TarInfo(f"{cls.base_folder}/../escaped-{name}")
        escape.size = 4
        tar.addfile(escape, io.BytesIO(b"evil"))
    archive = buffer.getvalue()
    sums[cls.filename] = md5(archive)
    return cls.filename, archive, sums, train, test


# --- MNIST-like --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "folder"), [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")]
)
def test_fetch_mnist_like_downloads_verifies_and_loads(tmp_path, server, name, folder):
    files, (x_tr, y_tr), (x_te, y_te) = mnist_files(tmp_path)
    server.files.update(files)
    sums = {f: md5(b) for f, b in files.items()}
    root = tmp_path / "data"

    result = fetch_dataset(name, root, mirror=server.url + "/", checksums=sums)

    raw = root / folder / "raw"
    assert result.folder == raw and sorted(result.downloaded) == sorted(MNIST_GZ)
    assert "downloaded 4 files" in result.summary()
    assert all((raw / f).read_bytes() == files[f] for f in MNIST_GZ)
    assert all((raw / f).stat().st_size > 0 for f in MNIST_RAW)
    assert no_temporaries(root) and (root / LOCK_NAME).is_file()

    splits = load_dataset(name, root, server_fraction=0.2)
    assert splits.in_shape == (1, 28, 28) and splits.num_classes == 10
    assert (len(splits.train[1]), len(splits.server[1]), len(splits.test[1])) == (40, 10, 20)
    assert torch.equal(splits.test[1], torch.from_numpy(y_te))
    assert torch.equal(
        torch.sort(torch.cat([splits.train[1], splits.server[1]])).values,
        torch.sort(torch.from_numpy(y_tr)).values,
    )
    expected = normalised(x_te[:, None], name)
    torch.testing.assert_close(splits.test[0].double(), expected, rtol=0, atol=1e-5)

    # idempotent: nothing is requested again, also through load_dataset(download=True)
    hits = server.hits.copy()
    again = fetch_dataset(name, root, mirror=server.url, checksums=sums)
    assert again.downloaded == () and "already present" in again.summary()
    load_dataset(name, root, download=True, mirror=server.url)
    assert server.hits == hits

    # a decompressed file lost, its valid .gz still there: decompressed again, no request
    (raw / MNIST_RAW[0]).unlink()
    assert fetch_dataset(name, root, mirror=server.url, checksums=sums).downloaded == ()
    assert server.hits == hits and (raw / MNIST_RAW[0]).is_file()

    # both lost: only that file is fetched again
    (raw / MNIST_RAW[1]).unlink()
    (raw / MNIST_GZ[1]).unlink()
    assert fetch_dataset(name, root, mirror=server.url, checksums=sums).downloaded == (MNIST_GZ[1],)
    assert {f for f in server.hits if server.hits[f] != hits[f]} == {MNIST_GZ[1]}


def test_load_dataset_download_goes_through_fetch(tmp_path, server, dead_url):
    files, _, _ = mnist_files(tmp_path)
    server.files.update(files)
    # an empty root: load_dataset(download=True) fetches from the mirror it is given, and the
    # real default md5 sums (torchvision's) reject our test-written files
    with pytest.raises(ChecksumError, match=mnist_md5(MNIST_GZ[0])):
        load_dataset("mnist", tmp_path / "a", download=True, mirror=server.url)
    assert not (tmp_path / "a" / "MNIST" / "raw" / MNIST_GZ[0]).exists()
    with pytest.raises(DownloadError, match=f"{dead_url}/cifar-10-python.tar.gz"):
        load_dataset("cifar10", tmp_path / "b", download=True, mirror=dead_url)


def test_files_copied_by_hand_need_no_network_and_stale_temporaries_go(tmp_path, server, dead_url):
    rng = np.random.default_rng(5)
    arrays = random_pixels(rng, 10, (28, 28)), balanced_labels(10, 10, rng)
    write_mnist_like(tmp_path / "copied", "MNIST", arrays, arrays)
    result = fetch_dataset("mnist", tmp_path / "copied", mirror=dead_url)
    assert result.downloaded == ()
    assert not (tmp_path / "copied" / LOCK_NAME).exists()  # present files: no lock, no writes

    files, _, _ = mnist_files(tmp_path)
    server.files.update(files)
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    ours = raw / f".{MNIST_GZ[0]}.k1ll3d.tmp"  # left by a killed fetch
    theirs = tmp_path / "data" / ".results.csv.x.tmp"  # someone else's write in progress
    ours.write_bytes(b"partial")
    theirs.write_bytes(b"partial")
    sums = {f: md5(b) for f, b in files.items()}
    fetch_dataset("mnist", tmp_path / "data", mirror=server.url, checksums=sums)
    assert not ours.exists() and theirs.exists()


# --- CIFAR -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_fetch_cifar_downloads_unpacks_and_loads(tmp_path, server, name):
    archive_name, archive, sums, (x_tr, y_tr), (x_te, y_te) = cifar_archive(tmp_path, name)
    server.files[archive_name] = archive
    root = tmp_path / "data"

    result = fetch_dataset(name, root, mirror=server.url, checksums=sums)

    assert result.downloaded == (archive_name,)
    assert (root / archive_name).read_bytes() == archive
    assert sorted(p.name for p in result.folder.iterdir()) == sorted(set(sums) - {archive_name})
    assert not list(tmp_path.rglob(f"escaped-{name}"))  # no member outside the batch folder
    assert no_temporaries(root)

    # our batches are not the official release: read as they are, after load_dataset's warning
    with pytest.warns(UserWarning, match="md5"):
        splits = load_dataset(name, root, server_fraction=0.0)
    k = 10 if name == "cifar10" else 100
    assert (splits.num_classes, splits.in_shape, splits.augment) == (k, (3, 32, 32), "crop_flip")
    assert len(splits.train[1]) == 2 * k and torch.equal(splits.test[1], torch.from_numpy(y_te))
    assert torch.equal(torch.bincount(splits.train[1], minlength=k), torch.full((k,), 2))

    hits = server.hits.copy()
    assert fetch_dataset(name, root, mirror=server.url, checksums=sums).downloaded == ()
    # a batch lost: unpacked again from the valid archive in root, without a request
    first_batch = sorted(set(sums) - {archive_name})[0]
    (result.folder / first_batch).unlink()
    assert fetch_dataset(name, root, mirror=server.url, checksums=sums).downloaded == ()
    assert (result.folder / first_batch).is_file() and server.hits == hits


# --- failures ----------------------------------------------------------------------------------


def test_wrong_checksum_raises_and_keeps_nothing(tmp_path, server):
    files, _, _ = mnist_files(tmp_path)
    server.files.update(files)
    sums = {f: md5(b) for f, b in files.items()}
    sums[MNIST_GZ[2]] = md5(b"something else")
    root = tmp_path / "data"
    with pytest.raises(ChecksumError, match=rf"md5 {md5(files[MNIST_GZ[2]])}, expected") as err:
        fetch_dataset("mnist", root, mirror=server.url, checksums=sums)
    assert f"{server.url}/{MNIST_GZ[2]}" in str(err.value) and "\n" not in str(err.value)
    raw = root / "MNIST" / "raw"
    assert not (raw / MNIST_GZ[2]).exists() and not (raw / MNIST_RAW[2]).exists()
    assert no_temporaries(root)
    # the files before it are complete and verified; a fixed sum resumes from there
    assert (raw / MNIST_RAW[0]).is_file()
    sums[MNIST_GZ[2]] = md5(files[MNIST_GZ[2]])
    assert fetch_dataset("mnist", root, mirror=server.url, checksums=sums).downloaded == tuple(
        MNIST_GZ[2:]
    )

    archive_name, archive, cifar_sums, _, _ = cifar_archive(tmp_path, "cifar10")
    server.files[archive_name] = archive[:-100]  # truncated in transit
    with pytest.raises(ChecksumError, match=cifar_sums[archive_name]):
        fetch_dataset("cifar10", root, mirror=server.url, checksums=cifar_sums)
    assert not (root / archive_name).exists() and not (root / "cifar-10-batches-py").exists()
    assert no_temporaries(root)


def test_unreachable_or_missing_files_give_one_line_errors(tmp_path, server, dead_url):
    root = tmp_path / "data"
    with pytest.raises(DownloadError) as err:
        fetch_dataset("mnist", root, mirror=dead_url)
    message = str(err.value)
    assert not isinstance(err.value, ChecksumError) and "\n" not in message
    assert f"{dead_url}/{MNIST_GZ[0]}" in message and "refused" in message
    assert (
        f"copy the .gz files (or the files they decompress to) into {root / 'MNIST' / 'raw'}"
        in message
    )
    assert not [p for p in (root / "MNIST" / "raw").iterdir()]

    with pytest.raises(DownloadError, match=r"HTTP Error 404"):
        fetch_dataset("fashion_mnist", root, mirror=server.url)  # serves nothing


def test_silent_server_times_out(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)  # accepts connections in the kernel, never answers
    try:
        start = time.monotonic()
        with pytest.raises(DownloadError, match="timed out"):
            fetch_dataset(
                "cifar10",
                tmp_path,
                mirror=f"http://127.0.0.1:{listener.getsockname()[1]}",
                timeout=0.5,
            )
        assert time.monotonic() - start < 10
        assert socket.getdefaulttimeout() is None  # restored
    finally:
        listener.close()


def test_concurrent_fetches_download_once(tmp_path, server):
    files, _, _ = mnist_files(tmp_path)
    server.files.update(files)
    sums = {f: md5(b) for f, b in files.items()}
    fetch_dataset("mnist", tmp_path / "single", mirror=server.url, checksums=sums)
    single = server.hits.copy()
    server.hits.clear()
    server.delay = 0.05  # both fetches are in flight together

    # flock locks belong to an open file description: two threads opening the lock file
    # exclude each other exactly as two processes do
    results, errors = [], []

    def fetch() -> None:
        try:
            results.append(
                fetch_dataset("mnist", tmp_path / "shared", mirror=server.url, checksums=sums)
            )
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(results) == 2
    assert sorted(len(r.downloaded) for r in results) == [0, 4]  # the second found them there
    assert server.hits == single  # every file requested as often as by one fetch
    assert load_dataset("mnist", tmp_path / "shared").test[0].shape == (20, 1, 28, 28)


# --- arguments ---------------------------------------------------------------------------------


def test_fetch_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match=r"'mnist5k' cannot be fetched; allowed: \('mnist'"):
        fetch_dataset("mnist5k", tmp_path)
    with pytest.raises(ValueError, match="'hf:x' cannot be fetched"):
        fetch_dataset("hf:x", tmp_path)
    with pytest.raises(ValueError, match="mirror='ftp://host' must be an http"):
        fetch_dataset("mnist", tmp_path, mirror="ftp://host")
    with pytest.raises(ValueError, match=r"'data_batch_1', not a file of 'mnist'; allowed: \["):
        fetch_dataset("mnist", tmp_path, checksums={"data_batch_1": "0" * 32})
    with pytest.raises(ValueError, match="32 hex digits"):
        fetch_dataset("cifar10", tmp_path, checksums={"data_batch_1": "xyz"})
    assert not (tmp_path / LOCK_NAME).exists()  # rejected before touching root


def mnist_md5(name: str) -> str:
    """torchvision's md5 of the MNIST file ``name``."""
    from torchvision.datasets import MNIST

    return dict(MNIST.resources)[name]


def test_default_checksums_are_torchvisions():
    from torchvision.datasets import CIFAR10, MNIST

    cifar = expected_files("cifar10")
    assert cifar["cifar-10-python.tar.gz"] == CIFAR10.tgz_md5
    assert cifar["data_batch_1"] == CIFAR10.train_list[0][1]
    assert cifar["batches.meta"] == CIFAR10.meta["md5"]
    mnist = expected_files("mnist")
    assert {f: mnist[f] for f in MNIST_GZ} == dict(MNIST.resources)
    assert MNIST_GZ == [f for f, _ in MNIST.resources]  # the names this file uses, in order
    assert all(mnist[f] == "" for f in MNIST_RAW)


def test_the_run_config_download_fetches_once_on_the_server(tmp_path, server, dead_url):
    """``download = true``: the ServerApp's data step fetches from ``data-mirror`` (here the
    local server) through the same code; torchvision's real md5 sums reject test-written files,
    and an unreachable mirror is one clear error."""
    from fedlmc.simulations.config import validate_run_config
    from fedlmc.simulations.server_app import prepare_data

    files, _, _ = mnist_files(tmp_path)
    server.files.update(files)
    root = tmp_path / "data"
    config = validate_run_config(
        {"dataset": "mnist", "data-root": str(root), "download": True, "data-mirror": server.url}
    )
    with pytest.raises(ChecksumError, match=mnist_md5(MNIST_GZ[0])):
        prepare_data(config)
    assert server.hits[MNIST_GZ[0]] >= 1 and not (root / "MNIST" / "raw" / MNIST_GZ[0]).exists()
    with pytest.raises(DownloadError, match=re.escape(f"{dead_url}/")):
        prepare_data({**config, "data-mirror": dead_url})


@pytest.mark.slow
def test_fedlmc_data_fetch_command(tmp_path, server, dead_url):
    """The command runs the real download: torchvision's md5 sums reject the test-written files
    (exit 1, one line, nothing kept); files already in place are reported, with no request."""
    import subprocess
    import sys

    files, _, _ = mnist_files(tmp_path)
    server.files.update(files)

    def fetch(root, mirror):
        cmd = [sys.executable, "-m", "fedlmc.simulations.cli", "data", "fetch", "mnist", "--root"]
        return subprocess.run(
            [*cmd, str(root), "--mirror", mirror], capture_output=True, text=True, timeout=120
        )

    failed = fetch(tmp_path / "new", server.url)
    assert failed.returncode == 1 and failed.stdout == ""
    errors = [line for line in failed.stderr.splitlines() if line.startswith("fedlmc:")]
    assert len(errors) == 1 and failed.stderr.rstrip().endswith(errors[0])  # above: progress
    assert "md5" in errors[0] and server.hits[MNIST_GZ[0]] >= 1
    rng = np.random.default_rng(1)
    arrays = random_pixels(rng, 10, (28, 28)), balanced_labels(10, 10, rng)
    write_mnist_like(tmp_path / "copied", "MNIST", arrays, arrays)
    present = fetch(tmp_path / "copied", dead_url)
    assert present.returncode == 0 and "already present" in present.stdout
