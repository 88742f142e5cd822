"""A griffe extension: the short paths of fedlmc's packages as aliases the docs can link to.

fedlmc's packages re-export their main names lazily (``_EXPORTS`` tables read by a module
``__getattr__``, so that ``import fedlmc.data`` loads no torch), which griffe's static reading
cannot see. Once ``fedlmc`` is loaded (and the Flower layer attached, ``griffe_app_folders``),
each package's table is read by importing the package itself, which imports nothing heavy, and
every entry becomes an alias of the object it names: ``fedlmc.data.load_dataset`` then links to
``fedlmc.data.loading.load_dataset``.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import griffe


class LazyExports(griffe.Extension):
    """Add an alias for every entry of every fedlmc package's ``_EXPORTS`` table."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "fedlmc":
            return
        for module in _packages(pkg):
            exports = getattr(importlib.import_module(module.path), "_EXPORTS", {})
            for name, home in exports.items():
                target = importlib.util.resolve_name(home, module.path)
                if name not in module.members:
                    module.set_member(name, griffe.Alias(name, f"{target}.{name}"))


def _packages(module: griffe.Module):
    if module.is_init_module:
        yield module
    for member in module.members.values():
        if not member.is_alias and member.is_module:
            yield from _packages(member)
