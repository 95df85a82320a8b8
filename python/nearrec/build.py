"""Creating stores: from numpy arrays or ``.npy`` files, from PyTorch state dicts, and from the
benchmark model specs with seeded random rows. Every builder streams in bounded memory (16 MiB
chunks) and publishes the store atomically: an interrupted build leaves the old store or none."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ._native import NativeStoreWriter, read_manifest, table_layout
from .errors import InvalidRequest
from .manifest import StoreInfo, StorePath
from .request import (
    as_array,
    count,
    flag,
    key_vector,
    path_arg,
    progress_enabled,
    regular_file,
)
from .specs import Variant, model_spec, scaled_rows
from .store import Store, Synced
from .units import parse_size

#: rows are fed to the writer in chunks of about this many bytes
CHUNK_BYTES = 16 << 20

#: the row dtypes a table may be stored as (``docs/format.md`` §4)
DTYPES = ("fp32", "fp16", "bf16", "int8", "int4", "int2", "fp8")


def _check_dtype(dtype: str) -> str:
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise InvalidRequest(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    return dtype


def _data_bytes(name: str, rows: int, dim: int, dtype: str, block_bytes: int) -> int:
    return table_layout(rows, dim, dtype, block_bytes, name)[1]


class _Writer:
    """A native store writer that is aborted (leaving nothing) unless committed."""

    def __init__(self, path: StorePath, overwrite: bool, params: Any, total_bytes: int,
                 progress: bool | None):
        self.path = path
        self.native = NativeStoreWriter(
            path_arg(path), flag(overwrite, "overwrite"), json.dumps(params), total_bytes,
            progress_enabled(progress)
        )

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.native.abort()

    def commit(self) -> StoreInfo:
        return StoreInfo._from_json(self.path, self.native.commit())


def _feed(w: NativeStoreWriter, name: str, rows: int, dim: int,
          chunk: Callable[[int, int], npt.NDArray[Any]]) -> None:
    """Feeds rows [i, j) of a table as float32 chunks of about CHUNK_BYTES."""
    step = max(1, CHUNK_BYTES // (4 * max(dim, 1)))
    for i in range(0, rows, step):
        block = np.ascontiguousarray(chunk(i, min(rows, i + step)), dtype=np.float32)
        w.write_f32(block)


def _source_array(name: str, a: Any) -> npt.NDArray[Any]:
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"a table name is a non-empty str, not {name!r}")
    if isinstance(a, str | os.PathLike):
        file = regular_file(a, f"table {name!r}")
        try:
            a = np.load(file, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise InvalidRequest(f"table {name!r}: {os.fspath(a)!r} is not a readable .npy "
                                 f"file: {e}", table=name) from None
        if not isinstance(a, np.ndarray):  # an .npz archive
            raise InvalidRequest(f"table {name!r}: expected one .npy array, got an archive",
                                 table=name)
    arr = as_array(a, "the rows", name) if not isinstance(a, np.ndarray) else a
    if arr.ndim != 2:
        raise InvalidRequest(f"table {name!r}: expected a 2-D [rows, dim] array, got shape "
                             f"{arr.shape}", table=name)
    if arr.dtype.kind != "f":
        raise InvalidRequest(f"table {name!r}: expected floating-point rows, got {arr.dtype}",
                             table=name)
    return arr


def from_numpy(path: StorePath, arrays: Mapping[str, Any], dtype: str | Mapping[str, str] = "fp32",
               *, keys: Mapping[str, Any] | None = None,
               capacity: Mapping[str, int] | None = None,
               default_rows: Mapping[str, Any] | None = None,
               overwrite: bool = False, block_bytes: int = 4096,
               progress: bool | None = None) -> StoreInfo:
    """Creates a store from ``{name: array}``; an array may be a ``.npy`` path, which is
    memory-mapped and streamed, so tables larger than RAM build in bounded memory.

    Rows are stored as ``dtype``, one for all tables or ``{name: dtype}`` (unlisted tables are
    fp32): ``fp32``, ``fp16``, ``bf16``; ``int8``, ``int4`` or ``int2`` row-wise quantised
    (FBGEMM's fused row-wise layouts: codes with a scale and bias per row; int4 needs an even
    dim, int2 a multiple of 4); ``fp8`` (e4m3, FBGEMM's HFP8). Quantised rows must be finite.
    Each lossy table's encoding error against the given rows is in its
    :attr:`TableInfo.quant_error` (``max_abs``, ``mean_abs``).

    ``keys`` makes tables keyed: ``{name: ids}``, one distinct integer id per row (int64, or
    uint64 whose bits are kept), and that table's lookups name those ids instead of row
    positions. A key the table does not hold answers as the store's ``unknown_keys`` says.
    ``capacity``: ``{name: keys}``, the most keys a keyed table may hold once a live store
    writes new ones (at least its keys; by default exactly them): the rows beyond its keys'
    are written as zeros, room that new keys take. ``default_rows``: ``{name: row}``, a keyed
    table's default row — what its unknown keys pool as under ``unknown_keys="default"``
    (zeros when not given; :func:`nearrec.torch.from_torchrec` gives a managed-collision
    table's default slot).
    """
    if not isinstance(arrays, Mapping):
        raise InvalidRequest(f"arrays is a mapping from table name to rows, not "
                             f"{type(arrays).__name__}")
    srcs = {name: _source_array(name, a) for name, a in arrays.items()}
    return _build(path, {n: (False, a) for n, a in srcs.items()}, _dtypes(dtype, srcs), "numpy",
                  keys=keys, capacity=capacity, default_rows=default_rows, overwrite=overwrite,
                  block_bytes=block_bytes, progress=progress)


def _dtypes(dtype: str | Mapping[str, str], tables: Iterable[str]) -> dict[str, str]:
    """Each table's dtype: ``dtype`` for all, or ``{name: dtype}`` with fp32 for the others."""
    if not isinstance(dtype, str | Mapping):
        raise InvalidRequest(f"dtype is one name or a mapping from table to name, not {dtype!r}")
    return {n: _check_dtype(dtype if isinstance(dtype, str) else dtype.get(n, "fp32"))
            for n in tables}


def _build(path: StorePath, tables: Mapping[str, tuple[bool, npt.NDArray[Any]]],
           dtypes: Mapping[str, str], source: str, *,
           keys: Mapping[str, Any] | None = None, capacity: Mapping[str, int] | None = None,
           default_rows: Mapping[str, Any] | None = None, overwrite: bool = False,
           block_bytes: int = 4096, progress: bool | None = None) -> StoreInfo:
    """Writes a store of ``tables``, ``{name: (encoded, rows)}``: float rows ``[rows, dim]``
    encoded here, or (``encoded``) uint8 rows ``[rows, row_bytes]`` in ``dtypes[name]``'s
    bytes, taken as they are; keyed tables as :func:`from_numpy` describes."""
    block_bytes = count(block_bytes, "block_bytes", 1, 2**30)
    dims = {n: _encoded_dim(n, dtypes[n], a.shape[1]) if enc else a.shape[1]
            for n, (enc, a) in tables.items()}
    key_cols = _key_columns(keys, {n: a.shape[0] for n, (_, a) in tables.items()})
    spare = _spare_rows(capacity, key_cols)
    defaults = _default_rows(default_rows, key_cols, dims)
    total = sum(_data_bytes(n, a.shape[0], dims[n], dtypes[n], block_bytes)
                for n, (_, a) in tables.items())
    params = {"source": source, "dtype": dict(dtypes)}
    with _Writer(path, overwrite, params, total, progress) as w:
        for name, (encoded, a) in tables.items():
            rows, dim = a.shape[0], dims[name]
            w.native.begin_table(name, rows, dim, dtypes[name], block_bytes,
                                 spare=spare.get(name), default_row=defaults.get(name))
            if encoded:
                step = max(1, CHUNK_BYTES // max(a.shape[1], 1))
                for i in range(0, rows, step):
                    w.native.write_encoded(np.ascontiguousarray(a[i:i + step]))
            else:
                _feed(w.native, name, rows, dim, lambda i, j, a=a: a[i:j])  # type: ignore[misc]
            w.native.finish_table(key_cols.get(name))
        return w.commit()


def _encoded_dim(name: str, dtype: str, row_bytes: int) -> int:
    """The dim of a ``dtype`` row of ``row_bytes`` bytes (every dtype's is whole bytes)."""
    dim = {"fp32": row_bytes / 4, "fp16": row_bytes / 2, "bf16": row_bytes / 2,
           "int8": row_bytes - 8, "int4": (row_bytes - 4) * 2, "int2": (row_bytes - 4) * 4,
           "fp8": row_bytes}[dtype]
    if dim != int(dim) or dim < 1:
        raise InvalidRequest(f"table {name!r}: {row_bytes}-byte rows are not {dtype} rows",
                             table=name)
    return int(dim)


def from_encoded(path: StorePath, arrays: Mapping[str, Any], dtype: str | Mapping[str, str], *,
                 overwrite: bool = False, block_bytes: int = 4096,
                 progress: bool | None = None) -> StoreInfo:
    """Creates a store from rows already encoded: ``{name: uint8 [rows, row_bytes]}``, each row
    in ``dtype``'s bytes (``docs/format.md`` §4), taken as they are — a quantised model's rows
    served without quantising them again. For the row-wise dtypes these are FBGEMM's quantize
    operators' bytes: ``int8`` as ``FloatToFused8BitRowwiseQuantized`` writes them (fp32
    scale and bias last), ``int4`` / ``int2`` as ``FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf``
    (fp16 scale and bias last); ``fp8`` rows are ``float8_e4m3fn`` bits. A table's dim follows
    from its row bytes. A row whose scale or bias is not finite is refused, naming it."""
    if not isinstance(arrays, Mapping):
        raise InvalidRequest(f"arrays is a mapping from table name to rows, not "
                             f"{type(arrays).__name__}")
    srcs = {}
    for name, a in arrays.items():
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"a table name is a non-empty str, not {name!r}")
        try:
            arr = np.asarray(a)
        except (ValueError, TypeError) as e:
            raise InvalidRequest(f"table {name!r}: encoded rows are a 2-D uint8 array: {e}",
                                 table=name) from None
        if arr.ndim != 2 or arr.dtype != np.uint8:
            raise InvalidRequest(f"table {name!r}: encoded rows are a 2-D uint8 array "
                                 f"[rows, row_bytes], not {arr.dtype} of shape {arr.shape}",
                                 table=name)
        srcs[name] = arr
    return _build(path, {n: (True, a) for n, a in srcs.items()}, _dtypes(dtype, srcs),
                  "encoded", overwrite=overwrite, block_bytes=block_bytes, progress=progress)


def _spare_rows(capacity: Mapping[str, int] | None,
                keys: Mapping[str, npt.NDArray[np.int64]]) -> dict[str, int]:
    """Each keyed table's rows beyond its keys' (``capacity`` less its keys; 0 by default)."""
    if capacity is not None and not isinstance(capacity, Mapping):
        raise InvalidRequest(f"capacity is a mapping from keyed table name to keys, not "
                             f"{type(capacity).__name__}")
    out = {name: 0 for name in keys}
    for name, cap in (capacity or {}).items():
        if name not in keys:
            raise InvalidRequest(f"a capacity is given for table {name!r}, which is not a keyed "
                                 f"table (give it keys)", table=name)
        cap = count(cap, f"capacity of {name!r}", len(keys[name]), 2**32 - 2)
        out[name] = cap - len(keys[name])
    return out


def _default_rows(rows: Mapping[str, Any] | None, keys: Mapping[str, Any],
                  dims: Mapping[str, int]) -> dict[str, npt.NDArray[np.float32]]:
    """Each keyed table's default row given, checked: ``dim`` finite values."""
    if rows is not None and not isinstance(rows, Mapping):
        raise InvalidRequest(f"default_rows is a mapping from keyed table name to a row, not "
                             f"{type(rows).__name__}")
    out = {}
    for name, row in (rows or {}).items():
        if name not in keys:
            raise InvalidRequest(f"a default row is given for table {name!r}, which is not a "
                                 f"keyed table (give it keys)", table=name)
        got = np.ascontiguousarray(np.asarray(row, np.float32).reshape(-1))
        if got.shape != (dims[name],) or not np.isfinite(got).all():
            raise InvalidRequest(f"table {name!r}: a default row is {dims[name]} finite values, "
                                 f"not {np.asarray(row).shape}", table=name)
        out[name] = got
    return out


def _key_columns(keys: Mapping[str, Any] | None,
                 rows: Mapping[str, int]) -> dict[str, npt.NDArray[np.int64]]:
    """Each keyed table's ids, checked against its `rows` (the writer refuses repeated ids)."""
    if keys is None:
        return {}
    if not isinstance(keys, Mapping):
        raise InvalidRequest(f"keys is a mapping from table name to ids, not "
                             f"{type(keys).__name__}")
    out = {}
    for name, ids in keys.items():
        if name not in rows:
            raise InvalidRequest(f"keys are given for table {name!r}, which is not among the "
                                 f"tables: {', '.join(rows)}", table=name)
        out[name] = key_vector(ids, name)
        if len(out[name]) != rows[name]:
            raise InvalidRequest(f"table {name!r}: {len(out[name])} keys for "
                                 f"{rows[name]} rows (one key a row)", table=name)
    return out


#: Where TorchRec keeps a table's weight in a module's state dict: ``...embedding_bags.NAME.weight``
#: (an EmbeddingBagCollection) or ``...embeddings.NAME.weight`` (an EmbeddingCollection), at
#: any depth of a full model (``sparse_arch.embedding_bag_collection.embedding_bags.NAME``).
_TORCHREC_TABLES = (".embedding_bags.", ".embeddings.")


class _Hash:
    """A managed-collision module's ``input_hash_func`` over its ``input_hash_size``."""

    def __init__(self, fn: Any, size: int):
        self.fn, self.size = fn, size

    def __call__(self, values: Any) -> Any:
        return self.fn(values, self.size)


def _managed_slots(module: Any, name: str, table: str) -> tuple[Any, Any, int, _Hash | None]:
    """Table ``name`` of a TorchRec managed-collision collection ``module`` (a
    ``ManagedCollisionEmbeddingBagCollection``): the raw ids it holds slots for, their slots'
    rows, the row TorchRec pools for any other id, and the module's ``input_hash_func``
    (``None``: ids are taken as given). What ``nearrec.torch.from_torchrec`` builds a keyed table
    from, and ``nearrec.feed.Publisher`` publishes by key."""
    from torchrec.modules.mc_modules import MCHManagedCollisionModule

    mc = module._managed_collision_collection._managed_collision_modules[name]
    if not isinstance(mc, MCHManagedCollisionModule):
        raise InvalidRequest(f"table {table!r}: a {type(mc).__name__} remaps its ids; "
                             f"nearrec serves and publishes MCHManagedCollisionModule's (ZCH)",
                             table=table)
    if module._return_remapped_features:
        raise InvalidRequest(f"table {table!r}: the module returns its remapped ids "
                             f"(return_remapped_features): slots stay inside nearrec",
                             table=table)
    sorted_ids = mc._mch_sorted_raw_ids.detach().cpu().numpy()
    mapping = mc._mch_remapped_ids_mapping.detach().cpu().numpy() - mc._output_global_offset
    empty = np.iinfo(np.int64).max
    held = sorted_ids != empty
    ids, slots = sorted_ids[held], mapping[held]
    if (~held).any():
        # TorchRec's search matches an id equal to the empty mark to the first empty slot
        ids = np.append(ids, empty)
        slots = np.append(slots, mapping[np.argmax(~held)])
    default = mc._zch_size - 1
    fn = mc._input_hash_func
    return ids, slots, default, None if fn is None else _Hash(fn, mc._input_hash_size)


def _split_state_dict(state_dict: Mapping[str, Any], tables: Iterable[str] | None,
                      prefix: Mapping[str, str] | None = None
                      ) -> tuple[dict[str, Any], list[str]]:
    """A state dict's embedding tables by name, and the keys of its other floating-point
    tensors (a full model's dense weights). A table is, in this order: a key under one of
    ``prefix``'s key prefixes (``{key prefix: table prefix}``, the rest of the key up to
    ``.weight`` naming it); else TorchRec's ``embedding_bags.NAME.weight`` or
    ``embeddings.NAME.weight`` at any depth; else, when the state dict has none of those, any
    2-D floating ``NAME.weight`` without a ``NAME.bias`` beside it (``nn.EmbeddingBag`` /
    ``nn.Embedding`` modules, not ``nn.Linear``). ``tables`` picks and orders them."""
    def floating(t: Any) -> bool:
        return bool(getattr(t, "is_floating_point", lambda: False)())

    def table_of(key: str) -> str | None:
        for kp, tp in (prefix or {}).items():
            if key.startswith(kp) and key.endswith(".weight"):
                return tp + key[len(kp):-len(".weight")]
        dotted = "." + key
        for seg in _TORCHREC_TABLES:
            at = dotted.rfind(seg)
            if at >= 0 and key.endswith(".weight"):
                return dotted[at + len(seg):-len(".weight")]
        return None

    found: dict[str, Any] = {}
    used: set[str] = set()  # the keys taken as tables
    named = {k: table_of(k) for k in state_dict}
    torchrec = any(n is not None for n in named.values())
    for key, t in state_dict.items():
        name = named[key]
        if name is None and not torchrec and key.endswith("weight") \
                and key[: -len("weight")] + "bias" not in state_dict:
            name = key[: -len("weight")].rstrip(".") or "weight"
        if name is not None and getattr(t, "ndim", 0) == 2 and floating(t):
            found[name] = t
            used.add(key)
    dense = [k for k, t in state_dict.items() if k not in used and floating(t)]
    if tables is not None:
        wanted = list(tables)
        missing = [n for n in wanted if n not in found]
        if missing:
            raise InvalidRequest(f"state dict has no embedding weights for {missing}; found "
                                 f"{sorted(found)}")
        found = {n: found[n] for n in wanted}
    if not found and not dense:
        raise InvalidRequest("state dict holds no embedding tables: no TorchRec "
                             "'embedding_bags.NAME.weight' and no 2-D floating-point "
                             "'*weight' without a bias")
    return found, dense


def _state_dict_tables(state_dict: Mapping[str, Any],
                       tables: Iterable[str] | None) -> dict[str, Any]:
    """:func:`_split_state_dict`'s tables alone (a store built from a state dict)."""
    return _split_state_dict(state_dict, tables)[0]


def from_state_dict(path: StorePath, state_dict: Mapping[str, Any] | StorePath,
                    dtype: str = "fp32", *, tables: Iterable[str] | None = None,
                    keys: Mapping[str, Any] | None = None,
                    capacity: Mapping[str, int] | None = None,
                    overwrite: bool = False, block_bytes: int = 4096,
                    progress: bool | None = None) -> StoreInfo:
    """Creates a store from the embedding weights of a PyTorch ``state_dict`` (of
    ``nn.EmbeddingBag`` modules or a TorchRec ``EmbeddingBagCollection``), or from a saved
    ``.pt`` file (memory-mapped).

    ``keys`` makes tables keyed (as :func:`from_numpy` does): ``{table: ids}``, the ids an
    integer tensor or array with one id a row, or the name of the state dict's entry that holds
    them (an id column kept beside the weights, e.g. ``{"user": "user.ids"}``); ``capacity``
    as for :func:`from_numpy`."""
    import torch

    _check_dtype(dtype)
    block_bytes = count(block_bytes, "block_bytes", 1, 2**30)
    if isinstance(state_dict, str | os.PathLike):
        state_dict = _load_state_dict(regular_file(state_dict, "the state dict file"))
    if not isinstance(state_dict, Mapping):
        raise InvalidRequest(f"a state dict is a mapping from names to tensors (or a .pt file), "
                             f"not {type(state_dict).__name__}")
    if tables is not None and (isinstance(tables, str) or not all(isinstance(t, str)
                                                                   for t in tables)):
        raise InvalidRequest(f"tables is a list of table names, not {tables!r}")
    weights = _state_dict_tables(state_dict, tables)
    key_cols = _key_columns(_state_dict_keys(state_dict, keys),
                            {n: int(t.shape[0]) for n, t in weights.items()})
    spare = _spare_rows(capacity, key_cols)
    total = sum(_data_bytes(n, t.shape[0], t.shape[1], dtype, block_bytes)
                for n, t in weights.items())
    params = {"source": "state_dict", "dtype": dtype}
    with _Writer(path, overwrite, params, total, progress) as w, torch.no_grad():
        for name, t in weights.items():
            rows, dim = t.shape
            key_col = key_cols.get(name)
            w.native.begin_table(name, rows, dim, dtype, block_bytes, spare=spare.get(name))
            _feed(w.native, name, rows, dim,
                  lambda i, j, t=t: t[i:j].detach().to("cpu", torch.float32).numpy())  # type: ignore[misc]
            w.native.finish_table(key_col)
        return w.commit()


def _state_dict_keys(state_dict: Mapping[str, Any],
                     keys: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`keys` with each entry's name replaced by the state dict's ids under it, as numpy."""
    if keys is None or not isinstance(keys, Mapping):
        return keys  # (refused, named, by _key_columns)
    out = {}
    for table, ids in keys.items():
        if isinstance(ids, str):
            if ids not in state_dict:
                raise InvalidRequest(f"table {table!r}: the state dict has no entry {ids!r} "
                                     f"for its keys", table=table)
            ids = state_dict[ids]
        if hasattr(ids, "detach"):
            ids = ids.detach().cpu().numpy()
        out[table] = ids
    return out


def build(path: StorePath, model: str = "rmc1", *, rows: int | None = None,
          table_bytes: int | None = None, seed: int = 0, dtype: str = "fp32",
          variant: Variant = "deeprecsys", overwrite: bool = False, block_bytes: int = 4096,
          progress: bool | None = None) -> StoreInfo:
    """Creates a store with the tables of a benchmark model (``rmc1`` ... ``dien``), filled with
    seeded U(−√(1/n), √(1/n)) rows (DeepRecInfra's initialisation).

    ``rows`` sets every table's row count; ``table_bytes`` scales the tables (keeping their
    proportions) to about that many bytes in total — to make a table set several times larger
    than the DRAM budget of a run.
    """
    _check_dtype(dtype)
    spec = model_spec(model)
    if variant not in ("deeprecsys", "recssd"):
        raise InvalidRequest(f"variant must be 'deeprecsys' or 'recssd', not {variant!r}")
    if rows is not None:
        rows = count(rows, "rows", 1, 2**48)
    if table_bytes is not None:
        table_bytes = parse_size(table_bytes)
        if table_bytes == 0:
            raise InvalidRequest("table_bytes must be positive")
    seed = count(seed, "seed", 0, 2**64 - 1)
    block_bytes = count(block_bytes, "block_bytes", 1, 2**30)
    dim = spec.table_dim(variant)
    row_bytes = table_layout(1, dim, dtype, block_bytes)[0]
    table_rows = scaled_rows(spec, variant, rows=rows, table_bytes=table_bytes,
                             row_bytes=row_bytes)
    if any(r <= 0 for r in table_rows):
        raise InvalidRequest(f"rows must be positive, got {rows}")
    total = sum(_data_bytes(f"t{i}", r, dim, dtype, block_bytes)
                for i, r in enumerate(table_rows))
    params = {"source": "random", "model": spec.name, "variant": variant, "seed": seed,
              "dtype": dtype, "init": "uniform(-sqrt(1/rows), sqrt(1/rows))",
              "pooling_factor": spec.pooling_factor(variant)}
    with _Writer(path, overwrite, params, total, progress) as w:
        for i, r in enumerate(table_rows):
            w.native.begin_table(f"t{i}", r, dim, dtype, block_bytes)
            w.native.write_random(seed, i)
            w.native.finish_table()
        return w.commit()


def remove(path: StorePath) -> None:
    """Deletes a store directory (only if it is a nearrec store)."""
    import shutil

    p = Path(path_arg(path))
    read_manifest(os.fspath(p))  # raises unless it is a store
    shutil.rmtree(p)


class Updated(dict[str, Synced]):
    """What :func:`update` did: per table, what was compared and written
    (:class:`nearrec.Synced`); ``dense``, the dense weights it replaced in the model kept with
    the store, by their names in the source."""

    dense: tuple[str, ...] = ()


def update(store: Store, source: Any, *, tolerance: float = 0.0,
           tables: Iterable[str] | None = None, prefix: Mapping[str, str] | None = None,
           dense: str = "update") -> Updated:
    """A training feed: brings a writable store's tables — here, or on a node
    (:func:`nearrec.connect`) — to what a trainer holds now, writing only the rows that differ
    (by more than ``tolerance`` in any value, compared as each table stores them). Rows are
    compared by digest where they are stored (:meth:`Store.sync_table`): through a node, an
    unchanged row costs 8 bytes on the wire.

    ``source`` is:

    - an ``.npz`` file: an array named after a table (``[rows, dim]``, the whole table) is
      compared with it; arrays ``TABLE.ids`` and ``TABLE.rows`` are written as given;
    - a PyTorch ``state_dict`` (a mapping of tensors or a saved ``.pt`` file), or a module
      whose ``state_dict()`` it is: a full model's as a trainer checkpoints it (TorchRec's
      ``...embedding_bags.NAME.weight`` at any depth, e.g.
      ``sparse_arch.embedding_bag_collection.embedding_bags.t_user.weight``), an
      ``EmbeddingBagCollection``'s or ``nn.EmbeddingBag`` modules'; ``prefix`` maps other key
      prefixes to table prefixes (``{"model.tables.": ""}``);
    - a mapping from table name to a whole table, or to an ``(ids, rows)`` pair.

    A state dict's other floating-point tensors are the model's dense weights. They are never
    dropped silently: with ``dense="update"`` (the default) they replace the weights of the
    model kept with the store (:meth:`Store.update_model`: by name, a wrapper's prefix such as
    ``model.`` allowed; an unknown one or another shape refuses the update before any table
    is written), and a store that keeps no model refuses them; ``dense="skip"`` updates the
    tables alone; ``dense="error"`` refuses a source that holds any.

    ``tables`` picks the tables (default: every one the source names). Returns, per table,
    what was compared and written (:class:`nearrec.Synced`), and the dense weights replaced
    (:class:`Updated`). Torch is imported only for a ``.pt`` file."""
    if dense not in ("update", "skip", "error"):
        raise InvalidRequest(f"dense is 'update', 'skip' or 'error', not {dense!r}")
    if prefix is not None and not (isinstance(prefix, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in prefix.items())):
        raise InvalidRequest(f"prefix maps key prefixes to table prefixes (str to str), not "
                             f"{prefix!r:.60}")
    if callable(getattr(source, "state_dict", None)):
        source = source.state_dict()
    if isinstance(source, str | os.PathLike):
        file = regular_file(source, "the update file")
        if file.endswith(".npz"):
            source = _npz_tables(file)
        else:
            source = _load_state_dict(file, "neither an .npz of tables nor a loadable state dict")
    if not isinstance(source, Mapping):
        raise InvalidRequest(f"an update comes from an .npz or .pt file, a state dict, a module "
                             f"or a mapping of tables, not {type(source).__name__}")
    done = Updated()
    if prefix is not None or not all(k in store.tables for k in source):
        state, (source, weights) = source, _split_state_dict(source, tables, prefix)
        some = f"{', '.join(weights[:3])}{', ...' if len(weights) > 3 else ''}"
        if weights and dense == "error":
            raise InvalidRequest(
                f"the state dict holds {len(weights)} dense weights besides its tables "
                f"({some}): pass dense='skip' (nearrec update --dense skip) to update the "
                "tables alone, or dense='update' to update the model kept with the store")
        if weights and dense == "update":
            if not store.has_model:
                raise InvalidRequest(
                    f"the state dict holds {len(weights)} dense weights besides its tables "
                    f"({some}), but the store keeps no model to update: keep it with "
                    "nearrec.models.save first, or pass dense='skip' (nearrec update --dense "
                    "skip) to update the tables alone")
            # first: a refused dense update leaves every table as it was
            store.update_model({k: state[k] for k in weights})
            done.dense = tuple(weights)
    elif tables is not None:
        source = {t: source[t] for t in tables}
    for name, value in source.items():
        if isinstance(value, tuple | list) and len(value) == 2:
            ids, rows = value
            v = store.write(name, ids, np.asarray(rows, dtype=np.float32))
            n = len(np.asarray(ids))
            done[name] = Synced(n, n, 1, v)
        else:
            if callable(getattr(value, "detach", None)):  # a torch tensor
                value = value.detach().cpu().numpy()
            done[name] = store.sync_table(name, value, tolerance=tolerance)
    return done


def _load_state_dict(file: str, what: str = "not a loadable state dict (torch.save of a dict "
                     "of tensors)") -> Any:
    """A saved state dict, memory-mapped; anything torch cannot load is ``{file} is {what}``."""
    import torch

    try:
        return torch.load(file, map_location="cpu", mmap=True, weights_only=True)
    except Exception as e:  # torch raises RuntimeError, pickle's errors, EOFError, ...
        raise InvalidRequest(f"{file!r} is {what}: {type(e).__name__}: {e}") from None


def _npz_tables(file: str) -> dict[str, Any]:
    """An update archive's tables: ``NAME`` whole, or ``NAME.ids`` with ``NAME.rows``."""
    try:
        with np.load(file, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise InvalidRequest(f"{file!r} is not a readable .npz archive: {e}") from None
    out: dict[str, Any] = {}
    for key, a in arrays.items():
        if key.endswith(".ids"):
            name = key[: -len(".ids")]
            if name + ".rows" not in arrays:
                raise InvalidRequest(f"{file!r}: {key} has no {name}.rows beside it", table=name)
            out[name] = (a, arrays[name + ".rows"])
        elif key.endswith(".rows"):
            if key[: -len(".rows")] + ".ids" not in arrays:
                raise InvalidRequest(f"{file!r}: {key} has no .ids beside it")
        else:
            out[key] = a
    return out
