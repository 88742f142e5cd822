"""Every module has a test module of its name, and every test module names a module.

The test tree mirrors the source folders: ``fedlmc/a/b.py`` is tested in
``tests/fedlmc/a/test_b.py`` or ``tests/fedlmc/a/test_b_<topic>.py`` (``strategies/x.py`` in
``tests/strategies/``, ``simulations/a/b.py`` in ``tests/simulations/a/``). In the other
direction, a test module in those folders is named after a module or a package of its mirror
folder (``test_<name>`` or ``test_<name>_<topic>``). ``tests/project/`` holds the tests of the
project as a whole (layout, docs, packaging, deployments) and is exempt.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("fedlmc", "strategies", "simulations")


def source_modules() -> list[Path]:
    """Every non-package module of the source folders, relative to the repository root."""
    return sorted(
        path.relative_to(ROOT)
        for folder in SOURCE_FOLDERS
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "__init__.py"
    )


def mirrored_test_modules() -> list[Path]:
    """Every test module of the mirrored folders, relative to ``tests/``."""
    tests = ROOT / "tests"
    return sorted(
        path.relative_to(tests)
        for folder in SOURCE_FOLDERS
        for path in (tests / folder).rglob("test_*.py")
    )


def names(module: str, stem: str) -> bool:
    """Whether the test-module stem ``stem`` (``test_b``, ``test_b_topic``) names ``module``."""
    return stem == f"test_{module}" or stem.startswith(f"test_{module}_")


def mirror_tests(module: Path) -> list[Path]:
    """The test modules in ``module``'s mirror folder named after it."""
    folder = ROOT / "tests" / module.parent
    return [p for p in folder.glob("test_*.py") if names(module.stem, p.stem)]


def named_sources(test: Path) -> list[Path]:
    """The modules and packages of ``test``'s mirror source folder that it is named after."""
    folder = ROOT / test.parent
    candidates = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
    candidates += [p for p in folder.iterdir() if (p / "__init__.py").is_file()]
    return [p for p in candidates if names(p.stem, test.stem)]


def test_the_mapping_rules_read_names_as_intended():
    assert names("server_app", "test_server_app")
    assert names("server_app", "test_server_app_failures")
    assert not names("server_app", "test_server_apps")
    assert not names("spec", "test_model_spec")


def test_every_module_has_a_test_module_of_its_name():
    missing = [str(m) for m in source_modules() if not mirror_tests(m)]
    assert not missing, f"{len(missing)} modules without tests/<folder>/test_<name>*.py: {missing}"


def test_every_test_module_names_a_module_or_package():
    orphans = [f"tests/{t}" for t in mirrored_test_modules() if not named_sources(t)]
    assert not orphans, f"test modules naming no module of their mirror folder: {orphans}"
