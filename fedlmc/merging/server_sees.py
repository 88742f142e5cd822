r"""What a merge rule lets the server see of the clients: the ``server_sees`` vocabulary.

A plain average :math:`\bar\theta = \sum_i w_i \theta_i` needs only a **sum** of the clients'
(pre-weighted) arrays, which secure aggregation (Flower's SecAgg+) computes without the server
ever holding one client's arrays; every alignment needs each model, or statistics of each, in
the clear. Each merge method declares the least its rule needs
(``register_method(..., server_sees=...)``), one of :data:`SERVER_SEES`:

- ``sum``: only weighted sums of the clients' arrays (secure aggregation can run it);
- ``each model's statistics``: the sum, plus each client's per-unit activation statistics
  (REPAIR's endpoint means and standard deviations);
- ``one model and permutations``: one client's model in the clear (the reference the others
  match to) and each client's permutation;
- ``each model``: every client's arrays in the clear.

A registration that says nothing gets :data:`DEFAULT_SERVER_SEES` (``each model``: a method is
assumed to need every model until it says otherwise, so nothing is ever run under secure
aggregation by mistake). The declaration is a property of the merge *rule*: a run in the clear
shows the server every model whatever the method (the ``secure-aggregation`` run-config key says
how a run was run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedlmc.merging.sum_form import SecureSums, SumExponents

__all__ = [
    "DEFAULT_SERVER_SEES",
    "REFERENCE_SERVER_SEES",
    "SECURE_SUM",
    "SERVER_SEES",
    "SecureForm",
    "check_server_sees",
]

SECURE_SUM = "sum"
SERVER_SEES: dict[str, str] = {
    SECURE_SUM: "only weighted sums of the clients' arrays (secure aggregation can compute them)",
    "each model's statistics": "the sum plus each client's per-unit activation statistics",
    "one model and permutations": "one client's model in the clear and each client's permutation",
    "each model": "every client's arrays in the clear",
}
"""The vocabulary, least revealing first: value -> what the server receives."""
DEFAULT_SERVER_SEES = "each model"
REFERENCE_SERVER_SEES: dict[str, str] = {
    "ensemble": "each model",
    "ensemble_equal": "each model",
    "ensemble_calibrated": "each model",
    "logit_ensemble": "each model",
    "fedavg": SECURE_SUM,
}
"""The rows that are not merge methods: the ensembles run every client's model; each FedAvg
round is a weighted sum."""


def check_server_sees(method: str, value: str) -> str:
    """``value`` if it is one of :data:`SERVER_SEES`, else ``ValueError`` naming ``method``."""
    if value not in SERVER_SEES:
        allowed = ", ".join(repr(v) for v in SERVER_SEES)
        raise ValueError(f"merge method {method!r}: server_sees = {value!r}; allowed: {allowed}")
    return value


@dataclass(frozen=True)
class SecureForm:
    r"""The secure-protocol part of a merge method's declaration
    (:func:`fedlmc.merging.method_registry.register_method`'s keys): ``server_sees`` (one of
    :data:`SERVER_SEES`), ``sum_exponents`` (a ``sum`` rule as :math:`\sum_i w_i^{1+e_k}
    \theta_i[k]`, :mod:`fedlmc.merging.sum_form`), ``secure_sums`` (a rule from several secure
    means), ``divide_by_holders`` (HeteroFL's division by the summed holder masks) and ``note``
    (its ``secure_note``: what a ``sum`` rule without them would need)."""

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

    def check(self, name: str, mixed_widths: bool) -> None:
        """``ValueError`` when this part of method ``name``'s declaration contradicts itself
        (:func:`fedlmc.merging.method_registry.register_method`'s keys)."""
        sees = self.server_sees
        check_server_sees(name, sees)
        if self.sum_exponents is not None and sees != SECURE_SUM:
            raise ValueError(
                f"merge method {name!r}: sum_exponents with server_sees = {sees!r}; "
                f"allowed only with server_sees = {SECURE_SUM!r}"
            )
        if self.secure_sums is not None and (sees != SECURE_SUM or self.sum_exponents is not None):
            raise ValueError(
                f"merge method {name!r}: secure_sums with server_sees = {sees!r} or with "
                f"sum_exponents; allowed only with server_sees = {SECURE_SUM!r}, without exponents"
            )
        if self.divide_by_holders and (self.sum_exponents is None or not mixed_widths):
            raise ValueError(
                f"merge method {name!r}: divide_by_holders without sum_exponents and "
                "mixed_widths; allowed only on a mixed-widths rule with its sum_exponents"
            )
