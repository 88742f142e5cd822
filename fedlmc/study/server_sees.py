r"""What a merge rule lets the server see of the clients: the ``server_sees`` vocabulary.

A plain average :math:`\bar\theta = \sum_i w_i \theta_i` needs only a **sum** of the clients'
(pre-weighted) arrays, which secure aggregation (Flower's SecAgg+) computes without the server
ever holding one client's arrays; every alignment needs each model, or statistics of each, in
the clear. The study reports, in every row's ``server_sees`` column, the least a merge method's
rule needs, as registered with its evaluation policy
(:func:`fedlmc.study.method_policy.register_evaluation`, ``server_sees=...``), one of
:data:`SERVER_SEES`:

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

__all__ = [
    "DEFAULT_SERVER_SEES",
    "REFERENCE_SERVER_SEES",
    "SECURE_SUM",
    "SERVER_SEES",
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
