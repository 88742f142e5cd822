"""Private merging on the Flower side: the plain average under Flower's secure aggregation.

:mod:`~fedlmc.simulations.private.secure_client` (the ClientApp's ``train`` handler behind
Flower's ``secaggplus_mod``: it trains as in the clear, checks the clipping range, and answers
the SecAgg+ rounds) and :mod:`~fedlmc.simulations.private.secure_server` (the ServerApp's mode
for ``secure-aggregation = "secagg+"``: one SecAgg+ round of
:mod:`fedlmc.strategies.secure`, the secure temperature, the rows). The run-config keys and
their checks are in :mod:`fedlmc.simulations.config.secure`; the page is docs/private.md. It sits
between the task and the Flower app, which plugs it in.
"""
