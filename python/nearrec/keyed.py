"""Keyed tables: embedding rows addressed by unbounded 64-bit feature ids (DeepRec's
EmbeddingVariable), held in DRAM: the keys in the index a store's keyed table keeps (five keys a
cache line), the rows beside it.

A keyed table holds at most ``capacity`` keys, each with one fp32 row of ``dim`` values; its
memory (:meth:`KeyedTable.bytes_for`) is fixed when it is made. A key the table does not hold
is handled by ``unknown``:

- ``"error"``: the lookup fails with :class:`~nearrec.errors.UnknownKey`, naming the table and
  the key's position; nothing is pooled or inserted;
- ``"zero"``: the key pools as a row of zeros (counted in ``stats()["unknown_zero"]``);
- ``"init"``: the key is inserted with a row drawn uniformly from ``±init_scale``, seeded by
  ``(seed, key)`` alone, so every thread, batch and run gives a key the same row (counted in
  ``stats()["initialised"]``). A full table raises :class:`~nearrec.errors.TableFull`.

Lookups from many threads run at once (the GIL is released); inserts from several threads are
safe, and racing inserts of one key agree on one row. ``nearrec.torch.EmbeddingBagCollection``
takes keyed tables beside (or instead of) a store's tables, on the CPU or behind the GPU tier.
"""

from __future__ import annotations

import math
import os
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ._native import NativeKeyedTable
from ._native import key_index_bytes as _key_index_bytes
from ._native import read_keys as _read_keys
from .errors import InvalidRequest, StoreCorrupted, StoreIOError, StoreNotFound
from .request import (
    PoolingModeName,
    TableLookup,
    as_array,
    count,
    flag,
    index_vector,
    is_bool,
    key_vector,
    path_arg,
    regular_file,
)

UNKNOWN_POLICIES = ("error", "zero", "init")
I64 = npt.NDArray[np.int64]
F32 = npt.NDArray[np.float32]


def _bags(table: str, ids: I64, offsets: Any, lengths: Any, include_last_offset: bool,
          mode: PoolingModeName, per_sample_weights: Any) -> TableLookup:
    """A table's bags as a store's lookup takes them (converted and checked natively, as
    :class:`~nearrec.TableLookup` converts them); with neither offsets nor lengths, one id a
    bag."""
    if offsets is None and lengths is None:
        lengths = np.ones(len(ids), np.int64)
    return TableLookup(table, ids, offsets, lengths, per_sample_weights, mode,
                       include_last_offset)


def _rows(x: Any, what: str, table: str) -> F32:
    """Rows given as numbers (``values`` of :meth:`KeyedTable.assign`) as float32 ``[n, dim]``."""
    a = as_array(x, what, table)
    if a.dtype.kind not in "fiu" or a.ndim != 2:
        raise InvalidRequest(f"table {table!r}: {what} must be a 2-D [n, dim] array of numbers, "
                             f"got {a.dtype} of shape {a.shape}", table=table)
    return np.ascontiguousarray(a, dtype=np.float32)


class KeyedTable:
    """See the module docs."""

    def __init__(self, name: str, dim: int, capacity: int, unknown: str = "error",
                 init_scale: float = 0.01, seed: int = 0):
        if not isinstance(name, str):
            raise InvalidRequest(f"a keyed table's name is a str, not {name!r}")
        if not isinstance(unknown, str) or unknown not in UNKNOWN_POLICIES:
            raise InvalidRequest(f"unknown={unknown!r}: expected one of {UNKNOWN_POLICIES}",
                                 table=name)
        if is_bool(init_scale) or not isinstance(init_scale, int | float) \
                or not math.isfinite(init_scale) or init_scale < 0:
            raise InvalidRequest(f"table {name!r}: init_scale must be a finite number ≥ 0, not "
                                 f"{init_scale!r}", table=name)
        self._native = NativeKeyedTable(
            name, count(dim, "dim", 1, 2**20), count(capacity, "capacity", 1, 2**40), unknown,
            float(init_scale), count(seed, "seed", 0, 2**64 - 1))
        self.unknown = unknown
        self.init_scale = init_scale
        self.seed = seed

    @classmethod
    def from_arrays(cls, name: str, keys: Any, values: Any, capacity: int | None = None,
                    **config: Any) -> KeyedTable:
        """A table holding ``keys`` with rows ``values`` (``[n, dim]``), room for ``capacity``
        keys (default: twice as many)."""
        k = key_vector(keys, name)
        v = _rows(values, "values", name)
        t = cls(name, v.shape[1], max(1, 2 * len(k)) if capacity is None else capacity, **config)
        t.write(k, v, allow_nonfinite=True)
        return t

    @classmethod
    def load(cls, path: str | Path, **config: Any) -> KeyedTable:
        """Reads a table :meth:`save` wrote (``config`` overrides its saved policies)."""
        where = regular_file(path, "the keyed table file")
        try:
            f = np.load(where, allow_pickle=False)
            if not isinstance(f, np.lib.npyio.NpzFile):
                raise StoreCorrupted(f"{where}: not a saved keyed table (one .npy array, not an "
                                     ".npz archive)")
            with f:
                saved = {k: f[k].item() for k in ("name", "capacity", "unknown", "init_scale",
                                                  "seed")}
                keys, values = f["keys"], f["values"]
        except FileNotFoundError:
            raise StoreNotFound(f"no keyed table file {where!r}") from None
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
            raise StoreCorrupted(f"{where}: not a readable saved keyed table: "
                                 f"{type(e).__name__}: {e}") from None
        saved.update(config)
        name = str(saved.pop("name"))
        return cls.from_arrays(name, keys, values, **saved)

    def save(self, path: str | Path) -> Path:
        """Writes keys, rows and settings to one ``.npz`` file, atomically (a temporary file
        renamed into place)."""
        path = Path(path_arg(path, "the keyed table file"))
        keys, values = self.export()
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                np.savez(f, keys=keys, values=values, name=self.name, capacity=self.capacity,
                         unknown=self.unknown, init_scale=self.init_scale, seed=self.seed)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            raise StoreIOError(f"table {self.name!r}: cannot save to {path}: {e}",
                               table=self.name) from None
        finally:
            tmp.unlink(missing_ok=True)
        return path

    @staticmethod
    def bytes_for(capacity: int, dim: int) -> int:
        """DRAM a table of this shape takes: its index and rows for the whole capacity."""
        return int(NativeKeyedTable.bytes_for(count(capacity, "capacity", 1, 2**40),
                                              count(dim, "dim", 1, 2**20)))

    @property
    def name(self) -> str:
        return str(self._native.name)

    @property
    def dim(self) -> int:
        return int(self._native.dim)

    @property
    def capacity(self) -> int:
        return int(self._native.capacity)

    @property
    def version(self) -> int:
        """How many calls have changed rows (``write``, ``remove``): caches above the table
        (the GPU tier) start again when it moves."""
        return int(self._native.version)

    def __len__(self) -> int:
        return len(self._native)

    def __repr__(self) -> str:
        return (f"KeyedTable({self.name!r}, dim={self.dim}, keys={len(self)}/{self.capacity}, "
                f"unknown={self.unknown!r})")

    def write(self, keys: Any, values: Any, *, allow_nonfinite: bool = False) -> int:
        """EMB_WRITE: sets the rows of ``keys`` (``[n, dim]`` values), inserting keys not held;
        returns how many were new. A reader on another thread sees each row wholly before or
        wholly after (each row is replaced atomically); the call is checked whole first — the
        width, finite values unless ``allow_nonfinite``, room for the new keys — and changes
        nothing when it fails. A repeated key takes its last row."""
        return int(self._native.write(key_vector(keys, self.name),
                                      _rows(values, "values", self.name),
                                      flag(allow_nonfinite, "allow_nonfinite")))

    def assign(self, keys: Any, values: Any) -> int:
        """:meth:`write` (the name it had first)."""
        return self.write(keys, values)

    def remove(self, keys: Any) -> int:
        """EMB_REMOVE: ``keys`` become unknown (HS-Rec's deleted state) — lookups handle them
        by the unknown-key policy — until written again, when they take their old slot and row
        back. Keys not held are passed over; returns how many were removed."""
        return int(self._native.remove(key_vector(keys, self.name)))

    def lookup(self, keys: Any, offsets: Any = None, lengths: Any = None,
               include_last_offset: bool = False, mode: PoolingModeName = "sum",
               per_sample_weights: Any = None) -> F32:
        """Pools bags of keys like ``torch.nn.EmbeddingBag``: ``offsets`` (or ``lengths``; with
        neither, one key per bag); returns ``[bags, dim]`` float32."""
        k = key_vector(keys, self.name)
        return np.asarray(self._native.pool(_bags(self.name, k, offsets, lengths,
                                                  include_last_offset, mode, per_sample_weights)))

    def read(self, keys: Any) -> F32:
        """The rows of ``keys`` (``[n, dim]``), unknown keys handled by the policy."""
        return np.asarray(self._native.read(key_vector(keys, self.name)))

    def contains(self, keys: Any) -> npt.NDArray[np.bool_]:
        """Whether each key is held (no policy applied, nothing counted)."""
        return np.asarray(self._native.contains(key_vector(keys, self.name)))

    def resolve(self, keys: Any) -> I64:
        """Each key's row index as the policy has it (-1: a zero row). Indices are stable:
        keys are never removed."""
        return np.asarray(self._native.resolve(key_vector(keys, self.name)))

    def read_rows(self, rows: Any) -> F32:
        """Rows by index (as :meth:`resolve` gives them; -1: zeros), ``[n, dim]``."""
        r = index_vector(rows, self.name, "rows")
        return np.asarray(self._native.pool_rows(_bags(self.name, r, None, None, False, "sum",
                                                       None)))

    def pool_rows(self, rows: Any, offsets: Any, mode: PoolingModeName = "sum",
                  per_sample_weights: Any = None, include_last_offset: bool = False) -> F32:
        """As :meth:`lookup`, for row indices from :meth:`resolve`."""
        r = index_vector(rows, self.name, "rows")
        return np.asarray(self._native.pool_rows(_bags(self.name, r, offsets, None,
                                                       include_last_offset, mode,
                                                       per_sample_weights)))

    def export(self) -> tuple[I64, F32]:
        """Every key held and its row: ``(keys [n], values [n, dim])``, in no particular order."""
        keys, values = self._native.export()
        return np.asarray(keys), np.asarray(values)

    def stats(self) -> dict[str, int]:
        """Keys held, capacity, hits, and the unknown keys refused / pooled as zeros /
        initialised."""
        return {k: int(v) for k, v in self._native.stats().items()}


__all__ = ["UNKNOWN_POLICIES", "KeyedTable"]


def index_bytes(keys: int) -> int:
    """DRAM the index of a keyed table kept in a store takes for ``keys`` keys (15.1 bytes a
    key at its load): what a store's DRAM budget must hold beside its tiers."""
    return int(_key_index_bytes(count(keys, "keys", 0, 2**40)))


def keys_of(path: str | os.PathLike[str], table: str) -> I64:
    """The keys keyed table ``table`` of the store at ``path`` holds, read from its keys file
    (checked), as int64 bits (uint64 ids: ``.view(np.uint64)``)."""
    return np.asarray(_read_keys(path_arg(path), table))
