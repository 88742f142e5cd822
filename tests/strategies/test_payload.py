"""The payload screen (:mod:`fedlmc.strategies.payload`) on real Flower ``Array`` objects whose
bytes disagree with their labels: each bad client is dropped by name before anything it sent is
decoded, and the others are merged (the real strategy's round, in process)."""

from __future__ import annotations

import io
import tracemalloc

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedlmc.models.classifiers import build_model
from fedlmc.strategies import OneShotAverage, StrategyOptions
from fedlmc.strategies.payload import (
    MAX_HEADER_BYTES,
    ScreenError,
    bytes_bound,
    check_payload,
    check_record,
    sent_bytes,
)
from fedlmc.strategies.protocol import moments_to_content, state_to_record, tensor_bytes
from fedlmc.strategies.screening import screen_align_reply, screen_moments_reply

IN_SHAPE = (1, 4, 4)
WEIGHT = "hidden.0.linear.weight"  # shape (8, 16) in the tiny model


@pytest.fixture(autouse=True)
def _messages_need_a_task_identity(task_identity):
    yield


def tiny():
    torch.manual_seed(0)
    return build_model("mlp", width=1.0, in_shape=IN_SHAPE, depth=2, base_hidden=8)


def npy(values: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, values, allow_pickle=False)
    return buffer.getvalue()


def labelled(dtype: str, shape: tuple[int, ...], data: bytes) -> Array:
    return Array(dtype=dtype, shape=shape, stype="numpy.ndarray", data=data)


def object_npy(length: int) -> bytes:
    """A NumPy header declaring an object array, then pickle-sized junk (what ``np.save`` of an
    object array with pickles allowed starts with)."""
    buffer = io.BytesIO()
    header = {"descr": "|O", "fortran_order": False, "shape": (length,)}
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue() + b"\x80\x04junk" * length


SHAPE = (8, 16)
LIES = {
    "three elements labelled (8, 16)": (
        labelled("float32", SHAPE, npy(np.ones(3, np.float32))),
        "bytes hold shape (3,)",
    ),
    "garbage after the header": (
        labelled("float32", SHAPE, npy(np.ones(SHAPE, np.float32)) + b"garbage"),
        "bytes; a float32 array of shape (8, 16) is",
    ),
    "bytes cut short": (
        labelled("float32", SHAPE, npy(np.ones(SHAPE, np.float32))[:-4]),
        "bytes; a float32 array of shape (8, 16) is",
    ),
    "object bytes labelled float32": (
        labelled("float32", SHAPE, object_npy(128)),
        "labelled float32 but its bytes hold |O",
    ),
    "an object array": (labelled("object", SHAPE, object_npy(128)), "dtype 'object'"),
    "float64 bytes labelled float32": (
        labelled("float32", SHAPE, npy(np.ones(SHAPE, np.float64))),
        "labelled float32 but its bytes hold <f8",
    ),
    "big-endian bytes": (
        labelled(">f4", SHAPE, npy(np.ones(SHAPE, ">f4"))),
        "dtype '>f4'",
    ),
    "no NumPy header": (labelled("float32", SHAPE, b"\x00" * 512), "no NumPy array header"),
    "a dtype label naming no dtype": (labelled("float32x", SHAPE, b""), "names no dtype"),
    "a complex dtype": (
        labelled("complex64", SHAPE, npy(np.ones(SHAPE, np.complex64))),
        "dtype 'complex64'",
    ),
    "a foreign serialisation": (
        Array(dtype="float32", shape=SHAPE, stype="torch.save", data=b""),
        "serialised as 'torch.save'",
    ),
    "a negative shape label": (labelled("float32", (8, -16), b""), "shape label"),
}


@pytest.mark.parametrize("case", LIES)
def test_an_array_whose_bytes_disagree_with_its_labels_is_refused_undecoded(case):
    array, words = LIES[case]
    with pytest.raises(ScreenError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_payload(array, WEIGHT, SHAPE)


def test_an_honest_array_passes_and_its_labels_must_be_the_templates_shape():
    honest = Array(np.ones(SHAPE, np.float32))
    check_payload(honest, WEIGHT, SHAPE)
    check_payload(Array(np.zeros((), np.int64)), "n", ())  # a scalar buffer
    with pytest.raises(ScreenError, match=r"wrong shape: .* has \(16, 8\), expected \(8, 16\)"):
        check_payload(Array(np.ones((16, 8), np.float32)), WEIGHT, SHAPE)


def test_the_reply_bound_counts_bytes_without_decoding_and_sent_bytes_match_the_tensors():
    template = tiny()
    record = state_to_record(template.state_dict())
    shapes = {k: tuple(a.shape) for k, a in record.items()}
    check_record(record, shapes)
    assert sent_bytes(record) == tensor_bytes(record)
    elements = sum(int(np.prod(s)) for s in shapes.values())
    assert bytes_bound(shapes) == 8 * elements + MAX_HEADER_BYTES * len(shapes)
    hidden = ArrayRecord({**dict(record.items()), WEIGHT: labelled("float32", SHAPE, b"x" * 10**6)})
    with pytest.raises(ScreenError, match="allowed: at most"):
        check_record(hidden, shapes)


# ----------------------------------------------------------------------------- in the strategy


def reply(node: int, pid: int, record: ArrayRecord) -> Message:
    content = RecordDict(
        {"arrays": record, "metrics": MetricRecord({"num-examples": 10, "partition-id": pid})}
    )
    return Message(content, reply_to=Message(RecordDict(), dst_node_id=node, message_type="train"))


def constant_record(template, value: float) -> ArrayRecord:
    state = {
        k: torch.full_like(v, value) if v.is_floating_point() else v.clone()
        for k, v in template.state_dict().items()
    }
    return state_to_record(state)


def with_array(template, array: Array) -> ArrayRecord:
    record = constant_record(template, 5.0)
    return ArrayRecord({**dict(record.items()), WEIGHT: array})


def test_each_lying_client_is_dropped_by_name_and_the_others_merged():
    """Four honest clients (values 1, 2, 3, 4) and every lie of :data:`LIES` plus a hidden
    10^7-element payload behind the template's labels: the merge is the honest clients'
    average (2.5), each liar is named by node and partition with its reason, and the hidden
    payload is refused without being decoded (no allocation of its size)."""
    template = tiny()
    hidden = labelled("float32", SHAPE, npy(np.ones(10**7, np.float32)))
    bad = [*(array for array, _ in LIES.values()), hidden]
    honest = [reply(10 + i, i, constant_record(template, 1.0 + i)) for i in range(4)]
    liars = [reply(100 + i, 4 + i, with_array(template, a)) for i, a in enumerate(bad)]
    nodes = [*(10 + i for i in range(4)), *(100 + i for i in range(len(bad)))]
    strategy = OneShotAverage(
        template, StrategyOptions(num_clients=len(nodes), min_clients=2, calibration="none")
    )
    strategy.expect_replies(state_to_record(template.state_dict()), nodes)
    tracemalloc.start()
    try:
        found = strategy.merge_round(1, [*honest, *liars])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10**7  # the hidden payload is 4e7 bytes: never decoded, never copied
    assert found.report.survivor_ids == [0, 1, 2, 3]
    failures = {f.node_id: f for f in found.report.failures}
    assert sorted(failures) == [100 + i for i in range(len(bad))]
    for i, (_, words) in enumerate(LIES.values()):
        failure = failures[100 + i]
        assert failure.partition_id == 4 + i and words.split(" (")[0] in failure.reason
        assert failure.describe().startswith(f"node {100 + i} (partition {4 + i}): ")
    assert "allowed: at most" in failures[100 + len(LIES)].reason
    for key, tensor in found.arrays.to_torch_state_dict().items():
        if tensor.is_floating_point():
            assert torch.allclose(tensor, torch.full_like(tensor, 2.5)), key


def test_query_replies_with_lying_arrays_are_refused_before_decoding():
    from fedlmc.merging.repair import UnitStats

    stats = {"layer": UnitStats(sum=torch.ones(4), sum_sq=torch.full((4,), 2.0), count=3)}
    content = moments_to_content(stats, {})
    screen_moments_reply(content, {"layer": 4})
    arrays = content.array_records["moments"]
    arrays["layer/sum"] = labelled("float64", (4,), npy(np.ones(3, np.float64)))
    with pytest.raises(ScreenError, match="bytes hold shape"):
        screen_moments_reply(content, {"layer": 4})
    perms = RecordDict(
        {
            "perms": ArrayRecord({"perm/g": labelled("int32", (4,), object_npy(4))}),
            "digest": ConfigRecord({"state-digest": "abc"}),
        }
    )
    with pytest.raises(ScreenError, match="bytes hold"):
        screen_align_reply(perms, {"g": 4})
