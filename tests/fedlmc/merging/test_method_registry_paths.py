"""Merge methods named by import path
(:func:`fedlmc.merging.method_registry.resolve_method_entry`): an entry
``package.module:name`` resolves to the method it registers or to a merge function."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedlmc.merging.method_registry import (
    METHODS,
    check_merge_function,
    is_method_path,
    resolve_method_entry,
)
from fedlmc.models.registry import MODEL_ALLOW_VARIABLE

ROOT = Path(__file__).resolve().parents[3]

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


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """A user's folder holding ``my_merges_<id>.py``, the current folder, and not on
    ``sys.path`` (as under the ``fedlmc`` console script, whose ``sys.path[0]`` is its bin
    folder); the module's registrations removed afterwards."""
    name = f"my_merges_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    here = {"", ".", str(tmp_path)}
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in here])
    monkeypatch.delenv(MODEL_ALLOW_VARIABLE, raising=False)
    yield name
    if "first_client" in METHODS:
        METHODS.remove("first_client")


def test_a_module_in_the_current_folder_is_found_as_python_m_finds_it(user_folder, tmp_path):
    assert resolve_method_entry(f"{user_folder}:first_client") == "first_client"
    # the folder is on sys.path as an absolute path: Ray's workers, started elsewhere, get it
    assert str(tmp_path) in sys.path


def test_a_module_that_still_does_not_import_names_pythonpath(user_folder, tmp_path):
    with pytest.raises(ValueError) as refused:
        resolve_method_entry("no_such_merges:first_client")
    line = str(refused.value)
    assert "\n" not in line
    assert "No module named 'no_such_merges'" in line
    assert str(tmp_path) in line and "PYTHONPATH" in line


def test_the_allow_list_still_applies_to_the_current_folder(user_folder, monkeypatch):
    monkeypatch.setenv(MODEL_ALLOW_VARIABLE, "other.module:*")
    with pytest.raises(ValueError, match="is not allowed here"):
        resolve_method_entry(f"{user_folder}:first_client")
    assert "first_client" not in METHODS


@pytest.mark.slow
def test_fedlmc_validate_started_in_the_users_folder_resolves_its_module(tmp_path):
    """The CLI as the console script starts it (``-P``: no current folder on ``sys.path``,
    ``PYTHONPATH`` without the user's folder)."""
    (tmp_path / "my_merges.py").write_text(MODULE)
    config = tmp_path / "sweep.toml"
    config.write_text('name = "mine"\n[run]\nmethods = "average,my_merges:first_client"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(MODEL_ALLOW_VARIABLE, None)
    command = [sys.executable, "-P", "-m", "fedlmc.simulations.cli", "validate", str(config)]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "1 cell(s)" in done.stdout
    config.write_text('name = "mine"\n[run]\nmethods = "my_merge:first_client"\n')
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert "No module named 'my_merge'" in done.stderr and "PYTHONPATH" in done.stderr
