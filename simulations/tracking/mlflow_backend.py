"""Tracker runs in an MLflow tracking store (``mlflow.tracking.MlflowClient``; the ``mlflow``
extra, ``mlflow-skinny``).

Each run is an MLflow run in the experiment named after the sweep (``config.json``'s ``name``;
a ``fedlmc run`` folder: the folder's name), named ``<cell id> <grid values>``:

- **params**: the run's params (text, as MLflow keeps them);
- **metrics**: the step metrics with ``step`` = epoch or round, the ``<method>/<column>`` row
  metrics at step 0 (float64, as in the CSV files);
- **artefacts**: each figure under ``figures/``, ``report.md`` at the top (the ``report`` run);
- **tags**: ``fedlmc.cell_id`` (the run's key), ``fedlmc.kind`` (``cell``, ``run`` or
  ``report``), ``fedlmc.digest``, ``fedlmc.source`` (the results folder) and, set last,
  ``fedlmc.exported = true``.

The default store, used when no tracking URI is given, is ``sqlite:///<out dir>/mlflow.db`` with
the artefacts under ``<out dir>/mlartifacts`` (MLflow 3 refuses plain ``./mlruns`` file stores
unless ``MLFLOW_ALLOW_FILE_STORE=true``; its database store is the maintained one). With a
given URI the experiment, when new, gets MLflow's own default artefact location.

Idempotency: an active run of the experiment tagged with the run's key, its digest and
``fedlmc.exported = true`` means the run is there: skipped. Other active runs with the key (a
killed export, a changed run) are deleted first.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from fedlmc.simulations.tracking.runs import TrackedRun, params_text

__all__ = ["DATABASE", "TAG_KEY", "default_store", "export_runs"]

DATABASE = "mlflow.db"
ARTIFACTS = "mlartifacts"
TAG_KEY = "fedlmc.cell_id"
TAG_DIGEST = "fedlmc.digest"
TAG_DONE = "fedlmc.exported"
MAX_METRICS, MAX_PARAMS = 1000, 100  # MLflow's log_batch limits
QUIET_LOGGERS = ("alembic", "mlflow.store.db.utils")


def default_store(out_dir: str | Path) -> tuple[str, str]:
    """``(tracking URI, artefact location)`` of the default store in ``out_dir``."""
    folder = Path(out_dir).resolve()
    return f"sqlite:///{folder / DATABASE}", (folder / ARTIFACTS).as_uri()


def export_runs(
    runs: Sequence[TrackedRun],
    tracking_uri: str,
    experiment: str,
    *,
    artifact_location: str | None = None,
    source: str = "",
) -> tuple[list[str], list[str]]:
    """Log every run not yet in the experiment; ``(written keys, skipped keys)``."""
    from mlflow.tracking import MlflowClient

    with quiet_loggers():
        client = MlflowClient(tracking_uri=tracking_uri)
        experiment_id = experiment_id_of(client, experiment, artifact_location)
        existing = existing_runs(client, experiment_id)
        written, skipped = [], []
        for run in runs:
            digest = run.digest
            olds = existing.get(run.key, [])
            if any(is_done(old, digest) for old in olds):
                skipped.append(run.key)
                continue
            for old in olds:
                client.delete_run(old.info.run_id)
            log_run(client, experiment_id, run, digest, source)
            written.append(run.key)
    return written, skipped


@contextmanager
def quiet_loggers() -> Iterator[None]:
    """MLflow's database set-up logs (table creation, migrations) at WARNING and above only, and
    no deprecation warnings raised inside MLflow (e.g. SQLAlchemy's about MLflow's own mappers:
    nothing a fedlmc user can act on)."""
    loggers = [logging.getLogger(name) for name in QUIET_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"mlflow\.")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def experiment_id_of(client, name: str, artifact_location: str | None) -> str:
    """The id of the experiment ``name``, created (or restored, when deleted) as needed."""
    found = client.get_experiment_by_name(name)
    if found is None:
        return client.create_experiment(name, artifact_location=artifact_location)
    if found.lifecycle_stage == "deleted":
        client.restore_experiment(found.experiment_id)
    return found.experiment_id


def existing_runs(client, experiment_id: str) -> dict[str, list]:
    """The experiment's active runs by their ``fedlmc.cell_id`` tag."""
    found: dict[str, list] = {}
    token = None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token)
        for run in page:
            key = run.data.tags.get(TAG_KEY)
            if key:
                found.setdefault(key, []).append(run)
        token = page.token
        if not token:
            return found


def is_done(run, digest: str) -> bool:
    """Whether an MLflow run is a finished export of the run with ``digest``."""
    tags = run.data.tags
    return tags.get(TAG_DIGEST) == digest and tags.get(TAG_DONE) == "true"


def log_run(client, experiment_id: str, run: TrackedRun, digest: str, source: str) -> None:
    """Create the MLflow run and log everything ``run`` holds (module docstring)."""
    from mlflow.entities import Metric, Param

    tags = {TAG_KEY: run.key, "fedlmc.kind": run.kind, TAG_DIGEST: digest}
    if source:
        tags["fedlmc.source"] = source
    created = client.create_run(experiment_id, tags=tags, run_name=run.name)
    run_id = created.info.run_id
    now = int(time.time() * 1000)
    params = [Param(k, v) for k, v in params_text(run.params).items()]
    metrics = [Metric(tag, value, now, step) for tag, step, value in run.step_metrics]
    metrics += [Metric(tag, value, now, 0) for tag, value in run.row_metrics]
    for start in range(0, len(params), MAX_PARAMS):
        client.log_batch(run_id, params=params[start : start + MAX_PARAMS])
    for start in range(0, len(metrics), MAX_METRICS):
        client.log_batch(run_id, metrics=metrics[start : start + MAX_METRICS])
    for path in run.figures:
        client.log_artifact(run_id, str(path), artifact_path="figures")
    for path in run.texts:
        client.log_artifact(run_id, str(path))
    client.set_tag(run_id, TAG_DONE, "true")
    client.set_terminated(run_id)
