"""fedlmc.columns: the one results-column table assembles every family once, in order, with
unique names, every report section filled and the round and provenance columns last."""

from __future__ import annotations

from fedlmc import column_schema, columns_mechanism, columns_metrics
from fedlmc.columns import (
    COMMON_COLUMNS,
    PROVENANCE_COLUMNS,
    REPORT_SECTIONS,
    ROUND_COLUMNS_DECLARED,
    Column,
    check_unique,
)

FAMILIES = (
    columns_metrics.endpoint_family,
    columns_metrics.metric_family,
    columns_metrics.ensemble_family,
    columns_metrics.temperature_family,
    columns_metrics.merge_gap_family,
    columns_mechanism.barrier_family,
    columns_mechanism.client_barrier_family,
    columns_mechanism.lewc_scope_family,
    columns_mechanism.prediction_mean_family,
    columns_mechanism.mechanism_family,
    columns_mechanism.prediction_layer_family,
    columns_mechanism.layer_mechanism_family,
)


def test_the_table_has_unique_names_and_holds_every_family_column_once():
    names = [c.name for c in COMMON_COLUMNS]
    check_unique(COMMON_COLUMNS)
    for family in FAMILIES:
        for column in family():
            assert names.count(column.name) == 1, column.name
            assert column in COMMON_COLUMNS


def test_a_familys_columns_keep_their_order_in_the_table():
    position = {c.name: i for i, c in enumerate(COMMON_COLUMNS)}
    for family in FAMILIES:
        places = [position[c.name] for c in family()]
        assert places == sorted(places), family.__name__


def test_the_row_columns_come_first_then_round_then_provenance():
    sources = [c.source for c in COMMON_COLUMNS]
    tail = (*ROUND_COLUMNS_DECLARED, *PROVENANCE_COLUMNS)
    assert COMMON_COLUMNS[-len(tail) :] == tail
    assert COMMON_COLUMNS[0].name == "method" and sources[: -len(tail)].count("row") > 80
    assert {c.source for c in PROVENANCE_COLUMNS} == {"provenance"}
    assert {c.source for c in ROUND_COLUMNS_DECLARED} <= {"round", "server"}


def test_every_report_section_averages_some_numeric_column():
    for section in REPORT_SECTIONS:
        averaged = [c for c in COMMON_COLUMNS if c.report_table == section]
        assert averaged and not any(c.is_string for c in averaged), section


def test_the_schema_names_are_the_same_objects_here():
    assert Column is column_schema.Column
    assert check_unique is column_schema.check_unique
