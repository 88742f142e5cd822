"""Flower's private API that the strategies use, behind one function each.

Flower 1.42's ``FedAvg`` builds its train and evaluate messages in the private method
``FedAvg._construct_messages(record, node_ids, message_type)``: one :class:`flwr.app.Message`
per node, all carrying the same ``RecordDict``. :class:`fedlmc.strategies.base.ScreenedFedAvg` sends
its own node selection through it, so the messages are exactly those ``FedAvg`` would send.
If Flower renames or changes it, this module is the one place to change;
``tests/strategies/test_flower_compat.py`` fails first (it checks the signature and builds real
messages).
"""

from __future__ import annotations

from collections.abc import Sequence

from flwr.app import Message, RecordDict
from flwr.serverapp.strategy import FedAvg

__all__ = ["construct_messages"]


def construct_messages(
    strategy: FedAvg, record: RecordDict, node_ids: Sequence[int], message_type: str
) -> list[Message]:
    """One ``message_type`` message per node of ``node_ids`` (in that order), each carrying
    ``record``: Flower's ``FedAvg._construct_messages``."""
    return list(strategy._construct_messages(record, list(node_ids), message_type))
