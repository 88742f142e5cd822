"""Private merging on the Flower side: the plain average under Flower's secure aggregation
and under Flower's fixed-clipping differential privacy.

:mod:`~fedlmc.simulations.private.secure_client` (the ClientApp's ``train`` handler behind
Flower's ``secaggplus_mod``: it trains as in the clear, checks the clipping range, and answers
the SecAgg+ rounds) and :mod:`~fedlmc.simulations.private.secure_server` (the ServerApp's mode
for ``secure-aggregation = "secagg+"``: one SecAgg+ round of :mod:`fedlmc.strategies.secure`,
the secure temperature, the rows). :mod:`~fedlmc.simulations.private.dp_client` (Flower's
``fixedclipping_mod`` on the ``train`` handler for ``dp = "client-fixed"``) and
:mod:`~fedlmc.simulations.private.dp_server` (the ServerApp's mode for ``dp``: one round of
Flower's DP wrapper around ``FedAvg``, :mod:`fedlmc.strategies.private`, the rows with
``dp_epsilon``). The run-config keys and their checks are in
:mod:`fedlmc.simulations.config.secure` and :mod:`fedlmc.simulations.config.dp`; the page is
docs/private.md. It sits between the task and the Flower app, which plugs it in.
"""
