"""fedlmc.columns_metrics: the endpoint, metric, ensemble, temperature and merge-gap families."""

from __future__ import annotations

from fedlmc.columns_metrics import (
    endpoint_family,
    ensemble_family,
    merge_gap_family,
    metric_family,
    temperature_family,
)

FAMILIES = (endpoint_family, metric_family, ensemble_family, temperature_family, merge_gap_family)


def test_the_families_declare_disjoint_unique_names():
    names = [c.name for family in FAMILIES for c in family()]
    assert len(names) == len(set(names))


def test_the_endpoints_are_mean_min_max_accuracy_mean_nll_and_a_json_list_per_client():
    columns = {c.name: c for c in endpoint_family()}
    assert list(columns) == [
        "endpoint_acc_mean",
        "endpoint_acc_min",
        "endpoint_acc_max",
        "endpoint_nll_mean",
        "endpoint_acc_clients",
    ]
    assert columns["endpoint_acc_clients"].kind == "JSON"
    assert {c.kind for n, c in columns.items() if n != "endpoint_acc_clients"} == {"number"}


def test_the_merge_gap_is_accuracy_loss_and_calibrated_loss_in_its_report_section():
    columns = merge_gap_family()
    assert [c.name for c in columns] == [
        "merge_gap_accuracy",
        "merge_gap_loss",
        "merge_gap_loss_calibrated",
    ]
    assert {c.report_table for c in columns} == {"merge gap"}


def test_the_metric_family_holds_the_merges_own_accuracy_nll_and_temperature():
    names = [c.name for c in metric_family()]
    assert names[:4] == ["accuracy", "nll", "ece", "temperature"]
    assert all(c.source == "row" for f in FAMILIES for c in f())


def test_ensemble_agreement_columns_are_averaged_in_the_agreement_section():
    agreement = [c.name for c in ensemble_family() if c.report_table == "agreement"]
    assert agreement and all(n.startswith("agreement_") for n in agreement)
    assert {c.report_table for c in temperature_family()} <= {"", "temperature"}
