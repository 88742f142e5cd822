"""The suite's order (``tests/conftest.py``, ``pytest_collection_modifyitems``): the files with the
most ``slow`` tests first, so that pytest-xdist's ``--dist loadfile`` starts the long files
early instead of leaving one to run alone at the end; and pytest-xdist's own reordering (most
tests first) is off, or it would undo that order."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import pytest_collection_modifyitems


@dataclass
class FakeItem:
    """What the hook reads of a pytest item: its file and its marks."""

    name: str
    path: Path
    marks: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str):
        return name if name in self.marks else None


def test_files_with_more_slow_tests_come_first_each_file_whole_and_in_its_order():
    items = [
        FakeItem("a1", Path("a.py")),
        FakeItem("a2", Path("a.py")),
        FakeItem("b1", Path("b.py"), {"slow"}),
        FakeItem("c1", Path("c.py"), {"slow"}),
        FakeItem("c2", Path("c.py")),
        FakeItem("c3", Path("c.py"), {"slow"}),
        FakeItem("d1", Path("d.py"), {"slow"}),
        FakeItem("e1", Path("e.py")),
    ]
    pytest_collection_modifyitems(items)
    assert [item.name for item in items] == ["c1", "c2", "c3", "b1", "d1", "a1", "a2", "e1"]


def test_pytest_xdist_keeps_the_suites_order(pytestconfig: pytest.Config):
    if not hasattr(pytestconfig.option, "loadscopereorder"):
        pytest.fail("pytest-xdist is part of the test extra and must be installed")
    assert pytestconfig.option.loadscopereorder is False
