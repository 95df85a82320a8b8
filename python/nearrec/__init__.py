"""nearrec: embedding tables larger than memory, pooled where the rows are read.

Quick start::

    import numpy as np, nearrec
    nearrec.from_numpy("/tmp/store", {"t0": np.random.rand(1000, 16).astype(np.float32)})
    store = nearrec.open("/tmp/store")   # or open(path, config=nearrec.StoreConfig(...))
    pooled = store.lookup("t0", np.array([1, 2, 3]), offsets=np.array([0, 2]))  # [2, 16]

A store on a storage node is the same :class:`Store`: ``nearrec.connect("host:port", "name")``.

The modules, lowest layer first: each imports only from the layers before it
(``[tool.importlinter]`` in ``pyproject.toml`` holds them to it; braces: none of each other).

- ``errors``: the exception tree; a Rust error's class is the name its ``nearrec::ErrorKind``
  gives (``tests/test_errors.py`` holds the two in step). ``_native``: the Rust extension
  (``crates/nearrec-py``), typed by ``_native.pyi``.
- {``units``, ``request``, ``specs``}: sizes such as ``"4GiB"`` (parsed by Rust);
  :class:`TableLookup` (native, with torch's defaults) and the conversion of every other
  argument; the eight benchmark models' shapes.
- ``config``: :class:`StoreConfig`, the mirror of Rust's (defaults read from Rust, values checked
  by Rust, TOML in and out).
- {``manifest``, ``answers``}: a store on disk without opening it: :func:`info`, :func:`attach` /
  :func:`read_attachment`, :func:`verify`, :func:`scrub`, :func:`gc`; a repository of versions:
  :func:`publish`, :func:`versions`. What a store's calls answer: ``Table``, ``PooledBatch``,
  ``Changes``, ``Synced``, ``Compaction``.
- {``store``, ``keyed``}: :class:`Store`, one class over the store's contract
  (``nearrec::StoreApi``) whatever serves it — ``open``, lookups, ``submit`` → ``Pending``,
  ``lookup_stream``, ``infer``, writes, swaps, stats — each a call of the binding's
  ``NativeStore`` (a keyed table's lookups name raw 64-bit keys); :class:`KeyedTable`, rows
  by unbounded 64-bit ids held in DRAM alone, and ``keyed.index_bytes``, the DRAM a store's
  keyed table's index takes.
- {``build``, ``trace``, ``remote``, ``gpu``}: :func:`from_numpy`,
  :func:`from_state_dict` (both take ``keys=`` for keyed tables), :func:`from_encoded` (rows
  already quantised, as FBGEMM writes them), :func:`build`, :func:`update`, :func:`remove`;
  ``nearrec.trace`` (generators, ``.nrtrace``
  files, FBGEMM conversion, profiles); :func:`connect` and the pickling of a node's store
  (``RemoteStore`` is a deprecated alias of :class:`Store`); ``nearrec.gpu``, the HBM tier.
- {``distributed``, ``feed``}: a store cut into shards (``plan_shards``, ``shard``,
  ``load_plan``) and ``connect``, a :class:`Store` over the Rust router that serves it from
  several nodes; ``nearrec.feed``, a trainer's delta files applied to a store each once
  (``apply``, ``watch``) and written by its training loop (``Publisher``).
- ``nearrec.torch``: ``EmbeddingBag``, ``KeyedEmbeddingBag``, ``EmbeddingBagCollection`` and
  ``EmbeddingCollection`` over a store, ``KeyedJaggedTensor``; ``from_torchrec``; the
  ``nearrec::`` custom ops that ``torch.compile`` / ``torch.export`` see.
- ``capture``: a user's model traced by ``torch.export`` into the engine's dense program.
- {``nearrec.models``, ``plan``, ``simulate``, ``datasets``, ``ray``, ``triton``}: the eight
  benchmark models as PyTorch modules, ``save`` / ``load`` with a store, ``infer`` pipelined,
  ``offload`` whole into the engine; ``nearrec.plan`` (the planner and plan files, co-located
  copies); ``nearrec.simulate`` (the flash device model); ``nearrec.datasets`` (Criteo, FBGEMM
  files, MovieLens-100K); ``nearrec.ray`` (a sharded store's nodes as Ray actors:
  ``ShardedStore.launch``); ``nearrec.triton`` (a Triton model repository from a store: ``export``).
- ``cli``: the ``nearrec`` command (``cli/__init__.py`` the command tree, the verbs by what they
  touch in ``stores``, ``serving``, ``workloads``).
"""

from __future__ import annotations

from . import errors
from ._native import __version__
from .build import Updated, build, from_encoded, from_numpy, from_state_dict, remove, update
from .config import StoreConfig
from .errors import (
    DeadlineExceeded,
    DeltaFull,
    IndexOutOfRange,
    InvalidRequest,
    InvalidTrace,
    KeysFull,
    MembershipChanged,
    NearrecError,
    Overloaded,
    PermissionDenied,
    StoreCorrupted,
    StoreExists,
    StoreIOError,
    StoreLocked,
    StoreNotFound,
    StoreReadOnly,
    TableFull,
    Unauthenticated,
    Unavailable,
    UnknownKey,
    UnknownTable,
    Unsupported,
    UnsupportedVersion,
    VersionNotServed,
)
from .keyed import KeyedTable
from .manifest import (
    GcReport,
    QuantError,
    StoreInfo,
    TableCheck,
    TableInfo,
    Versions,
    attach,
    gc,
    info,
    publish,
    read_attachment,
    scrub,
    verify,
    versions,
)
from .remote import RemotePending, RemoteStore, RemoteTable, connect
from .specs import MODELS, ModelSpec, model_spec
from .store import (
    Changes,
    Compaction,
    FeedCursor,
    Pending,
    PooledBatch,
    Store,
    Synced,
    Table,
    TableLookup,
)
from .store import open_store as open  # noqa: A001  (nearrec.open mirrors the builtin's role)

__all__ = [
    "DeadlineExceeded",
    "Overloaded",
    "PermissionDenied",
    "RemotePending",
    "RemoteStore",
    "RemoteTable",
    "Table",
    "Unauthenticated",
    "Unavailable",
    "connect",
    "MODELS",
    "Changes",
    "FeedCursor",
    "Compaction",
    "DeltaFull",
    "KeysFull",
    "GcReport",
    "IndexOutOfRange",
    "InvalidRequest",
    "InvalidTrace",
    "MembershipChanged",
    "KeyedTable",
    "ModelSpec",
    "NearrecError",
    "Pending",
    "PooledBatch",
    "QuantError",
    "Store",
    "StoreConfig",
    "StoreCorrupted",
    "StoreExists",
    "StoreIOError",
    "StoreInfo",
    "Synced",
    "StoreLocked",
    "StoreNotFound",
    "StoreReadOnly",
    "TableCheck",
    "TableFull",
    "TableInfo",
    "TableLookup",
    "UnknownKey",
    "UnknownTable",
    "Unsupported",
    "UnsupportedVersion",
    "Updated",
    "VersionNotServed",
    "__version__",
    "attach",
    "build",
    "errors",
    "from_encoded",
    "from_numpy",
    "from_state_dict",
    "info",
    "model_spec",
    "open",
    "read_attachment",
    "remove",
    "update",
    "gc",
    "scrub",
    "verify",
    "Versions",
    "publish",
    "versions",
]
