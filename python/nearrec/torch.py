"""PyTorch modules over a nearrec store: drop-in ``nn.EmbeddingBag`` and a TorchRec-shaped
``EmbeddingBagCollection`` whose rows live in the store, not in parameters.

Requires the ``torch`` extra (``pip install nearrec[torch]``). Lookups run in the nearrec engine
(GIL released); outputs are float32 tensors that share memory with the engine's result (no copy),
moved to the input's device when it is not the CPU. The modules are inference-only: they hold no
parameters and produce no gradients for the rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ._native import NativeCollection
from .build import update
from .errors import InvalidRequest, UnknownTable
from .keyed import KeyedTable
from .remote import RemoteStore
from .request import as_array, flag, jagged, mode_name, padding
from .store import Changes, PoolingModeName, Store, Synced, TableLookup


def _numpy(t: Any) -> Any:
    if isinstance(t, Tensor):
        if t.requires_grad:
            t = t.detach()
        return t.numpy() if t.device.type == "cpu" else t.cpu().numpy()
    return t


def _table_name(table: Any) -> str:
    if not isinstance(table, str):
        raise InvalidRequest(f"a table name must be a str, not {type(table).__name__} "
                             f"{table!r:.60}")
    return table


def _device_arg(device: Any) -> torch.device | None:
    if device is None:
        return None
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError) as e:
        raise InvalidRequest(f"device must be a torch device such as 'cpu' or 'cuda', not "
                             f"{device!r:.60}: {e}") from None


def _features_arg(features: Any) -> None:
    if not all(callable(getattr(features, m, None)) for m in ("keys", "values", "lengths")):
        raise InvalidRequest("features must be a KeyedJaggedTensor (keys(), values(), "
                             f"lengths()), not {type(features).__name__} {features!r:.60}")


def _device_of(*xs: Any) -> torch.device:
    for x in xs:
        if isinstance(x, Tensor):
            return x.device
    return torch.device("cpu")


class EmbeddingBag(nn.Module):
    """``torch.nn.EmbeddingBag`` over one table of a store.

    ``forward(input, offsets=None, per_sample_weights=None)`` behaves like
    ``nn.EmbeddingBag.forward``: 1-D ``input`` with ``offsets`` (``include_last_offset`` as in
    PyTorch), or 2-D ``[batch, bag_size]`` input without; empty bags give zeros; ``padding_idx``
    rows are skipped and not counted for mean; ``per_sample_weights`` only with ``mode="sum"``.
    """

    def __init__(self, store: Store, table: str, mode: PoolingModeName = "sum",
                 include_last_offset: bool = False, padding_idx: int | None = None):
        super().__init__()
        info = store.table(_table_name(table))
        mode = mode_name(mode, table)
        include_last_offset = flag(include_last_offset, "include_last_offset")
        padding_idx = padding(padding_idx, table)
        if padding_idx is not None and not -info.rows <= padding_idx < info.rows:
            raise InvalidRequest(
                f"table {table!r}: padding_idx {padding_idx} is out of range for {info.rows} rows",
                table=table,
            )
        self.store = store
        self.table = table
        self.mode: PoolingModeName = mode
        self.include_last_offset = include_last_offset
        self.padding_idx = padding_idx if padding_idx is None or padding_idx >= 0 \
            else padding_idx + info.rows
        self.num_embeddings = info.rows
        self.embedding_dim = info.dim

    def sync_from(self, source: Any, *, tolerance: float = 0.0) -> Synced:
        """A training feed: writes the rows of this table that differ from ``source`` — an
        ``nn.EmbeddingBag`` / ``nn.Embedding`` being trained, or its weight tensor — by more
        than ``tolerance`` into the (writable) store. See :meth:`nearrec.Store.sync_table`."""
        weight = getattr(source, "weight", source)
        if not isinstance(weight, Tensor):
            raise InvalidRequest(f"sync_from takes an embedding module or its weight tensor, not "
                                 f"{type(source).__name__}", table=self.table)
        return self.store.sync_table(self.table, weight.detach().cpu().numpy(),
                                     tolerance=tolerance)

    def forward(self, input: Tensor, offsets: Tensor | None = None,
                per_sample_weights: Tensor | None = None) -> Tensor:
        out = self.store.lookup(
            self.table, _numpy(input), offsets=_numpy(offsets),
            per_sample_weights=_numpy(per_sample_weights), mode=self.mode,
            include_last_offset=self.include_last_offset, padding_idx=self.padding_idx,
        )
        result = torch.from_numpy(out)
        device = _device_of(input)
        return result if device.type == "cpu" else result.to(device)

    def extra_repr(self) -> str:
        return (f"{self.table!r}, {self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}"
                + (f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""))


class KeyedEmbeddingBag(nn.Module):
    """``torch.nn.EmbeddingBag`` over a :class:`~nearrec.keyed.KeyedTable`: ``input`` holds
    64-bit feature ids instead of row numbers (1-D with ``offsets``, or 2-D ``[batch, bag]``);
    unknown ids follow the table's policy."""

    def __init__(self, table: KeyedTable, mode: PoolingModeName = "sum",
                 include_last_offset: bool = False):
        super().__init__()
        if not isinstance(table, KeyedTable):
            raise InvalidRequest(f"KeyedEmbeddingBag takes a KeyedTable, not "
                                 f"{type(table).__name__} {table!r:.60}")
        mode = mode_name(mode, table.name)
        include_last_offset = flag(include_last_offset, "include_last_offset")
        self.keyed = table
        self.mode: PoolingModeName = mode
        self.include_last_offset = include_last_offset
        self.embedding_dim = table.dim

    def forward(self, input: Tensor, offsets: Tensor | None = None,
                per_sample_weights: Tensor | None = None) -> Tensor:
        name = self.keyed.name
        if input is None:
            raise InvalidRequest(f"table {name!r}: input must be a tensor of ids, not None",
                                 table=name)
        keys = as_array(input, "input", name)
        if keys.ndim not in (1, 2):
            raise InvalidRequest(f"table {name!r}: input must be 1-D (with offsets) or 2-D, got "
                                 f"{keys.ndim}-D", table=name)
        last = self.include_last_offset and keys.ndim == 1
        if keys.ndim == 2:
            if offsets is not None:
                raise InvalidRequest("2-D input takes no offsets", table=self.keyed.name)
            starts = np.arange(0, keys.size, max(1, keys.shape[1]), dtype=np.int64)[
                :keys.shape[0]]
            keys = keys.reshape(-1)
        elif offsets is None:
            raise InvalidRequest("1-D input needs offsets", table=self.keyed.name)
        else:
            starts = as_array(offsets, "offsets", name)
        weights = None if per_sample_weights is None else \
            as_array(per_sample_weights, "per_sample_weights", name).reshape(-1)
        out = self.keyed.lookup(keys, offsets=starts, mode=self.mode,
                                per_sample_weights=weights, include_last_offset=last)
        result = torch.from_numpy(out)
        device = _device_of(input)
        return result if device.type == "cpu" else result.to(device)

    def extra_repr(self) -> str:
        return f"{self.keyed!r}, mode={self.mode!r}"


class KeyedJaggedTensor:
    """A minimal TorchRec ``KeyedJaggedTensor``: per key (feature) a jagged batch of ids, stored
    key-major: ``values`` concatenates every key's bags; ``lengths`` has ``len(keys) * batch``
    entries (or ``offsets`` one more). ``torchrec.KeyedJaggedTensor`` is accepted wherever this
    is."""

    def __init__(self, keys: Sequence[str], values: Tensor, lengths: Tensor | None = None,
                 offsets: Tensor | None = None, weights: Tensor | None = None):
        if (lengths is None) == (offsets is None):
            raise InvalidRequest("KeyedJaggedTensor needs lengths or offsets (exactly one)")
        if isinstance(keys, str) or not isinstance(keys, Sequence) \
                or not all(isinstance(k, str) for k in keys):
            raise InvalidRequest(f"KeyedJaggedTensor keys are a sequence of str, not {keys!r:.60}")
        for what, t in (("values", values), ("lengths", lengths), ("offsets", offsets)):
            if t is not None and not (isinstance(t, Tensor) and t.dim() == 1
                                      and not t.is_floating_point() and t.dtype != torch.bool):
                raise InvalidRequest(f"KeyedJaggedTensor {what} must be a 1-D integer tensor, not "
                                     f"{type(t).__name__} {t!r:.60}")
        bags = (lengths.numel() if lengths is not None
                else offsets.numel() - 1 if offsets is not None else 0)
        if keys and (bags < 0 or bags % len(keys)):
            raise InvalidRequest(f"KeyedJaggedTensor has {bags} bags for {len(keys)} keys: every "
                                 "key needs the same number (one per sample)")
        if weights is not None and not (isinstance(weights, Tensor)
                                        and weights.shape == values.shape):
            raise InvalidRequest("KeyedJaggedTensor weights must be a tensor shaped like values")
        self._keys = list(keys)
        self._values = values
        self._lengths = lengths
        self._offsets = offsets
        self._weights = weights

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> Tensor:
        return self._values

    def weights_or_none(self) -> Tensor | None:
        return self._weights

    def lengths(self) -> Tensor:
        if self._lengths is None:
            assert self._offsets is not None
            self._lengths = self._offsets[1:] - self._offsets[:-1]
        return self._lengths

    def offsets(self) -> Tensor:
        if self._offsets is None:
            lengths = self.lengths()
            self._offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
        return self._offsets

    def stride(self) -> int:
        n = len(self._keys)
        return self.lengths().numel() // n if n else 0


class KeyedTensor:
    """Pooled output of an :class:`EmbeddingBagCollection`, shaped like TorchRec's KeyedTensor:
    ``values()`` is ``[batch, Σ dim]``; ``kt[key]`` / ``to_dict()`` give per-table views."""

    def __init__(self, keys: Sequence[str], length_per_key: Sequence[int], values: Tensor):
        self._keys = list(keys)
        self._lengths = list(length_per_key)
        self._values = values
        self._offsets: list[int] | None = None  # made when asked for: forward does not need it

    def keys(self) -> list[str]:
        return self._keys

    def values(self) -> Tensor:
        return self._values

    def length_per_key(self) -> list[int]:
        return self._lengths

    def offset_per_key(self) -> list[int]:
        if self._offsets is None:
            self._offsets = [0, *itertools.accumulate(self._lengths)]
        return self._offsets

    def __getitem__(self, key: str) -> Tensor:
        try:
            i = self._keys.index(key)
        except ValueError:
            raise UnknownTable(f"the KeyedTensor has no key {key!r}; it has {self._keys}",
                               table=key if isinstance(key, str) else None) from None
        at = self.offset_per_key()
        return self._values[:, at[i]:at[i + 1]]

    def to_dict(self) -> dict[str, Tensor]:
        return {k: self[k] for k in self._keys}


class EmbeddingBagCollection(nn.Module):
    """TorchRec's ``EmbeddingBagCollection`` over a store's tables: the sparse part of a DLRM.

    ``forward(features)`` takes a KeyedJaggedTensor (nearrec's or torchrec's) whose keys name the
    tables (or map to them through ``feature_names``), pools every table's bags in one engine
    call and returns a :class:`KeyedTensor` whose ``values()`` is the ``[batch, Σ dim]`` tensor.
    Keys of ``features`` that no table uses are ignored (a KJT may feed several collections);
    a table whose feature is missing is an error.

    ``keyed`` adds :class:`~nearrec.keyed.KeyedTable` s (features of unbounded 64-bit ids): their
    columns follow the store's tables (``store`` may be ``None`` when every table is keyed).

    ``device="cuda"`` (or any ``hbm_budget``) turns on the GPU tier (:mod:`nearrec.gpu`): each
    table's hot rows are cached in ``hbm_budget`` bytes of GPU memory (``"8GiB"`` by default,
    split between tables by size), ``cache_policy`` ``"lru"``, ``"lfu"``, ``"lru_pa"`` or
    ``"lfu_pa"`` with ``admission_probability`` for the ``_pa`` ones; misses come from the
    store or the keyed table; the output is on ``device``. A keyed table's ids are resolved to
    its stable row indices on the host (its unknown-key policy applied there), and the GPU
    caches those rows. Pooling ``"sum"`` / ``"mean"`` only. On a CPU ``device`` the tier runs
    its reference path (for tests). Without either, nothing changes.
    """

    def __init__(self, store: Store | RemoteStore | None, tables: Sequence[str] | None = None,
                 pooling: PoolingModeName | Mapping[str, PoolingModeName] = "sum",
                 feature_names: Mapping[str, str] | None = None,
                 device: torch.device | str | None = None,
                 hbm_budget: int | str | None = None, cache_policy: str = "lfu_pa",
                 admission_probability: float = 0.5, keyed: Sequence[KeyedTable] = ()):
        super().__init__()
        if isinstance(keyed, KeyedTable) or not isinstance(keyed, Sequence) or \
                not all(isinstance(k, KeyedTable) for k in keyed):
            raise InvalidRequest(f"keyed must be a sequence of KeyedTable, not {keyed!r:.60}")
        if tables is not None and (isinstance(tables, str | bytes)
                                   or not isinstance(tables, Sequence)):
            raise InvalidRequest(f"tables must be a sequence of table names, not "
                                 f"{type(tables).__name__} {tables!r:.60}")
        if feature_names is not None and not isinstance(feature_names, Mapping):
            raise InvalidRequest(f"feature_names must be a mapping from feature to table, not "
                                 f"{type(feature_names).__name__} {feature_names!r:.60}")
        if feature_names is not None and not all(
                isinstance(k, str) and isinstance(v, str) for k, v in feature_names.items()):
            raise InvalidRequest(f"feature_names must map str features to str tables, not "
                                 f"{feature_names!r:.60}")
        device = _device_arg(device)
        self.store = store
        self.keyed = {k.name: k for k in keyed}
        store_tables = [] if store is None else \
            [_table_name(t) for t in tables] if tables is not None else list(store.tables)
        if store is None and tables:
            raise InvalidRequest("tables name store tables, but there is no store")
        for t in store_tables:
            store.table(t)  # type: ignore[union-attr]  # an UnknownTable error if missing
        clash = [t for t in store_tables if t in self.keyed]
        if clash or len(self.keyed) != len(keyed):
            raise InvalidRequest(f"table names must be unique, {clash or list(self.keyed)} are not")
        self.tables = store_tables + list(self.keyed)
        if not self.tables:
            raise InvalidRequest("the collection has no tables")
        if not isinstance(pooling, str | Mapping):
            raise InvalidRequest(f"pooling must be 'sum', 'mean', 'max' or a mapping from table "
                                 f"to one, not {pooling!r:.60}")
        if isinstance(pooling, Mapping):
            unknown = [t for t in pooling if t not in self.tables]
            if unknown:
                raise UnknownTable(f"pooling names tables {unknown} the collection does not have",
                                   table=unknown[0] if isinstance(unknown[0], str) else None)
        self.pooling = {t: mode_name(pooling if isinstance(pooling, str)
                                     else pooling.get(t, "sum"), t)
                        for t in self.tables}
        # feature -> table
        self.feature_names = dict(feature_names) if feature_names else {t: t for t in self.tables}
        self._feature_of = {table: feat for feat, table in self.feature_names.items()}
        missing = [t for t in self.tables if t not in self._feature_of]
        if missing:
            raise InvalidRequest(f"feature_names maps no feature to tables {missing}")
        self.dims = [self.keyed[t].dim if t in self.keyed else store.table(t).dim  # type: ignore[union-attr]
                     for t in self.tables]
        self.gpu_tier: Any = None
        # a local store pools the KJT's buffers in one native call; a node's store (RemoteStore)
        # takes the batch as TableLookups, one round trip
        self._native = None if not isinstance(store, Store) or self.keyed else NativeCollection(
            store._native, [(t, self._feature_of[t], self.pooling[t]) for t in store_tables])
        if hbm_budget is not None or (device is not None and device.type == "cuda"):
            # the GPU tier (nearrec.gpu): rows cached in HBM, misses from this store
            from .gpu import GpuCacheConfig, GpuTier

            if device is None:
                raise InvalidRequest("hbm_budget needs a device (e.g. device='cuda')")
            bad = [t for t, m in self.pooling.items() if m not in ("sum", "mean")]
            if bad:
                raise InvalidRequest(f"the GPU tier pools with 'sum' or 'mean'; tables {bad} "
                                     "use 'max'", table=bad[0])
            config = GpuCacheConfig(hbm_budget="8GiB" if hbm_budget is None else hbm_budget,
                                    policy=cache_policy,
                                    admission_probability=admission_probability)
            self.gpu_tier = GpuTier(_Sources(store, self.keyed), self.tables, config,  # type: ignore[arg-type]
                                    device=device)

    def lookups(self, features: Any) -> list[TableLookup]:
        """The engine's requests for ``features``: one :class:`~nearrec.TableLookup` per table,
        in the collection's order (what whole-model offload sends; store tables only)."""
        if self.keyed:
            raise InvalidRequest(f"keyed tables {list(self.keyed)} are not in the store")
        batch, values, lengths, _, weights, slices = self._parse(features)
        return [TableLookup(table, values[lo:hi], lengths=lengths[k * batch:(k + 1) * batch],
                            per_sample_weights=None if weights is None else weights[lo:hi],
                            mode=self.pooling[table])
                for table, k, lo, hi in slices]

    def _parse(self, features: Any
               ) -> tuple[int, Any, Any, Any, Any, list[tuple[str, int, int, int]]]:
        """``features`` checked: its batch, values, lengths, their bounds, weights and each
        table's ``(table, key position, lo, hi)``."""
        _features_arg(features)
        j = jagged(features)
        return (j.batch, j.values, j.lengths, j.bounds, j.weights,
                self._slices(j.keys, j.batch, j.bounds))

    def sync_from(self, source: Any, *, tolerance: float = 0.0) -> dict[str, Synced]:
        """A training feed: writes into the (writable) store the rows of this collection's
        tables that differ from ``source`` by more than ``tolerance`` — a TorchRec
        ``EmbeddingBagCollection`` (or any module holding embedding bags) being trained, its
        ``state_dict()``, or a saved one. See :func:`nearrec.update`."""
        if self.store is None:
            raise InvalidRequest("the collection has no store to write to")
        if not isinstance(self.store, Store):
            raise InvalidRequest("sync_from compares and writes a local store; over a storage "
                                 "node, write the rows that changed with remote.write_many")
        if isinstance(source, nn.Module):
            source = source.state_dict()
        wanted = [t for t in self.tables if t not in self.keyed]
        return update(self.store, source, tolerance=tolerance,
                      tables=[t for t in wanted if _names_table(source, t)])

    def forward(self, features: Any) -> KeyedTensor:
        if self._native is None or self.gpu_tier is not None:
            return self._forward_parts(features)
        # store tables only: one native call reads the KJT's own buffers (CPU tensors in place,
        # no per-table copies), pools and returns the tensor
        try:
            return KeyedTensor(self.tables, self.dims, self._native.forward(features))
        except AttributeError:
            _features_arg(features)
            raise

    def _forward_parts(self, features: Any) -> KeyedTensor:
        """Keyed tables or the GPU tier beside the store: each part pooled where it lives."""
        batch, values, lengths, bounds, weights, slices = self._parse(features)
        if self.gpu_tier is not None:
            return KeyedTensor(self.tables, self.dims, self.gpu_tier.pool_concat([
                (table, self._gpu_ids(table, values[lo:hi]), bounds[k * batch:(k + 1) * batch] - lo,
                 None if weights is None else weights[lo:hi], self.pooling[table])
                for table, k, lo, hi in slices]))
        reqs, parts = [], []
        for table, k, lo, hi in slices:
            w = None if weights is None else weights[lo:hi]
            lens = lengths[k * batch:(k + 1) * batch]
            if table in self.keyed:
                parts.append(self.keyed[table].lookup(values[lo:hi], lengths=lens,
                                                      mode=self.pooling[table],
                                                      per_sample_weights=w))
            else:
                reqs.append(TableLookup(table, values[lo:hi], lengths=lens, per_sample_weights=w,
                                        mode=self.pooling[table]))
        if reqs:
            parts.insert(0, self.store.lookup_many(reqs).values)  # type: ignore[union-attr]
        out = torch.from_numpy(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1))
        device = _device_of(features.values())
        if device.type != "cpu":
            out = out.to(device)
        return KeyedTensor(self.tables, self.dims, out)

    def _gpu_ids(self, table: str, values: Any) -> Any:
        """What the GPU tier caches by: row numbers; a keyed table's ids resolved to its row
        indices (a zero row, where the policy gives one, is the row past its capacity)."""
        if table not in self.keyed:
            return values
        kt = self.keyed[table]
        rows = kt.resolve(values)
        rows[rows < 0] = kt.capacity
        return rows

    def _slices(self, keys: list[str], batch: int,
                bounds: Any) -> list[tuple[str, int, int, int]]:
        """Per table: its feature's position among ``keys`` and its values' ``[lo, hi)``."""
        position = {k: i for i, k in enumerate(keys)}
        out = []
        for table in self.tables:
            feat = self._feature_of[table]
            if feat not in position:
                raise InvalidRequest(f"features have no key {feat!r} for table {table!r}",
                                     table=table)
            k = position[feat]
            out.append((table, k, int(bounds[k * batch]), int(bounds[(k + 1) * batch])))
        return out


class _KeyedInfo:
    """A keyed table as the GPU tier sees it: ``capacity + 1`` fp32 rows (the last one zeros)."""

    def __init__(self, table: KeyedTable):
        self.name, self.rows, self.dim, self.dtype = table.name, table.capacity + 1, \
            table.dim, "fp32"


def _names_table(state_dict: Any, table: str) -> bool:
    """Whether a state dict (or a mapping of tables) holds table ``table``'s weights."""
    if not isinstance(state_dict, Mapping):
        return True  # a file: let the update say what it holds
    return table in state_dict or any(
        k in state_dict for k in (f"{table}.weight", f"embedding_bags.{table}.weight"))


class _Sources:
    """A store's tables and keyed tables behind the one interface the GPU tier reads misses
    through (keyed tables by row index, as :meth:`EmbeddingBagCollection._gpu_ids` gives)."""

    def __init__(self, store: Store | None, keyed: Mapping[str, KeyedTable]):
        self._store, self._keyed = store, keyed
        self.tier = store.tier if store is not None else "keyed"
        self.tables = (list(store.tables) if store is not None else []) + list(keyed)

    def table(self, name: str) -> Any:
        if name in self._keyed:
            return _KeyedInfo(self._keyed[name])
        return self._store.table(name)  # type: ignore[union-attr]

    def changes_since(self, version: int) -> Changes:
        """The store's changes. Keyed tables' rows are cached by row index and a keyed write
        changes rows in place: the keyed tables' write counts go into the engine's id, so that
        a keyed write makes every cache above these sources start again."""
        now = Changes(0, 0, 0, {}) if self._store is None else self._store.changes_since(version)
        if not self._keyed:
            return now
        engine = hash((now.engine, *(t.version for t in self._keyed.values())))
        return Changes(now.version, now.base, engine, now.rows)

    def table_array(self, name: str) -> Any:
        if name in self._keyed:
            raise InvalidRequest("keyed tables have no row array", table=name)
        return self._store.table_array(name)  # type: ignore[union-attr]

    def _rows(self, name: str, rows: Any) -> Any:
        r = np.array(rows, dtype=np.int64)
        r[r == self._keyed[name].capacity] = -1
        return r

    def read_rows(self, name: str, rows: Any) -> Any:
        if name in self._keyed:
            return self._keyed[name].read_rows(self._rows(name, rows))
        return self._store.read_rows(name, rows)  # type: ignore[union-attr]

    def lookup(self, name: str, indices: Any, offsets: Any = None,
               per_sample_weights: Any = None, mode: PoolingModeName = "sum") -> Any:
        if name in self._keyed:
            return self._keyed[name].pool_rows(self._rows(name, indices), offsets, mode,
                                               per_sample_weights)
        return self._store.lookup(name, indices, offsets=offsets,  # type: ignore[union-attr]
                                  per_sample_weights=per_sample_weights, mode=mode)


__all__ = ["EmbeddingBag", "EmbeddingBagCollection", "KeyedEmbeddingBag", "KeyedJaggedTensor",
           "KeyedTensor"]
