r"""The merge-method registry: one registration per one-shot merge method.

A merge method turns the client state dicts :math:`\theta_1, \dots, \theta_N` (same architecture)
and their normalised weights :math:`w_i` into the clients *in a common basis*,
:math:`\pi_1(\theta_1), \dots, \pi_N(\theta_N)` (:math:`\pi_i` a hidden-unit permutation, the
identity for plain averaging), and optionally its own merged weights (MergeMany); otherwise the
merge is :math:`\bar\theta = \sum_i w_i \pi_i(\theta_i)`. It is registered once with
:func:`register_method`, together with what it needs:

- ``needs_server_data``: inputs held by the server (activation matching correlates activations
  on them);
- ``many_clients``: whether it accepts more than two clients;
- ``reestimate_bn``: whether a BatchNorm model's running statistics are re-estimated after the
  merge (by the study on the server split, by the strategies on server or federated data);
- ``repair``: whether the merge is followed by REPAIR (:mod:`fedlmc.merging.repair`: every hidden
  unit rescaled so that its pre-activation mean and std match the endpoints' interpolated ones) for
  models without BatchNorm; for BatchNorm models REPAIR reduces to re-estimating the statistics;
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
methods`` and the docs' methods table. :func:`merge_states` is the one function the study and the
strategies call.

This module imports no torch at import time (the run-config validation reads the method names
without loading torch); each registered function imports what it needs when it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fedlmc.columns import COMMON_COLUMNS, Column, check_unique
from fedlmc.merging.alignment_record import ALIGNMENT_COLUMNS, alignment_info
from fedlmc.merging.random_direction import RANDOM_DIRECTION_COLUMNS
from fedlmc.registry import Registry

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from fedlmc.permutation.spec import PermutationSpec

    StateDict = dict[str, Tensor]

__all__ = [
    "AUTO_TOLERANCE",
    "CALIBRATED_SUFFIX",
    "METHODS",
    "REFERENCE_METHODS",
    "Alignment",
    "ClientQueries",
    "MergeJob",
    "MergeMethod",
    "base_method",
    "merge_method",
    "merge_method_names",
    "merge_states",
    "merge_with_info",
    "register_method",
    "study_methods",
]

CALIBRATED_SUFFIX = "_t"
REFERENCE_METHODS = {
    "ensemble": "mean of the clients' softmax outputs (N forward passes)",
    "logit_ensemble": "softmax of the weighted mean of the clients' logits (N forward passes)",
}
Combine = Callable[["PermutationSpec | None", Sequence["StateDict"], Sequence[float]], "StateDict"]


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


@dataclass
class MergeJob:
    """What a merge method receives: the clients, their normalised weights and the context
    (the server's held-out data ``(x, y)`` if any, method ``options`` such as
    ``auto_tolerance``, and ``clients``, the :class:`ClientQueries` of a federation)."""

    template: nn.Module
    states: Sequence[StateDict]
    weights: list[float]
    seed: int = 0
    server_data: tuple[Tensor, Tensor] | None = None
    device: torch.device | None = None
    spec: PermutationSpec | None = None
    options: dict[str, Any] = field(default_factory=dict)
    clients: ClientQueries | None = None

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


@dataclass(frozen=True)
class MergeMethod:
    """A registered merge method (see the module docstring)."""

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

    def combined(
        self, spec: PermutationSpec | None, states: Sequence[StateDict], weights: Sequence[float]
    ) -> StateDict:
        """``states`` combined at ``weights`` by this method's rule (plain average by default)."""
        if self.combine is None:
            from fedlmc.averaging import average

            return average(states, weights)
        return self.combine(spec, states, weights)


METHODS: Registry[MergeMethod] = Registry("merge method")


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
    replace: bool = False,
) -> Callable[[Callable[[MergeJob], Alignment]], Callable[[MergeJob], Alignment]]:
    """Decorator registering ``align(job) -> Alignment`` as the merge method ``name``."""
    if name.endswith(CALIBRATED_SUFFIX) or name in REFERENCE_METHODS:
        raise ValueError(
            f"merge method name {name!r}: allowed: a name not ending in "
            f"{CALIBRATED_SUFFIX!r} and not {', '.join(REFERENCE_METHODS)}"
        )
    check_own_columns(name, tuple(columns), replace=replace)

    def decorator(align: Callable[[MergeJob], Alignment]) -> Callable[[MergeJob], Alignment]:
        entry = MergeMethod(
            name,
            align,
            description,
            needs_server_data,
            many_clients,
            reestimate_bn,
            repair,
            needs_clients,
            clients_for_data,
            combine,
            plain_chain_only,
            tuple(columns),
            mixed_widths,
            counterpart_of,
            on_path,
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


def study_methods() -> tuple[str, ...]:
    """Every row a study can report: each merge method raw and with ``_t`` (but those that need
    the clients, which only a federation's strategy can run), then ``ensemble``."""
    names = [
        n
        for m in merge_method_names()
        if not METHODS.get(m).needs_clients
        for n in (m, m + CALIBRATED_SUFFIX)
    ]
    return (*names, *REFERENCE_METHODS)


def merge_states(
    method: str,
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float] | None = None,
    *,
    server_data: tuple[Tensor, Tensor] | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
    spec: PermutationSpec | None = None,
    options: dict[str, Any] | None = None,
    clients: ClientQueries | None = None,
) -> tuple[StateDict, list[StateDict]]:
    r"""Merge ``states`` with the registered ``method``: ``(merged, aligned clients)``.

    ``merged`` is the method's own merge or :math:`\sum_i w_i \pi_i(\theta_i)`; no BatchNorm
    re-estimation and no temperature here (the callers add them). A single client is returned
    unchanged (a ``mixed_widths`` method embeds it into ``template``'s shapes). ``ValueError``
    when the method is unknown, needs ``server_data`` (or, for
    methods that take the clients' data instead, ``clients``) that is missing, needs the
    ``clients`` of a federation that are missing, or does not accept this many clients, and
    when the clients' state dicts differ in shape for a method that is not ``mixed_widths``
    (those embed every client into ``template``'s shapes, the server width).
    :func:`merge_with_info` also returns what the
    method reports (e.g. ``auto``'s choice).
    """
    merged, aligned, _ = merge_with_info(
        method,
        template,
        states,
        weights,
        server_data=server_data,
        seed=seed,
        device=device,
        spec=spec,
        options=options,
        clients=clients,
    )
    return merged, aligned


def merge_with_info(
    method: str,
    template: nn.Module,
    states: Sequence[StateDict],
    weights: Sequence[float] | None = None,
    *,
    server_data: tuple[Tensor, Tensor] | None = None,
    seed: int = 0,
    device: str | torch.device | None = None,
    spec: PermutationSpec | None = None,
    options: dict[str, Any] | None = None,
    clients: ClientQueries | None = None,
) -> tuple[StateDict, list[StateDict], dict[str, Any]]:
    """:func:`merge_states` plus the method's ``Alignment.info``."""
    from fedlmc.averaging import average, normalised_weights
    from fedlmc.evaluation import resolve_device

    entry = merge_method(method)
    if not states:
        raise ValueError("need at least one client state dict, got none")
    if not entry.mixed_widths:
        check_one_width(entry.name, states)
    if entry.needs_clients and clients is None:
        raise ValueError(
            f"merge method {entry.name!r} runs on the clients: allowed only in a federation "
            "(strategy = 'aligned'), not in the server-side study"
        )
    data_from_clients = entry.clients_for_data and clients is not None
    if entry.needs_server_data and server_data is None and not data_from_clients:
        raise ValueError(f"merge method {entry.name!r} needs server data; got none")
    if not entry.many_clients and len(states) > 2:
        raise ValueError(f"merge method {entry.name!r}: allowed: at most 2 clients")
    w = normalised_weights(weights, len(states))
    if len(states) == 1 and not entry.mixed_widths:
        return average(states, w), list(states), {}
    job = MergeJob(
        template,
        list(states),
        w,
        int(seed),
        server_data,
        resolve_device(device),
        spec,
        dict(options or {}),
        clients,
    )
    alignment = entry.align(job)
    undeclared = sorted(set(alignment.info) - {c.name for c in entry.columns})
    if undeclared:
        raise ValueError(
            f"merge method {entry.name!r} reports column {undeclared[0]!r} it does not declare; "
            "allowed: the names in its register_method(columns=...)"
        )
    if alignment.kept is not None:
        w = normalised_weights([w[i] for i in alignment.kept], len(alignment.kept))
    merged = alignment.merged
    if merged is None:
        spec = job.spec if entry.combine is None else job.permutation_spec()
        merged = entry.combined(spec, alignment.aligned, w)
    return merged, alignment.aligned, dict(alignment.info)


def check_one_width(method: str, states: Sequence[StateDict]) -> None:
    """``ValueError`` naming ``method`` and the first key whose shape differs between client 0
    and another client (or that one of them lacks): the method needs clients of one width."""
    reference = states[0]
    for index, sd in enumerate(states[1:], start=1):
        for key in dict.fromkeys([*reference, *sd]):
            a, b = reference.get(key), sd.get(key)
            shape_a = "no such key" if a is None else tuple(a.shape)
            shape_b = "no such key" if b is None else tuple(b.shape)
            if shape_a != shape_b:
                allowed = ", ".join(m.name for m in METHODS if m.mixed_widths) or "none"
                raise ValueError(
                    f"merge method {method!r} needs clients of one width: {key!r} has shape "
                    f"{shape_a} in client 0 and {shape_b} in client {index}; allowed for mixed "
                    f"widths: {allowed}"
                )


# ----------------------------------------------------------------------------- built-in methods


@register_method("average", description="plain weighted average, no permutation")
def plain_average(job: MergeJob) -> Alignment:
    r""":math:`\pi_i = \mathrm{id}`: the clients as they are."""
    return Alignment(list(job.states))


@register_method(
    "weight_matching",
    description="Git Re-Basin weight matching of every client onto client 0, then average",
    columns=ALIGNMENT_COLUMNS,
)
def weight_matching_to_first(job: MergeJob) -> Alignment:
    """Every client permuted onto client 0 by weight matching (coordinate descent + LAP)."""
    from fedlmc.permutation.matching import reference_permutations

    spec = job.permutation_spec()
    perms = reference_permutations(spec, job.states, reference=0, method="weight", seed=job.seed)
    return permuted(spec, job.states, perms)


def permuted(
    spec: PermutationSpec, states: Sequence[StateDict], perms: Sequence[dict[str, Tensor]]
) -> Alignment:
    """``states`` with their ``perms`` applied (an empty mapping leaves a client as it is), and
    what the alignment did (:func:`fedlmc.merging.alignment_record.alignment_info`)."""
    from fedlmc.permutation.spec import apply_permutation

    aligned = [
        apply_permutation(spec, p, sd) if p else dict(sd)
        for p, sd in zip(perms, states, strict=True)
    ]
    return Alignment(aligned, info=alignment_info(spec, perms))


@register_method(
    "activation_matching",
    description="activation matching onto client 0 on the server split's inputs, then average",
    needs_server_data=True,
    columns=ALIGNMENT_COLUMNS,
)
def activation_matching_to_first(job: MergeJob) -> Alignment:
    """Every client permuted onto client 0 by correlating activations on the server inputs."""
    from fedlmc.averaging import load_state
    from fedlmc.permutation.matching import reference_permutations

    spec = job.permutation_spec()
    models = [load_state(job.template, sd).to(job.device).eval() for sd in job.states]
    perms = reference_permutations(
        spec, job.states, 0, "activation", models=models, x=job.server_inputs, seed=job.seed
    )
    return permuted(spec, job.states, perms)


@register_method(
    "activation_federated",
    description="activation matching onto client 0 computed by each client on its own data; "
    "only permutation indices leave the clients",
    needs_clients=True,
    columns=ALIGNMENT_COLUMNS,
)
def activation_matching_on_clients(job: MergeJob) -> Alignment:
    r"""Client-side activation matching: every client receives client 0's model, correlates its
    hidden activations with its own model's on its own data, solves the assignments and returns
    only its permutations (``job.clients.activation_permutations``); the server applies them,
    :math:`\pi_i(\theta_i)`. Each permutation is checked to be one over its group's units."""
    from fedlmc.permutation.spec import apply_permutation

    spec = job.permutation_spec()
    perms = job.clients.activation_permutations(job.states[0])
    if len(perms) != len(job.states):
        raise ValueError(
            f"the clients returned {len(perms)} permutation sets for {len(job.states)} clients"
        )
    aligned, kept, applied = [job.states[0]], [0], [{}]
    for index, (found, sd) in enumerate(zip(perms[1:], job.states[1:], strict=True), start=1):
        if found is None:  # the client's answer was dropped: it is left out of the merge
            continue
        kept.append(index)
        missing = sorted(set(spec.perm_to_axes) - set(found))
        if missing:
            raise ValueError(f"client {index} returned no permutation for group {missing[0]!r}")
        aligned.append(apply_permutation(spec, found, sd))  # validates every permutation
        applied.append(found)
    kept_all = len(kept) == len(job.states)
    return Alignment(aligned, kept=None if kept_all else kept, info=alignment_info(spec, applied))


@register_method(
    "merge_many",
    description="MergeMany: each client matched to the weighted mean of the others, repeated",
    columns=ALIGNMENT_COLUMNS,
)
def merge_many_alignment(job: MergeJob) -> Alignment:
    """MergeMany's permutations and its merged weights."""
    from fedlmc.permutation.matching import merge_many
    from fedlmc.permutation.spec import apply_permutation

    spec = job.permutation_spec()
    merged, perms = merge_many(spec, list(job.states), weights=job.weights, seed=job.seed)
    aligned = [apply_permutation(spec, p, sd) for p, sd in zip(perms, job.states, strict=True)]
    return Alignment(aligned, merged, info=alignment_info(spec, perms))


@register_method(
    "random_permutation",
    description="control: every client but the first randomly permuted, then average",
    columns=ALIGNMENT_COLUMNS,
)
def random_permutation_control(job: MergeJob) -> Alignment:
    r"""The scrambled control of the LMC literature: :math:`\pi_0 = \mathrm{id}` and, for
    :math:`i \ge 1`, an independent uniformly random permutation of every hidden group (seeded
    by ``(seed, i)``), so the average mixes unrelated units."""
    import numpy as np

    from fedlmc.permutation.spec import random_permutations

    spec = job.permutation_spec()
    perms: list[dict[str, Tensor]] = [{}]
    for i, sd in enumerate(job.states[1:], start=1):
        seed = int(np.random.SeedSequence([job.seed, i]).generate_state(1)[0])
        perms.append(random_permutations(spec, sd, seed=seed))
    return permuted(spec, job.states, perms)


register_method(
    "average_repair",
    description="plain average, then REPAIR of every hidden unit's statistics (server split, "
    "or the clients' data when calibration is federated)",
    needs_server_data=True,
    repair=True,
    clients_for_data=True,
)(plain_average)
register_method(
    "weight_matching_repair",
    description="weight matching onto client 0, average, then REPAIR (server split, or the "
    "clients' data when calibration is federated)",
    needs_server_data=True,
    repair=True,
    clients_for_data=True,
    columns=ALIGNMENT_COLUMNS,
)(weight_matching_to_first)


def lewc_bias_combination(
    spec: PermutationSpec | None, states: Sequence[StateDict], weights: Sequence[float]
) -> StateDict:
    r""":math:`\sum_i w_i \theta_i`, but each layer's bias :math:`\sum_i w_i^{\,l} b^{(i)}_l`
    (:func:`fedlmc.permutation.chain.depth_weighted_bias_average`; ``ValueError`` for models that
    are not norm-free plain chains)."""
    from fedlmc.permutation.chain import depth_weighted_bias_average, norm_free_chain

    layers = norm_free_chain(spec, states[0])
    return depth_weighted_bias_average(layers, states, weights)


register_method(
    "average_lewc_bias",
    description="plain average, but layer l's bias combined as sum_i w_i^l b_i, the way LEWC "
    "says the signal combines (norm-free plain chains: MLP, VGG without BatchNorm)",
    combine=lewc_bias_combination,
    plain_chain_only=True,
    reestimate_bn=False,
)(plain_average)


AUTO_TOLERANCE = 0.05
"""Default tolerance of ``auto`` in nats: the plain average is kept when its calibrated NLL on
the server split is at most this much above the endpoints' mean calibrated NLL."""


def calibrated_nll(job: MergeJob, state: StateDict, *, reestimate_bn: bool = True) -> float:
    """Mean NLL on the server data of the model with ``state``, at the temperature fitted on
    that data (BatchNorm statistics re-estimated on it first when ``reestimate_bn``)."""
    from fedlmc.averaging import load_state
    from fedlmc.evaluation import metrics_from_logits, predict_logits
    from fedlmc.merging.calibrate import fit_temperature, has_batchnorm, reset_bn_stats

    x, y = job.server_data
    model = load_state(job.template, state).to(job.device).eval()
    if reestimate_bn and has_batchnorm(model):
        reset_bn_stats(model, job.server_data)
        model.eval()
    logits = predict_logits(model, x, device=job.device)
    return float(metrics_from_logits(logits, y, fit_temperature(logits, y))["nll"])


AUTO_COLUMNS = (
    Column(
        "auto_choice",
        "the merge the auto method picked",
        "`auto`, `auto_t` rows",
        "`average` or `weight_matching`: the plain average when its calibrated-NLL gap "
        "`auto_nll_gap` is at most `auto-tolerance`, else the one of the two with the lower "
        "calibrated NLL (on the server split, or the clients' held-out data when calibration is "
        "federated)",
        kind="text",
    ),
    Column(
        "auto_nll_gap",
        "the plain average's calibrated-NLL gap the auto method measured",
        "`auto`, `auto_t` rows",
        "`L_T(sum_i w_i theta_i) - mean_i L_T(theta_i)`, with `L_T` the NLL at the temperature "
        "fitted on the same data (BatchNorm statistics of the average re-estimated), nats",
    ),
)
"""The columns the ``auto`` method fills (:func:`automatic_choice`'s ``info``)."""


@register_method(
    "auto",
    description="plain average if its calibrated NLL is within auto-tolerance of the endpoints', "
    "else the better of it and weight matching (server split, or the clients' held-out data "
    "when calibration is federated)",
    needs_server_data=True,
    clients_for_data=True,
    columns=(*AUTO_COLUMNS, *ALIGNMENT_COLUMNS),
)
def automatic_choice(job: MergeJob) -> Alignment:
    r"""Decide whether permutation alignment is worth its cost.

    With :math:`\bar L_T(\theta)` the NLL on the server split at the temperature fitted there,
    the gap :math:`g = \bar L_T(\sum_i w_i \theta_i) - \frac1N \sum_i \bar L_T(\theta_i)` of the
    plain average (BatchNorm statistics re-estimated) is measured first. If
    :math:`g \le` ``auto_tolerance`` (``job.options``, default :data:`AUTO_TOLERANCE` nats) the
    plain average is kept and no alignment runs; otherwise every client is weight-matched onto
    client 0 and the merge with the lower calibrated NLL is kept. ``info``: ``auto_choice``
    (``average`` or ``weight_matching``), ``auto_nll_gap`` (:math:`g`) and, when it kept weight
    matching, what that alignment did (``aligned_groups``, ``aligned_units_moved``).

    With ``job.clients`` set (federated calibration) the same NLLs are measured on the clients'
    held-out data by :meth:`ClientQueries.calibrated_nlls` (exact sums over the clients, at the
    grid temperature minimising their summed NLL): the plain average and the endpoints in one call,
    the weight-matched merge in a second one only when alignment runs.
    """
    from fedlmc.averaging import average
    from fedlmc.permutation.matching import reference_permutations

    tolerance = float(job.options.get("auto_tolerance", AUTO_TOLERANCE))
    plain_state = average(job.states, job.weights)
    if job.clients is not None:
        nlls = job.clients.calibrated_nlls(
            [plain_state, *job.states], [True] + [False] * len(job.states)
        )
        plain, endpoints = nlls[0], nlls[1:]
    else:
        plain = calibrated_nll(job, plain_state)
        endpoints = [calibrated_nll(job, sd, reestimate_bn=False) for sd in job.states]
    gap = plain - sum(endpoints) / len(endpoints)
    info: dict[str, Any] = {"auto_choice": "average", "auto_nll_gap": gap}
    if gap <= tolerance:
        return Alignment(list(job.states), info=info)
    spec = job.permutation_spec()
    perms = reference_permutations(spec, job.states, reference=0, method="weight", seed=job.seed)
    matched = permuted(spec, job.states, perms)
    aligned_state = average(matched.aligned, job.weights)
    if job.clients is not None:
        aligned_nll = job.clients.calibrated_nlls([aligned_state], [True])[0]
    else:
        aligned_nll = calibrated_nll(job, aligned_state)
    if aligned_nll < plain:
        info.update(matched.info, auto_choice="weight_matching")
        return Alignment(matched.aligned, info=info)
    return Alignment(list(job.states), info=info)


# ----------------------------------------------------------------------------- mixed widths


@register_method(
    "embed_average",
    description="mixed widths: every client embedded at the first units of the server width "
    "(HeteroFL's nesting), then the plain weighted average",
    mixed_widths=True,
    counterpart_of="average",
)
def embed_first_slots(job: MergeJob) -> Alignment:
    """Every client embedded into the server shapes at its first units
    (:func:`fedlmc.merging.widths.embed_clients`)."""
    from fedlmc.merging.widths import embed_clients

    return Alignment(embed_clients(job.template, job.states, job.permutation_spec(), "first"))


@register_method(
    "embed_weight_matching",
    description="mixed widths: the widest client at the first units of the server width, every "
    "other client weight-matched onto its units (rectangular assignments), then average",
    mixed_widths=True,
    columns=ALIGNMENT_COLUMNS,
    counterpart_of="weight_matching",
)
def embed_matched_slots(job: MergeJob) -> Alignment:
    """Every client embedded at the slots that weight-match it onto the widest client
    (:func:`fedlmc.merging.widths.match_to_widest`)."""
    from fedlmc.merging.widths import match_to_widest

    spec = job.permutation_spec()
    matched, _ = match_to_widest(job.template, job.states, spec, seed=job.seed)
    return Alignment(matched, info=alignment_info(spec, [m.slots for m in matched]))


register_method(
    "embed_weight_matching_repair",
    description="mixed widths: embed_weight_matching, then REPAIR of every hidden unit's "
    "statistics (server split, or the clients' data when calibration is federated)",
    needs_server_data=True,
    repair=True,
    clients_for_data=True,
    mixed_widths=True,
    columns=ALIGNMENT_COLUMNS,
)(embed_matched_slots)


def holder_combination(
    spec: PermutationSpec | None, states: Sequence[StateDict], weights: Sequence[float]
) -> StateDict:
    """HeteroFL's rule: every entry averaged over the clients that hold it
    (:func:`fedlmc.merging.widths.holder_average`)."""
    from fedlmc.merging.widths import holder_average

    return holder_average(spec, states, weights)


register_method(
    "heterofl",
    description="mixed widths: every client embedded at the first units of the server width, "
    "each entry averaged over the clients that hold it (HeteroFL's aggregation)",
    combine=holder_combination,
    mixed_widths=True,
)(embed_first_slots)


@register_method(
    "random_direction",
    description="control (flatness): client 0 moved by a seeded Gaussian direction of the "
    "length of its step to the plain average (two clients)",
    many_clients=False,
    on_path=False,
    columns=RANDOM_DIRECTION_COLUMNS,
)
def random_direction(job: MergeJob) -> Alignment:
    r"""The flatness control: :math:`\theta_0 + \|s\|\,g/\|g\|` with :math:`s = \bar\theta -
    \theta_0` the step to the plain average at the job's weights
    (:mod:`fedlmc.merging.random_direction`). The clients
    stay as they are (no common basis); the moved endpoint is the merge."""
    from fedlmc.averaging import average
    from fedlmc.merging.random_direction import parameter_keys, random_step

    plain = average(job.states, job.weights)
    moved, length = random_step(job.states[0], plain, parameter_keys(job.template), job.seed)
    return Alignment(list(job.states), moved, info={"random_direction_step_norm": length})
