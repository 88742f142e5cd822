r"""The payload screen: every array a client sends, checked against its own labels and the
server's template **before** it is decoded.

A Flower :class:`flwr.app.Array` carries four fields that travel separately: ``dtype`` (a
string), ``shape`` (a tuple), ``stype`` (how ``data`` was serialised) and ``data`` (bytes). For
``stype = "numpy.ndarray"`` (the only one Flower 1.42 decodes, ``Array.numpy()``), ``data`` is
what :func:`numpy.save` wrote: a magic string, a header that states the dtype, the memory order
and the shape once more, then exactly :math:`\prod_k s_k \times \text{itemsize}` bytes. Nothing
in Flower checks that the labels, the header and the bytes agree until ``np.load`` decodes them:
a 3-element array labelled ``(64, 784)`` decodes to 3 elements, an object array is refused only
by ``np.load`` (with a ``ValueError`` no screen expected), and a hidden :math:`10^7`-element
payload is decoded in full before anything can refuse it.

:func:`check_payload` refuses, for one array and without decoding it:

- ``stype`` other than ``"numpy.ndarray"``;
- a ``dtype`` label that is not one of :data:`ALLOWED_DTYPES` (the dtypes a torch state dict
  holds: no object, string, complex, datetime or ``float128`` arrays);
- a ``shape`` label that is not a tuple of non-negative integers, or, when the template gives
  one, differs from it (so the element count is the template's);
- ``data`` whose NumPy header (read with NumPy's own header parser, at most
  :data:`MAX_HEADER_BYTES`) names another dtype or shape than the labels, a non-native byte
  order, or whose length is not exactly the header's plus :math:`\prod_k s_k \times
  \text{itemsize}` (bytes missing, or garbage after the array).

:func:`check_record_size` bounds a whole reply first: its arrays' bytes may not exceed
:func:`bytes_bound` of the template (per array the largest allowed itemsize, 8, times its
elements plus a header), which it checks by summing ``len(data)`` alone. Once an array passed,
:func:`decode` is ``Array.numpy()``: ``np.load`` without pickles of bytes known to be one array
of the labelled dtype and shape.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

NUMPY_STYPE = "numpy.ndarray"
"""The serialisation Flower 1.42 writes and decodes (``flwr.common.constant.SType.NUMPY``)."""
ALLOWED_DTYPES = frozenset(
    np.dtype(name).str
    for name in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8")
) | {np.dtype(bool).str}
"""The dtypes a reply's array may have (native byte order): those of a torch state dict."""
MAX_HEADER_BYTES = 10_000
"""Largest NumPy header read (:func:`numpy.lib.format.read_array_header_1_0`'s default)."""
MAX_ITEMSIZE = 8
"""Largest itemsize of :data:`ALLOWED_DTYPES` (float64, int64)."""
MAX_LABEL_CHARS = 64
"""Longest ``dtype`` / ``stype`` label looked at (longer ones are refused unparsed)."""


class ScreenError(ValueError):
    """A reply fails the screen (the message is the reason, on one line); raised here and by
    every screen of :mod:`fedlmc.strategies.screening`, which exports it."""


def declared_dtype(array: Array, key: str) -> np.dtype:
    """The dtype the ``dtype`` label of ``array`` names, if it is one of
    :data:`ALLOWED_DTYPES`; :class:`ScreenError` otherwise."""
    label = array.dtype
    if not isinstance(label, str) or len(label) > MAX_LABEL_CHARS:
        raise ScreenError(f"{key!r} has dtype label {str(label)[:MAX_LABEL_CHARS]!r}")
    try:
        dtype = np.dtype(label)
    except (TypeError, ValueError):
        raise ScreenError(f"{key!r} has dtype label {label!r}, which names no dtype") from None
    if dtype.str not in ALLOWED_DTYPES:
        raise ScreenError(
            f"{key!r} has dtype {label!r}; allowed: float16/32/64, int8/16/32/64, uint8, bool"
        )
    return dtype


def declared_shape(array: Array, key: str) -> tuple[int, ...]:
    """The ``shape`` label of ``array`` as a tuple of non-negative ints; :class:`ScreenError`
    otherwise."""
    shape = array.shape
    valid = isinstance(shape, tuple | list) and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    )
    if not valid:
        raise ScreenError(f"{key!r} has shape label {str(shape)[:MAX_LABEL_CHARS]}")
    return tuple(int(d) for d in shape)


def read_header(data: bytes, key: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape, dtype, header length)`` of the NumPy header at the start of ``data`` (NumPy's
    own parser, no pickles, at most :data:`MAX_HEADER_BYTES`); :class:`ScreenError` when there
    is none."""
    stream = io.BytesIO(data[: MAX_HEADER_BYTES + 16])
    try:
        version = np.lib.format.read_magic(stream)
        read = {
            (1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0,
        }.get(version)
        if read is None:
            raise ValueError(f"format version {version}")
        shape, _fortran, dtype = read(stream, max_header_size=MAX_HEADER_BYTES)
    except (ValueError, TypeError, SyntaxError, EOFError) as err:
        reason = " ".join(str(err).split())[:80]
        raise ScreenError(f"{key!r} holds no NumPy array header ({reason})") from None
    return tuple(int(d) for d in shape), dtype, stream.tell()


def check_payload(array: Array, key: str, expected_shape: tuple[int, ...] | None = None) -> None:
    """:class:`ScreenError` unless ``array``'s labels are allowed (and its shape is
    ``expected_shape`` when given) and its bytes are exactly one NumPy array of that dtype and
    shape (module docstring); nothing is decoded."""
    if not isinstance(array, Array):
        raise ScreenError(f"{key!r} is a {type(array).__name__}, not a flwr Array")
    if array.stype != NUMPY_STYPE:
        stype = str(array.stype)[:MAX_LABEL_CHARS]
        raise ScreenError(f"{key!r} is serialised as {stype!r}; allowed: {NUMPY_STYPE!r}")
    dtype = declared_dtype(array, key)
    shape = declared_shape(array, key)
    if expected_shape is not None and shape != tuple(expected_shape):
        raise ScreenError(f"wrong shape: {key!r} has {shape}, expected {tuple(expected_shape)}")
    if not isinstance(array.data, bytes):
        raise ScreenError(f"{key!r} carries {type(array.data).__name__}, not bytes")
    header_shape, header_dtype, offset = read_header(array.data, key)
    if header_dtype.hasobject or header_dtype != dtype or not header_dtype.isnative:
        raise ScreenError(
            f"{key!r} is labelled {dtype} but its bytes hold {header_dtype.str} (byte order "
            "and dtype must match the label)"
        )
    if header_shape != shape:
        raise ScreenError(f"{key!r} is labelled {shape} but its bytes hold shape {header_shape}")
    expected = offset + math.prod(shape) * dtype.itemsize
    if len(array.data) != expected:
        raise ScreenError(
            f"{key!r} carries {len(array.data)} bytes; a {dtype} array of shape {shape} is "
            f"{expected} bytes"
        )


def bytes_bound(shapes: Mapping[str, tuple[int, ...]]) -> int:
    r"""The most bytes a reply of arrays of these ``shapes`` may carry:
    :math:`\sum_k (8 \prod_j s_{kj} + H)`, :math:`H` = :data:`MAX_HEADER_BYTES`."""
    return sum(MAX_ITEMSIZE * math.prod(s) + MAX_HEADER_BYTES for s in shapes.values())


def check_record_size(record: ArrayRecord, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """:class:`ScreenError` when ``record``'s arrays carry more bytes than
    :func:`bytes_bound` of ``shapes`` (the template's; counted without decoding)."""
    sent = sum(len(a.data) if isinstance(a.data, bytes) else 0 for a in record.values())
    bound = bytes_bound(shapes)
    if sent > bound:
        raise ScreenError(
            f"the reply carries {sent} bytes of arrays; allowed: at most {bound} for the "
            "template's arrays"
        )


def sent_bytes(record: ArrayRecord) -> int:
    """The tensor bytes ``record``'s arrays carry, nothing decoded: each array's ``data`` less
    its NumPy header (all of it when it has none). Equal to
    :func:`fedlmc.strategies.protocol.tensor_bytes` for well-formed arrays; what a dropped
    reply is counted as."""
    total = 0
    for key, array in record.items():
        data = array.data if isinstance(array.data, bytes) else b""
        try:
            total += len(data) - read_header(data, key)[2]
        except ScreenError:
            total += len(data)
    return total


def check_record(record: ArrayRecord, shapes: Mapping[str, tuple[int, ...]] | None = None) -> None:
    """Every array of ``record`` through :func:`check_payload` (against ``shapes``, the
    template's, when given: then the reply's total bytes first, :func:`check_record_size`)."""
    if shapes is not None:
        check_record_size(record, shapes)
    for key, array in record.items():
        check_payload(array, key, None if shapes is None else shapes.get(key))


def decode(array: Array, key: str, expected_shape: tuple[int, ...] | None = None) -> Any:
    """``array`` as a NumPy array once it passed :func:`check_payload`."""
    check_payload(array, key, expected_shape)
    return array.numpy()
