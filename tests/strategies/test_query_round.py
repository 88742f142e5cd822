"""One query round (fedlmc.strategies.query_round.QueryRound, on its own): the answers come back
in the clients' order, a client that errs or fails the screen is dropped by name with the query
as its stage and asked nothing more, too few answers is a clear error, and a client the merge
refuses is dropped the same way. Real Messages, in process."""

from __future__ import annotations

import pytest
from flwr.app import ConfigRecord, Error, Message, RecordDict

from fedlmc.models.classifiers import build_model
from fedlmc.strategies.query_round import QueryRound
from fedlmc.strategies.strategy_utils import ClientUpdate, NotEnoughClientsError


@pytest.fixture(autouse=True)
def _messages_need_a_task_identity(task_identity):
    """Messages need a run id: what Flower sets for a ServerApp."""
    yield


class EchoGrid:
    """Nodes answer with their node id; the nodes in ``failing`` answer with an error."""

    def __init__(self, failing=()):
        self.failing, self.asked = set(failing), []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.asked.append(sorted(int(m.metadata.dst_node_id) for m in messages))
        replies = []
        for message in reversed(messages):  # arrival order is not the clients' order
            node = int(message.metadata.dst_node_id)
            if node in self.failing:
                error = Error(code=1002, reason=f"partition-id={node}: RuntimeError: boom")
                replies.append(Message(error, reply_to=message))
            else:
                content = RecordDict({"answer": ConfigRecord({"node": node})})
                replies.append(Message(content, reply_to=message))
        return replies


def _round(grid, min_clients=2) -> QueryRound:
    model = build_model("mlp", in_shape=(1, 2, 2), depth=1, base_hidden=4)
    survivors = [ClientUpdate(n, n, model.state_dict(), 10, {}, 0) for n in (5, 6, 7)]
    return QueryRound(
        grid, survivors, {}, template=model, device="cpu", timeout=5.0, min_clients=min_clients
    )


def _nodes(answers) -> list[int]:
    return [int(content["answer"]["node"]) for _, content in answers]


def test_answers_come_in_the_clients_order_and_a_failing_client_is_dropped_for_good():
    from flwr.app import ArrayRecord

    grid = EchoGrid(failing=[6])
    rounds = _round(grid, min_clients=1)
    assert _nodes(rounds.ask("bn_stats", ArrayRecord())) == [5, 7]
    (failure,) = rounds.dropped
    assert failure.node_id == 6 and failure.stage == "bn_stats" and "boom" in failure.describe()

    def screen(content):
        if int(content["answer"]["node"]) == 7:
            raise ValueError("node 7's answer is off")

    assert _nodes(rounds.ask("unit_stats", ArrayRecord(), screen=screen, clients=None)) == [5]
    assert grid.asked == [[5, 6, 7], [5, 7]]
    assert [f.stage for f in rounds.dropped] == ["bn_stats", "unit_stats"]
    assert rounds.rounds == 2


def test_too_few_answers_name_the_query_and_who_was_dropped():
    from flwr.app import ArrayRecord

    rounds = _round(EchoGrid(failing=[5, 6]))
    with pytest.raises(NotEnoughClientsError, match="only 1 client.*temperature query"):
        rounds.ask("temperature", ArrayRecord())


def test_a_client_the_merge_refuses_is_dropped_with_the_latest_query_as_its_stage():
    from flwr.app import ArrayRecord

    rounds = _round(EchoGrid())
    rounds.ask("gram", ArrayRecord())
    rounds.refuse(0, "its Gram matrices blow the solution up")
    (failure,) = rounds.dropped
    assert failure.node_id == 5 and failure.stage == "gram"
    assert [u.node_id for u in rounds.survivors] == [6, 7]
