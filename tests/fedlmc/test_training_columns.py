"""fedlmc.training_columns: the ``training.csv`` table, its key/metric split and its docs table."""

from __future__ import annotations

import pytest

from fedlmc.training_columns import (
    KEY_COLUMNS,
    METRIC_COLUMNS,
    PHASES,
    TRAINING_COLUMNS,
    TrainingColumn,
    training_columns_markdown,
)


def test_the_keys_come_first_and_keys_and_metrics_partition_the_columns():
    names = [c.name for c in TRAINING_COLUMNS]
    assert len(set(names)) == len(names)
    assert KEY_COLUMNS == ("phase", "client", "step")
    assert tuple(names) == KEY_COLUMNS + METRIC_COLUMNS
    assert METRIC_COLUMNS and all(c.kind == "number" for c in TRAINING_COLUMNS[3:])


def test_every_column_applies_to_a_declared_phase():
    for column in TRAINING_COLUMNS:
        assert any(f"`{phase}`" in column.applies for phase in PHASES), column.name


def test_the_docs_table_has_one_row_per_column_with_no_stray_pipe():
    lines = training_columns_markdown().splitlines()
    assert lines[:2] == ["| column | kind | phase | definition |", "|---|---|---|---|"]
    assert len(lines) == 2 + len(TRAINING_COLUMNS)
    for line, column in zip(lines[2:], TRAINING_COLUMNS, strict=True):
        assert line.startswith(f"| `{column.name}` | {column.kind} |")
        assert line.count("|") == 5


@pytest.mark.parametrize(("name", "kind"), [("bad name", "text"), ("ok", "float")])
def test_a_bad_name_or_kind_is_refused(name, kind):
    with pytest.raises(ValueError, match=repr(name)):
        TrainingColumn(name, kind, "`client_epoch`", "d")
