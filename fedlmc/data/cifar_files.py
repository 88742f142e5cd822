"""CIFAR batch files that fail torchvision's md5 check, read without running their code.

A CIFAR ``python`` batch (``data_batch_1`` ... ``test_batch``, CIFAR-100's ``train`` /
``test``) is a pickle of a dict: ``data`` a ``uint8`` array ``(n, 3072)``, ``labels`` (or
``fine_labels`` and ``coarse_labels``) a list of ints, ``batch_label`` a string, ``filenames`` a
list of strings. ``pickle.load`` would call whatever a file names (``posix.system`` included),
so a file that does not match the md5 sum torchvision publishes for the official release is read
by :class:`BatchUnpickler`, which admits only what that format holds:

- strings, bytes, numbers, lists, tuples and dicts (no global needed);
- NumPy arrays as NumPy pickles them: ``_reconstruct(ndarray, (0,), dtype)`` of an empty array
  then its state (protocols 2-4), ``_frombuffer(bytes, dtype, shape, order)`` (protocol 5),
  ``dtype``, and ``scalar(dtype, bytes)`` for NumPy scalars in a label list; ``_codecs.encode``
  with ``latin1`` for bytes pickled by protocol 2.

Every other global (``posix.system``, ``builtins.eval``, ...) is refused before anything is
called, and the allowed ones are replaced by stand-ins: no NumPy function that trusts its pickled
state runs. A dtype must be a plain type code (numbers, fixed-size strings; never objects,
structures or sub-arrays: NumPy's ``ndarray.__setstate__`` fills an object array with pointers
from the file, which crashed the interpreter); an array is built over exactly
``prod(shape) x itemsize`` bytes of the file, ``ndarray`` cannot be called, and after loading
``data`` must be a numeric array whose size is at most the file's, and the labels one int per
row. A refused file is one ``ValueError`` line naming it, its md5 and torchvision's, and the fix
(``fedlmc data fetch``).
"""

from __future__ import annotations

import hashlib
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["BatchUnpickler", "read_batches"]

_NUMPY_CORE = ("numpy.core", "numpy._core")  # NumPy 1 and NumPy 2 pickles
ALLOWED_GLOBALS = frozenset(
    {(f"{core}.multiarray", name) for core in _NUMPY_CORE for name in ("_reconstruct", "scalar")}
    | {(f"{core}.numeric", "_frombuffer") for core in _NUMPY_CORE}
    | {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}
)
"""``(module, name)`` of every global a CIFAR batch may name."""


class _NdarrayMarker:
    """Stands for ``numpy.ndarray`` inside a batch: ``_reconstruct`` accepts it, calling it
    (``ndarray(shape, dtype)`` would allocate ``shape`` uninitialised) is refused."""

    def __new__(cls, *args: Any, **kwargs: Any):
        raise pickle.UnpicklingError("numpy.ndarray(...) called directly; allowed: arrays only")


PLAIN_KINDS = frozenset("biufcSU")
"""The dtype kinds a batch may hold: booleans, integers, floats, complex numbers and fixed-size
strings; never objects, structures or sub-arrays, whose NumPy state (``ndarray.__setstate__``
with an object dtype fills pointers from the file) can crash the interpreter."""


def plain_dtype(spec: Any) -> np.dtype:
    """``np.dtype(spec)`` for a type code (``"u1"``, ``b"<i8"``) of a :data:`PLAIN_KINDS`
    dtype; ``UnpicklingError`` otherwise."""
    if not isinstance(spec, str | bytes):
        raise pickle.UnpicklingError(f"a dtype of {type(spec).__name__}; allowed: a type code")
    try:
        dtype = np.dtype(spec.decode("latin1") if isinstance(spec, bytes) else spec)
    except TypeError as err:
        raise pickle.UnpicklingError(f"dtype {spec!r}: {err}") from None
    if dtype.kind not in PLAIN_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise pickle.UnpicklingError(
            f"dtype {dtype.str!r}; allowed: numbers and fixed-size strings, no objects"
        )
    return dtype


class _DtypeState:
    """Stands for ``numpy.dtype(spec, align, copy)`` in a batch: the dtype of a type code of
    :func:`plain_dtype`, its byte order taken from the pickled state, whose other fields
    (sub-array, names, fields, flags) must be empty. NumPy's own ``dtype.__setstate__`` is
    never called."""

    def __init__(self, spec: Any, align: Any = False, copy: Any = False) -> None:
        self.dtype = plain_dtype(spec)

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) < 5 or state[1] not in ("<", ">", "|", "="):
            raise pickle.UnpicklingError("a dtype state NumPy does not write")
        if any(part is not None for part in state[2:5]):
            raise pickle.UnpicklingError("a dtype with sub-arrays or fields; allowed: plain")
        if state[1] in ("<", ">"):
            self.dtype = self.dtype.newbyteorder(state[1])


def _resolved_dtype(dtype: Any) -> np.dtype:
    """The plain dtype a batch's dtype stands for (:class:`_DtypeState` or a type code)."""
    return dtype.dtype if isinstance(dtype, _DtypeState) else plain_dtype(dtype)


class _ArrayState:
    """Stands for NumPy's ``_reconstruct(ndarray, (0,), code)`` until its state arrives:
    ``(version, shape, dtype, is_fortran, raw bytes)``; the array is then built over exactly
    ``prod(shape) x itemsize`` bytes of the file (never by ``ndarray.__setstate__``)."""

    array: np.ndarray | None = None

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, tuple) or len(state) != 5:
            raise pickle.UnpicklingError("an array state NumPy does not write")
        _, shape, dtype, is_fortran, raw = state
        self.array = _array_over(raw, _resolved_dtype(dtype), shape, "F" if is_fortran else "C")


def _array_over(raw: Any, dtype: np.dtype, shape: Any, order: str) -> np.ndarray:
    """An array of ``dtype`` and ``shape`` over the bytes ``raw``, which must be exactly its
    size (``UnpicklingError`` otherwise)."""
    if isinstance(raw, str):
        raw = raw.encode("latin1")  # NumPy's Python 2 state
    if isinstance(raw, pickle.PickleBuffer):
        raw = raw.raw()
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise pickle.UnpicklingError(f"array data of {type(raw).__name__}; allowed: bytes")
    if not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape):
        raise pickle.UnpicklingError(f"array shape {shape!r}; allowed: a tuple of sizes")
    if math.prod(shape) * dtype.itemsize != len(raw):
        raise pickle.UnpicklingError(f"array shape {shape} does not match its {len(raw)} bytes")
    return np.frombuffer(raw, dtype=dtype).reshape(shape, order=order)


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> _ArrayState:
    """NumPy's ``_reconstruct`` for the empty array NumPy pickles (shape ``(0,)``) only."""
    if subtype is not _NdarrayMarker or tuple(shape) != (0,):
        raise pickle.UnpicklingError(f"_reconstruct({shape!r}) is no pickled NumPy array")
    return _ArrayState()


def _encode(text: Any, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` for the ``latin1`` strings protocol 2 writes bytes as."""
    if not isinstance(text, str) or encoding.replace("-", "").lower() != "latin1":
        raise pickle.UnpicklingError(f"_codecs.encode with {encoding!r}; allowed: latin1")
    return text.encode("latin1")


def _frombuffer(buffer: Any, dtype: Any, shape: Any, order: str) -> np.ndarray:
    """NumPy's protocol-5 ``_frombuffer``: an array over bytes the file holds."""
    return _array_over(buffer, _resolved_dtype(dtype), shape, "F" if order == "F" else "C")


def _scalar(dtype: Any, raw: Any = None) -> Any:
    """NumPy's ``scalar(dtype, bytes)`` for a plain dtype: one value over exactly its bytes."""
    return _array_over(raw, _resolved_dtype(dtype), (), "C")[()]


def _resolved(value: Any) -> Any:
    """``value`` with the stand-ins of the top two levels (a dict's values, a list's items)
    replaced by the arrays and dtypes they stand for; an array whose state never came is
    refused."""
    if isinstance(value, dict):
        return {key: _resolved(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_resolved_leaf(item) for item in value)
    return _resolved_leaf(value)


def _resolved_leaf(value: Any) -> Any:
    if isinstance(value, _ArrayState):
        if value.array is None:
            raise pickle.UnpicklingError("an array without its data")
        return value.array
    if isinstance(value, _DtypeState):
        return value.dtype
    return value


_REPLACEMENTS = {
    "_reconstruct": _reconstruct,
    "_frombuffer": _frombuffer,
    "ndarray": _NdarrayMarker,
    "dtype": _DtypeState,
    "scalar": _scalar,
    "encode": _encode,
}
"""Every allowed global, replaced by the bounded versions above: no NumPy function that trusts
its pickled state is ever called."""


class BatchUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`ALLOWED_GLOBALS` (``latin1`` for Python 2
    strings, as torchvision reads the batches)."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, encoding="latin1")

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(
                f"it names {module}.{name}, which a CIFAR batch never holds "
                "(allowed: arrays, lists, strings and numbers)"
            )
        return _REPLACEMENTS[name]


def read_batches(folder: Path, files: list[list[str]], fix: str) -> tuple[np.ndarray, list[int]]:
    """torchvision's CIFAR parsing (``CIFAR10.__init__``) of ``files`` (``[name, md5]`` pairs)
    in ``folder`` through :class:`BatchUnpickler`: ``data`` (n, 3072) stacked, reshaped to
    (N, 3, 32, 32) and transposed to torchvision's ``.data`` layout (N, 32, 32, 3), and the
    ``labels`` (or ``fine_labels``); ``ValueError`` naming a file that fails, with ``fix``."""
    data, targets = [], []
    for file_name, md5 in files:
        path = folder / file_name
        try:
            pixels, labels = _read_batch(path)
        except (OSError, pickle.UnpicklingError, KeyError, EOFError, ValueError, TypeError,
                MemoryError, AttributeError, IndexError) as err:  # fmt: skip
            raise ValueError(
                f"cannot read CIFAR batch {path}: {_one_line(err)}; its md5 is {_md5(path)}, "
                f"torchvision's for the official file {md5}: {fix}"
            ) from None
        data.append(pixels)
        targets.extend(labels)
    return np.vstack(data).reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1)), targets


def _read_batch(path: Path) -> tuple[np.ndarray, list[int]]:
    """One batch's ``(data (n, 3072) uint8, labels)``, checked to be what the format holds."""
    with open(path, "rb") as f:
        entry = _resolved(BatchUnpickler(f).load())
        size = f.tell()
    label_key = "labels" if isinstance(entry, dict) and "labels" in entry else "fine_labels"
    if not isinstance(entry, dict) or not {"data", label_key} <= set(entry):
        raise ValueError("it holds no dict with 'data' and 'labels' (or 'fine_labels')")
    data = entry["data"]
    if not isinstance(data, np.ndarray) or not np.issubdtype(data.dtype, np.number):
        raise ValueError("its 'data' is no numeric array")
    if data.nbytes > size:
        raise ValueError(f"its 'data' claims {data.nbytes} bytes, more than the file's {size}")
    pixels = np.asarray(data, dtype=np.uint8).reshape(-1, 3072)
    labels = entry[label_key]
    if not isinstance(labels, list | np.ndarray) or len(labels) != len(pixels):
        raise ValueError(f"its labels are not a list of one int per row ({len(pixels)} rows)")
    if not all(isinstance(y, int | np.integer) for y in labels):
        raise ValueError("its labels are not all ints")
    return pixels, [int(y) for y in labels]


def _md5(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "md5").hexdigest()
    except OSError:
        return "unreadable"


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__
