"""nearrec: embedding tables larger than memory, pooled where the rows are read.

Quick start::

    import numpy as np, nearrec
    nearrec.from_numpy("/tmp/store", {"t0": np.random.rand(1000, 16).astype(np.float32)})
    store = nearrec.open("/tmp/store")   # or open(path, config=nearrec.StoreConfig(...))
    pooled = store.lookup("t0", np.array([1, 2, 3]), offsets=np.array([0, 2]))  # [2, 16]
"""

from __future__ import annotations

from . import errors
from ._native import __version__
from .build import build, from_numpy, from_state_dict, remove, update
from .config import StoreConfig
from .errors import (
    DeadlineExceeded,
    DeltaFull,
    IndexOutOfRange,
    InvalidRequest,
    InvalidTrace,
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
)
from .keyed import KeyedTable
from .manifest import (
    GcReport,
    StoreInfo,
    TableCheck,
    TableInfo,
    attach,
    gc,
    info,
    read_attachment,
    verify,
)
from .remote import RemotePending, RemoteStore, RemoteTable, connect
from .specs import MODELS, ModelSpec, model_spec
from .store import (
    Changes,
    Compaction,
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
    "Compaction",
    "DeltaFull",
    "GcReport",
    "IndexOutOfRange",
    "InvalidRequest",
    "InvalidTrace",
    "KeyedTable",
    "ModelSpec",
    "NearrecError",
    "Pending",
    "PooledBatch",
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
    "__version__",
    "attach",
    "build",
    "errors",
    "from_numpy",
    "from_state_dict",
    "info",
    "model_spec",
    "open",
    "read_attachment",
    "remove",
    "update",
    "gc",
    "verify",
]
