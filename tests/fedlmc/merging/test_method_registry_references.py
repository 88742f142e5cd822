"""The reference ensembles as rows a reader can tell apart (issue 53 item 2): the equal-weight
and the per-member calibrated ensemble beside the sample-count-weighted one, in the registry
(rows a study reports by default, ``fedlmc methods``, the run config's default ``methods``),
each needing every model, so that SecAgg+ refuses them as it refuses ``ensemble``."""

from __future__ import annotations

import pytest

from fedlmc.merging.method_registry import REFERENCE_METHODS, study_methods
from fedlmc.simulations.cli import main
from fedlmc.simulations.config import ConfigError, run_schema, validate_run_config
from fedlmc.simulations.config.tables import methods_table
from fedlmc.study.context import default_methods
from fedlmc.study.rows import empty_row
from fedlmc.study.server_sees import REFERENCE_SERVER_SEES

NEW = ("ensemble_equal", "ensemble_calibrated")


def test_the_three_probability_ensembles_are_reference_rows_of_every_study():
    assert set(NEW) < set(REFERENCE_METHODS)
    for count in (1, 2, 8):
        assert set(REFERENCE_METHODS) <= set(default_methods(count))
    assert set(REFERENCE_METHODS) <= set(study_methods())
    assert "equal-weight" in REFERENCE_METHODS["ensemble_equal"]
    assert "own temperature" in REFERENCE_METHODS["ensemble_calibrated"]
    assert "sample-count-weighted" in REFERENCE_METHODS["ensemble"]


def test_fedlmc_methods_names_and_describes_each_ensemble(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    lines = {line.split(" | ")[0]: line for line in methods_table().splitlines()}
    for name, text in REFERENCE_METHODS.items():
        assert f"| `{name}`" in lines and text in lines[f"| `{name}`"]
        assert f"`{name}`" in out and text.split(",")[0] in " ".join(out.split())
    assert lines["| `ensemble_calibrated`"].startswith("| `ensemble_calibrated` | server split")
    assert lines["| `ensemble_equal`"].startswith("| `ensemble_equal` | none")


def test_the_default_methods_key_includes_every_probability_ensemble():
    default = run_schema()["methods"].default.split(",")
    assert {"ensemble", *NEW} <= set(default)


@pytest.mark.parametrize("name", ["ensemble", *NEW, "logit_ensemble"])
def test_every_reference_row_needs_each_model_and_secagg_refuses_it_like_ensemble(name):
    assert REFERENCE_SERVER_SEES[name] == "each model"
    assert empty_row(name, 2)["server_sees"] == "each model"
    with pytest.raises(ConfigError, match=f"'{name}' needs the server to see each model"):
        validate_run_config(
            {"strategy": "compare", "methods": f"average,{name}", "secure-aggregation": "secagg+"},
            check_devices=False,
        )
