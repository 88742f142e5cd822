"""A griffe extension for the API pages: the docstrings' Sphinx roles as Markdown.

``:func:`name``` (also ``:class:``, ``:mod:``, ``:data:``, ``:meth:``, ``:attr:``, ``:exc:``,
``:obj:``) becomes a cross-reference to the object ``name`` resolves to in the docstring's
scope, so that the strict build fails on a reference to nothing; references to the objects of
:data:`OTHER_LIBRARIES` become code. Maths (``:math:`x``` and ``.. math::`` displays) becomes
the site's maths markup first (``docstring_math.py`` beside this file), which KaTeX renders.
"""

from __future__ import annotations

import importlib.util
import re
from functools import partial
from pathlib import Path
from typing import Any

import griffe


def _load_docstring_math():
    """``docstring_math.py`` beside this file (mkdocs loads this extension by its path)."""
    path = Path(__file__).with_name("docstring_math.py")
    spec = importlib.util.spec_from_file_location("fedlmc_docs_docstring_math", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


math_to_markdown = _load_docstring_math().math_to_markdown

OTHER_LIBRARIES = {"flwr", "numpy", "pandas", "ray", "scipy", "threading", "torch", "torchvision"}
"""Roles naming these libraries' objects stay plain code (no inventory of theirs is loaded)."""
ROLE = re.compile(r":(func|class|mod|data|meth|attr|exc|obj):`~?([^`]+)`")


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring once the whole package is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name in ("strategies", "simulations"):
            return  # loaded for fedlmc (griffe_app_folders): rewritten there, under their paths
        for obj in _walk(pkg):
            if obj.docstring is not None:
                text = math_to_markdown(obj.docstring.value)
                obj.docstring.value = ROLE.sub(partial(_markdown, obj), text)


def _walk(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)


def _markdown(obj: griffe.Object, match: re.Match[str]) -> str:
    role, name = match.groups()
    target = _resolve(obj, name)
    if target.split(".")[0] in OTHER_LIBRARIES:
        return f"`{name}`"  # an object of another library: plain code
    return f"[`{name}`][{target}]"


def _resolve(obj: griffe.Object, name: str) -> str:
    """The full path of ``name`` (``helper``, ``Class.method`` or a full path) as the docstring
    of ``obj`` sees it, through aliases (a package's short path, an import) to the object that
    is documented; ``name`` itself when it resolves to nothing in that scope."""
    head, dot, rest = name.partition(".")
    scope = obj if obj.is_class or obj.is_module else obj.parent
    try:
        path = scope.resolve(head) + dot + rest
    except griffe.NameResolutionError:
        return name
    return _documented(obj, path)


def _documented(obj: griffe.Object, path: str) -> str:
    """``path``, or the path of the object it aliases when it is an alias."""
    try:
        found = obj.modules_collection[path]
        return found.final_target.path if found.is_alias else path
    except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return path
