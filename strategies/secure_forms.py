r"""How secure aggregation computes a merge method: its secure form, registered against its name.

A merge method (:func:`fedlmc.merging.method_registry.register_method`) is its name, its align
function and its needs; the study says what its rule lets the server see
(:func:`fedlmc.study.method_policy.register_evaluation`, ``server_sees``). A ``sum`` rule runs
under SecAgg+ (:mod:`fedlmc.strategies.secure`, ``secure-aggregation = "secagg+"``) when it is
registered here with :func:`register_secure_form` (optional: a method registered without it
does not run securely), in one of two forms:

- ``sum_exponents`` (a rule :math:`\sum_i w_i^{1+e_k} \theta_i[k]`,
  :mod:`fedlmc.merging.sum_form`: each client pre-scales, the server post-scales), with
  ``divide_by_holders`` for HeteroFL's division by the summed holder masks (a ``mixed_widths``
  method);
- ``secure_sums`` (a rule from several secure means, :class:`fedlmc.merging.sum_form.SecureSums`:
  Fisher merging, RegMean).

``note`` says, for a ``sum`` rule not built here, what it would need (the secure-aggregation
table and the run config's refusal print it). The built-in methods' forms are declared at the
end of this module, registered once, before the registry's first use. No Flower or torch
import.
"""

from __future__ import annotations

from dataclasses import dataclass

from fedlmc.merging.method_registry import METHODS, base_method
from fedlmc.merging.sum_form import SecureSums, SumExponents
from fedlmc.registry import Registry
from fedlmc.study.method_policy import evaluation_of
from fedlmc.study.server_sees import SECURE_SUM

__all__ = [
    "NOT_BUILT",
    "SECURE_FORMS",
    "SecureForm",
    "TASK_VECTOR_NOTE",
    "register_secure_form",
    "runs_securely",
    "secure_form",
]

NOT_BUILT = "it registers no sum_exponents (how each client would pre-scale)"
"""What a ``sum`` rule registered with no form and no ``note`` would need."""
TASK_VECTOR_NOTE = (
    "the clients' weights (DARE: each drops and rescales its own task vector first) summed "
    "securely, then the server's rescaling about its own initialisation"
)


@dataclass(frozen=True)
class SecureForm:
    """A method's secure form (see the module docstring); the defaults: no form."""

    sum_exponents: SumExponents | None = None
    secure_sums: SecureSums | None = None
    divide_by_holders: bool = False
    note: str = ""

    @property
    def built(self) -> bool:
        """Whether the form computes the rule: ``sum_exponents`` or ``secure_sums``."""
        return self.sum_exponents is not None or self.secure_sums is not None


def _load_builtin_forms() -> None:
    """Register the built-in methods' forms (run once, before the first use)."""
    from fedlmc.merging.field.field_methods import FISHER_SUMS, REGMEAN_SUMS
    from fedlmc.merging.sum_form import lewc_bias_exponents, plain_exponents

    for name in ("average", "embed_average"):
        register_secure_form(name, sum_exponents=plain_exponents)
    register_secure_form("average_lewc_bias", sum_exponents=lewc_bias_exponents)
    register_secure_form("heterofl", sum_exponents=plain_exponents, divide_by_holders=True)
    register_secure_form("fisher", secure_sums=FISHER_SUMS)
    register_secure_form("regmean", secure_sums=REGMEAN_SUMS)
    register_secure_form("task_arithmetic", note=TASK_VECTOR_NOTE)
    register_secure_form(
        "ties",
        note="two secure rounds (the elected signs from the summed trimmed task vectors, then "
        "the agreeing entries' sums and counts)",
    )
    register_secure_form("dare", note=TASK_VECTOR_NOTE)


SECURE_FORMS: Registry[SecureForm] = Registry("secure form", load=_load_builtin_forms)


def register_secure_form(
    method: str,
    *,
    sum_exponents: SumExponents | None = None,
    secure_sums: SecureSums | None = None,
    divide_by_holders: bool = False,
    note: str = "",
    replace: bool = False,
) -> SecureForm:
    """Register how secure aggregation computes the merge method ``method`` (registered, with
    ``server_sees = "sum"`` in its evaluation policy); ``ValueError`` in one line when the form
    contradicts itself or the method."""
    sees = evaluation_of(method).server_sees
    if sees != SECURE_SUM:
        raise ValueError(
            f"merge method {method!r}: a secure form with server_sees = {sees!r}; allowed only "
            f"with server_sees = {SECURE_SUM!r} (register_evaluation)"
        )
    if secure_sums is not None and sum_exponents is not None:
        raise ValueError(
            f"merge method {method!r}: secure_sums with sum_exponents; allowed: one of them"
        )
    mixed = method in METHODS and METHODS.get(method).needs.mixed_widths
    if divide_by_holders and (sum_exponents is None or not mixed):
        raise ValueError(
            f"merge method {method!r}: divide_by_holders without sum_exponents and "
            "mixed_widths; allowed only on a mixed-widths rule with its sum_exponents"
        )
    form = SecureForm(sum_exponents, secure_sums, divide_by_holders, note)
    return SECURE_FORMS.add(method, form, replace=replace)


def secure_form(method: str) -> SecureForm:
    """The secure form of ``method`` (a ``_t`` row as its merge): its registration, else none."""
    base = base_method(method)
    return SECURE_FORMS.get(base) if base in SECURE_FORMS else SecureForm()


def runs_securely(method: str) -> bool:
    """Whether secure aggregation runs ``method``: a ``sum`` rule with a built form."""
    return evaluation_of(method).server_sees == SECURE_SUM and secure_form(method).built
