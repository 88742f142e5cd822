"""The study's evaluation policy of a merge method (fedlmc.study.method_policy): registered
against the method's name, apart from the method itself; a method registered without one is
evaluated with the defaults. In process, no Flower run."""

from __future__ import annotations

import inspect

import pytest

from fedlmc.columns import Column
from fedlmc.merging.merge_job import Alignment
from fedlmc.merging.method_registry import METHODS, register_method
from fedlmc.study.merge import path_rule
from fedlmc.study.method_policy import (
    EVALUATIONS,
    Evaluation,
    check_info,
    evaluation_of,
    mixed_width_row,
    register_evaluation,
)
from fedlmc.study.rows import empty_row, row_columns

NEEDS_AND_RULE = {
    "name",
    "description",
    "needs_server_data",
    "clients_for_data",
    "needs_clients",
    "needs_base",
    "plain_chain_only",
    "many_clients",
    "min_clients",
    "mixed_widths",
    "combine",
    "builds_model",
    "reestimate_bn",
    "repair",
    "replace",
}


def test_a_method_record_holds_its_needs_and_rule_only():
    assert set(inspect.signature(register_method).parameters) == NEEDS_AND_RULE
    entry = METHODS.get("weight_matching")
    assert not hasattr(entry, "evaluation") and not hasattr(entry, "secure")


@pytest.fixture
def scored():
    """A temporary method that reports a score, and a narrow width's stand-in for it."""

    @register_method("s55_scored", description="test: plain average with a score")
    def scored_align(job) -> Alignment:
        return Alignment(list(job.states), info={"s55_score": 1.0})

    register_method("s55_mixed", description="test: mixed", mixed_widths=True)(scored_align)
    yield "s55_scored"
    for name in ("s55_scored", "s55_mixed"):
        METHODS.remove(name)
        if name in EVALUATIONS:
            EVALUATIONS.remove(name)


def test_a_method_without_a_policy_gets_the_defaults(scored):
    assert evaluation_of(scored) == Evaluation() == evaluation_of(f"{scored}_t")
    assert evaluation_of(scored).on_path and path_rule(scored, None, None) is not None
    assert empty_row(scored, 2)["server_sees"] == "each model"
    assert mixed_width_row(scored) is None  # no mixed-width method stands in for it
    with pytest.raises(ValueError, match="reports column 's55_score' it does not declare"):
        check_info(scored, {"s55_score": 1.0})


def test_a_registered_policy_reaches_the_path_the_columns_and_the_mixed_width_rows(scored):
    score = Column("s55_score", "a test score", "`s55_scored` rows", "1")
    register_evaluation(scored, on_path=False, columns=(score,), server_sees="sum")
    register_evaluation("s55_mixed", counterpart_of=scored)
    check_info(f"{scored}_t", {"s55_score": 1.0})  # declared: no error
    assert path_rule(scored, None, None) is None
    assert "s55_score" in row_columns() and empty_row(scored, 2)["server_sees"] == "sum"
    assert mixed_width_row(f"{scored}_t") == "s55_mixed_t"
    with pytest.raises(ValueError, match="evaluation policy 's55_scored' is already registered"):
        register_evaluation(scored)
