"""``calibration = "lewc"`` in the run config (simulations/config/lewc_calibration.py): accepted
where LEWC's temperature is defined, refused in one line elsewhere (by validation and by the
CLI, exit 2, before any work), listed among the calibration key's values, and the note of a run
whose clients share their start."""

from __future__ import annotations

import pytest

from fedlmc.simulations.cli import main
from fedlmc.simulations.config import ConfigError, validate_run_config
from fedlmc.simulations.config.lewc_calibration import lewc_note, uses_lewc

LEWC = {"strategy": "average", "calibration": "lewc"}


@pytest.mark.parametrize(
    "extra",
    [
        {"bias": False},
        {"bias": False, "depth": 1, "num-clients": 8},
        {"bias": False, "init": "shared"},
        {"strategy": "aligned", "align": "average_lewc_bias"},
        {"bias": False, "secure-aggregation": "secagg+"},
        {"strategy": "aligned", "align": "average_lewc_bias", "secure-aggregation": "secagg+"},
        {"model": "vgg11", "norm": "none", "bias": False},
    ],
)
def test_plain_averages_of_norm_free_chains_are_accepted(extra):
    config = validate_run_config({**LEWC, **extra})
    assert config["calibration"] == "lewc" and uses_lewc(config)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({}, "calibration = 'lewc' with bias = true and the plain average"),
        ({"bias": True, "depth": 2}, "bias = true and the plain average"),
        (
            {"strategy": "aligned", "align": "weight_matching", "bias": False},
            "calibration = 'lewc' with align = 'weight_matching': LEWC predicts the logit scale",
        ),
        ({"strategy": "aligned", "align": "auto", "bias": False}, "align = 'auto'"),
        ({"model": "resnet20"}, "calibration = 'lewc' with model = 'resnet20': residual"),
        ({"model": "vit", "bias": False}, "with model = 'vit': residual"),
        ({"model": "vgg11", "bias": False}, "calibration = 'lewc' with norm = 'bn'"),
        ({"bias": False, "norm": "ln"}, "with norm = 'ln'"),
        (
            {"bias": False, "init": "shared", "dp": "server-fixed"},
            "calibration = 'lewc' with dp = 'server-fixed'",
        ),
    ],
)
def test_cells_where_lewc_is_undefined_are_refused_in_one_line(extra, needle):
    with pytest.raises(ConfigError) as refused:
        validate_run_config({**LEWC, **extra})
    message = str(refused.value)
    assert needle in message and "allowed: " in message and "\n" not in message


def test_the_key_does_not_apply_to_compare_or_fedavg():
    for strategy in ("compare", "fedavg"):
        config = validate_run_config({"strategy": strategy, "calibration": "lewc"})
        assert not uses_lewc(config)


def test_the_cli_refuses_with_one_line_and_exit_2_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cases = [
        (["run", "strategy=average", "calibration=lewc"], "bias = true and the plain average"),
        (
            ["run", "strategy=aligned", "align=weight_matching", "bias=false", "calibration=lewc"],
            "align = 'weight_matching'",
        ),
        (["run", "calibration=lwec"], "calibration"),
    ]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("fedlmc: error: ") and err.count("\n") == 1, err
        assert needle in err
    assert list(tmp_path.iterdir()) == []


def test_the_key_lists_lewc_among_its_values(capsys):
    assert main(["keys", "calibration"]) == 0
    out = capsys.readouterr().out
    assert "server, federated, lewc, none" in " ".join(out.split())


def test_a_shared_start_gets_a_note_and_an_independent_one_none():
    shared = validate_run_config({**LEWC, "bias": False, "init": "shared"})
    independent = validate_run_config({**LEWC, "bias": False})
    assert "one basin" in lewc_note(shared) and "T = 1" in lewc_note(shared)
    assert lewc_note(independent) is None
    assert lewc_note(validate_run_config({"init": "shared"})) is None
