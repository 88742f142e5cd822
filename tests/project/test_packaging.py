"""How fedlmc installs: the Flower layer's folders become fedlmc.strategies / fedlmc.simulations,
from a wheel, from a source tree and from a copied app folder (what a SuperNode unpacks)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fedlmc._app_folders import APP_FOLDERS, AppFolderFinder, sibling_app_root

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("fedlmc", *APP_FOLDERS)
PROBE = (
    "import sys, fedlmc.simulations.config as c, fedlmc.strategies.base as b\n"
    "print(c.__file__); print(b.__file__)\n"
    "print(sorted(n for n in ('simulations', 'strategies') if n in sys.modules))"
)


def copy_project(dest: Path) -> Path:
    """The files a wheel or a Flower app bundle is made of, without the repository's build dirs."""
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    for folder in SOURCES:
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def source_packages() -> set[str]:
    """Installed names of every source folder with an ``__init__.py``."""
    names = set()
    for folder in SOURCES:
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT).parts
            names.add(".".join(("fedlmc",) * (parts[0] != "fedlmc") + parts))
    return names


def probe(cwd: Path, pythonpath: Path) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(pythonpath)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


@pytest.mark.slow
def test_the_wheel_holds_only_fedlmc_with_every_subpackage(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "project")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + [str(project), "-w", str(tmp_path / "dist")],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("fedlmc-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path / "site")
    assert {name.split("/")[0] for name in names if not name.startswith("fedlmc-")} == {"fedlmc"}
    installed = {str(Path(n).parent).replace("/", ".") for n in names if n.endswith("__init__.py")}
    assert installed == source_packages()
    config, base, shadowing = probe(tmp_path, tmp_path / "site")
    assert Path(config).is_relative_to(tmp_path / "site" / "fedlmc" / "simulations")
    assert Path(base).is_relative_to(tmp_path / "site" / "fedlmc" / "strategies")
    assert shadowing == "[]"


@pytest.mark.slow
def test_a_copied_app_folder_imports_its_own_flower_layer(tmp_path: Path) -> None:
    app = copy_project(tmp_path / "app")
    config, base, shadowing = probe(app, app)
    assert Path(config) == app / "simulations" / "config" / "__init__.py"
    assert Path(base) == app / "strategies" / "base.py"
    assert shadowing == "[]"


def test_only_a_project_root_with_both_folders_is_mounted(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "fedlmc").mkdir(parents=True)
    for name in APP_FOLDERS:  # a user's own top-level packages of the same names
        (site / name).mkdir()
        (site / name / "__init__.py").write_text("")
    assert sibling_app_root(site / "fedlmc") is None  # no pyproject.toml: site-packages
    (site / "pyproject.toml").write_text('[project]\nname = "their-app"\n')
    assert sibling_app_root(site / "fedlmc") is None  # another project's folders
    (site / "pyproject.toml").write_text('[project]\nname = "fedlmc"\n')
    assert sibling_app_root(site / "fedlmc") == site
    (site / "fedlmc" / "strategies").mkdir()  # installed subpackage: never look beside
    assert sibling_app_root(site / "fedlmc") is None


@pytest.mark.parametrize(
    "name", ["fedlmc.data", "fedlmc.strategies.base", "strategies", "x.strategies"]
)
def test_the_finder_answers_for_the_two_app_packages_only(name: str) -> None:
    assert AppFolderFinder(ROOT).find_spec(name) is None


def test_the_finder_points_at_the_folder_beside_fedlmc() -> None:
    spec = AppFolderFinder(ROOT).find_spec("fedlmc.simulations")
    assert Path(spec.origin) == ROOT / "simulations" / "__init__.py"
    assert spec.submodule_search_locations == [str(ROOT / "simulations")]
