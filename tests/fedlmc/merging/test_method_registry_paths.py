"""Merge methods named by import path
(:func:`fedlmc.merging.method_registry.resolve_method_entry`): an entry
``package.module:name`` resolves to the method it registers or to a merge function."""

from __future__ import annotations

import pytest

from fedlmc.merging.method_registry import (
    METHODS,
    check_merge_function,
    is_method_path,
    resolve_method_entry,
)
from fedlmc.models.registry import MODEL_ALLOW_VARIABLE

MODULE = '''
from fedlmc.merging.merge_job import Alignment


def first_client(job):
    """The merge is client 0 (every client replaced by it)."""
    return Alignment([job.states[0]] * len(job.states))


def needs_two(job, other):
    return Alignment(list(job.states))
'''


@pytest.fixture
def module(tmp_path, monkeypatch):
    """A module of merge functions on ``sys.path``, its registrations removed afterwards."""
    name = f"hook_merges_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(MODEL_ALLOW_VARIABLE, raising=False)
    yield name
    if "first_client" in METHODS:
        METHODS.remove("first_client")


def test_a_registered_name_is_no_import_path():
    assert not is_method_path("weight_matching")
    assert is_method_path("package.module:merge")
    assert resolve_method_entry("weight_matching_t") == "weight_matching_t"


def test_a_merge_function_is_registered_once_and_its_t_row_named(module):
    assert "first_client" not in METHODS
    assert resolve_method_entry(f"{module}:first_client") == "first_client"
    assert METHODS.get("first_client").description == f"user merge function {module}:first_client"
    # a second resolution, and the _t row of the same function, find the registered method
    assert resolve_method_entry(f"{module}:first_client") == "first_client"
    assert resolve_method_entry(f"{module}:first_client_t") == "first_client_t"


def test_a_function_not_called_as_merge_job_is_refused(module):
    with pytest.raises(ValueError, match=r"needs_two.*other.*allowed: a function merge\(job\)"):
        resolve_method_entry(f"{module}:needs_two")
    with pytest.raises(ValueError, match=r"merge method .os:system.: it takes \(command\)"):
        check_merge_function("os:system", __import__("os").system)


def test_the_allow_list_decides_which_paths_may_be_imported(module, monkeypatch):
    monkeypatch.setenv(MODEL_ALLOW_VARIABLE, "other.module:*")
    with pytest.raises(ValueError, match=f"is not allowed here; allowed .*{MODEL_ALLOW_VARIABLE}"):
        resolve_method_entry(f"{module}:first_client")
    monkeypatch.setenv(MODEL_ALLOW_VARIABLE, f"{module}:*")
    assert resolve_method_entry(f"{module}:first_client") == "first_client"


def test_a_file_path_is_refused_naming_what_is_allowed():
    with pytest.raises(ValueError, match="allowed: 'package.module:function'"):
        resolve_method_entry("merges/mine.py:merge")
