r"""A ``.safetensors`` file's header checked against the model it is to be loaded into, before
any tensor is read: :func:`check_header`.

The format: 8 bytes, a little-endian unsigned integer :math:`n`; :math:`n` bytes of JSON, an
object mapping each tensor's name to ``{"dtype": "F32", "shape": [s_1, ...], "data_offsets":
[b, e]}`` (plus an optional ``"__metadata__"`` of strings); then the data, tensor ``k`` at bytes
:math:`[b_k, e_k)` after the header. ``safetensors.torch.load_file`` allocates each tensor as
its header declares it, so a header claiming a :math:`10^5 \times 10^5` tensor (40 GB of
float32) over a sparse file would be allocated before ``load_state_dict`` could refuse its
shape. :func:`check_header` reads at most :func:`header_bound` bytes of header itself (its own
parser, ``json.loads``) and refuses, naming the file and the first difference:

- a header length beyond the file or :func:`header_bound` (a few hundred bytes per tensor);
- a header that is no JSON object of tensors;
- tensor names other than the state dict's (a name missing or one too many);
- a tensor whose dtype or shape differs from the state dict's;
- data offsets that do not span exactly :math:`\prod_k s_k \times \text{itemsize}` bytes
  inside the file;
- data offsets that overlap or leave bytes uncovered (the tensors must tile the data exactly,
  as safetensors itself requires), and a ``"__metadata__"`` that is no object of strings.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedlmc.simulations.config.schema import ConfigError

__all__ = ["DTYPE_NAMES", "check_header", "header_bound", "read_header"]

DTYPE_NAMES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}
"""A torch dtype's name (``str(dtype)`` without ``torch.``) -> its safetensors dtype."""
HEADER_BYTES_BASE = 4096
HEADER_BYTES_PER_TENSOR = 512


def header_bound(tensors: int) -> int:
    """The most header bytes read for a state dict of ``tensors`` tensors: each entry
    (name, dtype, shape, offsets) takes well under :data:`HEADER_BYTES_PER_TENSOR` bytes."""
    return HEADER_BYTES_BASE + HEADER_BYTES_PER_TENSOR * tensors


def read_header(path: Path, bound: int) -> tuple[dict[str, Any], int]:
    """The header of the safetensors file ``path`` (read only if at most ``bound`` bytes) and
    how many data bytes follow it; :class:`ConfigError` naming the file otherwise."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise ConfigError(f"{path}: {size} bytes, no safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(bound, size - 8):
            raise ConfigError(
                f"{path}: its header claims {length:,} bytes; allowed: at most "
                f"{min(bound, size - 8):,} (the file's size and the model's tensors)"
            )
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path}: its header is no JSON ({error})") from None
    if not isinstance(header, dict):
        raise ConfigError(f"{path}: its header is no JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise ConfigError(f"{path}: its header's __metadata__ is no object of strings")
    return header, size - 8 - length


def check_header(path: str | os.PathLike, state: Mapping[str, Any]) -> None:
    """:class:`ConfigError` (one line, naming ``path``) unless the header of ``path`` declares
    exactly the tensors of ``state`` (a state dict), each with its dtype and shape, at offsets
    inside the file; nothing but the header is read."""
    path = Path(path)
    header, data_bytes = read_header(path, header_bound(len(state)))
    missing = [k for k in state if k not in header]
    extra = [k for k in header if k not in state]
    if missing or extra:
        what = f"lacks tensor {missing[0]!r}" if missing else f"has tensor {extra[0]!r}"
        raise ConfigError(
            f"{path}: its header {what}; allowed: the {len(state)} tensors of the model the "
            "results row builds"
        )
    for name, tensor in state.items():
        _check_entry(path, name, header[name], tensor, data_bytes)
    _check_tiling(path, [header[name]["data_offsets"] for name in state], data_bytes)


def _check_tiling(path: Path, offsets: list[list[int]], data_bytes: int) -> None:
    """The tensors' ``[begin, end)`` byte ranges, sorted, must follow one another from 0 to
    ``data_bytes`` with neither overlap nor gap."""
    end = 0
    for begin, stop in sorted(offsets):
        if begin != end:
            what = "overlap" if begin < end else "leave a gap"
            raise ConfigError(
                f"{path}: its tensors' data_offsets {what} at byte {min(begin, end):,}; allowed: "
                "tensors that tile the data exactly"
            )
        end = stop
    if end != data_bytes:
        raise ConfigError(
            f"{path}: its tensors cover {end:,} of its {data_bytes:,} data bytes; allowed: "
            "tensors that tile the data exactly"
        )


def _check_entry(path: Path, name: str, entry: Any, tensor: Any, data_bytes: int) -> None:
    """One header entry against the state dict's ``tensor`` (dtype, shape, offsets)."""
    expected = (DTYPE_NAMES.get(str(tensor.dtype).removeprefix("torch.")), list(tensor.shape))
    claimed = (entry.get("dtype"), entry.get("shape")) if isinstance(entry, dict) else entry
    if claimed != expected:
        raise ConfigError(
            f"{path}: tensor {name!r} is {_shown(claimed)} in its header; allowed: "
            f"{_shown(expected)}, as in the model the results row builds"
        )
    offsets = entry.get("data_offsets")
    nbytes = math.prod(tensor.shape) * tensor.element_size()
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(o) is int for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_bytes
        or offsets[1] - offsets[0] != nbytes
    ):
        raise ConfigError(
            f"{path}: tensor {name!r} has data_offsets {str(offsets)[:60]} in its header; "
            f"allowed: {nbytes:,} bytes within the file's {data_bytes:,} data bytes"
        )


def _shown(claimed: Any) -> str:
    """``("F32", [64, 784])`` as ``F32 [64, 784]``; anything else as its (cut) repr."""
    if isinstance(claimed, tuple) and len(claimed) == 2:
        return f"{claimed[0]} {claimed[1]}"[:80]
    return repr(claimed)[:80]
