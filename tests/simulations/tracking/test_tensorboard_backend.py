"""Tracker runs as TensorBoard event files (:mod:`fedlmc.simulations.tracking.tensorboard_backend`),
read back with TensorBoard's own ``EventAccumulator``: scalars at their steps, the figure's PNG
bytes, the hparams; an unchanged run is skipped, a changed one replaced."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedlmc.simulations.tracking.runs import TrackedRun
from fedlmc.simulations.tracking.tensorboard_backend import (
    MARKER,
    export_runs,
    log_dir_name,
    png_size,
)


def accumulator(log_dir: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    return events


def hparams_of(events) -> dict:
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    values = HParamsPluginData.FromString(content).session_start_info.hparams
    return {k: getattr(v, v.WhichOneof("kind")) for k, v in values.items()}


def png(path: Path) -> Path:
    from matplotlib.image import imsave

    imsave(path, np.random.default_rng(0).random((6, 10, 3)))
    return path


def a_run(tmp_path: Path, accuracy: float = 0.75) -> TrackedRun:
    return TrackedRun(
        key="0123456789ab",
        name="0123456789ab width=0.5",
        label="width=0.5",
        params={"width": 0.5, "model": "mlp"},
        step_metrics=(
            ("client_epoch/client-0/train_loss", 1, 2.0),
            ("client_epoch/client-0/train_loss", 2, 1.0),
        ),
        row_metrics=(("average/accuracy", accuracy),),
        figures=(png(tmp_path / "curves.png"),),
    )


def test_a_run_reads_back_from_its_event_file(tmp_path):
    run = a_run(tmp_path)
    assert export_runs([run], tmp_path / "tb") == (["0123456789ab"], [])
    log_dir = tmp_path / "tb" / "width=0.5 cell=0123456789ab"
    assert log_dir_name(run) == log_dir.name and (log_dir / MARKER).is_file()
    events = accumulator(log_dir)
    loss = events.Scalars("client_epoch/client-0/train_loss")
    assert [(e.step, e.value) for e in loss] == [(1, 2.0), (2, 1.0)]
    assert [(e.step, e.value) for e in events.Scalars("average/accuracy")] == [(0, 0.75)]
    (image,) = events.Images("figures/curves")
    assert image.encoded_image_string == (tmp_path / "curves.png").read_bytes()
    assert (image.width, image.height) == (10, 6)
    assert hparams_of(events) == {"width": 0.5, "model": "mlp"}


def test_an_unchanged_run_is_skipped_and_a_changed_one_replaced(tmp_path):
    export_runs([a_run(tmp_path)], tmp_path / "tb")
    log_dir = tmp_path / "tb" / "width=0.5 cell=0123456789ab"
    files = {p: p.stat().st_mtime_ns for p in log_dir.iterdir()}
    assert export_runs([a_run(tmp_path)], tmp_path / "tb") == ([], ["0123456789ab"])
    assert {p: p.stat().st_mtime_ns for p in log_dir.iterdir()} == files
    assert export_runs([a_run(tmp_path, accuracy=0.5)], tmp_path / "tb") == (["0123456789ab"], [])
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 1
    (value,) = accumulator(log_dir).Scalars("average/accuracy")
    assert value.value == 0.5


def test_log_dir_names_hold_no_character_a_folder_cannot():
    run = TrackedRun(key="k", name="k", label='data-root=/a:b "c"')
    assert log_dir_name(run) == "data-root=_a_b _c_ cell=k"
    assert log_dir_name(TrackedRun(key="k", name="k")) == "k"


def test_png_size_reads_the_header_and_refuses_other_files(tmp_path):
    assert png_size(png(tmp_path / "x.png").read_bytes()) == (10, 6, 4)
    with pytest.raises(ValueError, match="not a PNG file"):
        png_size(b"GIF89a" + bytes(30))


def test_a_folder_without_the_marker_at_a_log_dir_name_is_refused_and_kept(tmp_path):
    from fedlmc.simulations.config.schema import ConfigError

    user = tmp_path / "tb" / "width=0.5 cell=0123456789ab"
    user.mkdir(parents=True)
    (user / "draft.md").write_text("mine\n")
    with pytest.raises(ConfigError, match=r"not written by fedlmc .*allowed: "):
        export_runs([a_run(tmp_path)], tmp_path / "tb")
    assert (user / "draft.md").read_text() == "mine\n"
    assert sorted(p.name for p in user.iterdir()) == ["draft.md"]


def test_only_marked_folders_of_the_same_run_are_deleted(tmp_path):
    tb = tmp_path / "tb"
    (tb / "0123456789ab").mkdir(parents=True)  # the user's folder named by the key
    (tb / "0123456789ab" / "draft.md").write_text("mine\n")
    (tb / "old cell=0123456789ab").mkdir()  # an earlier export of the run under another label
    (tb / "old cell=0123456789ab" / MARKER).write_text("pending\n")
    assert export_runs([a_run(tmp_path)], tb) == (["0123456789ab"], [])
    assert (tb / "0123456789ab" / "draft.md").read_text() == "mine\n"
    assert not (tb / "old cell=0123456789ab").exists()
    assert (tb / "width=0.5 cell=0123456789ab" / MARKER).is_file()
