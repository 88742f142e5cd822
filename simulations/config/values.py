"""The allowed values of single run-config keys: the named choices (strategies, inits, data
sets, models, methods) read from the registries, and the value checks the key table uses."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from fedlmc.data.catalog import (
    DATASETS,
    is_known_dataset,
)
from fedlmc.merging.method_registry import (
    merge_method,
    merge_method_names,
    resolve_method_entry,
    study_methods,
    template_merge_names,
)
from fedlmc.models.registry import (
    MODELS,
    is_factory_path,
    model_entry,
    model_names,
    public_options,
)
from fedlmc.simulations.config.schema import (
    Check,
    Key,
    Range,
    Rule,
    at_least,
    integers,
    numbers,
)


class Mode(StrEnum):
    """The run config's ``strategy``: what the ServerApp does with the federation (not a merge
    method: ``average`` and ``fedavg`` are method names too, the rows of ``compare``)."""

    COMPARE = "compare"
    """Collect the client models once and evaluate every method of ``methods`` on them."""
    AVERAGE = "average"
    """:class:`fedlmc.strategies.OneShotAverage`: one round, the plain weighted average."""
    ALIGNED = "aligned"
    """:class:`fedlmc.strategies.PermutationAlignedAverage` with the merge method ``align``."""
    FEDAVG = "fedavg"
    """:class:`fedlmc.strategies.FedAvgBaseline`: ``fedavg-rounds`` rounds."""


STRATEGIES = tuple(mode.value for mode in Mode)
"""The allowed values of ``strategy``, in :class:`Mode`'s order."""
ONE_SHOT_MODES = (Mode.AVERAGE, Mode.ALIGNED)
"""The modes of one one-shot strategy (their ``calibration`` applies)."""
BIAS_VALUES = ("auto", "true", "false")
FAILURE_MODES = ("raise", "nan", "hang", "exit")
FEDAVG = "fedavg"
"""The FedAvg baseline's method (row) name."""
INITS = ("independent", "shared")
DEFAULT_MAX_SHARE = 0.5  # = fedlmc.strategies.screening.DEFAULT_MAX_SHARE (no Flower import here)
DEFAULT_OUTLIER_FACTOR = 10.0  # = fedlmc.strategies.robust.DEFAULT_OUTLIER_FACTOR


def cell_methods() -> tuple[str, ...]:
    """Every method a cell can report: the study's rows, those that run on the clients too (a
    compare cell queries its clients for them;
    :func:`fedlmc.merging.method_registry.study_methods`),
    and the FedAvg baseline."""
    return (*study_methods(federated=True), FEDAVG)


def aligning_methods() -> tuple[str, ...]:
    """The merge methods of the ``aligned`` strategy: every registered one but ``average`` and
    those whose merge is no state dict of the model (``builds_model``: ``preserve_first``)."""
    return tuple(m for m in template_merge_names() if m != "average")


def dataset_names() -> tuple[str, ...]:
    """The data set names shown as allowed (``hf:NAME`` is allowed too)."""
    return (*DATASETS, "hf:NAME")


def _dataset(value: Any) -> str | None:
    if is_known_dataset(value):
        return None
    return f"allowed: {', '.join(DATASETS)}, or hf:NAME (a Hugging Face hub name or local path)"


server_split_share = numbers(
    0.0,
    1.0,
    "the server fits each model's temperature for the calibrated columns on its split, "
    "whatever the calibration",
    low_open=True,
    high_open=True,
)
"""``server-fraction`` in (0, 1): every strategy and calibration needs a server split, since
the server fits each model's temperature for the calibrated columns on it."""


def _model(value: Any) -> str | None:
    if value in model_names() or is_factory_path(value):
        return None
    return (
        f"allowed: {', '.join(model_names())}, or a model factory "
        "'package.module:make_net' / 'path/to/file.py:make_net'"
    )


def _methods(value: Any) -> str | None:
    try:
        names = [resolve_method_entry(m.strip()) for m in value.split(",") if m.strip()]
    except ValueError as error:  # an import path that names no method
        return str(error)
    allowed = cell_methods()
    unknown = [m for m in names if m not in allowed]
    if not names or unknown:
        what = (
            f"unknown method {unknown[0]!r}{nearest_names(unknown[0], allowed)}; "
            if unknown
            else ""
        )
        return (
            f"{what}allowed: a comma-separated list of the {len(allowed)} method names "
            "`fedlmc methods` lists (average, average_t, weight_matching, ..., ensemble, "
            "fedavg), or 'package.module:function' merge methods"
        )
    return None


def nearest_names(name: str, choices: Sequence[str], n: int = 3) -> str:
    """`` (did you mean 'a', 'b'?)`` with the up to ``n`` choices closest to ``name``
    (``difflib.get_close_matches``), or an empty string."""
    close = difflib.get_close_matches(name, list(choices), n=n)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""


def _align(value: Any) -> str | None:
    try:
        name = resolve_method_entry(value)
    except ValueError as error:  # an import path that names no method
        return str(error)
    if name in aligning_methods():
        return None
    if name in merge_method_names() and not merge_method(name).rule.template_shaped:
        return (
            f"merge method {name!r} builds a model of another architecture, not a state dict "
            f"of the model the strategy returns; allowed: {', '.join(aligning_methods())}"
        )
    return (
        f"unknown aligning method {name!r}{nearest_names(name, aligning_methods())}; allowed: "
        f"{', '.join(aligning_methods())}, or a 'package.module:function' merge method"
    )


CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0 and C1 control characters, DEL


def _plain_path(value: Any) -> str | None:
    found = CONTROL.search(value)
    if found is None:
        return None
    return f"holds a control character ({found.group()!r}); allowed: a path of printable characters"


MAX_WIDTH = 1024
"""The widest width multiplier: 1,024 times the base widths (a 131,072-unit MLP layer) is
beyond any machine's memory for the built-in models; the memory check refuses less."""
WIDTH_RANGE = numbers(
    0.0, MAX_WIDTH, "1024 x the base widths is beyond any machine's memory", low_open=True
)
"""The range of every width multiplier: ``width``, each of ``client-widths``."""
MAX_CLIENTS = 100_000
"""The most clients: more than the largest built-in data set's 60,000 training examples."""
CLIENTS_WHY = "more clients than the largest built-in data set's 60000 examples"
AT_MOST_CLIENTS = f"at most num-clients, itself at most {MAX_CLIENTS}"
MAX_EPOCHS = 100_000
"""The most local epochs (and FedAvg rounds): far beyond any study's training budget, and
below the holdout split's seed stream (:data:`fedlmc.simulations.task.HOLDOUT_STREAM`)."""
EPOCHS_WHY = "far beyond any study's training budget"
MAX_EXAMPLES = 10_000_000
"""The most examples a batch or a client's statistics take: more than ImageNet's 1.28 million
training images, so one batch holds any partition whole."""
EXAMPLES_WHY = "more than ImageNet's 1.28 million images"
MAX_CPUS = 1024
"""The most cores of one machine a client slot or the server computes on."""
CPUS_WHY = "the cores of the largest machine"
SECAGG_MAX_RANGE = 65536.0
"""The widest SecAgg+ clipping or statistics range: beyond it, SecAgg+'s quantisation step
:math:`2c / 2^{22}` exceeds 1/32 and the sum loses the weights."""
SECAGG_WHY = "beyond, SecAgg+'s quantisation step 2 x range / 2^22 exceeds 1/32"


def parse_widths(text: str) -> tuple[float, ...]:
    """``"0.5, 1,2"`` -> ``(0.5, 1.0, 2.0)``; ``ValueError`` naming the first item that is not a
    number in :data:`WIDTH_RANGE` (empty text: no widths)."""
    if not text.strip():
        return ()
    widths = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"width {item.strip()!r} is not a number > 0")
        if WIDTH_RANGE(value):
            raise ValueError(f"width {item.strip()!r} is over {MAX_WIDTH}")
        widths.append(value)
    return tuple(widths)


def _widths_list(value: Any) -> str | None:
    try:
        parse_widths(value)
    except ValueError as err:
        return (
            f"{err}; allowed: empty, or comma-separated width multipliers in "
            f"{WIDTH_RANGE.bounds} ('0.5,1,2,4')"
        )
    return None


def _failures(value: Any) -> str | None:
    if value == "none":
        return None
    for item in value.split(","):
        mode, _, pid = item.strip().partition(":")
        if mode not in FAILURE_MODES or not pid.isdigit():
            return (
                f"allowed: none, or MODE:PARTITION-ID[,...] with MODE in {', '.join(FAILURE_MODES)}"
            )
    return None


MAX_LAMBDAS = 201  # every point costs a full evaluation (and a temperature fit)


LAMBDAS_WHY = "odd, so that the grid holds lambda = 1/2 for the *_barrier_half columns"


def _odd(value: Any) -> str | None:
    return None if value % 2 == 1 else _lambdas.allowed


RAY_RESOURCE_UNIT = 1e-4
"""The least fraction of a resource Ray schedules (``RESOURCE_UNIT_SCALING``): a non-zero
``num_cpus`` or ``num_gpus`` below it fails inside Ray, after it started."""


def ray_precision(value: Any) -> str | None:
    if 0 < value < RAY_RESOURCE_UNIT:
        return "allowed: 0 or at least 0.0001 (the least fraction of a resource Ray schedules)"
    return None


_lambdas = integers(3, MAX_LAMBDAS, LAMBDAS_WHY, also=_odd)
_share = numbers(0.0, 1.0, low_open=True)


def option_key(name: str) -> str:
    """The run-config key of a public model option: ``base_hidden`` -> ``base-hidden``."""
    return name.replace("_", "-")


def _has_option(name: str) -> Rule:
    return Rule(
        f"the model has a `{option_key(name)}` option",
        lambda config: name in model_entry(config["model"]).options,
    )


_OPTION_KEYS: list[tuple[tuple[object, ...], dict[str, Key]]] = []
"""The last :func:`_model_option_keys`, with the model entries it was built from."""


def _model_option_keys() -> dict[str, Key]:
    """One run-config key per public model option (:mod:`fedlmc.models.registry`); a cell ignores
    it when its model has no such option. Built again only when the registered models changed
    (entries compared by identity; an entry is frozen): a sweep's start read it three times per
    cell. The caller must not change the returned mapping."""
    entries = tuple(MODELS)
    if _OPTION_KEYS and _same_entries(_OPTION_KEYS[0][0], entries):
        return _OPTION_KEYS[0][1]
    keys = _build_model_option_keys()
    _OPTION_KEYS[:] = [(entries, keys)]
    return keys


def _same_entries(old: tuple[object, ...], new: tuple[object, ...]) -> bool:
    return len(old) == len(new) and all(a is b for a, b in zip(old, new, strict=True))


def _build_model_option_keys() -> dict[str, Key]:
    keys = {}
    for name, (option, models) in public_options().items():
        check = option_range(option)
        docs: dict[str, list[str]] = {}  # each model's own doc, models with one doc together
        for model in models:
            docs.setdefault(model_entry(model).options[name].doc, []).append(model)
        doc = "; ".join(f"{text} ({', '.join(names)})" for text, names in docs.items())
        kind = type(option.default)
        keys[option_key(name)] = Key(kind, option.default, doc, check, applies=_has_option(name))
    return keys


def option_range(option: Any) -> Check | None:
    """The check of a numeric model option's key: its registered ``minimum`` .. ``maximum``
    (:class:`fedlmc.models.registry.ModelOption`; a :class:`Range`), ``>= minimum`` where it
    declares no maximum (a user's model), none where it declares neither."""
    kind = type(option.default)
    if kind not in (int, float) or option.minimum is None:
        return None
    if option.maximum is None:
        return at_least(option.minimum)
    return Range(option.minimum, option.maximum, option.why_maximum, kind is int)


def _strategy_is(*names: Mode) -> Rule:
    text = " or ".join(f'`"{name}"`' for name in names)
    return Rule(
        f"`strategy` {'=' if len(names) == 1 else 'is'} {text}",
        lambda config: config["strategy"] in names,
    )
