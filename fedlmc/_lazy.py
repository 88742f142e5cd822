"""Lazy re-exports for packages: ``from fedlmc.data import load_dataset`` without importing torch
for ``import fedlmc.data.catalog`` (PEP 562 module ``__getattr__``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` that import ``exports[name]`` on first use.

    ``exports`` maps a public name to the module (relative to ``package`` when it starts with a
    dot) that defines it.
    """

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name], package), name)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
