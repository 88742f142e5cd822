"""One merge result from one pipeline (fedlmc.merging.merge_result): the library's merge gives
the study's merge exactly, a temperature is an evaluation of the result, and a `_t` name is
refused. In process, tiny models."""

from __future__ import annotations

import pytest
import torch

from fedlmc.merging.merge_result import MergeResult, calibrated, merge_and_finish
from fedlmc.merging.post_merge import Calibration, ServerData, calibrate
from fedlmc.study.merge import Merged, merge_clients

try:  # rootdir on sys.path, or tests/ itself (pytest's default import mode)
    from tests.fedlmc.test_registry import tiny_splits, tiny_states
except ImportError:
    from fedlmc.test_registry import tiny_splits, tiny_states


@pytest.mark.parametrize("method", ["average", "weight_matching", "average_repair"])
def test_the_library_and_the_study_build_the_same_merge(method):
    template, states = tiny_states()
    splits = tiny_splits()
    found = merge_and_finish(method, template, states, [1, 3], server_data=splits.server)
    state, info = merge_clients(method, template, states, [1, 3], splits)
    assert found.state.keys() == state.keys()
    assert all(torch.equal(found.state[k], state[k]) for k in state)
    assert found.method == method and found.weights == (0.25, 0.75)
    assert found.bn_reset == info["bn_reset"] and found.repaired == (method == "average_repair")
    assert found.temperature == 1.0 and found.server_saw == "each model"
    assert issubclass(Merged, MergeResult)


def test_a_temperature_is_an_evaluation_of_the_result_not_another_merge():
    template, states = tiny_states()
    server = tiny_splits().server
    found = merge_and_finish("average", template, states, server_data=server)
    fitted = calibrate(found.model, ServerData(*server), warn=False)
    at_t = calibrated(found, fitted)
    assert at_t.model is found.model and at_t.state is found.state
    assert at_t.temperature == fitted.temperature != 1.0
    assert calibrated(found, Calibration(2.0, ({"t": 2.0},))).calibration_history == ({"t": 2.0},)
    with pytest.raises(ValueError, match="'average_t' is a study row, the merge 'average'"):
        merge_and_finish("average_t", template, states, server_data=server)


def test_a_merge_that_builds_another_model_is_finished_without_post_merge():
    template, states = tiny_states()
    found = merge_and_finish("preserve_first", template, states)
    assert not found.template_shaped and type(found.model) is not type(template)
    assert found.state.keys() == found.combined.keys() and found.bn_source == "none"
