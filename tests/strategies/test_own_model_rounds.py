"""The clients' own statistics as query rounds (``query.fisher``, ``query.gram``;
fedlmc.strategies.own_model_rounds through ClientRounds, the screen of
fedlmc.strategies.screening): honest
answers reach the merge in the clients' order, and a reply that is no Fisher diagonal or Gram
matrix (a missing or misshaped tensor, NaN, a negative Fisher entry, an asymmetric Gram) or
whose digest is not that of the weights the client trained is dropped by node, the others kept.
Real Messages on a Grid whose nodes answer with the ClientApp's encoding, in process."""

from __future__ import annotations

import math

import pytest
import torch
from flwr.app import Message

from fedlmc.merging.field.fisher import fisher_diagonal
from fedlmc.merging.field.regmean import gram_matrices, regmean_layers
from fedlmc.models.classifiers import build_model
from fedlmc.strategies.protocol import (
    FISHER_QUERY,
    GRAM_QUERY,
    state_digest,
    statistics_from_content,
    statistics_to_content,
)
from fedlmc.strategies.queries import ClientRounds
from fedlmc.strategies.robust import OFF, RobustScreen
from fedlmc.strategies.screening import ScreenError, screen_statistics_reply
from fedlmc.strategies.strategy_utils import ClientUpdate


@pytest.fixture(autouse=True)
def _messages_need_a_task_identity(task_identity):
    """Flower's Message reads the task identity (the shared fixture sets it)."""


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", in_shape=(1, 3, 3), depth=1, base_hidden=4).eval()


def _data(seed: int):
    """Inputs with a common offset (correlated, as pixels are), and labels."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(20, 1, 3, 3, generator=generator) + 1.0, torch.randint(
        0, 10, (20,), generator=generator
    )


class StatisticsGrid:
    """Nodes 0, 1, 2 answer ``query.fisher`` / ``query.gram`` about their own model on their own
    data; ``spoil(tensors, digest)`` rewrites node 2's answer first."""

    def __init__(self, models, spoil=None):
        self.models, self.spoil = models, spoil

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for message in messages:
            node = int(message.metadata.dst_node_id)
            model, (x, y) = self.models[node], _data(node)
            if message.metadata.message_type.endswith(FISHER_QUERY):
                found = fisher_diagonal(model, x, y)
            else:
                found = gram_matrices(model, x, message.content["config"]["layers"])
            digest = state_digest(model.state_dict())
            if node == 2 and self.spoil is not None:
                found, digest = self.spoil(found, digest)
            content = statistics_to_content(found, digest, {"partition-id": node})
            replies.append(Message(content, reply_to=message))
        return replies


def _rounds(spoil=None, robust=OFF):
    models = [_model(s) for s in range(3)]
    survivors = [ClientUpdate(n, n, models[n].state_dict(), 20, {}, 0) for n in range(3)]
    grid = StatisticsGrid(models, spoil)
    rounds = ClientRounds(
        grid,
        survivors,
        {},
        template=models[0],
        device="cpu",
        timeout=5.0,
        min_clients=2,
        robust=robust,
    )
    return rounds, models


def test_honest_answers_are_every_clients_own_statistics_in_order():
    rounds, models = _rounds()
    fishers = rounds.fisher_diagonals()
    for node, found in enumerate(fishers):
        expected = fisher_diagonal(models[node], *_data(node))
        assert all(torch.allclose(found[k], expected[k]) for k in expected)
    layers = regmean_layers(models[0])
    grams = rounds.gram_matrices(layers)
    assert [sorted(g) for g in grams] == [sorted(layers)] * 3
    assert rounds.rounds == 2 and rounds.dropped == [] and rounds.bytes_received > 0


def _first(tensors):
    return next(iter(tensors))


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        (lambda t, d: ({**t, _first(t): t[_first(t)] * math.nan}, d), "non-finite values"),
        (lambda t, d: ({**t, _first(t): -t[_first(t)] - 1}, d), "negative Fisher entries"),
        (lambda t, d: ({k: v for k, v in list(t.items())[1:]}, d), "is missing or unexpected"),
        (lambda t, d: ({**t, _first(t): t[_first(t)][:1]}, d), "has shape"),
        (lambda t, d: (t, "0" * 64), "digest mismatch"),
    ],
)
def test_a_bad_fisher_reply_is_dropped_by_node_and_the_others_kept(spoil, reason):
    rounds, _ = _rounds(spoil)
    fishers = rounds.fisher_diagonals()
    assert fishers[2] is None and fishers[0] is not None and fishers[1] is not None
    assert [f.node_id for f in rounds.dropped] == [2]
    assert reason in rounds.dropped[0].reason and rounds.dropped[0].stage == FISHER_QUERY
    assert [u.node_id for u in rounds.survivors] == [0, 1]


def test_an_asymmetric_gram_matrix_is_refused():
    def skew(tensors, digest):
        layer = _first(tensors)
        g = tensors[layer].clone()
        g[0, 1] += 1.0
        return {**tensors, layer: g}, digest

    rounds, models = _rounds(skew)
    grams = rounds.gram_matrices(regmean_layers(models[0]))
    assert grams[2] is None and "is no Gram matrix" in rounds.dropped[0].reason


def test_the_screen_refuses_a_reply_without_a_digest():
    content = statistics_to_content({"w": torch.ones(2)}, "d", {})
    tensors, digest = statistics_from_content(content)
    assert digest == "d" and torch.equal(tensors["w"], torch.ones(2))
    screen_statistics_reply(content, {"w": (2,)}, "fisher")
    del content.config_records["digest"]
    with pytest.raises(ScreenError, match="expected exactly one ConfigRecord"):
        screen_statistics_reply(content, {"w": (2,)}, "fisher")


def _off_diagonal_times(factor: float):
    def spoil(tensors, digest):
        out = {}
        for name, g in tensors.items():
            diagonal = torch.diag(torch.diagonal(g))
            out[name] = diagonal + factor * (g - diagonal)
        return out, digest

    return spoil


def _top_direction_negated(tensors, digest):
    """Every Gram's top eigen-direction negated off the diagonal: symmetric, the diagonal kept
    (what the screen accepted before), one eigenvalue far below 0."""
    out = {}
    for name, g in tensors.items():
        values, vectors = torch.linalg.eigh(g.double())
        part = values[-1] * torch.outer(vectors[:, -1], vectors[:, -1])
        out[name] = (g.double() - 2 * (part - torch.diag(torch.diagonal(part)))).float()
    return out, digest


def _times(factor: float):
    return lambda tensors, digest: ({k: v * factor for k, v in tensors.items()}, digest)


def _every_entry(value: float):
    return lambda tensors, digest: (
        {k: torch.full_like(v, value) for k, v in tensors.items()},
        digest,
    )


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        (_off_diagonal_times(-4.0), "positive semi-definite"),
        (_top_direction_negated, "positive semi-definite"),
        (_times(1e6), "x the median over clients"),
    ],
    ids=["off-diagonal x -4", "indefinite", "x1e6"],
)
def test_a_poisoned_gram_reply_is_dropped_by_name_and_the_others_merged(spoil, reason):
    rounds, models = _rounds(spoil, RobustScreen())
    layers = regmean_layers(models[0])
    grams = rounds.gram_matrices(layers)
    assert grams[2] is None and grams[0] is not None and grams[1] is not None
    (failure,) = rounds.dropped
    assert failure.partition_id == 2 and failure.stage == GRAM_QUERY
    assert reason in failure.reason and "partition 2" in failure.describe()
    honest = gram_matrices(models[0], _data(0)[0], layers)
    assert all(torch.allclose(grams[0][k], honest[k]) for k in layers)


@pytest.mark.parametrize("spoil", [_times(1e6), _every_entry(1e37)], ids=["x1e6", "1e37"])
def test_a_fisher_reply_out_of_scale_is_dropped_by_name_and_the_others_merged(spoil):
    rounds, _ = _rounds(spoil, RobustScreen())
    fishers = rounds.fisher_diagonals()
    assert fishers[2] is None and fishers[0] is not None and fishers[1] is not None
    (failure,) = rounds.dropped
    assert failure.partition_id == 2 and failure.stage == FISHER_QUERY
    assert "mean Fisher entry" in failure.reason and "x the median over clients" in failure.reason


def test_an_honest_round_with_the_relative_rule_drops_nobody():
    rounds, models = _rounds(robust=RobustScreen())
    assert all(f is not None for f in rounds.fisher_diagonals())
    assert all(g is not None for g in rounds.gram_matrices(regmean_layers(models[0])))
    assert rounds.dropped == []


def test_a_client_the_merge_refuses_is_dropped_by_name_from_the_latest_query():
    rounds, models = _rounds()
    rounds.gram_matrices(regmean_layers(models[0]))
    rounds.refuse(1, "its Gram matrices blow the solution up")
    (failure,) = rounds.dropped
    assert failure.partition_id == 1 and failure.stage == GRAM_QUERY
    assert [u.node_id for u in rounds.survivors] == [0, 2]
    assert rounds.fisher_diagonals()[1] is None  # asked nothing more
