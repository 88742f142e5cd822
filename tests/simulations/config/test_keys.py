"""The key table (:mod:`fedlmc.simulations.config.keys`): every key's default passes its own
check, the model options sit after ``width``, and the runtime keys are the ones declared so."""

from __future__ import annotations

from fedlmc.simulations.config.keys import (
    MODEL_OPTIONS_AFTER,
    RUN_KEYS,
    run_schema,
    runtime_keys,
)
from fedlmc.simulations.config.schema import check_value


def test_every_default_passes_its_own_check():
    schema = run_schema()
    for name, key in schema.items():
        assert check_value(name, key.default, schema) == key.default, name


def test_every_key_has_a_one_line_meaning():
    for name, key in run_schema().items():
        assert key.doc and "\n" not in key.doc, name


def test_the_model_options_follow_width_and_are_not_in_run_keys():
    names = list(run_schema())
    options = [n for n in names if n not in RUN_KEYS]
    assert options and "base-hidden" in options
    after = names.index(MODEL_OPTIONS_AFTER)
    assert names[after + 1 : after + 1 + len(options)] == options
    assert [n for n in names if n in RUN_KEYS] == list(RUN_KEYS)  # documentation order kept


def test_runtime_keys_are_exactly_those_declared_runtime():
    schema = run_schema()
    runtime = runtime_keys()
    assert set(runtime) == {n for n, k in schema.items() if k.runtime}
    assert {"device", "num-cpus", "data-root"} <= set(runtime)
    assert not {"seed", "model", "methods"} & set(runtime)
