"""fedlmc._app_folders: the sibling ``strategies/`` and ``simulations/`` folders are mounted as
``fedlmc.strategies`` / ``fedlmc.simulations`` only beside fedlmc's own project root."""

from __future__ import annotations

import sys
from pathlib import Path

from fedlmc._app_folders import (
    APP_FOLDERS,
    AppFolderFinder,
    mount_app_folders,
    sibling_app_root,
)


def project(tmp_path: Path, name: str = "fedlmc", folders=APP_FOLDERS) -> Path:
    (tmp_path / "pyproject.toml").write_text(f'[project]\nname = "{name}"\n')
    (tmp_path / "fedlmc").mkdir()
    for folder in folders:
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text(f"WHERE = {folder!r}\n")
    return tmp_path / "fedlmc"


def test_the_root_is_found_beside_fedlmcs_own_project(tmp_path):
    assert sibling_app_root(project(tmp_path)) == tmp_path


def test_another_projects_folders_are_never_mounted(tmp_path):
    assert sibling_app_root(project(tmp_path, name="someone_else")) is None


def test_a_missing_app_folder_or_an_installed_subpackage_means_no_root(tmp_path):
    (tmp_path / "a").mkdir()
    assert sibling_app_root(project(tmp_path / "a", folders=("strategies",))) is None
    (tmp_path / "b").mkdir()
    installed = project(tmp_path / "b")
    (installed / "simulations").mkdir()
    assert sibling_app_root(installed) is None


def test_an_unreadable_pyproject_means_no_root(tmp_path):
    package = project(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project\nname = ")
    assert sibling_app_root(package) is None


def test_the_finder_knows_exactly_the_two_app_folders(tmp_path):
    project(tmp_path)
    finder = AppFolderFinder(tmp_path)
    spec = finder.find_spec("fedlmc.strategies")
    assert spec.origin == str(tmp_path / "strategies" / "__init__.py")
    assert spec.submodule_search_locations == [str(tmp_path / "strategies")]
    assert finder.find_spec("fedlmc.data") is None
    assert finder.find_spec("strategies") is None
    assert finder.find_spec("fedlmc.simulations.cli") is None


def test_mounting_puts_the_finder_first_only_for_a_project_root(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    before = len(sys.meta_path)
    mount_app_folders([str(tmp_path / "nowhere")])
    assert len(sys.meta_path) == before
    mount_app_folders([str(project(tmp_path))])
    assert isinstance(sys.meta_path[0], AppFolderFinder)
    assert sys.meta_path[0].root == tmp_path
