"""A model's moments on the clients' data as query rounds
(fedlmc.strategies.moment_rounds.MomentRounds, on its own): the BatchNorm input sums the
clients answer add up to those of their pooled data, and a client whose moments sit far from
the others' is dropped by the relative rule. Real Messages, the ClientApp's encoding, in
process."""

from __future__ import annotations

import pytest
import torch
from flwr.app import Message

from fedlmc.merging.calibrate import BNStats, bn_statistics
from fedlmc.models.classifiers import build_model
from fedlmc.strategies.moment_rounds import MomentRounds
from fedlmc.strategies.protocol import bn_stats_to_content, record_to_state
from fedlmc.strategies.robust import RobustScreen
from fedlmc.strategies.strategy_utils import ClientUpdate

IN_SHAPE = (1, 4, 4)


@pytest.fixture(autouse=True)
def _messages_need_a_task_identity(task_identity):
    """Messages need a run id: what Flower sets for a ServerApp."""
    yield


class MomentsGrid:
    """Nodes answer ``query.bn_stats`` with the BatchNorm input sums of the model they are sent
    on their own data; node 2's sums are multiplied by ``spoil``."""

    def __init__(self, template, data_by_node, spoil: float = 1.0):
        self.template, self.data, self.spoil = template, data_by_node, spoil

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            node = int(message.metadata.dst_node_id)
            model = self.template
            model.load_state_dict(record_to_state(message.content.array_records["arrays"]))
            stats = bn_statistics(model, self.data[node])
            if node == 2:
                stats = {
                    k: BNStats(s.sum * self.spoil, s.sum_sq * self.spoil**2, s.count)
                    for k, s in stats.items()
                }
            replies.append(
                Message(bn_stats_to_content(stats, {"partition-id": node}), reply_to=message)
            )
        return replies


def _rounds(spoil: float = 1.0, robust=None):
    torch.manual_seed(0)
    model = build_model("mlp", in_shape=IN_SHAPE, depth=2, base_hidden=8, norm="bn")
    xs = {
        n: torch.randn(32, *IN_SHAPE, generator=torch.Generator().manual_seed(n)) for n in range(3)
    }
    survivors = [ClientUpdate(n, n, model.state_dict(), 32, {}, 0) for n in range(3)]
    kwargs = {} if robust is None else {"robust": robust}
    grid = MomentsGrid(
        build_model("mlp", in_shape=IN_SHAPE, depth=2, base_hidden=8, norm="bn"), xs, spoil
    )
    rounds = MomentRounds(
        grid, survivors, {}, template=model, device="cpu", timeout=5.0, min_clients=2, **kwargs
    )
    return rounds, model, xs


def test_the_clients_sums_add_up_to_those_of_their_pooled_data():
    rounds, model, xs = _rounds()
    found = rounds.bn_statistics(model)
    pooled = bn_statistics(model, torch.cat([xs[n] for n in range(3)]), batch_size=32)
    assert set(found) == set(pooled) and rounds.rounds == 1
    for layer, stats in pooled.items():
        assert found[layer].count == stats.count == 96
        assert torch.allclose(found[layer].sum, stats.sum, rtol=1e-4, atol=1e-4)
        assert torch.allclose(found[layer].sum_sq, stats.sum_sq, rtol=1e-4, atol=1e-4)


def test_moments_far_from_the_others_are_dropped_by_the_relative_rule():
    rounds, model, _ = _rounds(spoil=1e4, robust=RobustScreen())
    rounds.bn_statistics(model)
    assert [f.partition_id for f in rounds.dropped] == [2]
    assert [u.node_id for u in rounds.survivors] == [0, 1]
