"""How secure aggregation computes a merge method (fedlmc.strategies.secure_forms): a form
registered against the method's name, only for a ``sum`` rule, checked when registered. In
process, no Flower run."""

from __future__ import annotations

import pytest

from fedlmc.merging.field.field_methods import FISHER_SUMS
from fedlmc.merging.merge_job import Alignment
from fedlmc.merging.method_registry import METHODS, register_method
from fedlmc.merging.sum_form import lewc_bias_exponents, plain_exponents
from fedlmc.strategies.secure_forms import (
    SECURE_FORMS,
    register_secure_form,
    runs_securely,
    secure_form,
)
from fedlmc.study.method_policy import EVALUATIONS, register_evaluation


def test_the_built_in_forms():
    assert secure_form("average_lewc_bias_t").sum_exponents is lewc_bias_exponents
    assert secure_form("fisher").secure_sums is FISHER_SUMS
    assert secure_form("heterofl").divide_by_holders and runs_securely("heterofl")
    assert not runs_securely("task_arithmetic") and "two secure rounds" in secure_form("ties").note
    assert not runs_securely("weight_matching") and not secure_form("weight_matching").built
    assert set(SECURE_FORMS.names()) <= set(METHODS.names())


@pytest.fixture
def plain():
    """A temporary plain average, registered with no policy and no form."""
    register_method("s55_plain", description="test: plain")(lambda job: Alignment(job.states))
    yield "s55_plain"
    METHODS.remove("s55_plain")
    for registry in (EVALUATIONS, SECURE_FORMS):
        if "s55_plain" in registry:
            registry.remove("s55_plain")


def test_a_form_needs_a_sum_rule(plain):
    with pytest.raises(ValueError, match="server_sees = 'each model'; allowed only with server_"):
        register_secure_form(plain, sum_exponents=plain_exponents)
    register_evaluation(plain, server_sees="sum")
    with pytest.raises(ValueError, match="'s55_plain': divide_by_holders without sum_exponents"):
        register_secure_form(plain, sum_exponents=plain_exponents, divide_by_holders=True)
    with pytest.raises(ValueError, match="secure_sums with sum_exponents; allowed: one of them"):
        register_secure_form(plain, sum_exponents=plain_exponents, secure_sums=FISHER_SUMS)
    assert not runs_securely(plain)
    register_secure_form(plain, sum_exponents=plain_exponents)
    assert runs_securely(plain) and runs_securely(f"{plain}_t")
