"""Lookup requests and argument conversion at the Python surface.

:class:`TableLookup` is native (``nearrec._native.TableLookup``): its constructor converts its
arrays once into what the engine reads (contiguous int32 / int64 indices, offsets or lengths;
float32 weights; real bools; an integer ``padding_idx``) without any unsafe cast, and refuses
what it cannot convert with an :class:`~nearrec.errors.InvalidRequest` naming the table. The
engine then validates the values once (bags against indices, rows against tables). The array
converters here are the same native rules (``crates/nearrec-py/src/convert.rs``: every message
comes from there); the other helpers check the plain arguments of Python calls (counts, flags,
paths).
"""

from __future__ import annotations

import operator
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt

from ._native import TableLookup as NativeTableLookup
from ._native import as_array as as_array
from ._native import index_vector as index_vector
from ._native import jagged as native_jagged
from ._native import padding_idx as padding
from ._native import pooling_mode
from ._native import weights_vector as weights_vector
from .errors import InvalidRequest, StoreIOError, StoreNotFound

PoolingModeName = Literal["sum", "mean", "max"]
#: A pooled answer's dtype (``out_dtype``): pooled in float32 where the rows are, then each value
#: rounded once — to nearest even for fp16 / bf16; for int8, each bag's vector of each table
#: quantised row-wise as FBGEMM's ``FloatToFused8BitRowwiseQuantized`` does and dequantised as its
#: ``Fused8BitRowwiseQuantizedToFloat`` does (the answer is then float32).
OutDtypeName = Literal["fp32", "fp16", "bf16", "int8"]
_OUT_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


class TableLookup(NativeTableLookup):
    """The bags of one table in a batched lookup (``torch.nn.EmbeddingBag``'s arguments): give
    ``offsets`` (with ``include_last_offset``), or ``lengths``, or a 2-D ``indices``
    ``[batch, bag_size]`` with neither. A native object: its arrays are converted once, here
    (contiguous int32 / int64 ids, float32 weights, never an unsafe cast), and read by the
    engine without a copy; what cannot be converted is an
    :class:`~nearrec.errors.InvalidRequest` naming the table."""

    __slots__ = ()

    def __new__(cls, table: str, indices: Any, offsets: Any = None, lengths: Any = None,
                per_sample_weights: Any = None, mode: PoolingModeName = "sum",
                include_last_offset: bool = False,
                padding_idx: int | None = None) -> TableLookup:
        return super().__new__(cls, table, indices, offsets, lengths, per_sample_weights, mode,
                               include_last_offset, padding_idx)


def key_vector(keys: Any, table: str) -> npt.NDArray[np.int64]:
    """A keyed table's ids as int64: any 1-D integer array (uint64 ids keep their bits)."""
    a = as_array(keys, "keys", table)
    if a.ndim != 1 or not (a.dtype.kind in "iu" or a.size == 0):
        raise InvalidRequest(f"table {table!r}: keys must be a 1-D integer array, got "
                             f"{a.dtype} of shape {a.shape}", table=table)
    if a.dtype == np.uint64:
        a = a.view(np.int64)  # unsigned 64-bit ids keep their bits
    return np.ascontiguousarray(a, dtype=np.int64)


def is_bool(x: Any) -> bool:
    """Whether ``x`` is a real boolean (not a string such as ``"no"``, not a number)."""
    return isinstance(x, bool | np.bool_)


# The array converters are native (``as_array``, ``index_vector``, ``weights_vector``,
# ``padding``: see ``nearrec._native``'s stubs); these wrap the others.


def mode_name(mode: Any, table: str | None, what: str = "mode") -> PoolingModeName:
    """``mode`` checked, natively: ``"sum"``, ``"mean"`` or ``"max"`` (``what``: the
    argument's name in the error)."""
    return cast(PoolingModeName, pooling_mode(mode, table, what))


def out_dtype(value: Any) -> str | None:
    """``out_dtype`` as the binding names it: a name (``"fp32"``, ``"fp16"``, ``"bf16"``,
    ``"int8"``, or ``float32``, ``float16``, ``bfloat16``), a numpy dtype (``ml_dtypes``'
    bfloat16 among them) or a torch dtype; ``None`` is fp32. The binding refuses other names."""
    if value is None or isinstance(value, str):
        return None if value is None else _OUT_NAMES.get(value, value)
    name = str(value)
    if name.startswith("torch."):
        return _OUT_NAMES.get(name[6:], name[6:])
    try:
        name = str(np.dtype(value).name)
    except TypeError:
        raise InvalidRequest(f"out_dtype is a dtype or its name ('fp32', 'fp16', 'bf16', "
                             f"'int8'), not {type(value).__name__} {value!r:.60}") from None
    return _OUT_NAMES.get(name, name)


def narrowed(values: npt.NDArray[np.float32], out: str | None) -> npt.NDArray[Any]:
    """A float32 answer whose values ``out`` rounded already, in ``out``'s numpy dtype (exact):
    float16 for fp16, ``ml_dtypes.bfloat16`` for bf16; float32 otherwise."""
    if out == "fp16":
        return values.astype(np.float16)
    if out == "bf16":
        import ml_dtypes

        return values.astype(ml_dtypes.bfloat16)
    return values


def count(x: Any, what: str, minimum: int = 1, maximum: int | None = None) -> int:
    """``x`` as an ``int`` in ``[minimum, maximum]`` (a bool, a float or a string is refused)."""
    if not is_bool(x):
        try:
            v = operator.index(x)
        except TypeError:
            pass
        else:
            if v >= minimum and (maximum is None or v <= maximum):
                return v
    bound = f"at least {minimum}" if maximum is None else f"from {minimum} to {maximum}"
    raise InvalidRequest(f"{what} must be an integer {bound}, not {x!r}")


def text(x: Any, what: str) -> str:
    """A str argument (a name, a dtype), refused as such when it is anything else."""
    if not isinstance(x, str):
        raise InvalidRequest(f"{what} is a str, not {type(x).__name__} {x!r}")
    return x


def probability(x: Any, what: str) -> float:
    """``x`` as a ``float`` in ``[0, 1]`` (a bool, a string or NaN is refused)."""
    if is_bool(x) or not isinstance(x, int | float | np.floating | np.integer) \
            or not 0.0 <= float(x) <= 1.0:
        raise InvalidRequest(f"{what} must be a number from 0 to 1, not {x!r}")
    return float(x)


def flag(x: Any, what: str) -> bool:
    """``x`` as a ``bool``: only ``True`` / ``False`` (``"no"`` is not false, nor true)."""
    if not is_bool(x):
        raise InvalidRequest(f"{what} must be True or False, not {x!r}")
    return bool(x)


def progress_enabled(progress: bool | None) -> bool:
    """Progress bars: as asked, or by default when stderr is a terminal."""
    return os.isatty(2) if progress is None else flag(progress, "progress")


def path_arg(x: Any, what: str = "path") -> str:
    """A filesystem path argument as a ``str`` (``None`` or a number is refused)."""
    try:
        p = os.fspath(x)
    except TypeError:
        raise InvalidRequest(f"{what} must be a path (str or os.PathLike), not "
                             f"{type(x).__name__} {x!r:.60}") from None
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not p or "\0" in p:
        raise InvalidRequest(f"{what} must be a non-empty path without NUL bytes, not {p!r}")
    return str(p)


def regular_file(x: Any, what: str = "path") -> str:
    """A path argument naming a regular file: a missing one is
    :class:`~nearrec.errors.StoreNotFound`, and a FIFO, device or directory is a
    :class:`~nearrec.errors.StoreIOError` before it is opened (opening a FIFO would wait for a
    writer forever)."""
    p = path_arg(x, what)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise StoreNotFound(f"{what}: no file {p!r}") from None
    except OSError as e:
        raise StoreIOError(f"{what}: cannot read {p!r}: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode)
                else "a device or socket")
        raise StoreIOError(f"{what}: cannot read {p!r}: it is {kind}, not a regular file")
    return p


@dataclass(frozen=True, slots=True)
class Jagged:
    """A KeyedJaggedTensor read once: its keys, ``batch`` bags per key, its values and
    ``lengths`` as numpy (zero-copy for CPU tensors), the bags' ``bounds`` in the values
    (``keys × batch + 1`` positions) and its weights, if any."""

    keys: list[str]
    batch: int
    values: npt.NDArray[Any]
    lengths: npt.NDArray[Any]
    bounds: npt.NDArray[np.int64]
    weights: npt.NDArray[Any] | None


def jagged(features: Any) -> Jagged:
    """``features`` (a KeyedJaggedTensor: nearrec's or TorchRec's) as :class:`Jagged`, read
    and checked natively (``nearrec::jagged::bounds``): a KJT whose lengths do not fit its keys
    or its values is an :class:`InvalidRequest`."""
    return Jagged(*native_jagged(features))


# ---- a store call's arguments as the native calls take them -----------------------------------


def lookups(requests: Any) -> list[TableLookup]:
    """A batch as a list of :class:`TableLookup`: a sequence of them, or a mapping from table
    name to ``indices``, ``(indices, offsets)`` or a :class:`TableLookup`. A table may appear
    more than once (features sharing a table); its columns are then found by position
    (:meth:`PooledBatch.block`), not by name."""
    if isinstance(requests, Mapping):
        out: list[TableLookup] = []
        for name, r in requests.items():
            if isinstance(r, TableLookup):
                out.append(r)
            elif isinstance(r, tuple) and len(r) == 2:
                out.append(TableLookup(name, r[0], r[1]))
            else:
                out.append(TableLookup(name, r))
        return out
    if isinstance(requests, Sequence) and not isinstance(requests, str | bytes):
        return list(requests)
    raise InvalidRequest("a batch is a sequence of TableLookup or a mapping from table name "
                         f"to its bags, not {type(requests).__name__}")


def jagged_lookups(features: Any) -> list[TableLookup]:
    """A KeyedJaggedTensor's bags as one :class:`TableLookup` per key (the key naming the
    table), each a slice of its values and lengths."""
    j = jagged(features)
    out = []
    for k, key in enumerate(j.keys):
        lo, hi = int(j.bounds[k * j.batch]), int(j.bounds[(k + 1) * j.batch])
        out.append(TableLookup(key, j.values[lo:hi],
                               lengths=j.lengths[k * j.batch:(k + 1) * j.batch],
                               per_sample_weights=None if j.weights is None
                               else j.weights[lo:hi]))
    return out


__all__ = ["Jagged", "TableLookup", "as_array", "count", "flag", "index_vector", "is_bool",
           "jagged", "jagged_lookups", "lookups", "mode_name", "padding", "path_arg",
           "probability", "progress_enabled", "regular_file", "weights_vector"]
