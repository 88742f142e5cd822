"""Tests of fedlmc.study.context (the frozen StudyContext) and of fedlmc.study.compare's
``study_context``, which builds it from ``compare_methods``' arguments: weights normalised,
settings read-only, the diagnostics' inputs and layers found."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fedlmc.data.loading import DataSplits
from fedlmc.models.classifiers import build_model
from fedlmc.study.compare import study_context
from fedlmc.study.context import StudyContext


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
