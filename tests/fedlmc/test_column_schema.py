"""fedlmc.column_schema: a column declaration refuses a bad name, kind, source or report section,
and ``check_unique`` names the first column declared twice."""

from __future__ import annotations

import pytest

from fedlmc.column_schema import KINDS, REPORT_SECTIONS, SOURCES, Column, check_unique


def test_a_valid_column_keeps_its_fields_and_says_whether_it_holds_text():
    number = Column("acc", "accuracy", "every row", "mean of correct")
    assert (number.kind, number.source, number.report_table) == ("number", "row", "")
    assert not number.is_string
    for kind in ("text", "JSON"):
        assert Column("x", "m", "a", "d", kind=kind).is_string


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "not an identifier"}, "allowed: a Python identifier"),
        ({"kind": "float"}, "kind = 'float'; allowed: 'number', 'text', 'JSON'"),
        ({"source": "client"}, "source = 'client'; allowed: 'row'"),
        ({"report_table": "nowhere"}, "report_table = 'nowhere'; allowed: ''"),
        ({"methods": "every"}, "methods = 'every'; allowed: '', 'on_path', 'template_shaped'"),
    ],
)
def test_a_bad_field_is_refused_with_its_value_and_what_is_allowed(fields, message):
    args = {"name": "ok", "measures": "m", "applies": "a", "definition": "d", **fields}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Column(**args)


def test_every_declared_kind_source_and_section_is_accepted():
    for kind in KINDS:
        for source in SOURCES:
            for section in ("", *REPORT_SECTIONS):
                Column("c", "m", "a", "d", kind=kind, source=source, report_table=section)


def test_check_unique_names_the_first_duplicate_and_accepts_distinct_names():
    a, b = Column("a", "m", "x", "d"), Column("b", "m", "x", "d")
    check_unique([a, b])
    with pytest.raises(ValueError, match="column 'b' is declared twice"):
        check_unique([a, b, Column("c", "m", "x", "d"), Column("b", "other", "y", "e")])
