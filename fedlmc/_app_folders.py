"""Mount the Flower layer's folders, ``strategies/`` and ``simulations/``, as ``fedlmc.strategies``
and ``fedlmc.simulations`` when they sit beside ``fedlmc/``.

The product's design keeps the three folders side by side at the project's root. Installed from
a wheel they are real subpackages of ``fedlmc`` (``pyproject.toml`` maps them with setuptools'
``package-dir``), so site-packages holds no top-level ``strategies`` or ``simulations`` to collide
with a user's own. In a source tree, a worktree on ``PYTHONPATH`` or a Flower app bundle (FAB)
unpacked by a SuperNode, ``fedlmc/`` is imported from the folder itself and the siblings are
found by a meta-path finder that knows only those two names, so the same import names work
everywhere.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import tomllib
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path

APP_FOLDERS = ("strategies", "simulations")


def sibling_app_root(package_dir: Path) -> Path | None:
    """The project root beside ``package_dir`` when it holds the app folders, else None.

    A root counts only if its ``pyproject.toml`` is fedlmc's (``[project] name = "fedlmc"``),
    every app folder is a package, and the installed subpackages are absent: an installed
    ``fedlmc`` never looks at its neighbours in site-packages, and a vendored copy never mounts
    another project's folders.
    """
    root = package_dir.parent
    if any((package_dir / name).is_dir() for name in APP_FOLDERS):
        return None
    if _project_name(root / "pyproject.toml") != "fedlmc":
        return None
    if not all((root / name / "__init__.py").is_file() for name in APP_FOLDERS):
        return None
    return root


def _project_name(pyproject: Path) -> str | None:
    """``[project] name`` of ``pyproject``; None when the file is missing or unreadable."""
    try:
        return tomllib.loads(pyproject.read_text()).get("project", {}).get("name")
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None


class AppFolderFinder(importlib.abc.MetaPathFinder):
    """Finds exactly ``fedlmc.strategies`` and ``fedlmc.simulations`` in ``root``; nothing else."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> ModuleSpec | None:
        package, _, name = fullname.partition(".")
        if package != "fedlmc" or name not in APP_FOLDERS:
            return None
        folder = self.root / name
        return importlib.util.spec_from_file_location(
            fullname, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )


def mount_app_folders(package_path: Sequence[str]) -> None:
    """Put an :class:`AppFolderFinder` first on ``sys.meta_path`` when the package at
    ``package_path`` has the app folders beside it (:func:`sibling_app_root`).

    First, so that a source tree on ``PYTHONPATH`` wins over an editable install elsewhere, as it
    does for ``fedlmc`` itself. Their submodules then resolve through the ordinary path finder.
    """
    for entry in package_path:
        root = sibling_app_root(Path(entry))
        if root is not None:
            sys.meta_path.insert(0, AppFolderFinder(root))
            return
