"""A run resolved once (:mod:`fedlmc.simulations.config.run_plan`): the mode, the merge
methods, the strategy options and the client plan, read from the validated config once."""

from __future__ import annotations

import dataclasses

import pytest

from fedlmc.simulations.config import ConfigError, validate_run_config
from fedlmc.simulations.config.run_plan import RunPlan, plan_run
from fedlmc.simulations.config.values import Mode
from fedlmc.strategies.fedavg import FedAvgBaseline
from fedlmc.strategies.protocol import HOLDOUT_SHARE_KEY, KEEP_MODEL_KEY

ALIGNED = {"strategy": "aligned", "align": "weight_matching", "calibration": "federated"}


def test_an_aligned_plan_names_its_method_and_gives_its_clients_the_holdout_share():
    plan = plan_run({**ALIGNED, "calibration-holdout": 0.2})
    assert plan.mode is Mode.ALIGNED
    assert plan.align_method == plan.merge_method == "weight_matching"
    assert plan.compare_methods == () and not plan.runs_fedavg
    assert plan.client.holdout_share == 0.2 and plan.client.federated_calibration
    assert plan.strategy_options.holdout_share == 0.2
    assert plan.strategy_options.calibration == "federated"
    assert plan.strategy_options.client_holdout == 0.2
    assert plan.config["calibration-holdout"] == 0.2


def test_a_compare_plan_holds_its_rows_its_study_and_what_its_clients_keep():
    methods = "average,fisher,fedavg"
    plan = plan_run({"strategy": "compare", "methods": methods, "lambdas": 7, "seed": 3})
    assert plan.mode is Mode.COMPARE and plan.align_method is None
    assert plan.compare_methods == ("average", "fisher") and plan.runs_fedavg
    assert (plan.study.lambdas, plan.study.seed) == (7, 3)
    assert plan.client.queried_methods == ("fisher",) and plan.client.keeps_model
    assert plan.strategy_options.clients_keep_models
    assert plan.strategy_options.calibration == "none"  # the study calibrates afterwards
    assert plan.client.holdout_share == 0.0  # federated calibration is a one-shot mode's
    plain = plan_run({"strategy": "compare", "methods": "average,ensemble"})
    assert not plain.client.keeps_model and not plain.runs_fedavg


def test_the_plan_is_frozen_and_its_config_and_options_read_only():
    plan = plan_run(ALIGNED)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.mode = Mode.AVERAGE  # type: ignore[misc]
    with pytest.raises(TypeError):
        plan.config["align"] = "average"  # type: ignore[index]
    with pytest.raises(TypeError):
        plan.method_options["cca_ridge"] = 1.0  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.client.holdout_share = 0.5  # type: ignore[misc]


def test_planning_an_invalid_config_raises_the_one_line_error():
    with pytest.raises(ConfigError) as error:
        plan_run({"strategy": "aligned", "align": "weight_matchng"})
    text = str(error.value)
    assert "'weight_matchng'" in text and "weight_matching" in text and "\n" not in text
    with pytest.raises(ConfigError, match="strategy"):
        plan_run({"strategy": "fed_avg"})


def test_a_validated_config_is_planned_as_it_is():
    config = validate_run_config(ALIGNED, check_devices=False)
    plan = plan_run(config)
    assert isinstance(plan, RunPlan) and plan.config is config


def test_the_fedavg_options_derive_from_the_one_strategy_options():
    plan = plan_run({**ALIGNED, "init": "shared", "warmup-rounds": 1, "timeout": 42})
    fedavg = plan.fedavg_options
    one_shot = plan.strategy_options
    assert fedavg == one_shot.replace(
        calibration="none", keep_client_states=False, clients_keep_models=False
    )
    assert fedavg.wait_timeout == one_shot.wait_timeout == 42
    assert fedavg.robust == one_shot.robust and fedavg.client_check == one_shot.client_check
    assert fedavg.holdout_share == 0.1  # held out in the warm-up rounds too: never trained on
    sent = FedAvgBaseline(fedavg, total_epochs=1, num_rounds=1).round_config(1, {})
    assert sent[HOLDOUT_SHARE_KEY] == 0.1 and KEEP_MODEL_KEY not in sent
