"""Tests of fedlmc.study.context (the frozen StudyContext) and of fedlmc.study.compare's
``study_context``, which builds it from ``compare_methods``' arguments: weights normalised,
settings read-only, the diagnostics' inputs and layers found."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from fedlmc.data.loading import DataSplits
from fedlmc.merging.method_registry import METHODS
from fedlmc.models.classifiers import build_model
from fedlmc.models.registry import MODEL_ALLOW_VARIABLE
from fedlmc.study.compare import compare_methods, study_context
from fedlmc.study.context import StudyContext, check_methods


def tiny_splits() -> DataSplits:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(60, 1, 4, 4, generator=g)
    y = torch.randint(0, 10, (60,), generator=g)
    return DataSplits(
        name="constructed",
        train=(x[:20], y[:20]),
        server=(x[20:40], y[20:40]),
        test=(x[40:], y[40:]),
        num_classes=10,
        in_shape=(1, 4, 4),
    )


def mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", width=0.125, in_shape=(1, 4, 4), norm="none").eval()


def test_study_context_normalises_weights_and_is_read_only():
    splits = tiny_splits()
    template = mlp(0)
    states = [mlp(s).state_dict() for s in (0, 1, 2)]
    options = {"auto_tolerance": 0.1}
    context = study_context(
        template,
        states,
        [1, 1, 2],
        splits,
        device=torch.device("cpu"),
        diagnostic_samples=7,
        method_options=options,
    )
    assert context.weights == (0.25, 0.25, 0.5)
    assert context.num_clients == 3
    assert context.diagnostic_x.shape[0] == 7
    assert context.layer_names == tuple(template.layer_names)
    assert context.lewc_undefined == ""  # a plain MLP: LEWC's depths are defined
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.seed = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        context.method_options["auto_tolerance"] = 0.5  # type: ignore[index]
    options["auto_tolerance"] = 0.9  # the caller's dict is copied, not shared
    assert context.method_options["auto_tolerance"] == 0.1


def test_without_diagnostics_no_layers_are_looked_up():
    context = study_context(
        mlp(0),
        [mlp(0).state_dict()],
        None,
        tiny_splits(),
        device=torch.device("cpu"),
        diagnostics=False,
    )
    assert context.layer_names == () and context.lewc_undefined == ""
    assert context.weights == (1.0,)


def test_server_data_is_none_for_an_empty_server_split():
    splits = tiny_splits()
    empty = dataclasses.replace(splits, server=(splits.server[0][:0], splits.server[1][:0]))
    context = StudyContext(mlp(0), (), (), empty, torch.device("cpu"))
    assert context.server_data is None
    assert StudyContext(mlp(0), (), (), splits, torch.device("cpu")).server_data is not None


USER_MERGES = """
from fedlmc.merging.merge_job import Alignment


def keep_first(job):
    return Alignment([job.states[0]] * len(job.states))
"""


@pytest.fixture
def user_merges(tmp_path, monkeypatch):
    """``my_merges_<id>.py`` in the current folder, which is not on ``sys.path``; its method
    removed afterwards."""
    name = f"my_merges_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(USER_MERGES)
    monkeypatch.chdir(tmp_path)
    here = {"", ".", str(tmp_path)}
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in here])
    monkeypatch.delenv(MODEL_ALLOW_VARIABLE, raising=False)
    yield name
    if "keep_first" in METHODS:
        METHODS.remove("keep_first")


def test_compare_methods_accepts_a_module_function_method(user_merges):
    splits = tiny_splits()
    states = [mlp(s).state_dict() for s in (0, 1)]
    methods = [f"{user_merges}:keep_first", f"{user_merges}:keep_first_t", "average"]
    rows = compare_methods(mlp(0), states, None, splits, methods, diagnostics=False).rows
    assert [r["method"] for r in rows] == ["keep_first", "keep_first_t", "average"]
    assert 0.0 <= rows[0]["accuracy"] <= 1.0


def test_an_unresolvable_method_path_is_refused_before_any_work(user_merges):
    states = [mlp(s).state_dict() for s in (0, 1)]
    # splits=None: any work past the method check would fail on it first
    with pytest.raises(ValueError) as refused:
        compare_methods(mlp(0), states, None, None, ["my_merge:keep_first"])
    line = str(refused.value)
    assert "No module named 'my_merge'" in line and "PYTHONPATH" in line
    assert check_methods([f"{user_merges}:keep_first"]) == ["keep_first"]
