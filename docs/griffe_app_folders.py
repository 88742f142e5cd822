"""A griffe extension: document ``strategies/`` and ``simulations/`` as ``fedlmc.strategies`` and
``fedlmc.simulations``, the names they install as (``pyproject.toml``'s ``package-dir``).

Griffe reads packages from their folders, and these two folders sit beside ``fedlmc/`` rather
than inside it; once ``fedlmc`` is loaded, each folder is loaded as a package and attached to it.
"""

from __future__ import annotations

from typing import Any

import griffe

APP_FOLDERS = ("strategies", "simulations")


class AppFolders(griffe.Extension):
    """Attach the Flower layer's packages to ``fedlmc`` as soon as ``fedlmc`` is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "fedlmc":
            return
        for name in APP_FOLDERS:
            module = loader.load(name, try_relative_path=False)
            del loader.modules_collection.members[name]
            pkg.set_member(name, module)
