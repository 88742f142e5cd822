"""The model registry: one registration per architecture, with its default norm and options.

A model is registered once with :func:`register_model`: its name, its builder (a callable, or a
``"module:attribute"`` path imported when the first model is built, so that this module, and
any configuration front end that lists the models, never imports torch), its default
normalisation and its options. *Public* options are the ones a front end may let users set
(the Flower run config exposes them as hyphenated keys: ``base_hidden`` -> ``base-hidden``);
a public option shared by several models must have the same default in each.

A builder is called as ``builder(width, num_classes, in_shape, norm, **options)`` with every
option filled in (defaults first) and must return an ``nn.Module`` with ``layer_names`` and a
``permutation_spec()`` method (see :mod:`fedlmc.models`), or a model that
:func:`fedlmc.permutation.permutation_spec` can derive a spec for.

A model may declare its parameter count, ``parameters``: a callable (or ``"module:attribute"``
path) called like the builder, ``parameters(width, num_classes, in_shape, norm, **options)``,
returning ``sum(p.numel() for p in model.parameters())`` without building the model
(:func:`parameter_count`; the built-ins' are in the torch-free :mod:`fedlmc.models.sizes`).
Front ends check a run's memory from it before any work; a model that declares none is counted
by building it on torch's meta device where torch is loaded anyway (:func:`parameter_count`
with ``build=True``), or its memory check is skipped with a note.
"""

from __future__ import annotations

import importlib
import importlib.util
import numbers
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedlmc.models import sizes
from fedlmc.registry import Registry, import_user_module, signature_problem

__all__ = [
    "MODELS",
    "NORMS",
    "ModelEntry",
    "ModelOption",
    "import_factory",
    "is_factory_path",
    "model_entry",
    "model_names",
    "parameter_count",
    "register_model",
    "public_options",
    "user_factory",
]

NORMS = ("bn", "ln", "none")


@dataclass(frozen=True)
class ModelOption:
    """One build option: default (its type is the option's type), meaning, bounds, and whether
    front ends expose it (``public``). ``maximum``: the largest value a real run could use, with
    ``why_maximum``, one phrase saying why (the run config's key states both, ``fedlmc keys``)."""

    default: bool | int | float | str
    doc: str
    minimum: float | None = None
    public: bool = False
    maximum: float | None = None
    why_maximum: str = ""

    def check(self, name: str, value: Any) -> Any:
        """``value`` if it has the default's type (and is in ``minimum`` .. ``maximum``);
        ``ValueError`` else."""
        kind = type(self.default)
        if kind is bool:
            ok = isinstance(value, bool)
        elif kind is int:
            ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        elif kind is float:
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        else:
            ok = isinstance(value, kind)
        if not ok:
            raise ValueError(f"option {name} = {value!r}: allowed: a {kind.__name__}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"option {name} = {value!r}: allowed: a number >= {self.minimum:g}")
        if self.maximum is not None and value > self.maximum:
            raise ValueError(
                f"option {name} = {value!r}: allowed: a number <= {self.maximum:g} "
                f"({self.why_maximum})"
            )
        return kind(value)


@dataclass(frozen=True)
class ModelEntry:
    """A registered architecture."""

    name: str
    builder: Callable[..., Any] | str
    default_norm: str
    options: Mapping[str, ModelOption] = field(default_factory=dict)
    description: str = ""
    plain_chain: bool | None = None
    """Whether its Linear/Conv layers form one plain feed-forward chain (no residual
    connections), where LEWC's depth exponents exist; ``None``: not known before it is built."""
    parameters: Callable[..., int] | str | None = None
    """Its parameter count, called like the builder (see the module docstring); ``None``: not
    declared."""
    norms: tuple[str, ...] = NORMS
    """The values of ``norm`` it takes (a subset of :data:`NORMS`)."""
    mixed_widths: bool = True
    """Whether a narrow model of it embeds exactly into a wider one, so that clients of
    different widths can be merged (:mod:`fedlmc.permutation.embed`)."""

    def build_function(self) -> Callable[..., Any]:
        """The builder, importing ``"module:attribute"`` / ``"path/file.py:attribute"`` paths on
        first use (a user factory, the entry :func:`model_entry` makes of a path, checked by
        :func:`user_factory`)."""
        if callable(self.builder):
            return self.builder
        return (
            user_factory(self.builder)
            if self.name == self.builder
            else import_factory(self.builder)
        )

    def resolve_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Every option of this model: defaults overlaid by ``options``, each type-checked."""
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            allowed = ", ".join(self.options) or "none"
            raise ValueError(
                f"unknown option {unknown[0]!r} for model {self.name!r}; allowed: {allowed}"
            )
        resolved = {name: option.default for name, option in self.options.items()}
        for name, value in options.items():
            resolved[name] = self.options[name].check(name, value)
        return resolved


MODELS: Registry[ModelEntry] = Registry("model")


def register_model(
    name: str,
    builder: Callable[..., Any] | str,
    *,
    default_norm: str = "none",
    options: Mapping[str, ModelOption] | None = None,
    description: str = "",
    plain_chain: bool | None = None,
    parameters: Callable[..., int] | str | None = None,
    norms: tuple[str, ...] = NORMS,
    mixed_widths: bool = True,
    replace: bool = False,
) -> ModelEntry:
    """Register an architecture (see the module docstring and :class:`ModelEntry`'s fields);
    returns its entry."""
    if not norms or any(norm not in NORMS for norm in norms):
        raise ValueError(f"model {name!r}: norms = {norms!r}; allowed: values of {NORMS}")
    if default_norm not in norms:
        raise ValueError(f"default_norm = {default_norm!r}; allowed: {', '.join(norms)}")
    if not (parameters is None or callable(parameters) or is_factory_path(parameters)):
        raise ValueError(
            f"model {name!r}: parameters = {parameters!r}; allowed: a callable, a "
            "'module:function' path or None"
        )
    entry = ModelEntry(
        name,
        builder,
        default_norm,
        dict(options or {}),
        description,
        plain_chain,
        parameters,
        tuple(norms),
        mixed_widths,
    )
    _check_public_options(entry)
    return MODELS.add(name, entry, replace=replace)


FACTORY_PATTERN = re.compile(r"[\w.\-/~]+:[A-Za-z_]\w*")
"""A user model factory: ``"package.module:make_net"`` or ``"path/to/file.py:make_net"``."""


def is_factory_path(name: object) -> bool:
    """Whether ``name`` names a user model factory (:data:`FACTORY_PATTERN`) rather than a
    registered model."""
    return isinstance(name, str) and ":" in name and FACTORY_PATTERN.fullmatch(name) is not None


MODEL_ALLOW_VARIABLE = "FEDLMC_MODEL_ALLOW"


def factory_allowed(path: str, allow: str | None) -> bool:
    """Whether ``allow`` (the value of :data:`MODEL_ALLOW_VARIABLE`) lets ``path`` be imported:
    unset (``None``): any factory; otherwise a comma-separated list of ``location:attribute``
    or ``location:*`` entries (empty or ``none``: no factory at all)."""
    if allow is None:
        return True
    location = path.rpartition(":")[0]
    entries = {e.strip() for e in allow.split(",") if e.strip() and e.strip() != "none"}
    return path in entries or f"{location}:*" in entries


def import_factory(path: str) -> Callable[..., Any]:
    """The callable named by ``"package.module:attribute"`` or ``"path/file.py:attribute"``;
    ``ValueError`` naming the path when it cannot be imported, is not callable, or is not in
    the allow-list of the environment variable :data:`MODEL_ALLOW_VARIABLE` (when set: the
    trust boundary of a deployment, set by whoever starts the SuperLink and SuperNodes, since
    importing a module runs its code)."""
    allow = os.environ.get(MODEL_ALLOW_VARIABLE)
    if not factory_allowed(path, allow):
        raise ValueError(
            f"model factory {path!r} is not allowed here; allowed ({MODEL_ALLOW_VARIABLE}): "
            f"{allow or 'none'}"
        )
    location, _, attribute = path.rpartition(":")
    try:
        if location.endswith(".py"):
            file = Path(location).expanduser()
            spec = importlib.util.spec_from_file_location(f"fedlmc_user_model_{file.stem}", file)
            if spec is None or spec.loader is None or not file.is_file():
                raise ImportError(f"no file {str(file)!r}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = import_user_module(location)
        factory = getattr(module, attribute)
    except (ImportError, AttributeError, OSError) as error:
        raise ValueError(f"model factory {path!r} cannot be imported: {error}") from None
    if not callable(factory):
        raise ValueError(f"model factory {path!r} is not callable")
    return factory


FACTORY_PARAMETERS = ("width", "num_classes", "in_shape", "norm")
"""The parameters a user model factory is called with, in order (the builders' own)."""


def user_factory(path: str) -> Callable[..., Any]:
    """The user model factory ``path`` names (:func:`import_factory`: the allow-list applies),
    checked to be called as ``factory(width, num_classes, in_shape, norm)``
    (:func:`fedlmc.registry.signature_problem`); ``ValueError`` naming the path and what it
    takes otherwise (``os:system`` takes ``(command)``)."""
    factory = import_factory(path)
    problem = signature_problem(factory, FACTORY_PARAMETERS)
    if problem is not None:
        raise ValueError(
            f"model factory {path!r}: {problem}; allowed: a function or class called as "
            f"factory({', '.join(FACTORY_PARAMETERS)}) that returns a torch.nn.Module"
        )
    return factory


def model_entry(name: str) -> ModelEntry:
    """The entry of a registered model, or of a user factory path (:func:`is_factory_path`:
    called as ``factory(width, num_classes, in_shape, norm)``, default norm ``none``, no
    options); ``ValueError`` naming the registered models otherwise."""
    if name not in MODELS and is_factory_path(name):
        return ModelEntry(name, name, "none", {}, f"user model factory {name}")
    return MODELS.get(name)


def parameter_count(
    name: str,
    width: float,
    num_classes: int,
    in_shape: tuple[int, int, int],
    norm: str | None = None,
    *,
    build: bool = False,
    **options: Any,
) -> int | None:
    """How many parameters model ``name`` has at ``width`` (``sum(p.numel() for p in
    model.parameters())``), from its declared ``parameters`` without building it; for a model
    that declares none, ``None``, or with ``build=True`` the count of the model built on torch's
    meta device (no memory, no initialisation: only for callers that load torch anyway)."""
    entry = model_entry(name)
    norm = entry.default_norm if norm is None else norm
    resolved = entry.resolve_options(options)
    if entry.parameters is not None:
        count = entry.parameters if callable(entry.parameters) else import_factory(entry.parameters)
        return int(count(width, num_classes, in_shape, norm, **resolved))
    if not build:
        return None
    import torch

    with torch.device("meta"):
        model = entry.build_function()(width, num_classes, in_shape, norm, **resolved)
    return sum(p.numel() for p in model.parameters())


def model_names() -> tuple[str, ...]:
    """Registered model names, in registration order."""
    return MODELS.names()


def public_options() -> dict[str, tuple[ModelOption, tuple[str, ...]]]:
    """Per public option name: the option and the models that have it (registration order)."""
    found: dict[str, tuple[ModelOption, tuple[str, ...]]] = {}
    for entry in MODELS:
        for name, option in entry.options.items():
            if option.public:
                _, models = found.get(name, (option, ()))
                found[name] = (option, (*models, entry.name))
    return found


def _check_public_options(entry: ModelEntry) -> None:
    """A public option shared by several models must have the same default (and type)."""
    known = public_options()
    for name, option in entry.options.items():
        if option.public and name in known:
            other, models = known[name]
            if (type(other.default), other.default) != (type(option.default), option.default):
                raise ValueError(
                    f"model {entry.name!r}: public option {name!r} has default "
                    f"{option.default!r}, but {', '.join(models)} registered {other.default!r}"
                )


# ----------------------------------------------------------------------------- built-in models

DEPTH: dict[str, Any] = {
    "minimum": 1,
    "maximum": 1000,
    "why_maximum": "deeper than any net a merge study trains",
}
"""``depth``'s bounds (the MLP's and the ViT's: one run-config key)."""

register_model(
    "mlp",
    "fedlmc.models:MLP",
    default_norm="none",
    options={
        "depth": ModelOption(3, "hidden layers of the MLP", public=True, **DEPTH),
        "base_hidden": ModelOption(
            128,
            "hidden units of the MLP at width 1",
            minimum=1,
            public=True,
            maximum=65536,
            why_maximum="two 65536-unit layers hold 16 GiB of float32 weights",
        ),
        "bias": ModelOption(True, "bias in every linear layer"),
    },
    description="ReLU MLP: flatten, depth x round(base_hidden * width) units, linear head",
    plain_chain=True,
    parameters=sizes.mlp_parameters,
)
register_model(
    "vgg11",
    "fedlmc.models:VGG11",
    default_norm="bn",
    options={"bias": ModelOption(True, "bias in every conv and linear layer")},
    description="VGG-11 conv stack 64-128-256-256-512-512-512-512 (x width), GAP, linear head",
    plain_chain=True,
    parameters=sizes.vgg11_parameters,
)
register_model(
    "resnet20",
    "fedlmc.models:ResNet20",
    default_norm="bn",
    options={"bias": ModelOption(False, "bias in every conv and linear layer")},
    description="ResNet-20: 3x3 stem, 3 stages x 3 basic blocks of 16/32/64 (x width), GAP, linear",
    plain_chain=False,
    parameters=sizes.resnet20_parameters,
)
register_model(
    "vit",
    "fedlmc.models.vit:ViT",
    default_norm="ln",
    options={
        "depth": ModelOption(3, "transformer blocks", public=True, **DEPTH),
        "heads": ModelOption(
            4,
            "attention heads at width 1, scaled by width when grow-heads",
            minimum=1,
            public=True,
            maximum=1024,
            why_maximum="more heads than any transformer has",
        ),
        "head_dim": ModelOption(
            8,
            "dimensions per head at width 1, scaled by width unless grow-heads",
            minimum=1,
            public=True,
            maximum=4096,
            why_maximum="wider than any transformer's heads",
        ),
        "grow_heads": ModelOption(
            True,
            "width scales the head count (true: the ViT family's rule) or the head dimension",
            public=True,
        ),
        "mlp_ratio": ModelOption(
            2,
            "MLP hidden units per embedding dimension",
            minimum=1,
            maximum=64,
            why_maximum="ViTs use 4",
        ),
        "patch": ModelOption(
            7,
            "patch side in pixels, a divisor of the image's sides",
            minimum=1,
            public=True,
            maximum=1024,
            why_maximum="larger than the images' sides",
        ),
        "bias": ModelOption(True, "bias in the patch embedding and every linear layer"),
    },
    description="ViT: patch embedding, class token, position embedding, depth pre-norm blocks "
    "of heads x head_dim (x width) with an MLP of mlp_ratio x that, LayerNorm, linear head",
    plain_chain=False,
    parameters=sizes.vit_parameters,
    norms=sizes.VIT_NORMS,
    mixed_widths=False,
)
