"""fedlmc.permutation.tracing.recording: a model torch.fx cannot trace, or an example input
it cannot run, is refused naming the module or node; the trace computes the model; a module
that runs twice is never named as a node's output."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from fedlmc.permutation.tracing import derive_spec
from fedlmc.permutation.tracing.recording import ModuleOutputs, trace


class Gate(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        return x if x.sum() > 0 else -x


def test_untraceable_model_names_the_module():
    model = nn.Sequential(nn.Linear(4, 4), Gate(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match=r"cannot trace module '1' \(Gate\).*permutation_spec"):
        derive_spec(model, torch.randn(2, 4))


def test_bad_example_input_names_the_node():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    with pytest.raises(ValueError, match="node '_0'.*failed"):
        derive_spec(model, torch.randn(2, 5))
    with pytest.raises(ValueError, match="example_input must be a tensor"):
        derive_spec(model, [])


def test_the_trace_computes_the_model():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).eval()
    graph = trace(model)
    x = torch.randn(5, 4)
    assert torch.equal(graph(x), model(x))
    assert [n.op for n in graph.graph.nodes].count("call_module") == 3


def test_module_outputs_names_a_module_run_once_but_never_one_run_twice():
    shared = nn.Linear(3, 3)
    model = nn.Sequential(nn.Linear(2, 3), shared, nn.ReLU(), shared).eval()
    x = torch.randn(4, 2)
    outputs = ModuleOutputs(model, (x,))
    assert set(outputs.once) == {"0", "2"}
    nodes = list(trace(model).graph.nodes)
    relu, last = (
        next(n for n in nodes if n.target == "2"),
        [n for n in nodes if n.target == "1"][-1],
    )
    with torch.no_grad():
        hidden = torch.relu(shared(model[0](x)))
        assert outputs.name_of(relu, hidden) == "2"  # a module call run once: its own name
        assert outputs.name_of(last, model(x)) is None  # run twice, and no other module's output
    assert outputs.name_of(last, hidden.clone()) == "2"  # else the module whose output it equals
    assert outputs.name_of(relu, "not a tensor") is None
