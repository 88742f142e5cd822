"""fedlmc.permutation.tracing.operations: every kind of the tables has its handler in the
graph walk; a function outside the tables ends its group, and a wrong table entry is caught by
the check on the example input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedlmc.permutation.tracing import (
    SpecDerivationWarning,
    derive_spec,
    operations,
)
from fedlmc.permutation.tracing.operations import (
    FUNCTION_KINDS,
    METHOD_KINDS,
    MODULE_KINDS,
    MODULE_STATE,
)
from fedlmc.permutation.tracing.walk import GraphWalk


class Cumulative(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.b(torch.cumsum(self.a(x), dim=-1))


def test_unknown_function_ends_its_group_and_a_wrong_rule_is_caught(monkeypatch):
    model, x = Cumulative(), torch.randn(3, 4)
    with pytest.warns(SpecDerivationWarning, match="units of a .*cumsum.* not supported"):
        assert derive_spec(model, x).perm_to_axes == {}
    # Pretend cumsum were pointwise: the check on the example input refuses the wrong spec.
    monkeypatch.setitem(operations.FUNCTION_KINDS, torch.cumsum, "activation")
    with pytest.raises(ValueError, match="wrong spec.*group 'a'"):
        derive_spec(model, x)


def test_every_kind_of_the_tables_has_a_handler_in_the_walk():
    kinds = {*MODULE_KINDS.values(), *FUNCTION_KINDS.values(), *METHOD_KINDS.values()}
    missing = sorted(k for k in kinds if not callable(getattr(GraphWalk, f"_on_{k}", None)))
    assert missing == []
    assert set(MODULE_STATE) <= {*MODULE_KINDS.values()}
    assert MODULE_KINDS[nn.ReLU] == "activation" and FUNCTION_KINDS[F.relu] == "activation"
    assert torch.cumsum not in FUNCTION_KINDS  # the unknown function of the test below
