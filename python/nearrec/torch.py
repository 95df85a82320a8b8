"""PyTorch modules over a nearrec store: drop-in ``nn.EmbeddingBag`` and a TorchRec-shaped
``EmbeddingBagCollection`` whose rows live in the store, not in parameters; ``from_torchrec``
serves a TorchRec model's collections from a store.

Requires the ``torch`` extra (``pip install nearrec[torch]``). Lookups run in the nearrec engine
(GIL released); outputs are float32 tensors that share memory with the engine's result (no copy),
moved to the input's device when it is not the CPU. The modules are inference-only: they hold no
parameters and produce no gradients for the rows.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import sys
import weakref
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
from torch import Tensor, nn

from ._native import NativeCollection
from .build import from_numpy, update
from .errors import IndexOutOfRange, InvalidRequest, UnknownTable
from .keyed import KeyedTable
from .manifest import StorePath
from .request import as_array, flag, jagged, mode_name, padding
from .store import Changes, PoolingModeName, Store, Synced, TableLookup, open_store


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


def _not_traced(module: nn.Module) -> None:
    """``torch.jit.trace`` records the tensors a lookup returns as constants: the traced module
    would answer every later input with this input's embeddings. Refused."""
    if torch.jit.is_tracing():  # type: ignore[attr-defined, no-untyped-call]  # untyped in torch
        raise InvalidRequest(f"torch.jit.trace cannot record a {type(module).__name__}'s "
                             "lookup (it would freeze this input's embeddings as constants); "
                             "run the module eagerly")


def _device_of(*xs: Any) -> torch.device:
    for x in xs:
        if isinstance(x, Tensor):
            return x.device
    return torch.device("cpu")


# Collections by handle, for the custom ops: an op takes tensors and numbers, not modules.
_collections: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
_handles = itertools.count(1)


def _register(collection: nn.Module) -> int:
    """A new handle naming ``collection`` for the custom ops."""
    handle = next(_handles)
    _collections[handle] = collection
    return handle


def _by_handle(handle: int, positions: Sequence[int], num_keys: int, values: Tensor,
               lengths: Tensor, weights: Tensor | None = None) -> tuple[Any, Any]:
    """The collection ``handle`` names and the KeyedJaggedTensor an op's tensors make (its
    features at ``positions`` among ``num_keys`` keys)."""
    collection = _collections.get(handle)
    if collection is None:
        raise InvalidRequest(f"no nearrec collection has handle {handle} in this process (the "
                             "program outlived its module, or came from another process)")
    keys = [f"\0unused {k}" for k in range(num_keys)]
    for feature, k in zip(collection.features, positions, strict=True):
        keys[k] = feature
    return collection, KeyedJaggedTensor(keys, values, lengths, weights=weights)


@torch.library.custom_op("nearrec::pooled_lookup", mutates_args=())
def pooled_lookup(handle: int, values: Tensor, lengths: Tensor, weights: Tensor | None,
                  positions: Sequence[int], num_keys: int) -> Tensor:
    """The pooled lookup of the :class:`EmbeddingBagCollection` ``handle`` names, as one op that
    ``torch.compile`` and ``torch.export`` keep whole: a KeyedJaggedTensor's ``values``,
    ``lengths`` and ``weights`` over ``num_keys`` keys, the collection's features at
    ``positions`` among them. Returns ``[batch, Σ dim]``."""
    collection, features = _by_handle(handle, positions, num_keys, values, lengths, weights)
    out: Tensor = collection._eager(features).values().clone()
    return out


@pooled_lookup.register_fake
def _(handle: int, values: Tensor, lengths: Tensor, weights: Tensor | None,
      positions: Sequence[int], num_keys: int) -> Tensor:
    collection = _collections[handle]
    return values.new_empty((lengths.shape[0] // num_keys, sum(collection.dims)),
                            dtype=torch.float32)


@torch.library.custom_op("nearrec::sequence_lookup", mutates_args=())
def sequence_lookup(handle: int, values: Tensor, lengths: Tensor, positions: Sequence[int],
                    num_keys: int) -> list[Tensor]:
    """The rows of the :class:`EmbeddingCollection` ``handle`` names, as one op that
    ``torch.compile`` and ``torch.export`` keep whole: per feature (at ``positions`` among the
    KeyedJaggedTensor's ``num_keys`` keys) ``[its ids, dim]``, each id's row in order."""
    collection, features = _by_handle(handle, positions, num_keys, values, lengths)
    out = collection._eager(features)
    return [out[f].values().clone() for f in collection.features]


@sequence_lookup.register_fake
def _(handle: int, values: Tensor, lengths: Tensor, positions: Sequence[int],
      num_keys: int) -> list[Tensor]:
    # how many ids a feature has is in its lengths' values: a size known only when it runs
    ctx = torch.library.get_ctx()
    return [values.new_empty((ctx.new_dynamic_size(), d), dtype=torch.float32)
            for d in _collections[handle].dims]


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
        _not_traced(self)
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
    """

    def __init__(self, store: Store | None, tables: Sequence[Any] | None = None,
                 pooling: Any = "sum",
                 feature_names: Mapping[str, str] | None = None,
                 device: torch.device | str | None = None,
                 hbm_budget: int | str | None = None, cache_policy: str = "lfu_pa",
                 admission_probability: float = 0.5, keyed: Sequence[KeyedTable] = (),
                 is_weighted: bool | None = None):
        super().__init__()
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

    def _native_collection(self) -> Any:
        """The store pools the KJT's buffers in one native call (a node's: one round trip)."""
        if self.store is None or self.keyed:
            return None
        return NativeCollection(self.store._native, [
            (self.feature_names[f], f, self.pooling[self.feature_names[f]])
            for f in self.features])

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
                else self.store.table(t).rows  # type: ignore[union-attr]
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
        return KeyedTensor(self.features, self.dims, out)

    def _eager(self, features: Any) -> KeyedTensor:
        _not_traced(self)
        if self.is_weighted is not None:
            features = self._weighted(features)
        if self._native is None or self.gpu_tier is not None:
            return self._forward_parts(features)
        # store tables only: one native call reads the KJT's own buffers (CPU tensors in place,
        # no per-table copies), pools and returns the tensor
        try:
            return KeyedTensor(self.features, self.dims, self._native.forward(features))
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
            return KeyedTensor(self.features, self.dims, self.gpu_tier.pool_concat([
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
        return KeyedTensor(self.features, self.dims, out)

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


def _positions(collection: Any, keys: list[str]) -> list[int]:
    """Where each of the collection's features is among a KJT's ``keys`` (traced lookups, whose
    keys are fixed at tracing); a feature the KJT lacks is a typed error naming its table."""
    missing = [f for f in collection.features if f not in keys]
    if missing:
        table = collection.feature_names[missing[0]]
        raise InvalidRequest(f"features have no key {missing[0]!r} for table {table!r}",
                             table=table)
    return [keys.index(f) for f in collection.features]


def _torchrec_class(features: Any, name: str) -> Any:
    """TorchRec's class ``name`` (``KeyedTensor``, ``JaggedTensor``) when ``features`` is
    TorchRec's KeyedJaggedTensor — the types its own collections answer it with — else None."""
    module = type(features).__module__
    return getattr(sys.modules.get(module), name, None) if module.startswith("torchrec.") \
        else None


def _keyed_like(features: Any, out: KeyedTensor) -> Any:
    cls = _torchrec_class(features, "KeyedTensor")
    if cls is None:
        return out
    return cls(keys=out.keys(), length_per_key=out.length_per_key(), values=out.values())


def from_torchrec(module: nn.Module, path: StorePath, *, dtype: str = "fp32",
                  overwrite: bool = False, **open_options: Any) -> nn.Module:
    """A copy of ``module`` — a TorchRec ``EmbeddingBagCollection`` or any module holding them
    (``torchrec.models.dlrm.DLRM``, a model of your own) — whose collections are nearrec's, with
    the same ``forward``: every table is written to a new store at ``path`` (rows stored as
    ``dtype``; ``overwrite`` replaces a store there) and served as ``open_options`` ask
    (``nearrec.open``'s: e.g. ``tier="ssd", dram_budget="1GiB"``). The module itself is left
    as it was; its other parts are copied. A table keeps its config's name unless two
    collections both have one of that name: then it is stored as ``PATH.NAME``, ``PATH`` the
    collection's place in ``module``."""
    try:
        from torchrec.modules.embedding_modules import (
            EmbeddingBagCollection as TorchRecCollection,
        )
    except ImportError as e:
        raise InvalidRequest(f"from_torchrec needs torchrec: {e}") from None
    if not isinstance(module, nn.Module):
        raise InvalidRequest(f"from_torchrec takes a torch module, not {type(module).__name__}")
    found = [(name, m) for name, m in module.named_modules()
             if isinstance(m, TorchRecCollection)]
    if not found:
        raise InvalidRequest(f"{type(module).__name__} holds no TorchRec EmbeddingBagCollection")
    counts = Counter(c.name for _, m in found for c in m.embedding_bag_configs())
    arrays: dict[str, Any] = {}
    collections: list[tuple[Any, list[Any]]] = []
    for name, m in found:
        configs = []
        for c in m.embedding_bag_configs():
            table = c.name if counts[c.name] == 1 else f"{name or 'module'}.{c.name}"
            arrays[table] = m.embedding_bags[c.name].weight.detach().cpu().numpy()
            configs.append(dataclasses.replace(c, name=table))
        collections.append((m, configs))
    from_numpy(path, arrays, dtype, overwrite=overwrite)
    store = open_store(path, **open_options)
    # the copy takes nearrec's collection where the module has TorchRec's
    memo: dict[int, Any] = {id(m): EmbeddingBagCollection(store, configs,
                                                          is_weighted=m.is_weighted())
                            for m, configs in collections}
    return copy.deepcopy(module, memo)


def _check_configs(store: Any, configs: Sequence[Any]) -> None:
    """Each config's dim and rows are its store table's."""
    for c in configs:
        have = store.table(c.name)
        for what, want, got in (("dim", c.embedding_dim, have.dim),
                                ("rows", c.num_embeddings, have.rows)):
            if want != got:
                raise InvalidRequest(f"table {c.name!r}: its config has {what} {want}, the "
                                     f"store's table {got}", table=c.name)


def _features(tables: list[str], feature_names: Mapping[str, str] | None) -> dict[str, str]:
    """Feature -> table, grouped by table in ``tables``' order (TorchRec's output order); one
    feature per table, named as it, without a mapping. Every table needs a feature."""
    mapping = dict(feature_names) if feature_names else {t: t for t in tables}
    unknown = [t for t in mapping.values() if t not in tables]
    if unknown:
        raise UnknownTable(f"feature_names maps features to tables {unknown} the collection "
                           f"does not have (it has {tables})", table=unknown[0])
    out = {f: t for t in tables for f, ft in mapping.items() if ft == t}
    missing = [t for t in tables if t not in out.values()]
    if missing:
        raise InvalidRequest(f"feature_names maps no feature to tables {missing}",
                             table=missing[0])
    return out


def _is_config(c: Any) -> bool:
    return all(hasattr(c, a) for a in ("name", "embedding_dim", "num_embeddings",
                                       "feature_names"))


def _configs(tables: Sequence[Any], feature_names: Any, pooling: Any = "sum") -> list[Any]:
    """TorchRec ``EmbeddingBagConfig`` s checked: names, features, no second source of what
    they say."""
    for i, c in enumerate(tables):
        if not _is_config(c):
            raise InvalidRequest(f"tables are table names or TorchRec EmbeddingBagConfigs (name, "
                                 f"embedding_dim, num_embeddings, feature_names), not "
                                 f"{type(c).__name__} {c!r:.60} at position {i}", position=i)
        if not isinstance(c.name, str) or isinstance(c.feature_names, str) or not all(
                isinstance(f, str) for f in c.feature_names):
            raise InvalidRequest(f"config {i}: name and feature_names must be str and a list of "
                                 f"str, not {c.name!r:.40} and {c.feature_names!r:.40}",
                                 position=i)
        if not c.feature_names:
            raise InvalidRequest(f"table {c.name!r}: its config names no feature", table=c.name)
    if feature_names is not None:
        raise InvalidRequest("the configs name each table's features: pass feature_names only "
                             "with table names")
    if pooling != "sum":
        raise InvalidRequest("the configs give each table's pooling: pass pooling only with "
                             "table names")
    seen: dict[str, str] = {}
    for c in tables:
        for f in c.feature_names:
            if f in seen:
                raise InvalidRequest(f"feature {f!r} is named by tables {seen[f]!r} and "
                                     f"{c.name!r}: a feature reads one table", table=c.name)
            seen[f] = c.name
    return list(tables)


def _pooling(p: Any, table: str) -> PoolingModeName:
    """``"sum"`` / ``"mean"`` / ``"max"``, or TorchRec's ``PoolingType.SUM`` / ``MEAN``."""
    name = p.name.lower() if hasattr(p, "name") and not isinstance(p, str) else p
    if name == "none":
        raise InvalidRequest(f"table {table!r}: pooling NONE is a sequence embedding, which an "
                             "EmbeddingBagCollection does not pool", table=table)
    if name not in ("sum", "mean", "max"):
        raise InvalidRequest(f"table {table!r}: pooling must be 'sum', 'mean', 'max' or "
                             f"TorchRec's PoolingType.SUM / MEAN, not {p!r:.60}", table=table)
    return cast(PoolingModeName, name)


class JaggedTensor:
    """TorchRec's ``JaggedTensor``, as :class:`EmbeddingCollection` returns it: ``values()`` is
    ``[N, dim]``, the rows of every sample's ids back to back; ``lengths()`` the ids per sample.
    ``to_dense()`` gives each sample's ``[length, dim]`` rows, ``to_padded_dense()`` one
    ``[batch, length, dim]`` tensor."""

    def __init__(self, values: Tensor, lengths: Tensor):
        self._values = values
        self._lengths = lengths

    def values(self) -> Tensor:
        return self._values

    def lengths(self) -> Tensor:
        return self._lengths

    def offsets(self) -> Tensor:
        return torch.cat([self._lengths.new_zeros(1), torch.cumsum(self._lengths, 0)])

    def weights_or_none(self) -> Tensor | None:
        return None

    def to_dense(self) -> list[Tensor]:
        return list(torch.split(self._values, self._lengths.tolist()))

    def to_padded_dense(self, desired_length: int | None = None,
                        padding_value: float = 0.0) -> Tensor:
        """``[batch, desired_length, dim]`` (the longest sample's length by default): longer
        samples cut, shorter ones padded with ``padding_value``."""
        return self.padded(desired_length, padding_value)[0]

    def padded(self, desired_length: int | None = None,
               padding_value: float = 0.0) -> tuple[Tensor, Tensor]:
        """:meth:`to_padded_dense` and its mask, ``[batch, length]``: True where a sample has a
        row (what attention over a sequence sums over)."""
        lengths = self._lengths.to(torch.int64)
        values = self._values
        batch, total, dim = lengths.numel(), values.shape[0], values.shape[1]
        n = desired_length if desired_length is not None else \
            int(lengths.max()) if batch else 0
        starts = torch.cumsum(lengths, 0) - lengths
        sample = torch.repeat_interleave(torch.arange(batch, device=lengths.device), lengths,
                                         output_size=total)
        at = torch.arange(total, device=lengths.device) - starts[sample]
        # rows past the length go to one slot beyond the output, dropped (no data-dependent
        # shapes: this traces under torch.compile)
        slot = torch.where(at < n, sample * n + at, batch * n)
        out = values.new_full((batch * n + 1, dim), padding_value)
        out.index_copy_(0, slot, values)
        out = out[:batch * n].view(batch, n, dim)
        mask = torch.arange(n, device=lengths.device)[None, :] < lengths[:, None]
        return out, mask


class EmbeddingCollection(nn.Module):
    """TorchRec's ``EmbeddingCollection`` over a store's tables: unpooled (sequence) embeddings,
    what DIN / DIEN-style behaviour sequences need. ``forward(features)`` takes a
    KeyedJaggedTensor keyed by feature and returns ``{feature: JaggedTensor}``, each id's row
    in order, read where the store keeps it (either tier; one read per table, its features'
    ids together, duplicates read once).

    Tables and features are named as for :class:`EmbeddingBagCollection`: TorchRec's
    ``EmbeddingConfig`` s (``tables=[...]``), ``feature_names={feature: table}``, or one feature
    per table named as the table. A store on a node (:func:`nearrec.connect`) works too.
    """

    def __init__(self, store: Store, tables: Sequence[Any] | None = None,
                 feature_names: Mapping[str, str] | None = None):
        super().__init__()
        if not isinstance(store, Store):
            raise InvalidRequest(f"store must be a nearrec Store, not "
                                 f"{type(store).__name__}")
        if tables is not None and (isinstance(tables, str | bytes)
                                   or not isinstance(tables, Sequence)):
            raise InvalidRequest(f"tables must be a sequence of table names or "
                                 f"EmbeddingConfigs, not {type(tables).__name__} {tables!r:.60}")
        if feature_names is not None and not (isinstance(feature_names, Mapping) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in feature_names.items())):
            raise InvalidRequest(f"feature_names must map str features to str tables, not "
                                 f"{feature_names!r:.60}")
        self._configs: list[Any] | None = None
        if tables is not None and any(not isinstance(t, str) for t in tables):
            self._configs = _configs(tables, feature_names)
            tables = [c.name for c in self._configs]
            feature_names = {f: c.name for c in self._configs for f in c.feature_names}
        self.store = store
        if tables is not None:
            self.tables = [_table_name(t) for t in tables]
        elif feature_names is not None:
            self.tables = list(dict.fromkeys(feature_names.values()))
        else:
            self.tables = list(store.tables)
        for t in self.tables:
            store.table(t)  # an UnknownTable error if missing
        if len(set(self.tables)) != len(self.tables) or not self.tables:
            raise InvalidRequest(f"the collection needs unique tables, not {self.tables}")
        _check_configs(store, self._configs or ())
        #: feature -> the table it reads, in the output's order
        self.feature_names = _features(self.tables, feature_names)
        self.features = list(self.feature_names)
        self.dims = [store.table(self.feature_names[f]).dim for f in self.features]
        self._handle = _register(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[no-untyped-call]  # untyped in torch
        self._handle = _register(self)

    def embedding_configs(self) -> list[Any]:
        """TorchRec's ``EmbeddingConfig`` of each table: the configs given, else made from the
        tables (needs torchrec)."""
        if self._configs is not None:
            return list(self._configs)
        try:
            from torchrec.modules.embedding_configs import EmbeddingConfig
        except ImportError as e:
            raise InvalidRequest(f"embedding_configs() makes TorchRec configs: install "
                                 f"torchrec ({e})") from None
        return [EmbeddingConfig(name=t, embedding_dim=self.store.table(t).dim,
                                num_embeddings=self.store.table(t).rows,
                                feature_names=[f for f in self.features
                                               if self.feature_names[f] == t])
                for t in self.tables]

    def forward(self, features: Any) -> dict[str, Any]:
        """Each feature's rows, as nearrec's :class:`JaggedTensor` s — or TorchRec's own when
        ``features`` is TorchRec's KeyedJaggedTensor."""
        out = self._traced(features) if torch.compiler.is_compiling() else self._eager(features)
        cls = _torchrec_class(features, "JaggedTensor")
        if cls is None:
            return out
        return {f: cls(values=j.values(), lengths=j.lengths()) for f, j in out.items()}

    def _traced(self, features: Any) -> dict[str, JaggedTensor]:
        """Under ``torch.compile`` / ``torch.export``: the rows as one ``nearrec`` op over the
        KJT's tensors (its keys are fixed at tracing)."""
        keys = list(features.keys())
        positions = _positions(self, keys)
        lengths = features.lengths()
        batch = lengths.shape[0] // len(keys)
        rows = torch.ops.nearrec.sequence_lookup(
            self._handle, features.values(), lengths, positions, len(keys))
        return {f: JaggedTensor(r, lengths[k * batch:(k + 1) * batch])
                for f, k, r in zip(self.features, positions, rows, strict=True)}

    def _eager(self, features: Any) -> dict[str, JaggedTensor]:
        _not_traced(self)
        _features_arg(features)
        j = jagged(features)
        position = {k: i for i, k in enumerate(j.keys)}
        spans: dict[str, tuple[int, int, int]] = {}  # feature -> (key position, lo, hi)
        for f in self.features:
            if f not in position:
                raise InvalidRequest(f"features have no key {f!r} for table "
                                     f"{self.feature_names[f]!r}", table=self.feature_names[f])
            k = position[f]
            spans[f] = (k, int(j.bounds[k * j.batch]), int(j.bounds[(k + 1) * j.batch]))
        device = _device_of(features.values())
        out: dict[str, JaggedTensor] = {}
        for table in self.tables:
            mine = [f for f in self.features if self.feature_names[f] == table]
            ids = np.concatenate([j.values[spans[f][1]:spans[f][2]] for f in mine])
            try:
                rows = torch.from_numpy(self.store.read_rows(table, ids))
            except IndexOutOfRange as e:
                raise _at_key(e, table, ids, [(f, *spans[f][1:]) for f in mine]) from None
            if device.type != "cpu":
                rows = rows.to(device)
            at = 0
            for f in mine:
                k, lo, hi = spans[f]
                lengths = torch.from_numpy(np.ascontiguousarray(
                    j.lengths[k * j.batch:(k + 1) * j.batch], dtype=np.int64))
                out[f] = JaggedTensor(rows[at:at + hi - lo], lengths.to(device))
                at += hi - lo
        return {f: out[f] for f in self.features}

    def extra_repr(self) -> str:
        return f"features={self.features}"


def _at_key(e: IndexOutOfRange, table: str, ids: Any,
            spans: list[tuple[str, int, int]]) -> IndexOutOfRange:
    """``e``, raised for ``ids`` (``spans``' features' values back to back), with its position
    among the KeyedJaggedTensor's values and the feature named."""
    at = 0
    for feature, lo, hi in spans:
        if e.position is not None and at <= e.position < at + hi - lo:
            position = lo + e.position - at
            return IndexOutOfRange(f"feature {feature!r} (table {table!r}): id "
                                   f"{ids[e.position]} at position {position} of the "
                                   f"KeyedJaggedTensor's values is out of range ({e.message})",
                                   table=table, position=position)
        at += hi - lo
    return e


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


__all__ = ["EmbeddingBag", "EmbeddingBagCollection", "EmbeddingCollection", "JaggedTensor",
           "KeyedEmbeddingBag", "KeyedJaggedTensor", "KeyedTensor", "from_torchrec",
           "pooled_lookup"]
