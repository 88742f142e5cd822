"""``check_header``: a safetensors file's header against a state dict, read with a bound and
without reading a tensor; files written by ``safetensors`` itself pass, every difference is one
``ConfigError`` line naming the file."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from fedlmc.simulations.config.schema import ConfigError
from fedlmc.simulations.runs.safetensors_header import check_header, header_bound

STATE = {
    "w": torch.randn(3, 4),
    "b": torch.zeros(3, dtype=torch.float64),
    "n": torch.tensor(5),
    "m": torch.ones(2, dtype=torch.bool),
}


def written(tmp_path, header_edit=None, data: bytes | None = None):
    """``STATE`` saved by safetensors, its header then replaced by ``header_edit(header)``."""
    path = tmp_path / "m.safetensors"
    save_file(STATE, path, metadata={"format": "pt"})
    if header_edit is not None:
        raw = path.read_bytes()
        (length,) = struct.unpack("<Q", raw[:8])
        text = json.dumps(header_edit(json.loads(raw[8 : 8 + length]))).encode()
        rest = raw[8 + length :] if data is None else data
        path.write_bytes(struct.pack("<Q", len(text)) + text + rest)
    return path


def refused(path, state=STATE) -> str:
    with pytest.raises(ConfigError) as error:
        check_header(path, state)
    assert "\n" not in str(error.value) and str(error.value).startswith(f"{path}: ")
    return str(error.value)


def test_a_file_safetensors_wrote_passes_and_loads_as_written(tmp_path):
    path = written(tmp_path)
    check_header(path, STATE)
    loaded = load_file(path)
    assert all(torch.equal(loaded[k], v) for k, v in STATE.items())


def test_names_dtypes_shapes_and_offsets_must_be_the_state_dicts(tmp_path):
    def drop_w(h):
        return {k: v for k, v in h.items() if k != "w"}

    assert refused(written(tmp_path, drop_w)).endswith(
        "its header lacks tensor 'w'; allowed: the 4 tensors of the model the results row builds"
    )
    assert "has tensor 'w'" in refused(written(tmp_path), {k: STATE[k] for k in "bnm"})
    assert "tensor 'w' is F32 [3, 5] in its header; allowed: F32 [3, 4]" in refused(
        written(tmp_path, lambda h: {**h, "w": {**h["w"], "shape": [3, 5]}})
    )
    assert "tensor 'b' is F32 [3] in its header; allowed: F64 [3]" in refused(
        written(tmp_path, lambda h: {**h, "b": {**h["b"], "dtype": "F32"}})
    )
    assert "tensor 'w' is 'w' in its header" in refused(
        written(tmp_path, lambda h: {**h, "w": "w"})
    )
    no_data = written(tmp_path, lambda h: h, data=b"")
    assert refused(no_data).endswith("bytes within the file's 0 data bytes")
    overlap = written(tmp_path, lambda h: {**h, "w": {**h["w"], "data_offsets": [0, 47]}})
    assert "tensor 'w' has data_offsets [0, 47] in its header; allowed: 48 bytes" in refused(
        overlap
    )


def test_a_header_is_read_only_within_its_bound(tmp_path):
    path = tmp_path / "m.safetensors"
    bound = header_bound(len(STATE))
    path.write_bytes(struct.pack("<Q", bound + 1) + b" " * (bound + 1))
    assert f"its header claims {bound + 1:,} bytes; allowed: at most {bound:,}" in refused(path)
    path.write_bytes(struct.pack("<Q", 4) + b"[1]\xff")
    assert "its header is no JSON" in refused(path)
    path.write_bytes(struct.pack("<Q", 3) + b"[1]")
    assert refused(path).endswith("its header is no JSON object")
    path.write_bytes(b"\x01")
    assert refused(path).endswith("1 bytes, no safetensors header")


def test_tensors_must_tile_the_data_and_metadata_be_strings(tmp_path):
    """Headers that safetensors itself refuses only once it reads (found by an attack on the
    check as it landed): overlapping ranges, trailing bytes, metadata that is no object of
    strings; each is one line before any tensor is read."""

    def onto_w(h):  # 'b' moved onto 'w''s first bytes, its own range left uncovered
        start = h["w"]["data_offsets"][0]
        return {**h, "b": {**h["b"], "data_offsets": [start, start + 24]}}

    assert refused(written(tmp_path, onto_w)).endswith(
        "allowed: tensors that tile the data exactly"
    )
    raw = written(tmp_path).read_bytes()
    trailing = written(
        tmp_path, lambda h: h, data=raw[8 + struct.unpack("<Q", raw[:8])[0] :] + b"x"
    )
    assert "its tensors cover" in refused(trailing) and "tile the data exactly" in refused(trailing)
    for metadata in ([1], {"format": 1}):
        edited = written(tmp_path, lambda h, m=metadata: {**h, "__metadata__": m})
        assert refused(edited).endswith("its header's __metadata__ is no object of strings")
