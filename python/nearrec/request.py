"""Lookup requests and argument conversion at the Python surface.

:class:`TableLookup` is native (``nearrec._native.TableLookup``): its constructor converts its
arrays once into what the engine reads (contiguous int32 / int64 indices, offsets or lengths;
float32 weights; real bools; an integer ``padding_idx``) without any unsafe cast, and refuses
what it cannot convert with an :class:`~nearrec.errors.InvalidRequest` naming the table. The
engine then validates the values once (bags against indices, rows against tables). The helpers
here convert the other arguments of Python calls the same way (counts, flags, paths, sizes).
"""

from __future__ import annotations

import operator
import os
import stat
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple, cast

import numpy as np
import numpy.typing as npt

from ._native import TableLookup as NativeTableLookup
from .errors import IndexOutOfRange, InvalidRequest, StoreIOError, StoreNotFound

PoolingModeName = Literal["sum", "mean", "max"]
MODES = ("sum", "mean", "max")
_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
_I64_MAX = np.iinfo(np.int64).max


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


def is_bool(x: Any) -> bool:
    """Whether ``x`` is a real boolean (not a string such as ``"no"``, not a number)."""
    return isinstance(x, bool | np.bool_)


def as_array(x: Any, what: str, table: str | None = None) -> npt.NDArray[Any]:
    """``x`` (an array, a CPU or GPU tensor, a list) as a numpy array, zero-copy where it can
    be; anything numpy cannot make an array of is an ``InvalidRequest`` naming ``what``."""
    where = f"table {table!r}: " if table is not None else ""
    try:
        if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor: zero-copy on CPU
            x = x.detach()
            if x.device.type != "cpu":
                x = x.cpu()
            return np.asarray(x.numpy())
        return np.asarray(x)
    except (TypeError, ValueError, OverflowError, RuntimeError) as e:
        raise InvalidRequest(f"{where}{what} is not an array: {e}", table=table) from None


def index_array(x: Any, table: str | None, what: str) -> npt.NDArray[Any]:
    """``x`` as an int32 / int64 array. Arrays of other dtypes (floats, bools, unsigned or
    narrower integers) are refused rather than cast; Python lists of integers become int64,
    and an empty list is an empty int64 array. An unsigned value past int64 (a list holding
    2**63 or more) is an ``IndexOutOfRange`` at its position."""
    where = f"table {table!r}: " if table is not None else ""
    a = as_array(x, what, table)
    if a.dtype in _INDEX_DTYPES:
        return a
    if a.size == 0 and a.dtype == np.float64:  # an empty Python list
        return np.zeros(a.shape, dtype=np.int64)
    if isinstance(x, list | tuple | range) and a.dtype.kind in "iu":
        if a.dtype == np.uint64 and a.size and int(a.max()) > _I64_MAX:
            pos = int(np.argmax(a > _I64_MAX))
            raise IndexOutOfRange(f"{where}{what}[{pos}] = {int(a.flat[pos])} does not fit "
                                  "int64", table=table, position=pos)
        return a.astype(np.int64)
    kind = "Python objects (mixed, or integers past 64 bits)" if a.dtype == object else a.dtype
    raise InvalidRequest(f"{where}{what} must be int32 or int64, got {kind}", table=table)


def int64_vector(x: Any, table: str, what: str) -> npt.NDArray[np.int64]:
    """``x`` as a contiguous 1-D int64 array, with the same checks as a lookup's indices
    (floats, bools and unsigned arrays refused, not cast)."""
    a = index_array(x, table, what)
    if a.ndim != 1:
        raise InvalidRequest(f"table {table!r}: {what} must be 1-D, got shape {a.shape}",
                             table=table)
    return np.ascontiguousarray(a, dtype=np.int64)


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


def padding(p: Any, table: str | None) -> int | None:
    """``padding_idx`` as an ``int``: ``None``, or an integer (not a bool: ``True`` is not
    row 1) that fits int64."""
    if p is None:
        return None
    where = f"table {table!r}: " if table is not None else ""
    if is_bool(p):
        raise InvalidRequest(f"{where}padding_idx must be an integer row or None, not the bool "
                             f"{p!r}", table=table)
    try:
        v = operator.index(p)
    except TypeError:
        raise InvalidRequest(f"{where}padding_idx must be an integer row or None, not "
                             f"{type(p).__name__} {p!r}", table=table) from None
    if not -_I64_MAX - 1 <= v <= _I64_MAX:
        raise InvalidRequest(f"{where}padding_idx {v} is out of range", table=table)
    return v


def mode_name(mode: Any, table: str | None) -> PoolingModeName:
    """``mode`` checked: ``"sum"``, ``"mean"`` or ``"max"``."""
    if not isinstance(mode, str) or mode not in MODES:
        where = f"table {table!r}: " if table is not None else ""
        raise InvalidRequest(f"{where}mode must be 'sum', 'mean' or 'max', not {mode!r}",
                             table=table)
    return cast(PoolingModeName, mode)


def weights_array(w: Any, table: str) -> npt.NDArray[np.float32] | None:
    """``per_sample_weights`` as a contiguous float32 array (``None`` stays ``None``). Other
    dtypes are refused rather than cast: a float64 weight past float32's range would become
    inf."""
    if w is None:
        return None
    a = as_array(w, "per_sample_weights", table)
    if a.dtype != np.float32:
        raise InvalidRequest(
            f"table {table!r}: per_sample_weights must be float32, got {a.dtype}", table=table
        )
    return np.ascontiguousarray(a)


class Jagged(NamedTuple):
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
    """``features`` (a KeyedJaggedTensor: nearrec's or TorchRec's) as :class:`Jagged`; a KJT
    whose lengths do not fit its keys or its values is an :class:`InvalidRequest`."""
    keys = list(features.keys())
    values = as_array(features.values(), "values")
    lengths = np.ascontiguousarray(index_array(features.lengths(), None, "lengths"))
    weights = features.weights_or_none() if hasattr(features, "weights_or_none") else None
    weights = None if weights is None else as_array(weights, "weights")
    if not keys:
        raise InvalidRequest("the KeyedJaggedTensor has no keys")
    if lengths.size % len(keys):
        raise InvalidRequest(f"lengths has {lengths.size} entries, not a multiple of "
                             f"{len(keys)} keys")
    bounds = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    if bounds[-1] != len(values):
        raise InvalidRequest(f"lengths add up to {bounds[-1]} but there are {len(values)} "
                             "values")
    return Jagged(keys, lengths.size // len(keys), values, lengths, bounds, weights)



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
    if not all(hasattr(features, a) for a in ("keys", "values", "lengths")):
        raise InvalidRequest(f"features are a KeyedJaggedTensor or a list of TableLookup, not "
                             f"{type(features).__name__}")
    j = jagged(features)
    out = []
    for k, key in enumerate(j.keys):
        lo, hi = int(j.bounds[k * j.batch]), int(j.bounds[(k + 1) * j.batch])
        out.append(TableLookup(key, j.values[lo:hi],
                               lengths=j.lengths[k * j.batch:(k + 1) * j.batch],
                               per_sample_weights=None if j.weights is None
                               else j.weights[lo:hi]))
    return out


_F32_MAX = float(np.finfo(np.float32).max)


def write_calls(writes: Any, allow_nonfinite: bool
                ) -> list[tuple[str, npt.NDArray[np.int64], npt.NDArray[np.float32] | None]]:
    """A ``write_many`` call's ``{table: (ids, rows)}`` as the native call takes it."""
    if not isinstance(writes, Mapping):
        raise InvalidRequest(f"writes is a mapping from table to (ids, rows), not "
                             f"{type(writes).__name__}")
    calls: list[tuple[str, npt.NDArray[np.int64], npt.NDArray[np.float32] | None]] = []
    for table, pair in writes.items():
        if not (isinstance(pair, tuple | list) and len(pair) == 2):
            raise InvalidRequest(f"table {table!r}: a write is an (ids, rows) pair",
                                 table=table if isinstance(table, str) else None)
        ids, rows = pair
        calls.append((table, row_write_ids(table, ids), _rows(table, rows, allow_nonfinite)))
    return calls


def row_ids(table: str, rows: Any) -> npt.NDArray[np.int64]:
    """``read_rows``' row ids: 1-D int32 / int64 (or a list of ints), as contiguous int64."""
    ids = index_array(rows, table, "rows")
    if ids.ndim != 1:
        raise InvalidRequest(f"table {table!r}: rows must be 1-D, got shape {ids.shape}",
                             table=table)
    return np.ascontiguousarray(ids, dtype=np.int64)


def row_write_ids(table: Any, ids: Any) -> npt.NDArray[np.int64]:
    if not isinstance(table, str):
        raise InvalidRequest(f"a table name is a str, not {type(table).__name__} {table!r:.60}")
    return int64_vector(ids, table, "ids")


def _rows(table: str, rows: Any, allow_nonfinite: bool) -> npt.NDArray[np.float32]:
    """``rows`` as a contiguous float32 ``[n, dim]`` array: float32 as it is, float64 and
    float16 converted (a float64 value past float32's range is refused at its row, not made
    infinite); integers, bools and other dtypes are refused."""
    a = as_array(rows, "rows", table)
    if a.ndim != 2:
        raise InvalidRequest(f"table {table!r}: rows must be 2-D [len(ids), dim], got shape "
                             f"{a.shape}", table=table)
    if a.dtype.kind != "f":
        raise InvalidRequest(f"table {table!r}: rows must be floats, got {a.dtype}", table=table)
    if a.dtype == np.float64 and not allow_nonfinite and a.size:
        finite = np.isfinite(a)
        big = finite & (np.abs(np.where(finite, a, 0.0)) > _F32_MAX)
        if big.any():
            row, col = (int(i) for i in np.argwhere(big)[0])
            raise InvalidRequest(f"table {table!r}: rows[{row}][{col}] = {a[row, col]} does not "
                                 "fit float32", table=table, position=row)
    return np.ascontiguousarray(a, dtype=np.float32)


__all__ = ["Jagged", "TableLookup", "as_array", "count", "flag", "index_array", "is_bool",
           "jagged", "jagged_lookups", "lookups", "mode_name", "padding", "path_arg",
           "probability", "progress_enabled", "regular_file", "row_ids", "weights_array",
           "write_calls"]
