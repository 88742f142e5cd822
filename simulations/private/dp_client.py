"""The client side of ``dp = "client-fixed"``: Flower's ``fixedclipping_mod`` on the ``train``
handler of the fedlmc ClientApp, only for a run whose config says so.

:func:`dp_clipping_mod` sits on the ``train`` handler (after the SecAgg+ routing mod,
:mod:`fedlmc.simulations.private.secure_client`). A training message whose config record says
``dp = "client-fixed"`` goes through :func:`flwr.clientapp.mod.fixedclipping_mod`: the client
trains as in the clear, then its update from the arrays the server sent is clipped to the norm
Flower's ``DifferentialPrivacyClientSideFixedClipping`` put in the config, before anything is
sent. Every other message goes to the handler untouched. Two adaptations, both transparent:

- Flower's mod accepts exactly one config record; the sweep's partition record
  (:data:`fedlmc.strategies.protocol.PARTITION_RECORD`) is taken off while the mod checks the
  message and put back before the handler trains;
- Flower 1.42's clipping divides by the update's norm: a client whose weights did not move (a
  zero update) makes it raise ``ZeroDivisionError``; that reply is sent as it is (a zero
  update is within every clipping norm).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp.mod import fixedclipping_mod

from fedlmc.simulations.config.dp import CLIENT_FIXED
from fedlmc.strategies.protocol import PARTITION_RECORD

__all__ = ["dp_clipping_mod", "wants_client_clipping"]

Handler = Callable[[Message, Context], Any]


def wants_client_clipping(message: Message) -> bool:
    """Whether ``message`` is a training message of a ``dp = "client-fixed"`` run."""
    if not message.has_content():
        return False
    config = message.content.config_records.get("config", {})
    return config.get("dp") == CLIENT_FIXED


def dp_clipping_mod(message: Message, context: Context, call_next: Handler) -> Message:
    """Flower's ``fixedclipping_mod`` around the handler for a ``dp = "client-fixed"``
    training message (see the module docstring); ``call_next`` for every other message."""
    if not wants_client_clipping(message):
        return call_next(message, context)
    partition = message.content.config_records.get(PARTITION_RECORD)
    if partition is not None:
        del message.content[PARTITION_RECORD]
    replies: list[Message] = []

    def train(inner: Message, ctx: Context) -> Message:
        if partition is not None:
            inner.content[PARTITION_RECORD] = partition
        replies.append(call_next(inner, ctx))
        return replies[0]

    try:
        return fixedclipping_mod(message, context, train)
    except ZeroDivisionError:
        return replies[0]  # a zero update: clipped to itself
