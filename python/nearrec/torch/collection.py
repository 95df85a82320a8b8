"""TorchRec's ``EmbeddingBagCollection`` over a store's tables and keyed tables: the pooled
lookup (one native call, keyed tables beside it, or the GPU tier), pickling, the training feed
(``sync_from``), and the store and keyed tables as the GPU tier reads them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from .._native import NativeCollection
from ..build import update
from ..errors import InvalidRequest, UnknownTable
from ..keyed import KeyedTable
from ..request import OutDtypeName, flag, jagged
from ..store import Changes, PoolingModeName, Store, Synced, TableLookup
from .common import (
    _device_arg,
    _device_of,
    _features_arg,
    _not_traced,
    _table_name,
    answer_dtype,
    typed_answer,
)
from .configs import _check_configs, _configs, _features, _pooling
from .ops import _positions, _register
from .tensors import KeyedJaggedTensor, KeyedTensor, _keyed_like


class EmbeddingBagCollection(nn.Module):
    """TorchRec's ``EmbeddingBagCollection`` over a store's tables: the sparse part of a DLRM.

    ``forward(features)`` takes a KeyedJaggedTensor (nearrec's or torchrec's) keyed by feature,
    pools every feature's bags from its table in one engine call and returns a
    :class:`KeyedTensor` keyed by feature whose ``values()`` is the ``[batch, Σ dim]`` tensor.
    Keys of ``features`` that no feature of the collection uses are ignored (a KJT may feed
    several collections); a feature the KJT lacks is an error.

    The tables and their features are named in one of three ways:

    - ``tables=[EmbeddingBagConfig, ...]`` (TorchRec's configs, or anything with their
      ``name``, ``embedding_dim``, ``num_embeddings``, ``feature_names`` and ``pooling``): one
      table may serve several features, pooling comes from each config (``PoolingType``), and
      the output is keyed in TorchRec's order (by config, then by its feature names). Each
      config is checked against the store's table (its dim and rows).
    - ``feature_names={feature: table}``: the same, pooling from ``pooling``; ``tables``
      (names) fixes the tables' order, else the order the mapping first names them.
    - neither: one feature per table, named as the table (every store table, or ``tables``).

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

    ``out_dtype`` (``"fp16"``, ``"bf16"``, ``"int8"``, or ``torch.float16`` / ``torch.bfloat16``)
    is the output's, as :meth:`nearrec.Store.lookup_many` gives it: pooled in float32, rounded
    once where the store is (a node sends the narrower answer), then a float16 / bfloat16
    tensor; int8 answers come back dequantised, float32. Keyed tables' and the GPU tier's
    columns are rounded the same way here.
    """

    def __init__(self, store: Store | None, tables: Sequence[Any] | None = None,
                 pooling: Any = "sum",
                 feature_names: Mapping[str, str] | None = None,
                 device: torch.device | str | None = None,
                 hbm_budget: int | str | None = None, cache_policy: str = "lfu_pa",
                 admission_probability: float = 0.5, keyed: Sequence[KeyedTable] = (),
                 is_weighted: bool | None = None, out_dtype: OutDtypeName | Any = None):
        super().__init__()
        #: the output's dtype, by name (None: float32)
        self.out_dtype = answer_dtype(out_dtype)
        if isinstance(keyed, KeyedTable) or not isinstance(keyed, Sequence) or \
                not all(isinstance(k, KeyedTable) for k in keyed):
            raise InvalidRequest(f"keyed must be a sequence of KeyedTable, not {keyed!r:.60}")
        #: TorchRec's: True needs the KJT's weights, False ignores them, None uses them if any
        self.is_weighted = None if is_weighted is None else flag(is_weighted, "is_weighted")
        if tables is not None and (isinstance(tables, str | bytes)
                                   or not isinstance(tables, Sequence)):
            raise InvalidRequest(f"tables must be a sequence of table names or "
                                 f"EmbeddingBagConfigs, not {type(tables).__name__} "
                                 f"{tables!r:.60}")
        if feature_names is not None and not isinstance(feature_names, Mapping):
            raise InvalidRequest(f"feature_names must be a mapping from feature to table, not "
                                 f"{type(feature_names).__name__} {feature_names!r:.60}")
        if feature_names is not None and not all(
                isinstance(k, str) and isinstance(v, str) for k, v in feature_names.items()):
            raise InvalidRequest(f"feature_names must map str features to str tables, not "
                                 f"{feature_names!r:.60}")
        self._configs: list[Any] | None = None
        if tables is not None and any(not isinstance(t, str) for t in tables):
            self._configs = _configs(tables, feature_names, pooling)
            tables = [c.name for c in self._configs]
            feature_names = {f: c.name for c in self._configs for f in c.feature_names}
            pooling = {c.name: _pooling(c.pooling, c.name) for c in self._configs}
        device = _device_arg(device)
        self.store = store
        self.keyed = {k.name: k for k in keyed}
        if tables is not None:
            store_tables = [_table_name(t) for t in tables]
        elif feature_names is not None:  # the store's tables the mapping names
            store_tables = [t for t in dict.fromkeys(feature_names.values())
                            if t not in self.keyed]
        else:
            store_tables = [] if store is None else list(store.tables)
        if store is None and store_tables:
            raise UnknownTable(f"tables {store_tables} name store tables, but there is no store",
                               table=store_tables[0])
        for t in store_tables:
            store.table(t)  # type: ignore[union-attr]  # an UnknownTable error if missing
        _check_configs(store, self._configs or ())
        clash = [t for t in store_tables if t in self.keyed]
        if clash or len(set(store_tables)) != len(store_tables) or len(self.keyed) != len(keyed):
            raise InvalidRequest(f"table names must be unique, "
                                 f"{clash or store_tables + list(self.keyed)} are not")
        #: the tables the features read, store tables first, then keyed ones
        self.tables = store_tables + list(self.keyed)
        if not self.tables:
            raise InvalidRequest("the collection has no tables")
        if isinstance(pooling, Mapping):
            unknown = [t for t in pooling if t not in self.tables]
            if unknown:
                raise UnknownTable(f"pooling names tables {unknown} the collection does not have",
                                   table=unknown[0] if isinstance(unknown[0], str) else None)
        self.pooling = {t: _pooling(pooling.get(t, "sum") if isinstance(pooling, Mapping)
                                    else pooling, t)
                        for t in self.tables}
        #: feature -> the table it reads, in the output's order
        self.feature_names = _features(self.tables, feature_names)
        #: the output's keys, grouped by table in the tables' order (TorchRec's order)
        self.features = list(self.feature_names)
        dim = {t: self.keyed[t].dim if t in self.keyed else store.table(t).dim  # type: ignore[union-attr]
               for t in self.tables}
        #: per feature, its table's dim (the KeyedTensor's length per key)
        self.dims = [dim[self.feature_names[f]] for f in self.features]
        self.gpu_tier: Any = None
        self._native = self._native_collection()
        self._handle = _register(self)
        #: pooled outputs computed ahead (``nearrec.models.infer``), by the id of their KJT
        self._ahead: dict[int, tuple[Any, KeyedTensor]] = {}
        if hbm_budget is not None or (device is not None and device.type == "cuda"):
            # the GPU tier (nearrec.gpu): rows cached in HBM, misses from this store
            from ..gpu import GpuCacheConfig, GpuTier

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

    def _native_collection(self) -> Any:
        """The store pools the KJT's buffers in one native call (a node's: one round trip)."""
        if self.store is None or self.keyed:
            return None
        return NativeCollection(self.store._native, [
            (self.feature_names[f], f, self.pooling[self.feature_names[f]])
            for f in self.features], self.out_dtype)

    def _answer(self, values: torch.Tensor, rounded: bool = False) -> torch.Tensor:
        """A float32 output in the collection's ``out_dtype``; ``rounded``: the store rounded
        it already (rounding int8 again would not give the same values)."""
        return typed_answer(values, self.dims, self.out_dtype, rounded)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled with its store (which opens again where it is unpickled); keyed tables and
        the GPU tier hold memory a pickle cannot carry."""
        if self.keyed or self.gpu_tier is not None:
            raise InvalidRequest("a collection with keyed tables or the GPU tier cannot be "
                                 "pickled or copied: build it again where it is needed")
        return {**self.__dict__, "_native": None, "_ahead": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[no-untyped-call]  # untyped in torch
        self._native = self._native_collection()
        self._handle = _register(self)

    def ahead(self, features: Any, pooled: KeyedTensor) -> None:
        """Makes the next ``forward(features)`` of this very ``features`` object return
        ``pooled``, computed ahead (``nearrec.models.infer`` reads the next batches while the
        current one's dense part runs); :meth:`unused` takes back what no forward consumed."""
        self._ahead[id(features)] = (features, pooled)

    def unused(self) -> int:
        """Drops the outputs computed ahead that no ``forward`` consumed and says how many."""
        n = len(self._ahead)
        self._ahead.clear()
        return n

    def embedding_bag_configs(self) -> list[Any]:
        """TorchRec's ``EmbeddingBagConfig`` of each table (what ``torchrec.models.dlrm``
        reads to size its interaction): the configs given, else made from the tables (needs
        torchrec)."""
        if self._configs is not None:
            return list(self._configs)
        try:
            from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
        except ImportError as e:
            raise InvalidRequest(f"embedding_bag_configs() makes TorchRec configs: install "
                                 f"torchrec ({e})") from None
        rows = {t: self.keyed[t].capacity if t in self.keyed
                else self.store.table(t).entries  # type: ignore[union-attr]
                for t in self.tables}
        return [EmbeddingBagConfig(
            name=t, embedding_dim=self.dims[self.features.index(self._features_of(t)[0])],
            num_embeddings=rows[t], feature_names=self._features_of(t),
            pooling=PoolingType[self.pooling[t].upper()]) for t in self.tables]

    def _features_of(self, table: str) -> list[str]:
        return [f for f in self.features if self.feature_names[f] == table]

    def lookups(self, features: Any) -> list[TableLookup]:
        """The engine's requests for ``features``: one :class:`~nearrec.TableLookup` per
        feature, in the output's order (what whole-model offload sends; store tables only)."""
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
        if isinstance(source, nn.Module):
            source = source.state_dict()
        wanted = [t for t in self.tables if t not in self.keyed]
        return update(self.store, source, tolerance=tolerance,
                      tables=[t for t in wanted if _names_table(source, t)])

    def forward(self, features: Any) -> Any:
        """The pooled features, as nearrec's :class:`KeyedTensor` — or TorchRec's own when
        ``features`` is TorchRec's KeyedJaggedTensor, as TorchRec's collection answers it."""
        if torch.compiler.is_compiling():
            return _keyed_like(features, self._traced(features))
        if self._ahead:
            done = self._ahead.pop(id(features), None)
            if done is not None and done[0] is features:
                return _keyed_like(features, done[1])
        return _keyed_like(features, self._eager(features))

    def _traced(self, features: Any) -> KeyedTensor:
        """Under ``torch.compile`` / ``torch.export``: the lookup as one ``nearrec`` op over the
        KJT's tensors (its keys are fixed at tracing)."""
        keys = list(features.keys())
        positions = _positions(self, keys)
        weights = features.weights_or_none() if self.is_weighted is not False else None
        out = torch.ops.nearrec.pooled_lookup(
            self._handle, features.values(), features.lengths(), weights,
            positions, len(keys))
        return KeyedTensor(self.features, self.dims, self._answer(out))

    def _eager(self, features: Any) -> KeyedTensor:
        _not_traced(self)
        if self.is_weighted is not None:
            features = self._weighted(features)
        if self._native is None or self.gpu_tier is not None:
            return self._forward_parts(features)
        # store tables only: one native call reads the KJT's own buffers (CPU tensors in place,
        # no per-table copies), pools and returns the tensor
        try:
            out = self._native.forward(features)
            return KeyedTensor(self.features, self.dims, self._answer(out, rounded=True))
        except AttributeError:
            _features_arg(features)
            raise

    def _weighted(self, features: Any) -> Any:
        """``features`` as TorchRec's collection of this ``is_weighted`` reads them."""
        _features_arg(features)
        weights = features.weights_or_none()
        if self.is_weighted and weights is None:
            raise InvalidRequest("the collection is weighted (is_weighted=True) but the "
                                 "features carry no weights")
        if self.is_weighted or weights is None:
            return features
        return KeyedJaggedTensor(features.keys(), features.values(), features.lengths())

    def _forward_parts(self, features: Any) -> KeyedTensor:
        """Keyed tables or the GPU tier beside the store: each part pooled where it lives."""
        batch, values, lengths, bounds, weights, slices = self._parse(features)
        if self.gpu_tier is not None:
            return KeyedTensor(self.features, self.dims, self._answer(self.gpu_tier.pool_concat([
                (table, self._gpu_ids(table, values[lo:hi]), bounds[k * batch:(k + 1) * batch] - lo,
                 None if weights is None else weights[lo:hi], self.pooling[table])
                for table, k, lo, hi in slices])))
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
        return KeyedTensor(self.features, self.dims, self._answer(out))

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
        """Per feature: its table, its position among ``keys`` and its values' ``[lo, hi)``."""
        position = {k: i for i, k in enumerate(keys)}
        out = []
        for feat in self.features:
            table = self.feature_names[feat]
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
