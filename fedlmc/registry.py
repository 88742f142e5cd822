"""A name -> entry table, the extension point behind models and merge methods.

Like torchvision's ``register_model`` / ``get_model``: an entry is registered once, by name, and
every list of names (the run-config schema, the CLI help, the docs' tables) is read from the
registry instead of being written out again. Imports nothing heavy.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any, Generic, TypeVar

T = TypeVar("T")

__all__ = ["Registry", "import_user_module", "signature_problem"]
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
MAX_SHOWN = 120  # characters of a signature shown in a message


def signature_problem(function: Callable[..., Any], leading: Sequence[str]) -> str | None:
    """Why ``function`` is not an entry called as ``function(*values of leading)``: its first
    positional parameters must be named ``leading`` (``("job",)`` for a merge function,
    ``("width", "num_classes", "in_shape", "norm")`` for a model factory), it may take no
    ``*args`` and every other parameter needs a default; ``None`` when it fits. A callable
    whose signature cannot be read (a C built-in such as ``os.system``) does not fit."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return "its signature cannot be read (a built-in, not a Python function)"
    params = list(signature.parameters.values())
    first = [p for p in params if p.kind in POSITIONAL][: len(leading)]
    text = str(signature.replace(return_annotation=inspect.Signature.empty))
    takes = f"it takes {text[:MAX_SHOWN]}{'...' if len(text) > MAX_SHOWN else ''}"
    if [p.name for p in first] != list(leading):
        return takes
    for param in params:
        if param.kind == inspect.Parameter.VAR_POSITIONAL:
            return f"{takes}: *{param.name} as well"
        required = param.default is inspect.Parameter.empty
        if param not in first and required and param.kind != inspect.Parameter.VAR_KEYWORD:
            return f"{takes}: {param.name} has no default"
    return None


def import_user_module(location: str) -> ModuleType:
    """The module ``location`` (``"package.module"``) of a user's entry named by import path,
    searched as ``python -m`` searches: the current folder first, then ``sys.path``. The current
    folder is put on ``sys.path`` as an absolute path (once), so that it also reaches the
    simulation's workers, which start elsewhere: Ray's get the driver's ``sys.path`` through
    ``PYTHONPATH`` (:func:`fedlmc.simulations.engine.ray_runtime.init_ray`). ``ImportError``
    naming the folders searched and ``PYTHONPATH`` when it still cannot be imported."""
    here = os.path.abspath(os.getcwd())
    if here not in (os.path.abspath(p or os.curdir) for p in sys.path):
        sys.path.insert(0, here)
        importlib.invalidate_caches()
    try:
        return importlib.import_module(location)
    except ImportError as error:
        raise ImportError(
            f"{error} (searched the current folder {here} and sys.path; a module in another "
            "folder needs that folder on PYTHONPATH, e.g. PYTHONPATH=/path/to/folder)"
        ) from None


class Registry(Generic[T]):
    """Entries of one kind (``what``, e.g. ``"model"``) by name, in registration order.

    ``load``, if given, registers the built-in entries: it runs once, before the first
    registration, look-up or listing (so the built-ins come first, in its order)."""

    def __init__(self, what: str, load: Callable[[], None] | None = None) -> None:
        self.what = what
        self._entries: dict[str, T] = {}
        self._load = load

    def _loaded(self) -> dict[str, T]:
        """The entries, after the one run of ``load`` (cleared first: its registrations add)."""
        load, self._load = self._load, None
        if load is not None:
            load()
        return self._entries

    def add(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Register ``entry`` as ``name``; a second registration of a name is an error unless
        ``replace``."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{self.what} name {name!r}: allowed: a Python identifier")
        if name in self._loaded() and not replace:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> T:
        """The entry of ``name``; ``ValueError`` naming the allowed names otherwise."""
        try:
            return self._loaded()[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown {self.what} {name!r}; allowed: {', '.join(self._entries)}"
            ) from None

    def remove(self, name: str) -> None:
        """Unregister ``name`` (for tests and notebooks that register temporary entries)."""
        self.get(name)
        del self._entries[name]

    def names(self) -> tuple[str, ...]:
        """Registered names in registration order."""
        return tuple(self._loaded())

    def __contains__(self, name: object) -> bool:
        return name in self._loaded()

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._loaded().values()))

    def __len__(self) -> int:
        return len(self._loaded())
