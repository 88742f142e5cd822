r"""The merge-method registry: one registration per one-shot merge method.

A merge method turns the client state dicts :math:`\theta_1, \dots, \theta_N` (same architecture)
and their normalised weights :math:`w_i` into the clients *in a common basis*,
:math:`\pi_1(\theta_1), \dots, \pi_N(\theta_N)` (:math:`\pi_i` a hidden-unit permutation, the
identity for plain averaging), and optionally its own merged weights (MergeMany); otherwise the
merge is :math:`\bar\theta = \sum_i w_i \pi_i(\theta_i)`. It is registered once with
:func:`register_method`, together with what it needs:

- ``needs_server_data``: inputs held by the server (activation matching correlates activations
  on them);
- ``many_clients``: whether it accepts more than two clients; ``min_clients``: the fewest it
  accepts at its default options (Krum: :math:`2f + 3 = 3`; default 1), below which the
  study's default method list leaves it out;
- ``reestimate_bn``: whether a BatchNorm model's running statistics are re-estimated after the
  merge (by the study on the server split, by the strategies on server or federated data);
- ``repair``: whether the merge is followed by REPAIR (:mod:`fedlmc.merging.repair`: every hidden
  unit rescaled so that its pre-activation mean and std match the endpoints' interpolated ones) for
  models without BatchNorm, which must have a bias in every repaired layer (the mean is set
  through it; its refusal, :meth:`MergeMethod.refusal`, refuses a bias-free one); for
  BatchNorm models REPAIR reduces to re-estimating the statistics;
- ``needs_clients``: it runs a protocol with the clients (``job.clients``, a
  :class:`ClientQueries`), so it exists only inside a federation (the strategies), never in the
  server-side study;
- ``clients_for_data``: with ``job.clients`` set (a federation calibrating on the clients'
  held-out data, ``calibration = "federated"``), the data it needs comes from the clients
  instead of the server split;
- ``combine``: how the aligned clients become one model at given weights,
  ``combine(spec, states, weights)`` (default: the plain weighted average). The merge and every
  point of the study's interpolation paths use it, so a method's barriers and LEWC diagnostics
  are measured on the path its own rule defines;
- ``plain_chain_only``: the method is defined only for norm-free plain feed-forward chains
  (:mod:`fedlmc.permutation.chain`), and is refused for other models before any work;
- ``mixed_widths``: it accepts clients of different widths (:mod:`fedlmc.merging.widths`): it
  embeds every client into the shapes of ``template``, the *server* model (at least as wide as
  every client), so its merge and its aligned clients have the server's shapes. Every other
  method refuses clients whose state dicts differ in shape, before any work;
- ``on_path``: the merge lies on a path between the aligned clients (default); ``False`` for a
  control that moves one client off it (``random_direction``): the study leaves its barrier and
  path columns NaN;
- ``server_sees``: the least the server must see of the clients for this method's rule, one of
  :data:`fedlmc.merging.server_sees.SERVER_SEES` (``sum``: secure aggregation can run it;
  default ``each model``); the ``server_sees`` column, the methods table and ``fedlmc
  validate``'s refusal of a secure-aggregation cell read it;
- ``builds_model``: for a method whose merge is a model of another architecture than the
  template (Preserve-First Merging keeps every client's first layers),
  ``builds_model(template, aligned, weights, options) -> nn.Module`` (``options``: the job's
  method options), the model the study evaluates
  (in eval mode; a ``parameter_count`` attribute, if it has one, is what it needs to predict).
  Its merged state dict is then only the combination of the aligned clients its later layers
  use: whatever needs a state dict of the template (the strategies, the saved merges, the
  barrier paths, LEWC/LLFC) refuses it or leaves its columns NaN
  (:func:`check_template_merge`);
- ``sum_exponents``: for a ``sum`` rule that is one weighted sum with a per-key power of the
  weights, :math:`\sum_i w_i^{1+e_k} \theta_i[k]`, the exponents ``sum_exponents(spec, state)
  -> {key: e_k}`` (:mod:`fedlmc.merging.sum_form`): what each client pre-scales and the server
  post-scales, so that the method runs under secure aggregation; ``divide_by_holders``: a
  ``mixed_widths`` rule that averages each entry over the clients holding it (HeteroFL): each
  client also sends its holder masks in the same secure sum and the server divides by their
  sum (:func:`fedlmc.merging.sum_form.divided_by_holders`); ``secure_note``: for a ``sum``
  rule without them, what it would need to run securely (the refusal says it);
- ``secure_sums``: for a ``sum`` rule computed from several secure means at once (Fisher
  merging, RegMean: ratios and solves of sums over the clients), what each client sends and how
  the server merges the means (:class:`fedlmc.merging.sum_form.SecureSums`); like
  ``sum_exponents``, it makes the method run under secure aggregation;
- the secure-protocol declarations (``server_sees``, ``sum_exponents``, ``secure_sums``,
  ``divide_by_holders``, ``secure_note``) are kept together as one value, the entry's
  ``secure`` (:class:`SecureForm`);
- ``needs_base``: the rule is relative to the clients' common starting model (task vectors:
  Task Arithmetic, TIES, DARE), ``job.base``; refused before any work without one (clients
  initialised independently have none);
- ``counterpart_of``: for a ``mixed_widths`` method, the one-width method it stands in for when
  a run of clients of different widths leaves ``methods`` at its default (``embed_average`` for
  ``average``);
- ``columns``: the results columns only this method fills (:class:`fedlmc.columns.Column`,
  from its ``Alignment.info``; NaN or empty on the other rows). They join the results schema
  (:func:`fedlmc.study.rows.row_columns`), the docs' columns table and, with a ``report_table``, the
  report; an ``info`` key the method did not declare is an error. A method whose merge permutes
  hidden units declares :data:`fedlmc.merging.alignment_record.ALIGNMENT_COLUMNS` and fills them
  with :func:`~fedlmc.merging.alignment_record.alignment_info` (groups aligned, units moved).

Everything that lists methods reads this registry: the study's rows (each method ``m`` gives a
row ``m`` and a row ``m_t`` with a fitted temperature, plus the ``ensemble`` reference), the
strategies (``PermutationAlignedAverage(method=...)``), the run-config schema, ``fedlmc
methods`` and the docs' methods table. :func:`fedlmc.merging.methods.merge_states` is the one
function the study and the strategies call. The built-in methods are registered in
:mod:`fedlmc.merging.builtin_methods`; import :mod:`fedlmc.merging.methods` (which imports both)
to see them in :data:`METHODS`.

This module imports no torch at import time (the run-config validation reads the method names
without loading torch); each registered function imports what it needs when it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fedlmc.columns import COMMON_COLUMNS, Column, check_unique
from fedlmc.merging.server_sees import DEFAULT_SERVER_SEES, SECURE_SUM, check_server_sees
from fedlmc.registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from fedlmc.merging.sum_form import SecureSums, SumExponents
    from fedlmc.permutation.spec import PermutationSpec

    StateDict = dict[str, Tensor]

__all__ = [
    "CALIBRATED_SUFFIX",
    "METHODS",
    "REFERENCE_METHODS",
    "Alignment",
    "ClientQueries",
    "MergeJob",
    "MergeMethod",
    "MergeRequest",
    "SecureForm",
    "base_method",
    "check_method",
    "check_own_columns",
    "check_template_merge",
    "merge_method",
    "merge_method_names",
    "mixed_width_row",
    "refusal",
    "register_method",
    "study_methods",
    "template_merge_names",
]

CALIBRATED_SUFFIX = "_t"
REFERENCE_METHODS = {
    "ensemble": "mean of the clients' softmax outputs (N forward passes)",
    "logit_ensemble": "softmax of the weighted mean of the clients' logits (N forward passes)",
}
Combine = Callable[["PermutationSpec | None", Sequence["StateDict"], Sequence[float]], "StateDict"]
BuildModel = Callable[
    ["nn.Module", Sequence["StateDict"], Sequence[float], "Mapping[str, Any]"], "nn.Module"
]


class ClientQueries(Protocol):
    """What a federation lets a merge method ask the clients of ``MergeJob.states`` (in that
    order), without any data leaving them. The strategies implement it with Flower query
    rounds (:class:`fedlmc.strategies.queries.ClientRounds`);
    :class:`fedlmc.merging.clients.LocalClients` answers the same from data held in memory
    (notebooks, tests)."""

    def calibrated_nlls(
        self, states: Sequence[StateDict], reestimate_bn: Sequence[bool]
    ) -> list[float]:
        """Per state dict, the mean NLL over the clients' calibration data at the temperature of
        :func:`fedlmc.merging.calibrate.temperature_grid` minimising it (BatchNorm statistics
        re-estimated on the clients' data first where ``reestimate_bn``)."""
        ...

    def activation_permutations(self, reference: StateDict) -> list[dict[str, Tensor]]:
        """Per client, the permutations matching its own model's hidden units to
        ``reference``'s by activation correlation on its own data; an empty mapping (the
        identity) for client 0, whose model ``reference`` is."""
        ...

    def fisher_diagonals(self) -> list[StateDict | None]:
        """Per client, the diagonal empirical Fisher of its own model on (a bounded sample of)
        its own training data (:func:`fedlmc.merging.fisher.fisher_diagonal`); ``None`` for a
        client whose answer was dropped."""
        ...

    def gram_matrices(self, layers: Sequence[str]) -> list[dict[str, Tensor] | None]:
        """Per client, the Gram matrix of each of ``layers``' inputs of its own model on (a
        bounded sample of) its own training data (:func:`fedlmc.merging.regmean.gram_matrices`);
        ``None`` for a client whose answer was dropped."""
        ...


@dataclass
class MergeJob:
    """What a merge method receives: the clients, their normalised weights and the context
    (the server's held-out data ``(x, y)`` if any, method ``options`` such as
    ``auto_tolerance``, ``clients``, the :class:`ClientQueries` of a federation, and ``base``,
    the clients' common starting model if any)."""

    template: nn.Module
    states: Sequence[StateDict]
    weights: list[float]
    seed: int = 0
    server_data: tuple[Tensor, Tensor] | None = None
    device: torch.device | None = None
    spec: PermutationSpec | None = None
    options: dict[str, Any] = field(default_factory=dict)
    clients: ClientQueries | None = None
    base: StateDict | None = None
    """The clients' common starting model when they had one (``init = "shared"``: the server's
    initialisation), for the methods registered ``needs_base``."""

    @property
    def server_inputs(self) -> Tensor | None:
        """The inputs of the server data (``None`` without server data)."""
        return None if self.server_data is None else self.server_data[0]

    def permutation_spec(self) -> PermutationSpec:
        """The given spec, else the template's (:func:`fedlmc.permutation.permutation_spec`)."""
        if self.spec is None:
            from fedlmc.permutation.model_spec import permutation_spec

            self.spec = permutation_spec(self.template)
        return self.spec


@dataclass
class Alignment:
    """The clients in the merged basis, the method's own merged weights if it has them, and
    what the method reports about its choice (``info``: row columns such as ``auto_choice``)."""

    aligned: list[StateDict]
    merged: StateDict | None = None
    info: dict[str, Any] = field(default_factory=dict)
    kept: list[int] | None = None
    """Indices of the clients in ``aligned`` when the method had to leave some out (a client
    whose answer to a query was dropped); ``None``: all of them."""


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
    federation's clients answer queries; ``base``: the clients' common starting model exists."""

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


@dataclass(frozen=True)
class SecureForm:
    """The secure-protocol part of a method's declaration (module docstring; ``note``: its
    ``secure_note``)."""

    server_sees: str = DEFAULT_SERVER_SEES
    sum_exponents: SumExponents | None = None
    secure_sums: SecureSums | None = None
    divide_by_holders: bool = False
    note: str = ""

    @property
    def runs_securely(self) -> bool:
        """Whether secure aggregation can run the rule: ``sum`` with its ``sum_exponents`` or
        its ``secure_sums``."""
        built = self.sum_exponents is not None or self.secure_sums is not None
        return self.server_sees == SECURE_SUM and built


@dataclass(frozen=True)
class MergeMethod:
    """A registered merge method (see the module docstring); built by :func:`register_method`,
    its secure-protocol part one value, ``secure``."""

    name: str
    align: Callable[[MergeJob], Alignment]
    description: str
    needs_server_data: bool = False
    many_clients: bool = True
    reestimate_bn: bool = True
    repair: bool = False
    needs_clients: bool = False
    clients_for_data: bool = False
    combine: Combine | None = None
    plain_chain_only: bool = False
    columns: tuple[Column, ...] = ()
    mixed_widths: bool = False
    counterpart_of: str = ""
    on_path: bool = True
    builds_model: BuildModel | None = None
    min_clients: int = 1
    needs_base: bool = False
    secure: SecureForm = field(default_factory=SecureForm)

    @property
    def template_shaped(self) -> bool:
        """Whether the merge is a state dict of the template (every method but those registered
        with ``builds_model``)."""
        return self.builds_model is None

    @property
    def server_sees(self) -> str:
        """The least the server must see of the clients (``secure.server_sees``)."""
        return self.secure.server_sees

    @property
    def runs_securely(self) -> bool:
        """Whether secure aggregation can run the rule (:attr:`SecureForm.runs_securely`)."""
        return self.secure.runs_securely

    def refusal(self, request: MergeRequest, shown: str | None = None) -> str | None:
        """Why this method cannot run on ``request``, in one line naming the method (as
        ``shown``, default its name), the bad value and what is allowed; ``None`` when it can.
        Each precondition is asked in this order and written only here."""
        name = repr(shown or self.name)
        for precondition in _PRECONDITIONS:
            reason = precondition(self, request)
            if reason:
                return f"merge method {name}{reason}"
        return None

    def combined(
        self, spec: PermutationSpec | None, states: Sequence[StateDict], weights: Sequence[float]
    ) -> StateDict:
        """``states`` combined at ``weights`` by this method's rule (plain average by default)."""
        if self.combine is None:
            from fedlmc.averaging import average

            return average(states, weights)
        return self.combine(spec, states, weights)


METHODS: Registry[MergeMethod] = Registry("merge method")


def _one_width(m: MergeMethod, r: MergeRequest) -> str:
    if m.mixed_widths or not r.widths:
        return ""
    allowed = ", ".join(e.name for e in METHODS if e.mixed_widths) or "none"
    return (
        f" needs clients of one width ({r.widths}); allowed for mixed widths: {allowed} "
        f"(each also with {CALIBRATED_SUFFIX})"
    )


def _on_clients(m: MergeMethod, r: MergeRequest) -> str:
    if not m.needs_clients or r.clients is None or r.clients:
        return ""
    return (
        " runs on the clients; got none: allowed only in a federation (strategy = 'aligned' or "
        "'compare'; compare_methods(clients=...), merge_states(clients=...))"
    )


def _server_data(m: MergeMethod, r: MergeRequest) -> str:
    if not m.needs_server_data or r.server_data is None or r.server_data:
        return ""
    if m.clients_for_data and r.federated_data:
        return ""
    instead = " or the clients' data (calibration = 'federated')" if m.clients_for_data else ""
    return f" needs server data; got none: allowed: server data (server_data=(x, y)){instead}"


def _client_count(m: MergeMethod, r: MergeRequest) -> str:
    if not m.many_clients and r.num_clients > 2:
        return f" with {r.num_clients} clients: allowed: at most 2 clients"
    fewest = r.fewest_clients
    if fewest is not None and 1 < fewest < m.min_clients:  # one client is its own merge
        return f" with {fewest} clients: allowed: at least {m.min_clients} clients"
    return ""


def _base(m: MergeMethod, r: MergeRequest) -> str:
    if not m.needs_base or r.base is None or r.base:
        return ""
    return (
        " needs the clients' common base model; got none: its task vectors are relative to it, "
        "and clients initialised independently have none; allowed: init = 'shared' (the "
        "server's initialisation is the base), or base= in merge_states / compare_methods"
    )


def _plain_chain(m: MergeMethod, r: MergeRequest) -> str:
    if not m.plain_chain_only or not r.chain_reason:
        return ""
    return f": model {r.model!r} is not supported: {r.chain_reason}; allowed: {PLAIN_CHAINS}"


def _repair_bias(m: MergeMethod, r: MergeRequest) -> str:
    if not m.repair or not r.bias_free:
        return ""
    return (
        f": {r.bias_free} has no bias, and REPAIR (Jordan et al. 2023) sets each hidden unit's "
        "mean through its bias; allowed: a model with biases (bias = true); for the std alone "
        "use RESCALE (average_rescale, weight_matching_rescale)"
    )


_PRECONDITIONS: tuple[Callable[[MergeMethod, MergeRequest], str], ...] = (
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
    many_clients: bool = True,
    reestimate_bn: bool = True,
    repair: bool = False,
    needs_clients: bool = False,
    clients_for_data: bool = False,
    combine: Combine | None = None,
    plain_chain_only: bool = False,
    columns: Sequence[Column] = (),
    mixed_widths: bool = False,
    counterpart_of: str = "",
    on_path: bool = True,
    server_sees: str = DEFAULT_SERVER_SEES,
    builds_model: BuildModel | None = None,
    sum_exponents: SumExponents | None = None,
    secure_note: str = "",
    divide_by_holders: bool = False,
    min_clients: int = 1,
    secure_sums: SecureSums | None = None,
    needs_base: bool = False,
    replace: bool = False,
) -> Callable[[Callable[[MergeJob], Alignment]], Callable[[MergeJob], Alignment]]:
    """Decorator registering ``align(job) -> Alignment`` as the merge method ``name``."""
    if name.endswith(CALIBRATED_SUFFIX) or name in REFERENCE_METHODS:
        raise ValueError(
            f"merge method name {name!r}: allowed: a name not ending in "
            f"{CALIBRATED_SUFFIX!r} and not {', '.join(REFERENCE_METHODS)}"
        )
    check_own_columns(name, tuple(columns), replace=replace)
    secure = SecureForm(server_sees, sum_exponents, secure_sums, divide_by_holders, secure_note)
    _check_secure_form(name, secure, mixed_widths)

    def decorator(align: Callable[[MergeJob], Alignment]) -> Callable[[MergeJob], Alignment]:
        entry = MergeMethod(
            name=name,
            align=align,
            description=description,
            needs_server_data=needs_server_data,
            many_clients=many_clients,
            reestimate_bn=reestimate_bn,
            repair=repair,
            needs_clients=needs_clients,
            clients_for_data=clients_for_data,
            combine=combine,
            plain_chain_only=plain_chain_only,
            columns=tuple(columns),
            mixed_widths=mixed_widths,
            counterpart_of=counterpart_of,
            on_path=on_path,
            builds_model=builds_model,
            min_clients=int(min_clients),
            needs_base=needs_base,
            secure=secure,
        )
        METHODS.add(name, entry, replace=replace)
        return align

    return decorator


def check_own_columns(method: str, columns: Sequence[Column], *, replace: bool = False) -> None:
    """A method's own columns must be :class:`Column` rows of ``source = "row"`` whose names are
    new: not a common column, not another method's different column."""
    taken = {c.name for c in COMMON_COLUMNS}
    others = {c.name: c for m in METHODS if not (replace and m.name == method) for c in m.columns}
    for column in columns:
        if not isinstance(column, Column) or column.source != "row":
            what = column.name if isinstance(column, Column) else column
            raise ValueError(
                f"merge method {method!r}: column {what!r}; allowed: a "
                "fedlmc.columns.Column with source 'row'"
            )
        if column.name in taken or others.get(column.name, column) != column:
            raise ValueError(
                f"merge method {method!r}: column {column.name!r} is already declared; allowed: "
                "a new column name"
            )
    check_unique(columns)


def merge_method(name: str) -> MergeMethod:
    """The registered method ``name`` (a ``_t`` suffix is accepted: same merge, same weights)."""
    return METHODS.get(base_method(name))


def template_merge_names() -> tuple[str, ...]:
    """The registered methods whose merge is a state dict of the template (all but those
    registered with ``builds_model``), in registration order."""
    return tuple(m.name for m in METHODS if m.template_shaped)


def check_template_merge(
    method: str, where: str, allowed: Sequence[str] | None = None
) -> MergeMethod:
    """The registered ``method`` (a ``_t`` suffix accepted); ``ValueError`` in one line, naming
    it, ``where`` (a consumer of template state dicts: a strategy, a saved merge) and the methods
    ``allowed`` there (default: :func:`template_merge_names`), when its merge is a model of
    another architecture (``builds_model``)."""
    entry = merge_method(method)
    if not entry.template_shaped:
        names = template_merge_names() if allowed is None else allowed
        raise ValueError(
            f"{where}: merge method {entry.name!r} builds a model of another architecture (not "
            f"a state dict of the model); allowed: {', '.join(names)}"
        )
    return entry


def merge_method_names() -> tuple[str, ...]:
    """The registered merge methods, in registration order."""
    return METHODS.names()


def base_method(method: str) -> str:
    """The merge behind a row's method: ``"weight_matching_t"`` -> ``"weight_matching"``."""
    if isinstance(method, str) and method.endswith(CALIBRATED_SUFFIX):
        return method[: -len(CALIBRATED_SUFFIX)]
    return method


def mixed_width_row(method: str) -> str | None:
    """The row that stands for ``method`` in a run of clients of different widths: itself for a
    reference method or a ``mixed_widths`` merge; the mixed-width method registered
    ``counterpart_of`` its merge, with its ``_t`` kept (``"average_t"`` ->
    ``"embed_average_t"``); ``None`` when there is none."""
    base = base_method(method)
    if base not in METHODS or METHODS.get(base).mixed_widths:
        return method
    twin = next((m.name for m in METHODS if m.mixed_widths and m.counterpart_of == base), None)
    return None if twin is None else twin + method[len(base) :]


def study_methods(federated: bool = False) -> tuple[str, ...]:
    """Every row a study can report: each merge method raw and with ``_t`` (but those that need
    the clients, unless ``federated``: a study given a federation's clients, the ``compare``
    strategy's), then ``ensemble``."""
    names = [
        n
        for m in merge_method_names()
        if federated or not METHODS.get(m).needs_clients
        for n in (m, m + CALIBRATED_SUFFIX)
    ]
    return (*names, *REFERENCE_METHODS)


def _check_secure_form(name: str, secure: SecureForm, mixed_widths: bool) -> None:
    """``ValueError`` for a secure part that contradicts itself (``register_method``'s keys)."""
    sees = secure.server_sees
    check_server_sees(name, sees)
    if secure.sum_exponents is not None and sees != SECURE_SUM:
        raise ValueError(
            f"merge method {name!r}: sum_exponents with server_sees = {sees!r}; "
            f"allowed only with server_sees = {SECURE_SUM!r}"
        )
    if secure.secure_sums is not None and (sees != SECURE_SUM or secure.sum_exponents is not None):
        raise ValueError(
            f"merge method {name!r}: secure_sums with server_sees = {sees!r} or with "
            f"sum_exponents; allowed only with server_sees = {SECURE_SUM!r}, without exponents"
        )
    if secure.divide_by_holders and (secure.sum_exponents is None or not mixed_widths):
        raise ValueError(
            f"merge method {name!r}: divide_by_holders without sum_exponents and "
            "mixed_widths; allowed only on a mixed-widths rule with its sum_exponents"
        )
