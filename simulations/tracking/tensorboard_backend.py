"""Tracker runs as TensorBoard event files (torch's ``SummaryWriter``; the ``tensorboard`` extra).

Each run gets its own log dir, whose name is the run's name in TensorBoard's run list
(:func:`log_dir_name`): a sweep's cell is ``<grid key>=<value> ... cell=<cell id>`` (e.g.
``bias=False seed=0 width=4 cell=b9eff02d7d78``: the grid keys, which tell the cells apart, as
in MLflow's run names), a ``fedlmc run`` folder ``run-<12 hex>``, the figures ``report``:

- **HParams**: the run's params (the hparams plugin's session start info, written with
  :func:`torch.utils.tensorboard.summary.hparams`); the HParams table's metric columns are the
  ``<method>/<column>`` tags of :data:`HPARAM_COLUMNS`;
- **Scalars**: the step metrics at their step (epoch or round), the ``<method>/<column>`` row
  metrics at step 0 (TensorBoard keeps scalars as float32);
- **Images**: each figure under ``figures/<file stem>``, its PNG bytes stored as they are (no
  re-encoding); **Text**: ``report.md`` under ``report``.

Idempotency: a file ``.fedlmc-exported`` is written first (holding ``pending``) and holds the
run's digest once the export is done. A log dir whose marker holds the run's digest is skipped;
one whose marker holds anything else (an export that was killed, a changed run) is deleted and
written again, and so is a marked log dir of the same run under another name (an export by an
older fedlmc, named by the cell id alone). Only folders holding the marker are ever deleted: a
folder (or file) without it at a log dir's name is the user's, and :func:`check_log_dirs`
refuses the export in one line before anything is written or deleted.
"""

from __future__ import annotations

import re
import shutil
import struct
from collections.abc import Sequence
from pathlib import Path

from fedlmc.io import atomic_write_text
from fedlmc.simulations.config.schema import ConfigError
from fedlmc.simulations.tracking.runs import TrackedRun

__all__ = ["HPARAM_COLUMNS", "MARKER", "export_runs", "log_dir_name", "png_size"]

MARKER = ".fedlmc-exported"
HPARAM_COLUMNS = ("accuracy", "nll", "ece", "loss_barrier_half")
"""The results columns shown as metric columns of TensorBoard's HParams table (every row metric
is a scalar whatever this says)."""
PNG_COLORSPACE = {0: 1, 2: 3, 3: 3, 4: 2, 6: 4}  # PNG colour type -> channels
UNSAFE = re.compile(r'[/\\:*?"<>|\x00-\x1f]')  # what a folder name may not hold (any OS)


def log_dir_name(run: TrackedRun) -> str:
    """The run's log dir name: ``<label> cell=<key>`` for a run with a label (characters a
    folder name cannot hold replaced by ``_``), else its key."""
    if not run.label:
        return run.key
    return UNSAFE.sub("_", f"{run.label} cell={run.key}")


def stale_dirs(root: Path, run: TrackedRun, name: str) -> list[Path]:
    """Earlier log dirs of ``run`` under another name (its key alone, or another label) that
    hold fedlmc's :data:`MARKER` (a folder without it is not fedlmc's and is left alone)."""
    if not root.is_dir():
        return []
    return [
        p
        for p in root.iterdir()
        if p.is_dir()
        and not p.is_symlink()
        and (p / MARKER).is_file()
        and p.name != name
        and (p.name == run.key or p.name.endswith(f"cell={run.key}"))
    ]


def export_runs(runs: Sequence[TrackedRun], track_dir: str | Path) -> tuple[list[str], list[str]]:
    """Write every run not yet in ``track_dir``; ``(written keys, skipped keys)``."""
    root = Path(track_dir)
    check_log_dirs(runs, root)
    written, skipped = [], []
    for run in runs:
        log_dir = root / log_dir_name(run)
        for old in stale_dirs(root, run, log_dir.name):
            shutil.rmtree(old)
        digest = run.digest
        if is_exported(log_dir, digest):
            skipped.append(run.key)
            continue
        if log_dir.exists():
            shutil.rmtree(log_dir)
        log_dir.mkdir(parents=True)
        atomic_write_text(log_dir / MARKER, "pending\n")  # fedlmc's folder from now on
        write_run(run, log_dir)
        atomic_write_text(log_dir / MARKER, digest + "\n")
        written.append(run.key)
    return written, skipped


def check_log_dirs(runs: Sequence[TrackedRun], root: Path) -> None:
    """Before any work: :class:`ConfigError` when a run's log dir name in ``root`` is taken by
    something fedlmc did not write (no :data:`MARKER` in a real folder there)."""
    for run in runs:
        log_dir = root / log_dir_name(run)
        if not (log_dir.exists() or log_dir.is_symlink()):
            continue
        if log_dir.is_symlink() or not log_dir.is_dir() or not (log_dir / MARKER).is_file():
            raise ConfigError(
                f"--track-dir {str(root)!r}: {log_dir.name!r} there was not written by fedlmc "
                f"(no {MARKER} in it) and fedlmc would replace it; allowed: a folder without "
                f"{log_dir.name!r}, or one where fedlmc exported it"
            )


def is_exported(log_dir: Path, digest: str) -> bool:
    """Whether ``log_dir`` holds a finished export of the run with ``digest``."""
    marker = log_dir / MARKER
    return marker.is_file() and marker.read_text(encoding="utf-8").strip() == digest


def write_run(run: TrackedRun, log_dir: Path) -> None:
    """One event file in ``log_dir`` with everything ``run`` holds (module docstring)."""
    from torch.utils.tensorboard import SummaryWriter

    log_dir.mkdir(parents=True, exist_ok=True)
    with SummaryWriter(log_dir=str(log_dir)) as writer:
        if run.params:
            headline = {
                tag: value for tag, value in run.row_metrics if tag.split("/")[-1] in HPARAM_COLUMNS
            }
            write_hparams(writer, run.params, headline)
        for tag, step, value in run.step_metrics:
            writer.add_scalar(tag, value, global_step=step)
        for tag, value in run.row_metrics:
            writer.add_scalar(tag, value, global_step=0)
        for path in run.figures:
            writer.file_writer.add_summary(png_summary(f"figures/{path.stem}", path), 0)
        for path in run.texts:
            writer.add_text(path.stem, path.read_text(encoding="utf-8"), global_step=0)


def write_hparams(writer, params: dict, metrics: dict) -> None:
    """The hparams plugin's three summaries (experiment, session start, session end)."""
    from torch.utils.tensorboard.summary import hparams

    for summary in hparams(dict(params), dict(metrics)):
        writer.file_writer.add_summary(summary)


def png_size(data: bytes) -> tuple[int, int, int]:
    """``(width, height, channels)`` from a PNG file's IHDR chunk; ValueError for non-PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    width, height = struct.unpack(">II", data[16:24])
    return width, height, PNG_COLORSPACE.get(data[25], 4)


def png_summary(tag: str, path: Path):
    """An image ``Summary`` holding the PNG file's bytes as they are."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    data = path.read_bytes()
    try:
        width, height, channels = png_size(data)
    except ValueError:
        raise ValueError(f"figure {str(path)!r} is not a PNG file") from None
    image = Summary.Image(
        height=height, width=width, colorspace=channels, encoded_image_string=data
    )
    return Summary(value=[Summary.Value(tag=tag, image=image)])
