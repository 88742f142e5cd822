"""What a client starts from (issue 29): ``init = "shared"`` gives every client the server's
initial weights and ``independent`` each client its own; ``warmup-rounds = k`` runs k FedAvg
rounds of one epoch from the shared initialisation and starts the one-shot round's local
training from their global model, its rounds and bytes counted in the rows. The federation runs
the real ClientApp and ServerApp in-process on a Grid that hands each message to the ClientApp
(no Ray)."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fedlmc.simulations.client_app import _initial_model, app
from fedlmc.simulations.config import ConfigError, validate_run_config
from fedlmc.simulations.server_app import run_server
from fedlmc.simulations.task import build_from_config, client_setup, load_splits
from fedlmc.strategies.protocol import record_to_state, state_to_record

TINY = {
    "dataset": "mnist5k",
    "model": "mlp",
    "width": 0.25,
    "depth": 2,
    "base-hidden": 64,
    "bias": False,
    "num-clients": 2,
    "init": "shared",
    "timeout": 120.0,
}


class ClientAppGrid:
    """An in-process Grid: every message goes to the fedlmc ClientApp of its node (node ``i + 1``
    holds partition ``i``; one Context per node, kept across messages); it records each train
    message with the reply it got."""

    def __init__(self, num_nodes: int) -> None:
        self.contexts = {
            p + 1: Context(
                run_id=7,
                node_id=p + 1,
                state=RecordDict(),
                run_config={},
                node_config={"partition-id": p, "num-partitions": num_nodes},
            )
            for p in range(num_nodes)
        }
        self.trained: list[tuple[Message, Message]] = []

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages, *, timeout=None) -> list[Message]:
        replies = []
        for message in messages:
            reply = app(message, self.contexts[int(message.metadata.dst_node_id)])
            assert not reply.has_error(), reply.error.reason
            if message.metadata.message_type == "train":
                self.trained.append((message, reply))
            replies.append(reply)
        return replies

    def train_rounds(self) -> list[list[tuple[Message, Message]]]:
        """The recorded train messages grouped by round (every node gets one per round)."""
        n = len(self.contexts)
        return [self.trained[i : i + n] for i in range(0, len(self.trained), n)]


def sent_state(message: Message) -> dict[str, torch.Tensor]:
    return record_to_state(message.content["arrays"])


def sent_config(message: Message) -> dict:
    return dict(message.content["config"])


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_shared_init_gives_every_client_the_servers_weights_and_independent_its_own(
    task_identity,
):
    config = validate_run_config(TINY, check_devices=False)
    splits = load_splits(config)
    server = build_from_config(config, splits).state_dict()
    content = RecordDict({"arrays": state_to_record(server), "config": ConfigRecord(config)})
    message = Message(content, dst_node_id=1, message_type="train")
    shared = [
        _initial_model(client_setup(config), splits, p, message).state_dict() for p in (0, 1, 2)
    ]
    for state in shared:
        assert_same_state(state, server)
    independent = {**config, "init": "independent"}
    own = [
        _initial_model(client_setup(independent), splits, p, message).state_dict()
        for p in (0, 1, 2)
    ]
    first = "hidden.0.linear.weight"
    for p, state in enumerate(own):
        assert not torch.equal(state[first], server[first]), p
        for q in range(p):
            assert not torch.equal(state[first], own[q][first]), (p, q)
    again = _initial_model(client_setup(independent), splits, 1, message).state_dict()
    assert_same_state(again, own[1])  # seeded per client: the same client draws the same


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"init": "independent"}, "warmup-rounds = 2 with init = 'independent': allowed only"),
        ({"epochs": 2}, "warmup-rounds = 2: allowed: 0 .. epochs - 1 (1)"),
        ({"client-widths": "0.5,1", "methods": "embed_average"}, "allowed only with every"),
    ],
)
def test_warmup_rounds_are_refused_where_they_cannot_run(values, words):
    with pytest.raises(ConfigError, match=r"^warmup-rounds = 2") as err:
        validate_run_config({**TINY, "epochs": 3, "warmup-rounds": 2, **values})
    assert words in str(err.value)
    assert "\n" not in str(err.value)


def test_warmup_rounds_start_local_training_from_the_k_round_fedavg_model(task_identity):
    k, epochs = 2, 3
    warm = {**TINY, "strategy": "average", "calibration": "none", "epochs": epochs}
    grid = ClientAppGrid(2)
    outcome = run_server(grid, {**warm, "warmup-rounds": k}, simulated=True)
    rounds = grid.train_rounds()
    assert len(rounds) == k + 1
    config = validate_run_config(warm, check_devices=False)
    server = build_from_config(config, load_splits(config)).state_dict()
    for message, _ in rounds[0]:  # round 1 starts from the server's initialisation
        assert_same_state(sent_state(message), server)
    for r in range(k):
        assert {sent_config(m)["epochs"] for m, _ in rounds[r]} == {1}
    last = [sent_config(m) for m, _ in rounds[k]]
    assert {c["epochs"] for c in last} == {epochs - k} and {c["init"] for c in last} == {"shared"}
    # the same k rounds run alone as the FedAvg baseline (k rounds of one epoch)
    alone = ClientAppGrid(2)
    fedavg = {**TINY, "strategy": "fedavg", "fedavg-rounds": k, "epochs": k}
    baseline = run_server(alone, fedavg, simulated=True).merged["fedavg"]
    for message, _ in rounds[k]:  # the one-shot round's clients receive the k-round model
        assert_same_state(sent_state(message), baseline)
    # and start from it: the replies differ from a one-shot round trained from the server's init
    pure = ClientAppGrid(2)
    run_server(pure, {**warm, "epochs": epochs - k}, simulated=True)
    (one_shot,) = pure.train_rounds()
    for (_, warmed), (_, cold) in zip(rounds[k], one_shot, strict=True):
        a, b = sent_state(warmed), sent_state(cold)
        assert not torch.equal(a["hidden.0.linear.weight"], b["hidden.0.linear.weight"])
    # rounds and bytes count the warm-up: k + 1 rounds of both clients' full weights
    (row,) = [r for r in outcome.rows if r["method"] == "average"]
    size = sum(t.numel() * t.element_size() for t in server.values())
    assert row["rounds"] == k + 1
    assert row["bytes_sent_by_clients"] == (k + 1) * 2 * size
