"""Tests of fedlmc.merging.merge_job: what a merge method receives (``MergeJob``) and returns
(``Alignment``)."""

from __future__ import annotations

import torch

from fedlmc.merging.merge_job import Alignment, MergeJob
from fedlmc.models.classifiers import build_model
from fedlmc.permutation import permutation_spec


def tiny_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", width=0.125, in_shape=(1, 4, 4), norm="none").eval()


def test_permutation_spec_falls_back_to_the_templates_and_keeps_a_given_one():
    template = tiny_mlp()
    job = MergeJob(template=template, states=[template.state_dict()], weights=[1.0])
    spec = job.permutation_spec()
    assert spec.perm_to_axes == permutation_spec(template).perm_to_axes
    assert job.permutation_spec() is spec  # derived once, then kept
    given = permutation_spec(template)
    other = MergeJob(template=template, states=[], weights=[], spec=given)
    assert other.permutation_spec() is given


def test_server_inputs_are_the_first_half_of_the_server_data():
    template = tiny_mlp()
    x, y = torch.randn(3, 1, 4, 4), torch.tensor([0, 1, 2])
    job = MergeJob(template=template, states=[], weights=[], server_data=(x, y))
    assert job.server_inputs is x
    assert MergeJob(template=template, states=[], weights=[]).server_inputs is None
    assert job.options == {} and job.options is not MergeJob(template, [], []).options


def test_an_alignment_keeps_every_client_and_reports_nothing_by_default():
    sd = tiny_mlp().state_dict()
    alignment = Alignment([sd, sd])
    assert alignment.merged is None and alignment.kept is None and alignment.info == {}
