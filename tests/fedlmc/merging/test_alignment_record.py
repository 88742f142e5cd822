"""What an alignment did: every permuting method's rows count the permutation groups it aligned
and the hidden units it moved, and a method that aligned nothing is flagged by ``fedlmc run``
and ``report.md`` (fedlmc.merging.alignment_record)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from torch import nn

from fedlmc import build_model
from fedlmc.data.splits import DataSplits
from fedlmc.merging.alignment_record import nothing_aligned_lines
from fedlmc.merging.method_registry import METHODS
from fedlmc.merging.methods import merge_states
from fedlmc.permutation import (
    SpecDerivationWarning,
    apply_permutation,
    derive_spec,
    permutation_spec,
    random_permutations,
)
from fedlmc.simulations.records.run_table import print_alignment_flags
from fedlmc.simulations.report.markdown import report_markdown
from fedlmc.study.compare import compare_methods
from fedlmc.study.method_policy import evaluation_of
from fedlmc.train import train_model

IN_SHAPE = (1, 6, 6)
ALIGNING = ["weight_matching", "activation_matching", "merge_many"]


def teacher_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and the labels of a fixed random linear teacher (learnable in a few epochs)."""
    teacher = torch.randn(36, 10, generator=torch.Generator().manual_seed(99))
    x = torch.randn(n, *IN_SHAPE, generator=torch.Generator().manual_seed(seed))
    return x, (x.flatten(1) @ teacher).argmax(dim=1)


def splits() -> DataSplits:
    return DataSplits(
        "teacher", teacher_data(256, 0), teacher_data(64, 1), teacher_data(64, 2), 10, IN_SHAPE
    )


def trained(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    train_model(
        model, splits().train, epochs=2, lr=0.05, weight_decay=0.0, batch_size=64, seed=seed
    )
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def mlp(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", width=0.125, in_shape=IN_SHAPE)  # 3 hidden layers of 16 units


def rows_of(template, states, methods, spec=None) -> pd.DataFrame:
    found = compare_methods(template, states, None, splits(), methods, diagnostics=False, spec=spec)
    return pd.DataFrame(found.rows).set_index("method")


def test_every_permuting_method_declares_the_columns_and_plain_ones_do_not() -> None:
    declares = {
        m.name
        for m in METHODS
        if "aligned_groups" in {c.name for c in evaluation_of(m.name).columns}
    }
    assert {*ALIGNING, "random_permutation", "embed_weight_matching", "auto"} <= declares
    assert not {"average", "average_repair", "embed_average", "heterofl"} & declares


def test_mlp_rows_count_its_hidden_layers_and_the_units_alignment_moved() -> None:
    """Groups = the MLP's 3 hidden layers; independently trained clients: units moved > 0; a
    client matched with itself: 0 units moved (groups still 3); the plain average: NaN."""
    states = [trained(mlp(seed), seed) for seed in (1, 2)]
    rows = rows_of(mlp(0), states, ["average", *ALIGNING, "weight_matching_t"])
    for method in [*ALIGNING, "weight_matching_t"]:
        assert rows.loc[method, "aligned_groups"] == 3
        assert rows.loc[method, "aligned_units_moved"] > 0
    assert math.isnan(rows.loc["average", "aligned_groups"])
    assert math.isnan(rows.loc["average", "aligned_units_moved"])
    assert nothing_aligned_lines(rows.reset_index().to_dict("records")) == []

    # matched with itself (activation matching may swap dead units: their correlations tie)
    same = rows_of(mlp(0), [states[0], states[0]], ["weight_matching", "merge_many"])
    assert same["aligned_groups"].tolist() == [3, 3]
    assert same["aligned_units_moved"].tolist() == [0, 0]


@pytest.mark.parametrize("method", ["weight_matching", "embed_weight_matching", "auto"])
def test_units_moved_is_exactly_the_units_a_known_permutation_moved(method: str) -> None:
    """Client 1 is client 0 with its hidden units scrambled: weight matching recovers the
    permutation, and the count is the positions that permutation does not fix."""
    template = mlp(0)
    first = trained(template, 0)
    spec = permutation_spec(template)
    scramble = random_permutations(spec, first, seed=5)
    expected = sum(int((p != torch.arange(len(p))).sum()) for p in scramble.values())
    assert expected > 40  # 3 groups of 16 units: almost every unit moves
    states = [first, apply_permutation(spec, scramble, first)]
    options = {"auto_tolerance": -1.0}  # auto always tries weight matching (and keeps it here)
    _, aligned, info = merge_states(
        method, template, states, server_data=splits().server, options=options, with_info=True
    )
    assert info["aligned_groups"] == 3
    assert info["aligned_units_moved"] == expected
    assert all(torch.equal(aligned[1][k], first[k]) for k in first)


class NormCNN(nn.Module):
    """conv-GroupNorm-ReLU twice, global average pool, linear."""

    def __init__(self, groups: int, channels: int = 8) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1),
            nn.GroupNorm(groups, channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.GroupNorm(groups, channels),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


@pytest.mark.parametrize("groups", [1, 8])
def test_group_norm_with_one_or_per_channel_groups_is_aligned(groups: int) -> None:
    """GroupNorm(1, C) and GroupNorm(C, C) carry the channel permutation: both convolutions'
    groups survive, and the permuted model computes the same function."""
    torch.manual_seed(0)
    model = NormCNN(groups).eval()
    x = teacher_data(4, 3)[0]
    spec = derive_spec(model, x)
    assert len(spec.perm_to_axes) == 2
    state = model.state_dict()
    moved = apply_permutation(spec, random_permutations(spec, state, seed=1), state)
    assert not torch.equal(moved["body.0.weight"], state["body.0.weight"])
    other = NormCNN(groups).eval()
    other.load_state_dict(moved)
    torch.testing.assert_close(other(x), model(x), atol=1e-5, rtol=1e-5)


def test_group_norm_blocks_align_nothing_and_the_run_and_report_say_so(tmp_path, capsys) -> None:
    """GroupNorm(4, C): every group is dropped (warnings only), so weight and activation matching
    leave the clients as they are; their rows say 0 groups aligned, equal the plain average's,
    and ``fedlmc run``'s flag lines and report.md name both methods."""
    x = teacher_data(4, 3)[0]
    template = NormCNN(4)
    with pytest.warns(SpecDerivationWarning, match="GroupNorm"):
        spec = derive_spec(template, x)
    assert spec.perm_to_axes == {}
    states = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        states.append(trained(NormCNN(4), seed))
    methods = ["average", "weight_matching", "activation_matching"]
    rows = rows_of(template, states, methods, spec=spec)
    for method in methods[1:]:
        assert rows.loc[method, "aligned_groups"] == 0
        assert rows.loc[method, "aligned_units_moved"] == 0
        assert rows.loc[method, "accuracy"] == rows.loc["average", "accuracy"]
        assert rows.loc[method, "nll"] == rows.loc["average", "nll"]

    print_alignment_flags(rows.reset_index())
    printed = [line for line in capsys.readouterr().out.splitlines() if "aligned" in line]
    assert [line.split()[:5] for line in printed] == [
        ["warning:", method, "aligned", "0", "permutation"] for method in methods[1:]
    ]
    assert all("plain average" in line and "docs/own_model.md" in line for line in printed)

    results = rows.reset_index().assign(cell_id="c1", status="ok", width=1.0, seed=0)
    settings = {"dpi": 60, "error-bars": "std", "title": ""}
    text = report_markdown(results, {}, [], tmp_path, settings)
    for method in methods[1:]:
        assert f"**Warning**: {method} aligned 0 permutation groups in 1 of 1 cell(s)" in text
