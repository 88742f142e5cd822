r"""The merge-method registry: one registration per one-shot merge method.

A merge method turns the client state dicts :math:`\theta_1, \dots, \theta_N` (same architecture)
and their normalised weights :math:`w_i` into the clients *in a common basis*,
:math:`\pi_1(\theta_1), \dots, \pi_N(\theta_N)` (:math:`\pi_i` a hidden-unit permutation, the
identity for plain averaging), and optionally its own merged weights (MergeMany); otherwise the
merge is :math:`\bar\theta = \sum_i w_i \pi_i(\theta_i)`. It is registered once with
:func:`register_method`: its name, its ``align`` function and its declaration in two parts:

- what it needs (:class:`Needs`), asked by its one refusal (:meth:`MergeMethod.refusal`):
  ``needs_server_data`` (inputs held by the server; ``clients_for_data``: or, with ``job.clients``
  set and ``calibration = "federated"``, the clients' held-out data), ``needs_clients`` (it runs a
  protocol with the clients, ``job.clients``, a :class:`~fedlmc.merging.merge_job.ClientQueries`:
  only inside a federation), ``needs_base`` (the rule is relative to the clients' common starting
  model, ``job.base``: task vectors), ``plain_chain_only`` (defined only for norm-free plain
  feed-forward chains, :mod:`fedlmc.permutation.chain`), ``many_clients`` (more than two clients
  accepted), ``min_clients`` (the fewest it accepts: a number, or a function of the method options
  ``min_clients(options) -> (count, why)``, Krum: :math:`2f + 3`; below it the study's default
  method list leaves it out) and ``mixed_widths`` (it accepts
  clients of different widths, :mod:`fedlmc.merging.widths`, embedding each into the shapes of
  ``template``, the server model; every other method refuses them);
- how its result is built (:class:`Rule`), the merge and the post-merge steps that belong to
  it: ``combine(spec, states, weights)`` (combining the aligned clients, default the weighted
  average; the merge and every point of the study's paths use it), ``builds_model(template,
  aligned, weights, options) -> nn.Module`` (a merge that is a model of another architecture,
  Preserve-First Merging: whatever needs a state dict of the template refuses it,
  :func:`check_template_merge`), ``reestimate_bn`` (a BatchNorm model's running statistics are
  re-estimated after the merge) and ``repair`` (REPAIR follows, :mod:`fedlmc.merging.repair`,
  for models without BatchNorm, which need a bias in every repaired layer); both read by
  :func:`fedlmc.merging.post_merge.post_merge`.

What is not the merge is registered against the method's name by the layer that uses it, each
part optional: how the study evaluates it (its path, its own results columns, its mixed-width
counterpart and what its rule lets the server see:
:func:`fedlmc.study.method_policy.register_evaluation`) and how secure aggregation computes it
(``fedlmc.strategies.secure_forms.register_secure_form``).

Everything that lists methods reads this registry: the study's rows (each method ``m`` gives a
row ``m`` and a row ``m_t`` with a fitted temperature, plus the reference ensembles), the
strategies (``PermutationAlignedAverage(method=...)``), the run-config schema, ``fedlmc
methods`` and the docs' methods table. :func:`fedlmc.merging.methods.merge_states` is the one
function the study and the strategies call, with a :class:`~fedlmc.merging.merge_job.MergeJob`.
The built-in methods are declared in :data:`BUILTIN_MODULES` (:func:`builtin_method`); the
registry registers them itself, once, before its first registration, look-up or listing. A
method written in user code can also be named by import path, ``"package.module:name"``
(:func:`resolve_method_entry`).

This module imports no torch at import time (the run-config validation reads the method names
without loading torch); each registered function imports what it needs when it runs.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from fedlmc.models.registry import MODEL_ALLOW_VARIABLE, factory_allowed, is_factory_path
from fedlmc.registry import Registry, import_user_module, signature_problem

if TYPE_CHECKING:
    from torch import Tensor, nn

    from fedlmc.merging.merge_job import Alignment, MergeJob
    from fedlmc.permutation.spec import PermutationSpec

    StateDict = dict[str, Tensor]

__all__ = [
    "BUILTIN_MODULES",
    "CALIBRATED_SUFFIX",
    "METHODS",
    "MinClients",
    "REFERENCE_DATA",
    "REFERENCE_METHODS",
    "MergeMethod",
    "MergeRequest",
    "Needs",
    "Rule",
    "base_method",
    "builtin_method",
    "check_merge_function",
    "check_method",
    "check_template_merge",
    "is_method_path",
    "merge_method",
    "merge_method_names",
    "refuse_calibrated_row",
    "refusal",
    "register_method",
    "resolve_method_entry",
    "study_methods",
    "template_merge_names",
]

CALIBRATED_SUFFIX = "_t"
REFERENCE_METHODS = {
    "ensemble": "sample-count-weighted mean of the clients' softmax outputs at T = 1, "
    "sum_i w_i softmax(z_i) (N forward passes)",
    "ensemble_equal": "equal-weight mean of the clients' softmax outputs at T = 1, "
    "(1/N) sum_i softmax(z_i) (N forward passes)",
    "ensemble_calibrated": "sample-count-weighted mean of the clients' softmax outputs, each at "
    "its own temperature T_i fitted on the server split, sum_i w_i softmax(z_i / T_i) "
    "(N forward passes)",
    "logit_ensemble": "softmax of the sample-count-weighted mean of the clients' logits, "
    "softmax(sum_i w_i z_i) (N forward passes)",
}
"""The reference rows, which are not merges (every client's model runs): name -> what the row
is (``fedlmc methods``, the docs' methods table). The three probability ensembles differ in one
factor each: ``ensemble_equal`` from ``ensemble`` in the weights, ``ensemble_calibrated`` in the
members' temperatures; a merge is "above the ensembles" only above the best of them."""
REFERENCE_DATA = {"ensemble_calibrated": "server split (each client's own T)"}
"""The data a reference row needs (the methods table's data column; ``none`` if not here)."""
Combine = Callable[["PermutationSpec | None", Sequence["StateDict"], Sequence[float]], "StateDict"]
MinClients = Callable[[Mapping[str, Any]], tuple[int, str]]
"""``min_clients(options) -> (count, why)``: the fewest clients at the method options, and
``why`` (``""``, or the reason a refusal appends, such as ``" (2 x krum_byzantine + 3)"``)."""
BuildModel = Callable[
    ["nn.Module", Sequence["StateDict"], Sequence[float], "Mapping[str, Any]"], "nn.Module"
]


PLAIN_CHAINS = "norm-free plain feed-forward chains (MLP, VGG-11 with norm = 'none')"
"""What a ``plain_chain_only`` method allows, as its refusal says it."""


@dataclass(frozen=True)
class MergeRequest:
    """What a caller knows about one merge before any work, for :func:`refusal` (the run config's
    check from its keys, ``merge_states``, the study and the strategies from their arguments); a
    field left ``None`` is not known there and its precondition is not asked.

    ``num_clients``: the most clients the merge gets; ``fewest_clients``: the fewest (a
    ``min_clients`` method needs that many; one client is its own merge); ``model``: its name;
    ``chain_reason``: why the model is no norm-free plain chain (``""``: it is one);
    ``bias_free``: what has no bias where REPAIR needs one (``"layer 'fc1'"``; ``""``: none, or
    BatchNorm, whose statistics REPAIR resets); ``widths``: how the clients' widths differ
    (``""``: one width); ``server_data``: the server holds inputs; ``federated_data``: the
    clients' held-out data can stand in (``calibration = "federated"``); ``clients``: a
    federation's clients answer queries; ``base``: the clients' common starting model exists;
    ``options``: the method options the merge runs with (a ``min_clients`` function reads them)."""

    num_clients: int
    fewest_clients: int | None = None
    model: str = "the model"
    chain_reason: str | None = None
    bias_free: str | None = None
    widths: str = ""
    server_data: bool | None = None
    federated_data: bool = False
    clients: bool | None = None
    base: bool | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Needs:
    """What a method needs of a merge, asked by its one refusal (:meth:`MergeMethod.refusal`;
    ``register_method``'s ``needs_server_data``, ``needs_clients``, ``needs_base``, ...)."""

    server_data: bool = False
    clients_for_data: bool = False
    clients: bool = False
    base: bool = False
    plain_chain_only: bool = False
    many_clients: bool = True
    min_clients: int | MinClients = 1
    mixed_widths: bool = False

    def fewest_clients(self, options: Mapping[str, Any]) -> tuple[int, str]:
        """The fewest clients accepted at the method ``options`` and why (:data:`MinClients`)."""
        return self.min_clients(options) if callable(self.min_clients) else (self.min_clients, "")


@dataclass(frozen=True)
class Rule:
    """How the merge is built from the aligned clients: ``combine`` (default the weighted
    average), or ``builds_model``, a model of another architecture; then the post-merge steps
    the method asks for (:func:`fedlmc.merging.post_merge.post_merge`): ``reestimate_bn``
    (BatchNorm running statistics re-estimated) and ``repair`` (REPAIR of every hidden unit)."""

    combine: Combine | None = None
    builds_model: BuildModel | None = None
    reestimate_bn: bool = True
    repair: bool = False

    @property
    def template_shaped(self) -> bool:
        """Whether the merge is a state dict of the template (no ``builds_model``)."""
        return self.builds_model is None

    def combined(
        self, spec: PermutationSpec | None, states: Sequence[StateDict], weights: Sequence[float]
    ) -> StateDict:
        """``states`` combined at ``weights`` by this rule (plain average by default)."""
        if self.combine is None:
            from fedlmc.averaging import average

            return average(states, weights)
        return self.combine(spec, states, weights)


@dataclass(frozen=True)
class MergeMethod:
    """A registered merge method (see the module docstring), built by :func:`register_method`:
    its name, its alignment ``align(job) -> Alignment``, what it needs and how its result is
    built."""

    name: str
    description: str
    align: Callable[[MergeJob], Alignment]
    needs: Needs = field(default_factory=Needs)
    rule: Rule = field(default_factory=Rule)

    def refusal(self, request: MergeRequest, shown: str | None = None) -> str | None:
        """Why this method cannot run on ``request``, in one line naming the method (as
        ``shown``, default its name), the bad value and what is allowed; ``None`` when it can.
        Each precondition is asked in this order and written only here."""
        name = repr(shown or self.name)
        for precondition in _PRECONDITIONS:
            reason = precondition(self.needs, self.rule.repair, request)
            if reason:
                return f"merge method {name}{reason}"
        return None


BUILTIN_MODULES = ("builtin_methods", "baselines.baselines", "field.field_methods", "robust.rules")
"""The modules of ``fedlmc.merging`` declaring the built-in methods (:func:`builtin_method`), in
the order :data:`METHODS` lists them."""
_DECLARED: dict[str, list[tuple[str, dict[str, Any], Callable[[MergeJob], Alignment]]]] = {}
_Align = TypeVar("_Align", bound=Callable[..., Any])


def builtin_method(name: str, **declaration: Any) -> Callable[[_Align], _Align]:
    """Decorator of the built-in modules (:data:`BUILTIN_MODULES`): declares ``align`` as the
    method ``name``, ``register_method(name, **declaration)``, which the registry runs when it
    loads them (once, before its first use), so that importing such a module registers
    nothing and the built-ins are listed in one order whichever module was imported first."""
    module = sys._getframe(1).f_globals["__name__"]  # the declaring module, as namedtuple reads it

    def decorator(align: _Align) -> _Align:
        _DECLARED.setdefault(module, []).append((name, declaration, align))
        return align

    return decorator


def _load_builtin_methods() -> None:
    """Import the built-in modules and register what they declare, in their order (run once by
    :data:`METHODS`, before its first registration, look-up or listing)."""
    for module in BUILTIN_MODULES:
        full = f"fedlmc.merging.{module}"
        importlib.import_module(full)
        for name, declaration, align in _DECLARED.get(full, []):
            register_method(name, **declaration)(align)


METHODS: Registry[MergeMethod] = Registry("merge method", load=_load_builtin_methods)


def _one_width(n: Needs, repair: bool, r: MergeRequest) -> str:
    if n.mixed_widths or not r.widths:
        return ""
    allowed = ", ".join(e.name for e in METHODS if e.needs.mixed_widths) or "none"
    return (
        f" needs clients of one width ({r.widths}); allowed for mixed widths: {allowed} "
        f"(each also with {CALIBRATED_SUFFIX})"
    )


def _on_clients(n: Needs, repair: bool, r: MergeRequest) -> str:
    if not n.clients or r.clients is None or r.clients:
        return ""
    return (
        " runs on the clients; got none: allowed only in a federation (strategy = 'aligned' or "
        "'compare'; compare_methods(clients=...), merge_states(clients=...))"
    )


def _server_data(n: Needs, repair: bool, r: MergeRequest) -> str:
    if not n.server_data or r.server_data is None or r.server_data:
        return ""
    if n.clients_for_data and r.federated_data:
        return ""
    instead = " or the clients' data (calibration = 'federated')" if n.clients_for_data else ""
    return f" needs server data; got none: allowed: server data (server_data=(x, y)){instead}"


def _client_count(n: Needs, repair: bool, r: MergeRequest) -> str:
    if not n.many_clients and r.num_clients > 2:
        return f" with {r.num_clients} clients: allowed: at most 2 clients"
    if r.fewest_clients is None:
        return ""
    low = max(r.fewest_clients, 2)  # one client is its own merge
    need, why = n.fewest_clients(r.options)
    if low > r.num_clients or low >= need:
        return ""
    count = low if low == r.num_clients else f"as few as {low}"
    return f" with {count} clients: allowed: at least {need} clients{why}"


def _base(n: Needs, repair: bool, r: MergeRequest) -> str:
    if not n.base or r.base is None or r.base:
        return ""
    return (
        " needs the clients' common base model; got none: its task vectors are relative to it, "
        "and clients initialised independently have none; allowed: init = 'shared' (the "
        "server's initialisation is the base), or base= in merge_states / compare_methods"
    )


def _plain_chain(n: Needs, repair: bool, r: MergeRequest) -> str:
    if not n.plain_chain_only or not r.chain_reason:
        return ""
    return f": model {r.model!r} is not supported: {r.chain_reason}; allowed: {PLAIN_CHAINS}"


def _repair_bias(n: Needs, repair: bool, r: MergeRequest) -> str:
    if not repair or not r.bias_free:
        return ""
    return (
        f": {r.bias_free} has no bias, and REPAIR (Jordan et al. 2023) sets each hidden unit's "
        "mean through its bias; allowed: a model with biases (bias = true); for the std alone "
        "use RESCALE (average_rescale, weight_matching_rescale)"
    )


_PRECONDITIONS: tuple[Callable[[Needs, bool, MergeRequest], str], ...] = (
    *(_one_width, _on_clients, _server_data, _client_count, _base, _plain_chain, _repair_bias),
)
"""Each the tail of a refusal (``""``: met), in the order :meth:`MergeMethod.refusal` asks."""


def refusal(method: str, request: MergeRequest) -> str | None:
    """Why the registered ``method`` (a ``_t`` suffix accepted, and named so) cannot run on
    ``request`` (:meth:`MergeMethod.refusal`); ``None`` when it can."""
    return merge_method(method).refusal(request, method)


def check_method(method: str, request: MergeRequest) -> MergeMethod:
    """The registered ``method``; ``ValueError`` with :func:`refusal`'s line when it cannot run
    on ``request``."""
    entry = merge_method(method)
    reason = entry.refusal(request, method)
    if reason:
        raise ValueError(reason)
    return entry


def register_method(
    name: str,
    *,
    description: str,
    needs_server_data: bool = False,
    clients_for_data: bool = False,
    needs_clients: bool = False,
    needs_base: bool = False,
    plain_chain_only: bool = False,
    many_clients: bool = True,
    min_clients: int | MinClients = 1,
    mixed_widths: bool = False,
    combine: Combine | None = None,
    builds_model: BuildModel | None = None,
    reestimate_bn: bool = True,
    repair: bool = False,
    replace: bool = False,
) -> Callable[[Callable[[MergeJob], Alignment]], Callable[[MergeJob], Alignment]]:
    """Decorator registering ``align(job) -> Alignment`` as the merge method ``name``, with
    what it needs (:class:`Needs`) and how its result is built (:class:`Rule`)."""
    if name.endswith(CALIBRATED_SUFFIX) or name in REFERENCE_METHODS:
        raise ValueError(
            f"merge method name {name!r}: allowed: a name not ending in "
            f"{CALIBRATED_SUFFIX!r} and not {', '.join(REFERENCE_METHODS)}"
        )
    needs = Needs(
        *(needs_server_data, clients_for_data, needs_clients, needs_base, plain_chain_only),
        *(many_clients, min_clients if callable(min_clients) else int(min_clients), mixed_widths),
    )
    rule = Rule(combine, builds_model, reestimate_bn, repair)

    def decorator(align: Callable[[MergeJob], Alignment]) -> Callable[[MergeJob], Alignment]:
        METHODS.add(name, MergeMethod(name, description, align, needs, rule), replace=replace)
        return align

    return decorator


def merge_method(name: str) -> MergeMethod:
    """The registered method ``name`` (a ``_t`` suffix is accepted: same merge, same weights)."""
    return METHODS.get(base_method(name))


def template_merge_names() -> tuple[str, ...]:
    """The registered methods whose merge is a state dict of the template (all but those
    registered with ``builds_model``), in registration order."""
    return tuple(m.name for m in METHODS if m.rule.template_shaped)


def check_template_merge(
    method: str, where: str, allowed: Sequence[str] | None = None
) -> MergeMethod:
    """The registered ``method`` (a ``_t`` suffix accepted); ``ValueError`` in one line, naming
    it, ``where`` (a consumer of template state dicts: a strategy, a saved merge) and the methods
    ``allowed`` there (default: :func:`template_merge_names`), when its merge is a model of
    another architecture (``builds_model``)."""
    entry = merge_method(method)
    if not entry.rule.template_shaped:
        names = template_merge_names() if allowed is None else allowed
        raise ValueError(
            f"{where}: merge method {entry.name!r} builds a model of another architecture (not "
            f"a state dict of the model); allowed: {', '.join(names)}"
        )
    return entry


def merge_method_names() -> tuple[str, ...]:
    """The registered merge methods, in registration order."""
    return METHODS.names()


def refuse_calibrated_row(method: str, where: str, calibrate_with: str) -> None:
    """``ValueError`` in one line when ``method`` names a ``_t`` row of a registered merge:
    ``where`` (a function or strategy that returns a merge, never a row's temperature) would
    give the uncalibrated model under the name of the calibrated one. The line names the merge
    to ask for and ``calibrate_with``, where its temperature comes from."""
    base = base_method(method)
    if base != method and base in METHODS:
        raise ValueError(
            f"{where}: {method!r} is a study row, the merge {base!r} with a fitted temperature, "
            f"and {where} fits none; allowed: {base!r} (then the temperature: {calibrate_with})"
        )


def base_method(method: str) -> str:
    """The merge behind a row's method: ``"weight_matching_t"`` -> ``"weight_matching"``."""
    if isinstance(method, str) and method.endswith(CALIBRATED_SUFFIX):
        return method[: -len(CALIBRATED_SUFFIX)]
    return method


def study_methods(federated: bool = False) -> tuple[str, ...]:
    """Every row a study can report: each merge method raw and with ``_t`` (but those that need
    the clients, unless ``federated``: a study given a federation's clients, the ``compare``
    strategy's), then the reference rows (:data:`REFERENCE_METHODS`)."""
    names = [
        n
        for m in merge_method_names()
        if federated or not METHODS.get(m).needs.clients
        for n in (m, m + CALIBRATED_SUFFIX)
    ]
    return (*names, *REFERENCE_METHODS)


def is_method_path(entry: object) -> bool:
    """Whether a ``methods`` entry names a method by import path (``"package.module:name"``)
    rather than by its registered name."""
    return is_factory_path(entry)


def resolve_method_entry(entry: str) -> str:
    """The registered method (or ``_t`` row) a ``methods`` entry stands for: the entry itself
    unless it is an import path ``"package.module:name"`` (as a model used once is named; every
    process that validates the run config resolves it the same way; idempotent):

    1. ``package.module`` is imported, searched as ``python -m`` searches (the current folder
       first, then ``sys.path``; :func:`fedlmc.registry.import_user_module`: the folder travels
       to the workers; a module elsewhere needs its folder on ``PYTHONPATH``); the
       allow-list :data:`fedlmc.models.registry.MODEL_ALLOW_VARIABLE`, when set, applies too);
    2. if it registered a method ``name`` (``@register_method("name", ...)``), that method is
       the entry (a function ``name`` of the module that is not that method is refused);
    3. else, if ``name`` is a function of the module called as ``name(job)``
       (:func:`check_merge_function`; ``os:system`` is refused), it is registered as method
       ``name`` with :func:`register_method`'s defaults;
    4. else ``ValueError`` naming the entry and what is allowed.

    Its rows are ``name`` (and ``name_t`` for the entry ``package.module:name_t``)."""
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
        module = import_user_module(location)
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
