"""SecAgg+ with a client that drops out, in process: Flower's real server workflow
(:func:`fedlmc.strategies.secure.secure_round`) and Flower's real client mod
(``flwr.client.mod.secaggplus_mod``) on both sides of an in-process grid.

The grid (:class:`InProcessGrid`) is only the transport: it hands each message to the node's
``secaggplus_mod`` with the node's own context, and answers a message to a node that has
"dropped" from a given stage on the way the SuperLink answers one to a node whose heartbeats
stopped (an error reply from node 0, Flower's ``NODE_UNAVAILABLE`` code and reason, matched by
``reply_to_message_id``). Each client "trains" by answering constructed arrays, so the merge of
the survivors is known exactly. tests/project/test_deployment_secure.py kills a real SuperNode;
these cases (every stage, fewer survivors than the threshold) would each cost a deployment.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
from flwr.app import Context, Error, Message, Metadata, RecordDict
from flwr.app.message import make_message
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.common.constant import ErrorCode
from flwr.compat.common import recorddict_compat as compat

from fedlmc.strategies.secure import (
    SecureAggregationError,
    SecureSettings,
    dropped_text,
    secure_round,
)

STAGES = ("setup", "share keys", "masked vectors", "unmask")
NODES = (11, 22, 33)
COUNTS = {11: 300, 22: 500, 33: 400}


@pytest.fixture(autouse=True)
def server_task(task_identity):
    """The identity a ServerApp process has (Flower's ``Message`` reads it to address its
    instructions): the shared ``task_identity`` fixture, for every test here."""


def client_arrays(node: int) -> list[np.ndarray]:
    """What node ``node`` "trains": two arrays of its own, well inside the clipping range."""
    rng = np.random.default_rng(node)
    return [rng.uniform(-1, 1, (4, 3)), rng.uniform(-1, 1, (5,))]


class _Run:
    run_id = 7


class InProcessGrid:
    """The transport between the server workflow and each node's ``secaggplus_mod``;
    ``dead[node] = k``: the node answers nothing from the ``k``-th message on (0-based: the
    SecAgg+ stage), and the grid answers for it as the SuperLink answers for a dead node.
    ``answer`` is what each node's mod calls in the masked-vector stage (default :func:`fit`:
    constructed arrays); node ``NODES[p]`` holds partition ``p`` of ``len(NODES)``."""

    def __init__(self, dead: dict[int, int], answer=None) -> None:
        self.dead = dead
        self.answer = answer or fit
        self.run = _Run()
        self.contexts = {
            n: Context(
                run_id=7,
                node_id=n,
                node_config={"partition-id": p, "num-partitions": len(NODES)},
                state=RecordDict(),
                run_config={},
            )
            for p, n in enumerate(NODES)
        }
        self.received = dict.fromkeys(NODES, 0)
        self.ids = itertools.count(1)

    def get_node_ids(self) -> list[int]:
        return list(NODES)

    def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
        replies = []
        for message in messages:
            message.metadata.__dict__["_message_id"] = f"m{next(self.ids)}"
            node = message.metadata.dst_node_id
            stage, self.received[node] = self.received[node], self.received[node] + 1
            if stage >= self.dead.get(node, len(STAGES)):
                replies.append(unavailable_reply(message))
                continue
            try:
                # the node gets its own copy, as over a real transport (the mod edits it)
                delivered = copy.deepcopy(message)
                replies.append(secaggplus_mod(delivered, self.contexts[node], self.answer))
            except Exception as error:  # a client's exception: an error reply from the node
                replies.append(client_error_reply(message, error))
        return replies


def fit(message: Message, context: Context) -> Message:
    """The legacy fit reply of node ``context.node_id``: :func:`client_arrays`."""
    node = context.node_id
    arrays = ndarrays_to_parameters(client_arrays(node))
    fit_res = FitRes(Status(Code.OK, "ok"), arrays, COUNTS[node], {"node": node})
    return Message(compat.fitres_to_recorddict(fit_res, keep_input=True), reply_to=message)


def _error_metadata(message: Message, src: int) -> Metadata:
    return Metadata(
        run_id=7,
        message_id="",
        src_node_id=src,
        dst_node_id=0,
        reply_to_message_id=message.metadata.message_id,
        group_id=message.metadata.group_id,
        created_at=0.0,
        ttl=60.0,
        message_type=message.metadata.message_type,
    )


def unavailable_reply(message: Message) -> Message:
    """What the SuperLink answers for a node whose heartbeats stopped (sent by node 0)."""
    from flwr.server.superlink.linkstate.utils import NODE_UNAVAILABLE_ERROR_REASON

    error = Error(code=ErrorCode.NODE_UNAVAILABLE, reason=NODE_UNAVAILABLE_ERROR_REASON)
    return make_message(metadata=_error_metadata(message, 0), error=error)


def client_error_reply(message: Message, error: Exception) -> Message:
    """An error reply from the node itself (its ClientApp raised)."""
    code = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    failure = Error(code=code, reason=f"{type(error).__name__}: {error}")
    metadata = _error_metadata(message, message.metadata.dst_node_id)
    return make_message(metadata=metadata, error=failure)


SETTINGS = SecureSettings(clipping_range=8.0, max_weight=1000.0)


def run_round(dead: dict[int, int], num_clients: int = len(NODES)):
    sent = [np.zeros((4, 3)), np.zeros((5,))]
    return secure_round(InProcessGrid(dead), sent, num_clients, {}, SETTINGS, timeout=30.0)


def clear_average(nodes) -> list[np.ndarray]:
    weights = np.array([COUNTS[n] for n in nodes], dtype=float)
    stacked = [np.stack(a) for a in zip(*(client_arrays(n) for n in nodes), strict=True)]
    return [np.tensordot(weights / weights.sum(), s, axes=1) for s in stacked]


def max_gap(arrays, others) -> float:
    return max(float(np.abs(a - b).max()) for a, b in zip(arrays, others, strict=True))


def test_every_client_answering_gives_the_average_of_all_three():
    found = run_round({})
    assert found.dropped == {} and len(found.num_examples) == 3
    assert max_gap(found.aggregate, clear_average(NODES)) <= found.error_bound


def test_a_round_of_fewer_clients_than_nodes_merges_the_lowest_node_ids_only():
    """Three nodes connected, ``num_clients = 2``: the two lowest node ids take part (as in
    the clear round), not every connected node (FedAvg's ``fraction_fit = 1.0`` took all)."""
    grid = InProcessGrid({})
    sent = [np.zeros((4, 3)), np.zeros((5,))]
    found = secure_round(grid, sent, 2, {}, SETTINGS, timeout=30.0)
    assert grid.received == {11: 4, 22: 4, 33: 0}
    assert sorted(found.num_examples) == [COUNTS[11], COUNTS[22]]
    assert max_gap(found.aggregate, clear_average((11, 22))) <= found.error_bound


@pytest.mark.parametrize("stage", [2, 3])
def test_a_node_dead_after_sharing_its_keys_is_unmasked_without_or_with_its_vector(stage):
    """Dead in the masked-vector stage: SecAgg+ removes its pairwise masks from the survivors'
    shares of its key and returns the merge of the two survivors. Dead in the unmask stage:
    its masked vector is already in the sum, and the survivors' shares of its mask seed
    recover all three, and it is named apart (``unmask_missed``: it is merged, not dropped)."""
    found = run_round({33: stage})
    merged_nodes = (11, 22) if stage == 2 else NODES
    assert sorted(found.num_examples) == sorted(COUNTS[n] for n in merged_nodes)
    assert max_gap(found.aggregate, clear_average(merged_nodes)) <= found.error_bound
    other = clear_average(NODES if stage == 2 else (11, 22))
    assert max_gap(found.aggregate, other) > 100 * found.error_bound
    missed = found.dropped if stage == 2 else found.unmask_missed
    assert list(missed) == [33] and not (found.dropped if stage == 3 else found.unmask_missed)
    assert missed[33].startswith(f"SecAgg+ stage {STAGES[stage]!r}: Error: Node Unavailable")


@pytest.mark.parametrize("stage", [0, 1])
def test_a_node_dead_before_its_key_shares_arrived_halts_flowers_secagg_naming_it(stage):
    """Flower 1.42's SecAgg+ cannot drop a node that never distributed its key shares: in the
    unmask stage the survivors are asked for shares of it they never received and fail, so no
    aggregate comes back; the error names the dead node, its stage and the survivors'
    failures (measured here, not a choice of fedlmc's)."""
    with pytest.raises(SecureAggregationError) as raised:
        run_round({33: stage})
    text = str(raised.value)
    assert "\n" not in text
    assert f"node 33: SecAgg+ stage {STAGES[stage]!r}: Error: Node Unavailable" in text
    assert "need 2 of 3 clients to unmask" in text


def test_fewer_survivors_than_the_threshold_is_an_error_naming_every_dropped_node():
    """Two of three dead in the masked-vector stage: one survivor is below the reconstruction
    threshold of 2; SecAgg+ halts and the error names both dead nodes and the stage."""
    with pytest.raises(SecureAggregationError) as raised:
        run_round({22: 2, 33: 2})
    text = str(raised.value)
    assert text.startswith("SecAgg+ halted at its masked vectors stage with no aggregate")
    assert "(need 2 of 3 clients to unmask; 1 remained)" in text
    for node in (22, 33):
        assert f"node {node}: SecAgg+ stage 'masked vectors': Error: Node Unavailable" in text
    assert "node 11" not in text.split("failures:")[0]


def test_dropped_text_names_nodes_in_order_on_one_line():
    dropped = {33: "SecAgg+ stage 'unmask': no reply", 4: "SecAgg+ stage 'setup': x"}
    assert dropped_text(dropped) == (
        "node 4: SecAgg+ stage 'setup': x; node 33: SecAgg+ stage 'unmask': no reply"
    )
    assert dropped_text({}) == ""
