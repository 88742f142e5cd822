"""Merge methods named by import path: ``"package.module:name"`` in a run config's ``methods``.

A model used once needs no registration (``model = "package.module:factory"``); a merge method
written in user code is named the same way, from ``fedlmc sweep`` and ``flwr run`` alike, since
every process that validates the run config (the sweep driver, each Ray worker, the ServerApp)
resolves the entry through :func:`resolve_method_entry`:

1. ``package.module`` is imported (``importlib``: it must be importable where the run executes;
   the allow-list :data:`fedlmc.models.registry.MODEL_ALLOW_VARIABLE`, when set, applies too);
2. if it registered a method ``name`` (``@register_method("name", ...)``, with all its
   declarations: columns, data needs, ...), that method is the entry (a function ``name`` of
   the module that is not that method, e.g. one named like a built-in method, is refused);
3. else, if ``name`` is a function of the module called as ``name(job)`` (its one required
   parameter is ``job``: :func:`check_merge_function`; ``os:system``, which takes
   ``(command)``, is refused), it is registered as method ``name`` with the defaults of
   :func:`~fedlmc.merging.methods.register_method`: a plain merge function
   ``name(job) -> Alignment`` (a method the module registered is checked the same way);
4. else ``ValueError`` naming the entry and what is allowed.

The entry stands for the registered method: its rows are ``name`` (and ``name_t`` for the
entry ``package.module:name_t``, the same merge with a fitted temperature).
"""

from __future__ import annotations

import importlib
import os

from fedlmc.merging.methods import CALIBRATED_SUFFIX, METHODS, base_method, register_method
from fedlmc.models.registry import MODEL_ALLOW_VARIABLE, factory_allowed, is_factory_path
from fedlmc.registry import signature_problem

__all__ = ["is_method_path", "resolve_method_entry"]


def is_method_path(entry: object) -> bool:
    """Whether a ``methods`` entry names a method by import path (``"package.module:name"``)
    rather than by its registered name."""
    return is_factory_path(entry)


def resolve_method_entry(entry: str) -> str:
    """The registered method (or ``_t`` row) a ``methods`` entry stands for: the entry itself
    unless it is an import path, which is imported and resolved as the module docstring says
    (idempotent: a second call finds the method registered)."""
    if not is_method_path(entry):
        return entry
    location, _, name = entry.rpartition(":")
    if location.endswith(".py") or "/" in location:
        raise ValueError(
            f"merge method {entry!r}: allowed: 'package.module:function', importable where the "
            "run executes (not a file path)"
        )
    allow = os.environ.get(MODEL_ALLOW_VARIABLE)
    if not factory_allowed(entry, allow):
        raise ValueError(
            f"merge method {entry!r} is not allowed here; allowed ({MODEL_ALLOW_VARIABLE}): "
            f"{allow or 'none'}"
        )
    try:
        module = importlib.import_module(location)
    except ImportError as error:
        raise ValueError(f"merge method {entry!r} cannot be imported: {error}") from None
    base = base_method(name)
    function = getattr(module, base, None)
    if base in METHODS:
        if callable(function) and METHODS.get(base).align is not function:
            raise ValueError(
                f"merge method {entry!r}: {base!r} is already another method's name; allowed: "
                "a function of another name"
            )
        check_merge_function(entry, METHODS.get(base).align)
        return name
    if not callable(function) or isinstance(function, type):
        raise ValueError(
            f"merge method {entry!r}: module {location!r} registers no method {base!r} and has "
            f"no function {base!r}; allowed: a function job -> Alignment, or a method the module "
            "registers with @register_method"
        )
    check_merge_function(entry, function)
    register_method(base, description=f"user merge function {location}:{base}")(function)
    return base + CALIBRATED_SUFFIX if name != base else base


def check_merge_function(entry: str, function: object) -> None:
    """``ValueError`` unless ``function`` is called as a merge function, ``function(job)``
    (:func:`fedlmc.registry.signature_problem`): ``os:system`` takes ``(command)``, a C
    built-in no readable signature, and neither is registered as a merge method."""
    problem = signature_problem(function, ("job",))
    if problem is not None:
        raise ValueError(
            f"merge method {entry!r}: {problem}; allowed: a function merge(job) -> Alignment "
            "(a MergeJob in, an Alignment out), or a method the module registers with "
            "@register_method"
        )
