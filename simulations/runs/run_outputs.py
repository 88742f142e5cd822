"""Where one ``fedlmc run`` writes, guarded: its ``out-dir`` and its ``--csv`` file.

:func:`check_run_outputs` refuses, before any work, an ``out-dir`` that is no writable folder
or whose names fedlmc writes are taken by a link, a device or a FIFO
(:func:`fedlmc.simulations.records.written_paths.check_own_files`), and a ``--csv`` path that
is not new or a ``fedlmc run --csv`` table of the same columns, or would replace another
command's rows (:func:`fedlmc.simulations.records.results_file.check_csv_target`);
:func:`holding_outputs` then holds the lock of the out dir
(:mod:`fedlmc.simulations.records.out_dir_lock`) for the whole federation, and that of the
``--csv`` file's folder when that folder is a fedlmc out dir already (it holds a ``.lock``: no
lock file is ever created beside a user's file), and checks both again under it, since another
command may have written there between the first check and the lock. A folder in use is
refused at once, naming its holder (``fedlmc sweep (pid 1234)``): a run never writes beside a
sweep. The rows themselves are appended under a ``flock`` of the ``--csv`` file
(:func:`fedlmc.simulations.records.written_paths.append_csv_rows`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from fedlmc.simulations.records.out_dir_lock import LOCK, out_dir_lock
from fedlmc.simulations.records.results_file import (
    check_csv_target,
    check_writable_folder,
    refuse_mixing,
)
from fedlmc.simulations.records.written_paths import check_own_files

__all__ = ["check_run_outputs", "holding_outputs"]


def check_run_outputs(config: Mapping[str, Any], csv_path: str | None) -> None:
    """Before any work: the run's ``out-dir`` is a writable folder, and the ``--csv`` path is
    writable and replaces no other command's rows; that the out dir holds no sweep is checked
    under its lock (:func:`holding_outputs`), so that a folder in use names its holder."""
    if config["out-dir"]:
        check_writable_folder(config["out-dir"], "out-dir")
        check_own_files(config["out-dir"], "out-dir")
    if csv_path:
        check_csv_target(csv_path, config["out-dir"])


@contextmanager
def holding_outputs(config: Mapping[str, Any], csv_path: str | None) -> Iterator[None]:
    """Hold the lock of the run's ``out-dir`` (its kind checked again: no sweep's results
    there) and of the ``--csv`` file's folder (the file checked again) while the block runs;
    nothing for an output the run does not have."""
    out_dir = config["out-dir"]
    with ExitStack() as held:
        if out_dir:
            held.enter_context(out_dir_lock(out_dir, "fedlmc run"))
            refuse_mixing(out_dir, "run")
        if csv_path:
            folder = Path(csv_path).expanduser().parent
            if any((folder / n).is_file() for n in (LOCK, "results.csv")):  # a fedlmc out dir
                held.enter_context(out_dir_lock(folder, "fedlmc run"))
            check_csv_target(csv_path, out_dir)
        yield
