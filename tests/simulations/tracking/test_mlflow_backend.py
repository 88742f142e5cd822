"""Tracker runs in an MLflow sqlite store (:mod:`fedlmc.simulations.tracking.mlflow_backend`),
queried through ``MlflowClient``: params as text, metrics at their steps, the tags, figures as
artefacts; an unchanged run is skipped, a changed one replaces the old.

Creating a store runs MLflow's migrations (about 12 s on 2 cores): the store tests are ``slow``;
the fast loop exports to MLflow once, in ``tests/simulations/test_tracking.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedlmc.simulations.tracking.mlflow_backend import TAG_KEY, default_store, export_runs
from fedlmc.simulations.tracking.runs import TrackedRun


def a_run(tmp_path: Path, accuracy: float = 0.75) -> TrackedRun:
    figure = tmp_path / "figures" / "curves.png"
    figure.parent.mkdir(exist_ok=True)
    figure.write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    return TrackedRun(
        key="0123456789ab",
        name="0123456789ab width=0.5",
        params={"width": 0.5, "model": "mlp", "diagnostics": True},
        step_metrics=(
            ("fedavg_round/fedavg_accuracy", 1, 0.25),
            ("fedavg_round/fedavg_accuracy", 2, 0.5),
        ),
        row_metrics=(("average/accuracy", accuracy),),
        figures=(figure,),
    )


SLOW = pytest.mark.slow


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[str, str]:
    """One sqlite store for the module (creating one runs MLflow's migrations: seconds)."""
    return default_store(tmp_path_factory.mktemp("mlflow"))


def runs_of(client, experiment: str) -> list:
    return client.search_runs([client.get_experiment_by_name(experiment).experiment_id])


def test_the_default_store_is_a_sqlite_database_in_the_out_dir(tmp_path):
    uri, artefacts = default_store(tmp_path)
    assert uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert artefacts == (tmp_path.resolve() / "mlartifacts").as_uri()


@SLOW
def test_a_run_read_back_through_the_client(tmp_path, store):
    from mlflow.tracking import MlflowClient

    uri, artefacts = store
    run = a_run(tmp_path)
    written = export_runs([run], uri, "tiny", artifact_location=artefacts, source="here")
    assert written == (["0123456789ab"], [])
    client = MlflowClient(tracking_uri=uri)
    (stored,) = runs_of(client, "tiny")
    assert stored.info.run_name == run.name
    assert stored.data.params == {"width": "0.5", "model": "mlp", "diagnostics": "True"}
    assert stored.data.tags[TAG_KEY] == run.key and stored.data.tags["fedlmc.kind"] == "cell"
    history = client.get_metric_history(stored.info.run_id, "fedavg_round/fedavg_accuracy")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.25), (2, 0.5)]
    assert stored.data.metrics["average/accuracy"] == 0.75
    listed = [a.path for a in client.list_artifacts(stored.info.run_id, "figures")]
    assert listed == ["figures/curves.png"]


@SLOW
def test_an_unchanged_run_is_skipped_and_a_changed_one_replaced(tmp_path, store):
    from mlflow.tracking import MlflowClient

    uri, artefacts = store
    export_runs([a_run(tmp_path)], uri, "again", artifact_location=artefacts)
    client = MlflowClient(tracking_uri=uri)
    (first,) = runs_of(client, "again")
    assert export_runs([a_run(tmp_path)], uri, "again", artifact_location=artefacts) == (
        [],
        ["0123456789ab"],
    )
    changed = a_run(tmp_path, accuracy=0.5)
    assert export_runs([changed], uri, "again", artifact_location=artefacts)[0] == ["0123456789ab"]
    (second,) = runs_of(client, "again")  # the old run deleted, one run per key
    assert second.info.run_id != first.info.run_id
    assert second.data.metrics["average/accuracy"] == 0.5
