"""Serving pooled lookups from a store: :class:`Store`, whatever serves it — embedded in this
process (:func:`open_store`, ``nearrec.open``) or a storage node's (``nearrec.connect``). One
class over the store's contract (``nearrec::StoreApi``): the same calls, answers and typed
errors for both, held together by one conformance suite (``tests/test_contract.py``). What only
an embedded store has — its manifest, its config, its tables' memory, the simulated drive,
sub-batches, a caller's model — raises :class:`~nearrec.errors.Unsupported` on a node's."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt

from ._native import NativeStore
from .answers import Changes as Changes  # re-exported: what the store's calls answer
from .answers import Compaction as Compaction
from .answers import FeedCursor as FeedCursor
from .answers import PooledBatch as PooledBatch
from .answers import Synced as Synced
from .answers import Table as Table
from .answers import dense_features as dense_features
from .config import CachePolicy as CachePolicy  # re-exported
from .config import StoreConfig
from .config import Tier as Tier
from .errors import InvalidRequest, UnknownTable, Unsupported
from .manifest import (  # re-exported: the store's on-disk side
    GcReport as GcReport,
)
from .manifest import Leftover as Leftover
from .manifest import StoreInfo, StorePath
from .manifest import TableCheck as TableCheck
from .manifest import TableInfo as TableInfo
from .manifest import attach as attach
from .manifest import gc as gc
from .manifest import info as info
from .manifest import read_attachment as read_attachment
from .manifest import verify as verify
from .request import (  # re-exported: the public names
    OutDtypeName as OutDtypeName,
)
from .request import (
    PoolingModeName as PoolingModeName,
)
from .request import TableLookup as TableLookup
from .request import (
    as_array,
    count,
    flag,
    jagged_lookups,
    key_vector,
    lookups,
    narrowed,
    path_arg,
    progress_enabled,
    text,
)
from .request import (
    out_dtype as out_name,
)
from .units import parse_size

#: What a store can do beyond its core (:attr:`Store.capabilities`).
Capability = Literal["writes", "schema", "versions", "replica", "inference"]


class Store:
    """An open store: embedded in this process (:func:`nearrec.open`: tables resident in DRAM,
    or read from SSD with DRAM tiers in front) or on a storage node (:func:`nearrec.connect`),
    with one surface.

    Safe to share between threads; calls release the GIL. ``with nearrec.open(...) as store:``
    closes it at the end of the block (:meth:`close`).
    """

    def __init__(self, path: StorePath, config: StoreConfig | None = None, *,
                 progress: bool | None = None, **overrides: Any):
        if config is None:
            config = StoreConfig()
        elif not isinstance(config, StoreConfig):
            raise InvalidRequest(f"config is a nearrec.StoreConfig, not {type(config).__name__}")
        if overrides:
            config = config.replace(**overrides)
        native = NativeStore(path_arg(path, "the store path"), config.native(),
                             progress_enabled(progress))
        self._bind(native, config)

    @classmethod
    def _over(cls, native: NativeStore, address: str,
              reduce: Callable[[Store], tuple[Any, ...]]) -> Store:
        """A store another process serves, through ``native``; ``reduce`` pickles it."""
        store = cls.__new__(cls)
        store._bind(native, None, address, reduce)
        return store

    def _bind(self, native: NativeStore, config: StoreConfig | None, address: str | None = None,
              reduce: Callable[[Store], tuple[Any, ...]] | None = None) -> None:
        self._native, self._config, self._reduce = native, config, reduce
        #: the node's address (``host:port``) for a store on a node; ``None`` for an embedded one
        self.address: str | None = address
        self._manifest: StoreInfo | None = None
        self._read_info()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as how it was opened: unpickling opens the store again (a module holding it
        pickles, ``torch.save`` s and runs in a spawned process). An embedded store opens again
        from its path and config, with its own engine and DRAM tiers — read-only there: a
        store has one writer. A node's store connects again (``nearrec.connect``)."""
        if self._reduce is not None:
            return self._reduce(self)
        return (open_store, (self.path, self.config.replace(writable=False)))

    def __copy__(self) -> Store:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Store:
        """The same store: a copied module shares its store, as copied code shares a file."""
        return self

    def __enter__(self) -> Store:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Lets go of what the store holds now, not when its last reference goes: a writable
        store's writer lock (another open, here or in another process, may take it as soon as
        this returns; later writes raise :class:`~nearrec.errors.StoreReadOnly`), a node's
        connection (later calls raise :class:`~nearrec.errors.Unavailable`). An embedded
        store's lookups go on until its last reference goes; one opened with ``hot_set_dir``
        keeps its hot set there, which its next open warms its DRAM tiers from."""
        self._native.close()
        self._writable = False

    def _read_info(self) -> None:
        """What the store serves now (after a create, drop, refresh or swap)."""
        name, tables, version, tier, writable, model, stores, served = self._native.info()
        self._tables = {t[0]: Table(*t) for t in tables}
        self._version, self._tier, self._writable = int(version), str(tier), bool(writable)
        #: the name the store is served as: its directory's, or the node's name for it
        self.name: str = name
        #: whether a model is kept with the store (:meth:`infer`)
        self.has_model: bool = bool(model)
        #: the stores served beside it that the caller may see (a node's)
        self.stores: tuple[str, ...] = tuple(stores)
        path, served_version, versions = served
        #: the directory served now, on the serving side's file system (a node's, for a node's)
        self.served_path: str = path
        #: served from a repository of versions: the version served now (else ``None``) ...
        self.served_version: int | None = served_version
        #: ... and every version the repository holds, lowest first
        self.versions: tuple[int, ...] = tuple(versions)
        self._manifest = None

    @property
    def embedded(self) -> bool:
        """Whether the store is served in this process (:func:`nearrec.open`)."""
        return bool(self._native.embedded)

    @property
    def config(self) -> StoreConfig:
        """The config an embedded store was opened with."""
        if self._config is None:
            raise Unsupported(f"{self._native.describe} does not serve config")
        return self._config

    @property
    def path(self) -> Path:
        """The store's directory (an embedded store's)."""
        p = self._native.path
        if p is None:
            raise Unsupported(f"{self._native.describe} does not serve path")
        return Path(p)

    @property
    def info(self) -> StoreInfo:
        """The manifest as the store serves it now (an embedded store's): its tables' files,
        checksums and layout, how it was made, its attachments."""
        if self._manifest is None:
            self._manifest = StoreInfo._from_json(self.path, self._native.manifest_json)
        return self._manifest

    @property
    def tables(self) -> dict[str, Table]:
        """The tables by name, in store order, as of the last call that changed them or
        :meth:`refresh`."""
        return dict(self._tables)

    def table(self, name: str) -> Table:
        if not isinstance(name, str):
            raise InvalidRequest(f"a table name is a str, not {type(name).__name__} {name!r}")
        if name not in self._tables:
            self._read_info()  # another writer may have created it
        try:
            return self._tables[name]
        except KeyError:
            raise UnknownTable(
                f"unknown table {name!r}; the store has: {', '.join(self._tables)}", table=name
            ) from None

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What the store can do beyond lookups, info and counters (a read-only store):
        ``"writes"`` (writes, removals, compaction, ``sync_table``), ``"schema"`` (tables
        created and dropped), ``"versions"`` (swaps, pinned lookups), ``"replica"`` (a shard
        replica's verbs), ``"inference"`` (the kept model run and updated). An embedded store
        and a node's have every one (a read-only store refuses writes, typed, when asked); a
        sharded store is no replica (its tables are created and dropped as a new plan every
        shard moves to). A call a store has no capability
        for raises :class:`Unsupported` naming it."""
        return frozenset(cast("list[Capability]", self._native.capabilities))

    @property
    def threads(self) -> int:
        """Pooling threads (an embedded store's)."""
        return int(self._native.threads)

    @property
    def tier(self) -> Tier:
        """Where rows are served from: ``"dram"`` or ``"ssd"`` (``"auto"`` resolved at open)."""
        return "ssd" if self._tier == "ssd" else "dram"

    # --- live stores (docs/live.md) ---------------------------------------------------------

    @property
    def version(self) -> int:
        """The number of the last write applied (0 before any): every lookup that starts now
        sees it and everything before it."""
        return int(self._native.version())

    @property
    def writable(self) -> bool:
        return self._writable

    def write(self, table: str, ids: Any, rows: Any, *, allow_nonfinite: bool = False) -> int:
        """EMB_WRITE: rows ``ids`` of ``table`` become ``rows`` (``[len(ids), dim]`` floats,
        encoded with the table's dtype: int8 / int4 / int2 rows re-quantised row-wise, fp8
        rounded). Atomic and durable when it returns (``durability``), and seen by every lookup
        that starts after. NaN and infinite values are refused unless ``allow_nonfinite``.
        Returns the store's new version. Needs a store opened with ``writable=True``."""
        return self.write_many({table: (ids, rows)}, allow_nonfinite=allow_nonfinite)

    def write_many(self, writes: Mapping[str, tuple[Any, Any]], *,
                   allow_nonfinite: bool = False) -> int:
        """Several tables' rows in one atomic call (all of them or none): ``{table: (ids,
        rows)}``, each as :meth:`write` takes them (``None`` rows remove the ids, as
        :meth:`remove` does).

        A keyed table's ids are keys: a key it holds has its row written (or, removed, is let
        go of: unknown from then on, its row free); a new key takes a free row — once admitted
        (``key_limits``), else its row is dropped, counted — and at the table's cap evicts a
        key or, with eviction off, fails the whole call with
        :class:`~nearrec.errors.KeysFull` naming it. ``tables[t].keys`` follows."""
        version = int(self._native.write_many(writes, flag(allow_nonfinite, "allow_nonfinite")))
        if isinstance(writes, Mapping) and any(
                t in self._tables and self._tables[t].keyed for t in writes):
            self._read_info()  # the keys held changed
        return version

    def remove(self, table: str, ids: Any) -> int:
        """EMB_REMOVE: rows ``ids`` of ``table`` pool as zero rows until written again
        (counted in ``stats()["removed_served"]``); a keyed table's keys are let go of.
        Atomic and durable like :meth:`write`; returns the new version."""
        return self.write_many({table: (ids, None)})

    def create_table(self, name: str, rows: int, dim: int, dtype: str = "fp32", *,
                     init: str = "uniform", seed: int = 0) -> int:
        """RM_create_table: a new table of ``rows`` × ``dim`` values stored as ``dtype``, every
        value drawn from DeepRecInfra's U(−√(1/rows), √(1/rows)) seeded with ``seed``
        (``init="uniform"``) or 0 (``init="zeros"``), served from the next lookup on (on the SSD
        tier with no DRAM tiers in front of it). Everything written before is compacted first
        and writes wait meanwhile. Durable when it returns; returns the version that made it."""
        inits = {"uniform": count(seed, "seed", minimum=0), "zeros": None}
        if text(init, "init") not in inits:
            raise InvalidRequest(f'init is "uniform" or "zeros", not {init!r}', table=name)
        return self._change(lambda: self._native.create_table(
            text(name, "name"), count(rows, "rows"), count(dim, "dim"), text(dtype, "dtype"),
            inits[init]))

    def drop_table(self, name: str) -> int:
        """EMB_REMOVE of a table: lookups under way finish on it, later ones raise
        :class:`nearrec.errors.UnknownTable`; its files go. Compacts first, like
        :meth:`create_table`; returns the new version."""
        return self._change(lambda: self._native.drop_table(text(name, "name")))

    def swap(self, path: StorePath | None = None, *, version: int | None = None,
             warm: bool = True, force: bool = False) -> int:
        """Serves the store at ``path`` (a new version built offline, e.g. a retrained model's
        tables) — or, for a store opened from a repository of versions (``REPO/NAME``, see
        :func:`nearrec.publish`), its version ``version`` — from the next call on: lookups under
        way finish on the old one, none fails.
        With ``warm``, the new store's row caches first get the rows the old one's DRAM tiers
        hold, read from the new files, so that the switch does not start cold. A writable store
        takes the new store's writer lock and log and lets the old one's go. The new store must
        answer every request this one answers — each table with the same dim and dtype and at
        least its rows, the same model inputs — or the swap is refused with
        :class:`InvalidRequest` naming the difference; ``force`` serves it anyway. Returns the
        version now served: of a repository, its number (:attr:`served_version`); else the new
        store's count of writes (:attr:`version`). On a node's store, ``path`` is on the node's
        file system: the node takes it only from the store's own repository of versions or
        from under its swap root
        (``nearrec serve --swap-root``, or ``[swap_roots]`` in the node's config; a relative
        ``path`` is taken from there), never from a directory another served store uses, and
        only for a caller who may read what it exposes.

        From a repository, the swap names a version (a path must be one of its versions'
        directories), and the repository's ``CURRENT`` pointer names it, atomically, before it
        is served: a restart serves it too, and a refused swap leaves the pointer as it was.
        With the config's ``keep_last``, versions beyond the newest few are removed once no
        call reads them. :attr:`served_version` says what is served."""
        if (path is None) == (version is None):
            raise InvalidRequest("swap to a path or to a version (one of them)")
        where = None if path is None else path_arg(path, "the store path")
        number = None if version is None else count(version, "version", minimum=1)
        self._change(lambda: self._native.swap(where, number, False, flag(warm, "warm"),
                                               flag(force, "force")))
        return self._served()

    def rollback(self, *, warm: bool = True, force: bool = False) -> int:
        """Serves the version served before the current one, for a store opened from a
        repository of versions, as :meth:`swap` would (checked unless ``force``, the pointer
        replaced atomically); each rollback goes one further back. Raises
        :class:`InvalidRequest` when none served before is left. Returns the version now
        served."""
        self._change(lambda: self._native.swap(None, None, True, flag(warm, "warm"),
                                               flag(force, "force")))
        return self._served()

    def _served(self) -> int:
        """What a swap returns: the repository version served, else the count of writes."""
        return self.served_version if self.served_version is not None else self.version

    def _change(self, call: Callable[[], int]) -> int:
        try:
            return int(call())
        finally:
            self._read_info()

    def refresh(self) -> int:
        """A store opened read-only (its writer in another process) moves to the newest
        version the writer has logged (with the tables it created or dropped); returns it.
        Lookups in flight finish on the version they started with."""
        return self._change(self._native.refresh)

    def sync_table(self, table: str, values: Any, *, tolerance: float = 0.0) -> Synced:
        """A training feed: writes the rows of ``table`` that differ from ``values`` (the
        whole table, ``[rows, dim]`` floats, as a trainer holds it) by more than ``tolerance``
        in any value — compared as the table stores them, so an fp16 or int8 table is not
        rewritten for its rounding — in atomic, durable calls of up to 16,384 rows."""
        return Synced(*self._native.sync_table(text(table, "table"), values, tolerance))

    def update_model(self, weights: Mapping[str, Any]) -> None:
        """Replaces dense weights of the model kept with the store (:func:`nearrec.models.save`)
        by name — a trainer's update of the dense part, here or on a node: ``weights`` maps
        each name to a float array (a tensor, a numpy array) of the kept weight's shape; the
        rest stay. A name is the kept one, or ends with it after a dot (a checkpoint of a
        wrapper: ``model.over_arch.0.weight``). Refused whole — an unknown name, another shape,
        a NaN — naming the weight; durable when it returns, and every inference after it runs
        the new weights. The store must be writable and keep a model."""
        if not isinstance(weights, Mapping) or not weights:
            raise InvalidRequest(f"update_model takes a mapping of weight names to arrays, not "
                                 f"{weights!r:.60}")
        arrays = []
        for name, value in weights.items():
            if callable(getattr(value, "detach", None)):  # a torch tensor
                value = value.detach().cpu().numpy()
            arr = as_array(value, f"weight {name!r}")
            if arr.dtype.kind not in "fiu":
                raise InvalidRequest(f"weight {name!r} is {arr.dtype}, not numbers")
            arrays.append((text(name, "a weight's name"),
                           np.ascontiguousarray(arr, dtype=np.float32)))
        self._native.update_model(arrays)

    def changes_since(self, version: int) -> Changes:
        """What changed since ``version`` (one this store served), for a cache kept above it
        — the GPU tier drops those rows before its next batch. See :class:`Changes`."""
        v, base, engine, rows = self._native.changes_since(count(version, "version", minimum=0))
        return Changes(v, base, engine, None if rows is None else dict(rows))

    def compact(self) -> Compaction:
        """Folds every write so far into new table files (copy-on-write: lookups go on, on the
        old files until the switch) and moves the tables' base to the current version: the
        delta's memory is freed and the write-ahead log released. A writable store also
        compacts by itself when its delta is half full (``auto_compact``)."""
        done = Compaction(*self._native.compact())
        if any(t.keyed for t in self._tables.values()):
            self._read_info()  # keys past their TTL were let go of
        return done

    def feed_status(self) -> dict[str, FeedCursor]:
        """Each delta feed applied to the store (``nearrec feed``, :func:`nearrec.feed.apply`),
        by name, with the last delta file it applied: its sequence, the producer's step and
        wall time, and when the store logged it (``FeedCursor.lag_seconds``)."""
        return {name: FeedCursor(sequence, step, wall, applied, rows)
                for name, sequence, step, wall, applied, rows in self._native.feed_status()}

    def advance_clock(self, seconds: int) -> int:
        """Moves the clock keyed tables' TTLs and admission windows read ``seconds`` ahead — a
        store opened with ``manual_clock=True`` (tests); returns the Unix time it reads now.
        Keys past their TTL are let go of at the next :meth:`compact`."""
        return int(self._native.advance_clock(count(seconds, "seconds", 0, 2**40)))

    def live_stats(self) -> dict[str, float]:
        """``version`` and ``base_version`` (what the table files hold); the write-ahead log's
        ``log_bytes``, ``log_records``, ``log_groups`` (appends that shared one write),
        ``log_syncs`` and ``log_segments``; the deltas' ``delta_rows`` and ``delta_bytes``; rows
        served from them (``delta_served``), removed rows among those (``removed_served``);
        ``compactions`` run (or, read-only, followed), ``compacted_rows``, ``compaction_bytes``
        written and ``compaction_seconds``; with a ``scrub_rate``, the scrub's ``scrub_rate``,
        ``scrub_passes`` finished, ``scrub_bytes`` checked, ``scrub_damaged`` (damaged tables
        found, every pass counted) and ``scrub_last_damaged`` (those of the last pass)."""
        return dict(self._native.live_stats())

    def stats(self) -> dict[str, float | str | bool]:
        """Every counter since open: the ``device`` (``io_uring``, ``pread``, ``flash-model``;
        ``dram`` for a DRAM-resident store), ``direct_io`` and ``block_bytes``; the SSD tier's
        ``device_reads``, ``bytes_read``, ``useful_bytes``, ``read_amplification``, reads saved
        by de-duplication and merging, ``lookups``, ``unique_rows``, and p50 / p95 / p99 /
        p99.9 latencies in µs of the stages ``route``, ``io_wait``, ``pool`` and
        ``end_to_end``; the DRAM tiers' totals; the live store's counters
        (:meth:`live_stats`); and with keyed tables, ``keyed_keys``, ``keyed_index_bytes``,
        ``keyed_hits`` and the unknown keys answered ``unknown_keys_zero`` / ``_init`` or
        ``unknown_keys_refused``."""
        return dict(self._native.stats())

    def flash_stats(self) -> dict[str, Any] | None:
        """On a simulated drive (``open(..., device=...)``): its simulated time and traffic —
        ``batches``, ``commands``, ``flash_reads``, ``channel_bytes``, ``link_bytes``,
        ``busy_ns`` (simulated), ``batch_ns`` (per batch), ``inner_ns`` (real time spent
        fetching the bytes), ``callback_ns`` (real time pooling rows as they land) and
        ``served_ns`` (simulated, with that pooling overlapping the reads). ``None`` otherwise."""
        text = self._native.flash_stats()
        return None if text is None else json.loads(text)

    def lookup(
        self,
        table: str,
        indices: Any,
        offsets: Any = None,
        per_sample_weights: Any = None,
        mode: PoolingModeName = "sum",
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        lengths: Any = None,
        out_dtype: OutDtypeName | Any = None,
    ) -> npt.NDArray[Any]:
        """Pools the bags of one table exactly as ``torch.nn.EmbeddingBag`` does; returns
        ``[batch, dim]`` float32, or in ``out_dtype`` (see :meth:`lookup_many`)."""
        req = TableLookup(table, indices, offsets, lengths, per_sample_weights, mode,
                          include_last_offset, padding_idx)
        return self.lookup_many([req], out_dtype=out_dtype).values

    def lookup_many(self, requests: Sequence[TableLookup] | Mapping[str, Any],
                    sub_batch: int | None = None,
                    out_dtype: OutDtypeName | Any = None) -> PooledBatch:
        """Pools several tables' bags in one call (one bag per sample per table), in parallel;
        returns the ``[batch, Σ dim]`` output with per-table views.

        ``requests`` is a sequence of :class:`TableLookup`, or a mapping from table name to
        ``indices``, ``(indices, offsets)`` pairs or :class:`TableLookup`. With ``sub_batch``,
        the bags are cut into sub-batches of that many that flow through two at a time (one
        reading while the other pools; useful for large batches on the SSD tier).

        ``out_dtype`` (``"fp32"`` by default, ``"fp16"``, ``"bf16"``, ``"int8"``, or a numpy or
        torch dtype) is the answer's: the bags are pooled in float32 where the rows are and each
        value rounded once before it leaves — so a storage node sends half or about a quarter
        of the bytes. fp16 answers are ``float16`` arrays, bf16 ones ``ml_dtypes.bfloat16``;
        int8 answers are each bag's vector of each table quantised row-wise as FBGEMM's
        ``FloatToFused8BitRowwiseQuantized`` does, sent with its scale and bias, and come back
        dequantised as ``Fused8BitRowwiseQuantizedToFloat`` does, float32.
        """
        reqs = lookups(requests)
        sub = None if sub_batch is None else count(sub_batch, "sub_batch")
        out = out_name(out_dtype)
        return self._pooled(self._native.lookup(reqs, sub, out), reqs, out)

    def lookup_rows(self, requests: Sequence[TableLookup] | Mapping[str, Any]
                    ) -> list[tuple[str, npt.NDArray[np.int64], npt.NDArray[np.float32]]]:
        """Each table's distinct rows the batch reads, ``(table, ids ascending, [n, dim]
        rows)``, in request order — for a client that pools itself."""
        rows, _version = self._native.lookup_rows(lookups(requests))
        return [(str(t), ids, values) for t, ids, values in rows]

    def infer(self, dense: Any, features: Any, model: Any = None) -> npt.NDArray[np.float32]:
        """Whole-model offload (RM-SSD): runs a model's bottom MLP, interaction and top MLP in
        the engine, next to the embeddings, and returns only its outputs, ``[batch, outputs]``.

        By default the model kept with this store (:func:`nearrec.models.save`) runs, read from
        the store by the engine on first use; ``model`` is a :class:`nearrec.models.Offloaded`
        to run another (``nearrec.models.offload(model)``). ``dense`` is the ``[batch,
        dense_width]`` float32 features (``None`` for NCF); ``features`` a KeyedJaggedTensor
        whose keys name the model's inputs (its tables; a captured model's features, pooled as
        the model does), or one :class:`TableLookup` per model input, in any order: each is
        matched to its input by name (a missing, unknown or repeated one is an
        :class:`~nearrec.errors.InvalidRequest` naming it).
        """
        if model is not None and not (hasattr(model, "native") and hasattr(model, "requests")):
            if not callable(getattr(model, "offload", None)):
                raise InvalidRequest(f"model is a nearrec.models model or its Offloaded form, "
                                     f"not {type(model).__name__}")
            model = model.offload()
        if model is not None:
            return self._infer(model.native, dense, *model.requests(features))[0]
        if isinstance(features, Sequence) and not isinstance(features, str | bytes):
            reqs = lookups(features)
        else:
            reqs = jagged_lookups(features)
        return self._infer(None, dense, reqs)[0]

    def _infer(self, native_model: Any, dense: Any, reqs: Sequence[TableLookup],
               in_order: bool = False) -> tuple[npt.NDArray[np.float32], dict[str, float]]:
        """The engine's ``infer``: outputs and the seconds per part (``native_model`` None: the
        stored model); ``reqs`` matched to the model's inputs by name, or taken as they are
        with ``in_order``."""
        out, times = self._native.infer(native_model, dense_features(dense), list(reqs), in_order)
        return out, dict(times)

    def submit(self, requests: Sequence[TableLookup] | Mapping[str, Any],
               out_dtype: OutDtypeName | Any = None) -> Pending:
        """Starts :meth:`lookup_many` in the background and returns at once; ``.result()`` on
        the handle collects the :class:`PooledBatch` (or raises the lookup's error). Batches
        submitted together run concurrently: the reads of one overlap the pooling of another
        and whatever the caller does meanwhile. Malformed requests raise here, as
        :meth:`lookup_many` would."""
        reqs = lookups(requests)
        out = out_name(out_dtype)
        return Pending(self, self._native.submit(reqs, out), reqs, out)

    def lookup_stream(self, batches: Iterable[Sequence[TableLookup] | Mapping[str, Any]],
                      depth: int = 2,
                      out_dtype: OutDtypeName | Any = None) -> Iterator[PooledBatch]:
        """The results of ``batches`` in order (each in ``out_dtype``), keeping ``depth`` of
        them in flight: batch i + 1 is read while the caller works on batch i."""
        depth = count(depth, "depth")
        out = out_name(out_dtype)
        if not isinstance(batches, Iterable):
            raise InvalidRequest(f"batches must be an iterable of batches, not "
                                 f"{type(batches).__name__}")
        sent: deque[list[TableLookup]] = deque()

        def feed() -> Iterator[list[TableLookup]]:
            for b in batches:
                sent.append(lookups(b))
                yield sent[-1]

        native = self._native.stream(feed(), depth, out)
        return (self._pooled(values, sent.popleft(), out) for values in native)

    def _pooled(self, values: npt.NDArray[np.float32], reqs: Sequence[TableLookup],
                out: str | None = None) -> PooledBatch:
        keys = tuple(r.table for r in reqs)
        tables = self._tables
        dims = tuple(tables[k].dim if k in tables else self.table(k).dim for k in keys)
        return PooledBatch(narrowed(values, out), keys, dims)

    def tier_report(self) -> list[dict[str, Any]]:
        """Per table, the DRAM tiers in front of the SSD tier: what they hold (``resident``,
        ``hot_rows``, ``cache_rows``, ``bytes``), the lookups each tier served
        (``lookups_resident`` / ``_hot`` / ``_cache`` / ``_ssd``) and the row cache's counters
        (``cache_hits``, ``_misses``, ``_admissions``, ``_rejections``, ``_evictions``). Empty
        for a DRAM-resident store."""
        return [dict(r) for r in self._native.tier_report()]

    def scrub(self, rate: int | str = 0) -> list[TableCheck]:
        """One scrub pass where the store's data lies — this process's disk, a storage node's
        (its own disk, read there: nothing but the checks crosses the network), or every
        replica of a sharded store's (each check naming its node): every table read from the
        device at most ``rate`` bytes a second (a size such as ``"64MiB"``; 0: as fast as the
        disk goes) and checked against its sector checksums, as :func:`nearrec.scrub` checks a
        store directory. It changes nothing; lookups go on meanwhile."""
        checks = self._native.scrub(parse_size(rate))
        return [TableCheck(*c) for c in checks]

    def read_rows(self, table: str, rows: Any) -> npt.NDArray[np.float32]:
        """The given rows of a table, decoded to float32: ``[len(rows), dim]``. ``rows`` is a
        1-D int32 / int64 array or a list of ints (floats, bools and unsigned ids are refused,
        not cast)."""
        self.table(table)
        return self._native.read_rows(table, rows)

    def key_rows(self, table: str, keys: Any) -> npt.NDArray[np.int64]:
        """The row each of keyed table ``table``'s ``keys`` holds now, −1 for a key it does not
        hold — as a lookup resolves them, but no key is sighted, admitted or counted. ``keys``:
        a 1-D int64 array (uint64 taken as its bits) or a list of ints. An embedded store's
        (``Unsupported`` over a node); a table addressed by row is an ``InvalidRequest``. A key
        keeps its row until it is let go of, so this is how a keyed trace's keys become the
        rows a plan pins (``nearrec plan``)."""
        self.table(table)
        return self._native.key_rows(table, key_vector(keys, table))

    def table_array(self, name: str) -> npt.NDArray[np.float32]:
        """A read-only zero-copy ``[rows, dim]`` view of a dense fp32 table."""
        self.table(name)
        return self._native.table_array(name)

    def __repr__(self) -> str:
        return f"Store({self._native.describe!r}, tables={len(self._tables)})"


def open_store(path: StorePath, config: StoreConfig | None = None, *,
               progress: bool | None = None, **overrides: Any) -> Store:
    """Opens the store at ``path`` and validates it.

    ``tier="auto"`` (the default) serves the store from DRAM when its tables fit
    ``dram_budget`` (bytes, or a size such as ``"4GiB"``; by default half of this machine's
    memory) and from SSD otherwise. ``tier="dram"`` loads every table into DRAM (``threads`` = 0
    uses every core; ``verify_checksums`` checks each table's CRC-32C as it loads).
    ``tier="ssd"`` loads nothing: each batch reads the blocks holding its rows from the table
    files with direct I/O (io_uring, or pread threads where io_uring or ``O_DIRECT`` is
    unavailable), up to ``io_queue_depth`` reads in flight per ring, ``io_rings`` rings (batches
    reading at once; ``pread_threads`` threads for the fallback), merging reads of rows at most
    ``merge_gap_bytes`` apart. ``direct_io=False`` reads through the page cache, and
    ``dedup=False`` / ``merge=False`` read every lookup's row on its own (all three for
    comparisons only).

    On the SSD tier, DRAM tiers in front of the files share ``dram_budget`` (for
    ``tier="auto"`` by default half of memory; for an explicit ``tier="ssd"`` none unless
    given): tables small enough are kept whole, and the rest of the budget becomes a row cache
    per table, in proportion to the tables' sizes. The caches are set-associative
    (``cache_ways`` slots a set) with ``cache_policy`` ``"lru"``, ``"lfu"``, ``"lru_pa"`` or
    ``"lfu_pa"`` (the ``_pa`` ones admit a miss into a full set with probability
    ``admission_probability``). ``plan`` replaces that split: a plan file written by
    ``nearrec plan`` (:mod:`nearrec.plan`), or per table ``{"resident": bool, "hot_rows": row ids
    to pin (RecSSD's static partition), "cache_bytes": size}``; with an explicit
    ``dram_budget`` it must fit it. :meth:`Store.stats` and :meth:`Store.tier_report`
    say what each tier served.

    ``device`` serves the SSD tier from a simulated drive instead of the disk (the flash device
    model, :mod:`nearrec.simulate`: a preset name such as ``"rm-ssd"`` or a parameter set): the
    tables' bytes are read into memory and each batch's reads are timed by the model;
    :meth:`Store.flash_stats` reports the simulated time.

    ``verify_reads`` (on by default) checks every read of the SSD tier against the table's
    sector checksums as it lands (format version 3 stores; older ones are unprotected, which
    ``stats()["unprotected_tables"]`` counts): damaged data fails the batch with
    :class:`nearrec.errors.StoreCorrupted` naming the table and row, counted in
    ``stats()["corrupt_reads"]``. The checksums take 4 bytes of memory per 512 bytes of table.

    ``writable=True`` opens the store for :meth:`Store.write`, :meth:`Store.write_many` and
    :meth:`Store.remove` (one writing process per store, held by a lock the kernel drops however
    the process ends; other processes open it read-only and move to the newest version with
    :meth:`Store.refresh`). A call is durable when it returns: ``durability="sync"`` syncs the
    write-ahead log before (calls on many threads share one sync), ``"async"`` leaves it in the
    kernel, on disk within ``durability_window_ms``. Written rows wait in memory
    (``delta_budget`` bytes) until a compaction folds them into new table files
    (:meth:`Store.compact`; by itself when the delta is half full with ``auto_compact``, at most
    ``compaction_rate`` bytes a second); a call that does not fit waits up to ``write_wait_ms``
    for room, then fails with :class:`nearrec.errors.DeltaFull`, applying nothing.
    """
    return Store(path, config, progress=progress, **overrides)


class Pending:
    """A submitted batch. :meth:`result` waits for it and returns its :class:`PooledBatch`, or
    raises the error the lookup raised (typed, as a direct call would)."""

    def __init__(self, store: Store, native: Any, reqs: list[TableLookup], out: str | None):
        self._store, self._native, self._reqs, self._out = store, native, reqs, out

    def done(self) -> bool:
        return bool(self._native.done())

    def result(self, timeout: float | None = None) -> PooledBatch:
        return self._store._pooled(self._native.result(timeout), self._reqs, self._out)
