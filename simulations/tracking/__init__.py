"""Experiment trackers: a sweep's (or a ``fedlmc run``'s) results folder exported to TensorBoard
or MLflow, each an optional extra.

The trackers are a registry (:data:`TRACKERS`, :func:`register_tracker`), like the models and
merge methods: ``fedlmc sweep/run --track NAME`` and ``fedlmc track DIR --to NAME`` take their
names, the CLI's help lists them, and :func:`check_tracker` refuses an unknown name or an extra
that is not installed (``importlib.util.find_spec``, nothing imported) before any work.

What a run holds (params, step metrics, row metrics, figures) is read from the folder by
:func:`fedlmc.simulations.tracking.runs.tracked_runs`; each backend writes it in its own terms
(:mod:`~fedlmc.simulations.tracking.tensorboard_backend`,
:mod:`~fedlmc.simulations.tracking.mlflow_backend`). An export is idempotent: a run already in
the tracker with the same content is skipped, so exporting again after a resumed sweep adds
only the new cells (and replaces the ``report`` run when the figures changed).

Imports nothing heavy: the backends import torch's ``SummaryWriter`` / MLflow when they export.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fedlmc.registry import Registry
from fedlmc.simulations.config.schema import ConfigError

__all__ = [
    "TRACKERS",
    "ExportSummary",
    "Tracker",
    "check_tracker",
    "export_folder",
    "register_tracker",
    "tracker_names",
]


@dataclass(frozen=True)
class ExportSummary:
    """What an export did: the run keys written and those skipped (already there)."""

    tracker: str
    destination: str
    written: tuple[str, ...]
    skipped: tuple[str, ...]

    def line(self) -> str:
        """One line for the CLI."""
        return (
            f"{self.tracker}: {len(self.written)} run(s) exported, {len(self.skipped)} already "
            f"there, in {self.destination}"
        )


@dataclass(frozen=True)
class Tracker:
    """A tracker backend.

    ``modules``: the import names that must be installed; ``extra``: the pip extra installing
    them; ``option``: the CLI option naming the destination (``--track-dir`` /
    ``--tracking-uri``) and ``option_help`` its help; ``default_destination(out_dir)``: the
    destination without that option;
    ``export(out_dir, destination) -> (written, skipped)``: write the folder's runs.
    """

    name: str
    modules: tuple[str, ...]
    extra: str
    option: str
    option_help: str
    default_destination: Callable[[Path], str]
    export: Callable[[Path, str], tuple[list[str], list[str]]]

    def missing_modules(self) -> list[str]:
        """The modules of :attr:`modules` not installed (found without importing them)."""
        return [m for m in self.modules if importlib.util.find_spec(m) is None]


TRACKERS: Registry[Tracker] = Registry("tracker")


def register_tracker(tracker: Tracker, *, replace: bool = False) -> Tracker:
    """Add ``tracker`` to :data:`TRACKERS` under its name."""
    return TRACKERS.add(tracker.name, tracker, replace=replace)


def tracker_names() -> tuple[str, ...]:
    """The registered trackers' names."""
    return TRACKERS.names()


def check_tracker(name: str, option: str = "--track") -> Tracker:
    """The tracker ``name``; :class:`~fedlmc.simulations.config.schema.ConfigError` (one line) for
    an unknown name or a tracker whose extra is not installed, naming the install command."""
    if name not in TRACKERS:
        allowed = ", ".join(TRACKERS.names())
        raise ConfigError(f"{option} {name!r}: unknown tracker; allowed: {allowed}")
    tracker = TRACKERS.get(name)
    missing = tracker.missing_modules()
    if missing:
        raise ConfigError(
            f"{option} {name}: the {tracker.extra!r} extra is not installed (no module "
            f'{", ".join(missing)}); install it with: pip install -e ".[{tracker.extra}]"'
        )
    return tracker


def export_folder(out_dir: str | Path, name: str, destination: str | None = None) -> ExportSummary:
    """Export the runs of ``out_dir`` to the tracker ``name`` at ``destination`` (the tracker's
    default when ``None``)."""
    tracker = check_tracker(name)
    folder = Path(out_dir)
    target = destination or tracker.default_destination(folder)
    written, skipped = tracker.export(folder, target)
    return ExportSummary(name, target, tuple(written), tuple(skipped))


# ----------------------------------------------------------------------------- backends


def _tensorboard_export(folder: Path, track_dir: str) -> tuple[list[str], list[str]]:
    from fedlmc.simulations.tracking.runs import tracked_runs
    from fedlmc.simulations.tracking.tensorboard_backend import export_runs

    return export_runs(tracked_runs(folder), track_dir)


def experiment_name(folder: Path) -> str:
    """The sweep's name (``config.json``), else the folder's name."""
    try:
        name = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("name")
    except (OSError, ValueError, AttributeError):
        name = None
    return str(name) if name else folder.resolve().name


def _mlflow_default(folder: Path) -> str:
    from fedlmc.simulations.tracking.mlflow_backend import default_store

    return default_store(folder)[0]


def _mlflow_export(folder: Path, tracking_uri: str) -> tuple[list[str], list[str]]:
    from fedlmc.simulations.tracking.mlflow_backend import default_store, export_runs
    from fedlmc.simulations.tracking.runs import tracked_runs

    uri, artifacts = default_store(folder)
    return export_runs(
        tracked_runs(folder),
        tracking_uri,
        experiment_name(folder),
        artifact_location=artifacts if tracking_uri == uri else None,
        source=str(folder.resolve()),
    )


def _builtin_trackers() -> Sequence[Tracker]:
    return (
        Tracker(
            name="tensorboard",
            modules=("tensorboard",),
            extra="tensorboard",
            option="--track-dir",
            option_help="TensorBoard log dir, one sub-folder per run (default: <out>/tensorboard)",
            default_destination=lambda folder: str(folder / "tensorboard"),
            export=_tensorboard_export,
        ),
        Tracker(
            name="mlflow",
            modules=("mlflow",),
            extra="mlflow",
            option="--tracking-uri",
            option_help="MLflow tracking URI (default: sqlite:///<out>/mlflow.db, artefacts in "
            "<out>/mlartifacts)",
            default_destination=_mlflow_default,
            export=_mlflow_export,
        ),
    )


for _tracker in _builtin_trackers():
    register_tracker(_tracker)
