"""One registration adds a merge method or a model everywhere: study rows, strategies, the
run-config schema, the CLI and the docs tables; the random-permutation control behaves as the
LMC literature's scrambled control."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from fedlmc.averaging import average, load_state
from fedlmc.data.catalog import datasets_markdown
from fedlmc.data.loading import from_arrays
from fedlmc.evaluation import predict_logits
from fedlmc.merging.merge_job import Alignment
from fedlmc.merging.method_registry import METHODS, register_method, study_methods
from fedlmc.merging.methods import merge_states
from fedlmc.models.classifiers import build_model
from fedlmc.models.registry import MODELS as MODEL_REGISTRY
from fedlmc.models.registry import ModelOption, model_names, register_model
from fedlmc.registry import Registry
from fedlmc.simulations.cli import main
from fedlmc.simulations.config import ConfigError, run_schema, validate_run_config
from fedlmc.simulations.config.tables import (
    columns_table,
    keys_table,
    methods_table,
    models_table,
    secure_methods_table,
    training_columns_table,
)
from fedlmc.simulations.report.figure_table import figures_markdown
from fedlmc.simulations.task import build_from_config
from fedlmc.strategies import PermutationAlignedAverage, StrategyOptions
from fedlmc.strategies.query_handlers import query_handlers_table
from fedlmc.study.compare import compare_methods
from fedlmc.study.rows import COLUMNS, ROUND_COLUMNS, column_table

ROOT = Path(__file__).resolve().parents[2]


def docs_tables():
    """``docs/gen_tables.py``, the script that writes the generated tables into the docs pages."""
    spec = importlib.util.spec_from_file_location("gen_tables", ROOT / "docs" / "gen_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny_states(count: int = 2) -> tuple[nn.Module, list[dict[str, torch.Tensor]]]:
    states = []
    for seed in range(count):
        torch.manual_seed(seed)
        states.append(build_model("mlp", width=0.125, depth=2, in_shape=(1, 4, 4)).state_dict())
    return build_model("mlp", width=0.125, depth=2, in_shape=(1, 4, 4)), states


def tiny_splits():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 1, 4, 4, generator=g)
    y = torch.randint(0, 10, (120,), generator=g)
    return from_arrays(x[:80], y[:80], x[80:], y[80:], num_classes=10, server_fraction=0.25)


@pytest.fixture
def halfway_method():
    """A temporary merge method: every client moved halfway to client 0 (not a permutation)."""

    @register_method("halfway", description="test: clients moved halfway to client 0")
    def halfway(job) -> Alignment:
        first = job.states[0]
        moved = [{k: (v + first[k]) / 2 for k, v in sd.items()} for sd in job.states]
        return Alignment(moved)

    yield halfway
    METHODS.remove("halfway")


def test_a_registered_method_reaches_every_list(halfway_method):
    assert {"halfway", "halfway_t"} <= set(study_methods())
    assert validate_run_config({"methods": "halfway,halfway_t"})["methods"] == "halfway,halfway_t"
    assert validate_run_config({"strategy": "aligned", "align": "halfway"})["align"] == "halfway"
    assert "`halfway`, `halfway_t`" in methods_table() and "`halfway`" in keys_table()
    template, states = tiny_states()
    strategy = PermutationAlignedAverage(
        template, StrategyOptions(num_clients=2, calibration="none"), method="halfway"
    )
    assert strategy.merge_method == "halfway"
    merged, _ = merge_states("halfway", template, states, [1, 1])
    expected = average([states[0], {k: (v + states[0][k]) / 2 for k, v in states[1].items()}])
    assert all(torch.allclose(merged[k], expected[k]) for k in merged)
    rows = compare_methods(
        template, states, [1, 1], tiny_splits(), ["halfway", "halfway_t"], diagnostics=False
    ).rows
    assert [r["method"] for r in rows] == ["halfway", "halfway_t"]
    assert rows[0]["accuracy"] == rows[1]["accuracy"] and rows[1]["temperature"] != 1.0


def test_a_removed_method_is_gone_from_the_lists(halfway_method):
    METHODS.remove("halfway")
    try:
        assert "halfway" not in study_methods()
        with pytest.raises(ConfigError, match="methods = 'halfway'"):
            validate_run_config({"methods": "halfway"})
    finally:
        register_method("halfway", description="re-registered for the fixture")(halfway_method)


def test_method_names_must_not_collide_with_row_names():
    for name in ("average", "weight_matching_t", "ensemble", "not an identifier"):
        with pytest.raises(ValueError, match=repr(name)):
            register_method(name, description="x")(lambda job: Alignment(list(job.states)))


def test_unknown_method_and_model_name_the_registered_ones():
    template, states = tiny_states()
    with pytest.raises(ValueError, match="unknown merge method 'nope'; allowed: average, "):
        merge_states("nope", template, states)
    with pytest.raises(ValueError, match="unknown model 'nope'; allowed: mlp, vgg11, resnet20"):
        build_model("nope")
    registry: Registry[int] = Registry("thing")
    registry.add("one", 1)
    with pytest.raises(ValueError, match="thing 'one' is already registered"):
        registry.add("one", 2)


def test_activation_matching_needs_server_inputs_and_says_so():
    template, states = tiny_states()
    with pytest.raises(ValueError, match="'activation_matching' needs server data"):
        merge_states("activation_matching", template, states)


class Squares(nn.Module):
    """A user model: ``depth`` ReLU layers of ``round(units * width)`` units."""

    def __init__(self, width, num_classes, in_shape, norm, *, units, depth):
        super().__init__()
        size = max(1, round(units * width))
        fan_in = int(torch.tensor(in_shape).prod())
        layers: list[nn.Module] = [nn.Flatten()]
        for _ in range(depth):
            layers += [nn.Linear(fan_in, size), nn.ReLU()]
            fan_in = size
        self.body = nn.Sequential(*layers)
        self.classifier = nn.Linear(fan_in, num_classes)
        self.layer_names = ["classifier"]

    def forward(self, x):
        return self.classifier(self.body(x))


@pytest.fixture
def squares_model():
    register_model(
        "squares",
        Squares,
        default_norm="none",
        options={
            "units": ModelOption(16, "units at width 1", minimum=1, public=True),
            "depth": ModelOption(3, "hidden layers of the MLP", minimum=1, public=True),
        },
        description="test model",
    )
    yield
    MODEL_REGISTRY.remove("squares")


def test_a_registered_model_reaches_the_schema_and_the_client(squares_model):
    assert "squares" in model_names() and "units" in run_schema()
    assert "`squares`" in models_table() and "`units`" in keys_table()
    config = validate_run_config({"model": "squares", "units": 6, "depth": 2, "width": 0.5})
    model = build_from_config(config, tiny_splits())
    assert isinstance(model, Squares)
    assert model.body[1].out_features == 3 and len(model.body) == 5
    assert model.config["units"] == 6
    with pytest.raises(ValueError, match="option units = 0: allowed: a number >= 1"):
        build_model("squares", units=0)


def test_the_schema_follows_models_registered_and_removed_after_it_was_read():
    """run_schema keeps the model options' keys until the registered models change."""
    assert "units" not in run_schema()
    register_model(
        "squares",
        Squares,
        default_norm="none",
        options={"units": ModelOption(16, "units at width 1", minimum=1, public=True)},
        description="test model",
    )
    try:
        assert run_schema()["units"].default == 16
        MODEL_REGISTRY.remove("squares")
        assert "units" not in run_schema()
        register_model(  # the same name again, another entry: another default
            "squares",
            Squares,
            default_norm="none",
            options={"units": ModelOption(8, "units at width 1", minimum=1, public=True)},
            description="test model",
        )
        assert run_schema()["units"].default == 8
    finally:
        if "squares" in model_names():
            MODEL_REGISTRY.remove("squares")


def test_public_options_shared_by_models_must_agree():
    with pytest.raises(ValueError, match="public option 'depth' has default 5"):
        register_model(
            "deeper",
            Squares,
            options={"depth": ModelOption(5, "hidden layers", public=True)},
        )
    assert "deeper" not in model_names()


def test_docs_tables_are_the_registries():
    gen = docs_tables()
    made = {"methods": methods_table, "models": models_table, "keys": keys_table}
    made["columns"] = columns_table
    made["training-columns"] = training_columns_table
    made["datasets"] = datasets_markdown
    made["figures"] = figures_markdown
    made["secure-methods"] = secure_methods_table
    made["query-handlers"] = query_handlers_table
    made["reading-path"] = gen.reading_path_table
    assert {name: make for name, (_, make) in gen.BLOCKS.items()} == made
    for name, (page, make) in gen.BLOCKS.items():
        text = (ROOT / "docs" / page).read_text()
        assert gen.generated_block(text, name) == make() + "\n", "run python docs/gen_tables.py"
    assert gen.stale_blocks() == [] and gen.main(["--check"]) == 0


def test_the_columns_table_is_the_row_schema():
    table = columns_table()
    names = [line.split("`")[1] for line in table.split("\n")[2:]]
    assert names == [column.name for column in column_table()]
    assert names[: len(COLUMNS)] == list(COLUMNS) and set(ROUND_COLUMNS) <= set(names)
    assert "| `lewc_cos_layers` | JSON |" in table and "| `method` | text |" in table
    assert "| `accuracy` | number |" in table and "| `clients_failed` | text |" in table


def test_the_generator_rewrites_a_stale_block_and_needs_its_markers(tmp_path):
    gen = docs_tables()
    page = "intro\n<!-- BEGIN GENERATED keys -->\n| old |\n<!-- END GENERATED keys -->\nend\n"
    rewritten = gen.rewrite(page, "keys", keys_table())
    assert gen.generated_block(rewritten, "keys") == keys_table() + "\n"
    assert rewritten.startswith("intro\n") and rewritten.endswith("-->\nend\n")
    with pytest.raises(ValueError, match="no generated block 'models'"):
        gen.generated_block(page, "models")


@pytest.mark.slow
def test_cli_lists_methods_models_and_keys(capsys):
    assert main(["methods"]) == 0
    assert "`random_permutation`, `random_permutation_t`" in capsys.readouterr().out
    assert main(["models"]) == 0
    assert "`resnet20`" in capsys.readouterr().out
    assert main(["keys"]) == 0
    assert "\nalign\n" in capsys.readouterr().out
    assert main(["keys", "--markdown"]) == 0
    assert "`align`" in capsys.readouterr().out
    help_text = subprocess.run(
        [sys.executable, "-m", "fedlmc.simulations.cli", "run", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "random_permutation_t" in re.sub(r"\s+", "", help_text)


# ----------------------------------------------------------------------------- control


def test_random_permutation_scrambles_every_client_but_the_first_functionally_unchanged():
    template, states = tiny_states(3)
    x = torch.randn(16, 1, 4, 4)
    merged, aligned = merge_states("random_permutation", template, states, seed=7)
    assert aligned[0] is states[0] or all(torch.equal(aligned[0][k], states[0][k]) for k in merged)
    for original, scrambled in zip(states[1:], aligned[1:], strict=True):
        assert not torch.equal(
            original["hidden.0.linear.weight"], scrambled["hidden.0.linear.weight"]
        )
        before = predict_logits(load_state(template, original), x)
        after = predict_logits(load_state(template, scrambled), x)
        assert torch.allclose(before, after, atol=1e-5)
    again, _ = merge_states("random_permutation", template, states, seed=7)
    other, _ = merge_states("random_permutation", template, states, seed=8)
    assert all(torch.equal(merged[k], again[k]) for k in merged)
    assert not all(torch.equal(merged[k], other[k]) for k in merged)
    plain, _ = merge_states("average", template, states)
    assert not torch.equal(plain["hidden.0.linear.weight"], merged["hidden.0.linear.weight"])


def test_random_permutation_is_undone_by_weight_matching():
    """Two copies of one model: weight matching merges them back into the model; the scrambled
    control mixes unrelated units (the LMC literature's lower reference)."""
    template, states = tiny_states(1)
    copies = [states[0], dict(states[0])]
    scrambled, aligned = merge_states("random_permutation", template, copies, seed=1)
    matched, _ = merge_states("weight_matching", template, [copies[0], aligned[1]])
    assert all(torch.allclose(matched[k], states[0][k], atol=1e-6) for k in matched)
    assert not torch.allclose(
        scrambled["hidden.0.linear.weight"], states[0]["hidden.0.linear.weight"]
    )


def test_an_entry_of_another_signature_is_named_with_what_it_takes():
    """What a config names by import path must be called the way fedlmc calls it: a merge
    function as ``f(job)``, a model factory as ``f(width, num_classes, in_shape, norm)``."""
    import json
    import os

    from fedlmc.registry import signature_problem

    factory = ("width", "num_classes", "in_shape", "norm")
    assert signature_problem(lambda job: job, ("job",)) is None
    assert signature_problem(lambda job, *, scale=1.0: job, ("job",)) is None
    assert signature_problem(lambda width, num_classes, in_shape, norm, **o: 0, factory) is None
    assert signature_problem(os.system, ("job",)) == "it takes (command)"
    assert signature_problem(json.dumps, ("job",)).startswith("it takes (obj, *, skipkeys")
    assert signature_problem(lambda *args, timeout=None: 0, factory) == (
        "it takes (*args, timeout=None)"
    )  # the shape of a process launcher's call
    assert signature_problem(lambda job, extra: 0, ("job",)) == (
        "it takes (job, extra): extra has no default"
    )
    assert signature_problem(lambda job, *more: 0, ("job",)) == (
        "it takes (job, *more): *more as well"
    )
    assert "cannot be read" in signature_problem(min, ("job",))  # no signature in Python 3.11


def test_a_registry_runs_its_loader_once_before_the_first_use():
    calls = []
    registry: Registry[int] = Registry("thing", load=lambda: calls.append(registry.add("a", 1)))
    assert calls == []  # nothing loaded at creation
    registry.add("b", 2)  # a registration comes after the built-ins
    assert registry.names() == ("a", "b") and len(calls) == 1
    assert "a" in registry and registry.get("b") == 2 and len(registry) == 2
    assert len(calls) == 1
