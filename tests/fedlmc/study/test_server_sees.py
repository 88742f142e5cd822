"""`server_sees` (fedlmc.study.server_sees): every merge method's declaration (its evaluation
policy, fedlmc.study.method_policy), the results
column, the methods table, and the run-config refusal of a secure-aggregation cell whose merge
needs more than a sum (simulations/config/secure.py). In process, no Flower run."""

from __future__ import annotations

import pytest

from fedlmc.merging.merge_job import Alignment
from fedlmc.merging.method_registry import METHODS, register_method
from fedlmc.simulations.cli import main
from fedlmc.simulations.config import validate_run_config
from fedlmc.simulations.config.schema import ConfigError
from fedlmc.simulations.config.secure import secure_methods
from fedlmc.simulations.config.tables import methods_table
from fedlmc.strategies.secure_forms import runs_securely, secure_form
from fedlmc.study.method_policy import EVALUATIONS, evaluation_of, register_evaluation
from fedlmc.study.rows import empty_row
from fedlmc.study.server_sees import DEFAULT_SERVER_SEES, SERVER_SEES

SECURE = {"num-clients": 3, "secure-aggregation": "secagg+"}


def test_every_method_declares_a_known_value_and_only_sum_rules_say_sum():
    declared = {m.name: evaluation_of(m.name).server_sees for m in METHODS}
    assert set(declared.values()) <= set(SERVER_SEES)
    assert {m for m, v in declared.items() if v == "sum"} == {
        "average",
        "average_lewc_bias",
        "embed_average",
        "heterofl",
        "fisher",
        "regmean",
        "task_arithmetic",
        "ties",
        "dare",
    }
    for aligning in ("weight_matching", "activation_matching", "merge_many", "auto"):
        assert declared[aligning] == "each model"
    assert declared["average_repair"] == "each model's statistics"
    assert declared["activation_federated"] == "one model and permutations"


def test_a_registration_without_it_gets_each_model_and_a_bad_value_is_refused():
    @register_method("s33_plain", description="test: plain")
    def plain(job) -> Alignment:
        return Alignment(list(job.states))

    try:
        assert evaluation_of("s33_plain").server_sees == DEFAULT_SERVER_SEES == "each model"
        assert empty_row("s33_plain_t", 2)["server_sees"] == "each model"
    finally:
        METHODS.remove("s33_plain")
    with pytest.raises(ValueError, match=r"server_sees = 'a sum'; allowed: 'sum', "):
        register_evaluation("s33_bad", server_sees="a sum")
    assert "s33_bad" not in EVALUATIONS


def test_every_strategy_says_what_it_receives():
    from fedlmc.strategies import AutoMerge, FedAvgBaseline, OneShotAverage
    from fedlmc.strategies import PermutationAlignedAverage as Aligned
    from fedlmc.strategies.private import private_one_shot_average
    from fedlmc.strategies.secure import SumOnlyFedAvg

    for strategy in (OneShotAverage, Aligned, AutoMerge, FedAvgBaseline):
        assert strategy.server_sees == "each model"
    assert SumOnlyFedAvg.server_sees == "sum"
    assert private_one_shot_average(2, 1.0, 1.0).server_sees == "each model"


def test_rows_carry_the_rule_of_their_method():
    assert empty_row("average", 2)["server_sees"] == "sum"
    assert empty_row("average_t", 2)["server_sees"] == "sum"
    assert empty_row("weight_matching_t", 2)["server_sees"] == "each model"
    assert empty_row("ensemble", 2)["server_sees"] == "each model"
    assert empty_row("fedavg", 2)["server_sees"] == "sum"


def test_the_methods_table_has_a_server_sees_column():
    lines = {line.split(" | ")[0]: line for line in methods_table().splitlines()}
    assert lines["| method (rows)"].endswith("| what | server sees |")
    assert lines["| `average`, `average_t`"].endswith("| sum |")
    assert lines["| `merge_many`, `merge_many_t`"].endswith("| each model |")


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"strategy": "aligned", "align": "merge_many"}, "merge method 'merge_many' needs"),
        ({"strategy": "compare", "methods": "average,average_repair_t"}, "'average_repair_t'"),
        ({"strategy": "compare", "methods": "average,average_t"}, "strategy = 'compare'"),
        ({"strategy": "fedavg"}, "strategy = 'fedavg'"),
        ({"strategy": "average", "init": "shared", "warmup-rounds": 1}, "warmup-rounds = 1"),
    ],
)
def test_a_secure_cell_that_needs_more_than_a_sum_is_refused(extra, named):
    with pytest.raises(ConfigError, match="secure-aggregation = 'secagg[+]'") as err:
        validate_run_config({**SECURE, **extra})
    assert named in str(err.value)


def test_the_secure_plain_average_lewc_bias_embed_average_and_heterofl_are_accepted():
    config = validate_run_config({**SECURE, "strategy": "average"})
    assert config["secure-aggregation"] == "secagg+"
    assert validate_run_config({"strategy": "aligned"})["secure-aggregation"] == "off"
    lewc = validate_run_config({**SECURE, "strategy": "aligned", "align": "average_lewc_bias"})
    assert lewc["align"] == "average_lewc_bias"
    mixed = {"strategy": "aligned", "align": "embed_average", "client-widths": "0.5,1,1"}
    assert validate_run_config({**SECURE, **mixed})["align"] == "embed_average"
    hetero = {**mixed, "align": "heterofl", "init": "shared"}
    assert validate_run_config({**SECURE, **hetero})["align"] == "heterofl"


def test_every_sum_rule_runs_securely_or_says_what_it_would_need():
    """No silent mismatch: a method declared ``sum`` either registers its sum exponents (and
    the check accepts it) or a note that the refusal quotes."""
    secure = ("average", "average_lewc_bias", "embed_average", "heterofl", "fisher", "regmean")
    assert secure_methods() == secure
    for entry in METHODS:
        note = secure_form(entry.name).note
        if evaluation_of(entry.name).server_sees == "sum" and not runs_securely(entry.name):
            assert note
            init = "shared" if entry.needs.base else "independent"
            cell = {**SECURE, "strategy": "aligned", "align": entry.name, "init": init}
            with pytest.raises(ConfigError, match="is a sum, but fedlmc does not run it") as err:
                validate_run_config(cell)
            assert f"merge method {entry.name!r}" in str(err.value)
            assert note in str(err.value)
            assert "align = 'average_lewc_bias'" in str(err.value)


def test_a_sum_rule_without_a_secure_form_is_refused_securely():
    @register_method("s33_sum", description="test: a sum without exponents")
    def summed(job) -> Alignment:
        return Alignment(list(job.states))

    register_evaluation("s33_sum", server_sees="sum")
    try:
        assert not runs_securely("s33_sum")
        with pytest.raises(ConfigError, match="it registers no sum_exponents"):
            validate_run_config({**SECURE, "strategy": "aligned", "align": "s33_sum"})
    finally:
        METHODS.remove("s33_sum")
        EVALUATIONS.remove("s33_sum")


def test_fedlmc_validate_refuses_it_on_one_line_with_a_non_zero_status(tmp_path, capsys):
    sweep = tmp_path / "s.toml"
    sweep.write_text(
        'name = "s"\n[run]\nstrategy = "aligned"\nalign = "weight_matching"\nnum-clients = 2\n'
        'secure-aggregation = "secagg+"\n'
    )
    status = main(["validate", str(sweep), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status != 0
    assert len(err) == 1 and "merge method 'weight_matching' needs the server to see" in err[0]
    assert err[0].endswith(
        "allowed: strategy = 'average', or strategy = 'aligned' with align = "
        "'average_lewc_bias' / 'embed_average' / 'heterofl' / 'fisher' / 'regmean'"
    )
    assert not (tmp_path / "out").exists()
