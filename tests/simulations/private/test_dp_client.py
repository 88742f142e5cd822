"""The client side of ``dp = "client-fixed"``
(:func:`fedlmc.simulations.private.dp_client.dp_clipping_mod`): Flower's ``fixedclipping_mod``
clips a training reply's update from the arrays the server sent (a zero update and a short one
go as they are), the handler still sees the partition record, and a message of another run goes
to the handler untouched. In process."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM

from fedlmc.simulations.private.dp_client import dp_clipping_mod, wants_client_clipping
from fedlmc.strategies.protocol import PARTITION_RECORD


def _train_message(values: list[float], config: dict) -> Message:
    content = RecordDict(
        {
            "arrays": ArrayRecord({"w": Array(np.asarray(values, dtype=np.float64))}),
            "config": ConfigRecord(config),
            PARTITION_RECORD: ConfigRecord({"partition-id": 1}),
        }
    )
    return Message(content, dst_node_id=1, message_type="train")


def _trained_to(values: list[float], seen: list):
    def handler(message: Message, context) -> Message:
        seen.append(dict(message.content.config_records.get(PARTITION_RECORD, {})))
        arrays = ArrayRecord({"w": Array(np.asarray(values, dtype=np.float64))})
        return Message(RecordDict({"arrays": arrays}), reply_to=message)

    return handler


@pytest.mark.parametrize(
    ("trained", "expected"),
    [([4.0, 6.0], [1.6, 2.8]), ([1.0, 2.0], [1.0, 2.0]), ([1.3, 2.4], [1.3, 2.4])],
)
def test_the_client_mod_clips_the_update_from_the_sent_arrays(trained, expected, task_identity):
    message = _train_message([1.0, 2.0], {"dp": "client-fixed", KEY_CLIPPING_NORM: 1.0})
    seen: list = []
    reply = dp_clipping_mod(message, None, _trained_to(trained, seen))
    # update (3, 4) of norm 5 -> (0.6, 0.8); a zero update (Flower divides by its norm) and
    # an update of norm 0.5 are sent as they are; the handler saw the partition record
    np.testing.assert_allclose(reply.content["arrays"]["w"].numpy(), expected)
    assert seen == [{"partition-id": 1}]


def test_the_client_mod_leaves_a_run_without_client_clipping_untouched(task_identity):
    message = _train_message([1.0, 2.0], {"dp": "server-fixed", KEY_CLIPPING_NORM: 1.0})
    reply = dp_clipping_mod(message, None, _trained_to([4.0, 6.0], []))
    np.testing.assert_allclose(reply.content["arrays"]["w"].numpy(), [4.0, 6.0])


def test_only_a_training_message_of_a_client_fixed_run_wants_clipping(task_identity):
    assert wants_client_clipping(_train_message([1.0], {"dp": "client-fixed"}))
    assert not wants_client_clipping(_train_message([1.0], {"dp": "server-fixed"}))
    assert not wants_client_clipping(_train_message([1.0], {}))
