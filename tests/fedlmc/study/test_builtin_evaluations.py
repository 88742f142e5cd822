"""The built-in merge methods' evaluation policies (fedlmc.study.builtin_evaluations): each
names a registered method, and each says what the method's registration said before the policy
moved out of it (the results columns, the docs tables and the secure checks read them)."""

from __future__ import annotations

from fedlmc.merging.alignment_record import ALIGNMENT_COLUMNS
from fedlmc.merging.method_registry import METHODS
from fedlmc.study.method_policy import EVALUATIONS, evaluation_of


def test_every_built_in_policy_names_a_registered_method():
    assert set(EVALUATIONS.names()) <= set(METHODS.names())


def test_the_policies_of_the_paths_the_counterparts_and_the_columns():
    off_path = {m.name for m in METHODS if not evaluation_of(m.name).on_path}
    assert {"random_direction", "preserve_first", "fisher", "krum", "task_arithmetic"} <= off_path
    assert not {"average", "weight_matching", "ot_fusion", "cca_merge"} & off_path
    twins = {m.name: evaluation_of(m.name).counterpart_of for m in METHODS}
    assert {k: v for k, v in twins.items() if v} == {
        "embed_average": "average",
        "embed_weight_matching": "weight_matching",
    }
    assert evaluation_of("weight_matching").columns == ALIGNMENT_COLUMNS
    assert evaluation_of("average").columns == ()
