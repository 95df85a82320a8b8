"""A store served by a storage node: :func:`connect` returns a :class:`RemoteStore`, which has
the surface of a local :class:`~nearrec.Store` — lookups, background lookups and streams, the
stored model's inference, writes, stats — each call one round trip to the node, the bags pooled
where the rows are read. Errors arrive as the local store raises them (``IndexOutOfRange``
naming the table and position, ``UnknownTable``, ...) plus the node's own refusals:
:class:`~nearrec.errors.Unauthenticated` and :class:`~nearrec.errors.PermissionDenied`
(``PermissionError``), :class:`~nearrec.errors.DeadlineExceeded` (``TimeoutError``),
:class:`~nearrec.errors.Overloaded` and :class:`~nearrec.errors.Unavailable`
(``ConnectionError``: retry). The client is the native module's (Rust, tonic): no grpcio needed.
"""

from __future__ import annotations

import dataclasses
import os
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ._native import NativeRemote, NativeRemotePending
from .errors import InvalidRequest, Unauthenticated, UnknownTable
from .request import (
    PoolingModeName,
    TableLookup,
    as_array,
    count,
    flag,
    regular_file,
    text,
)
from .store import PooledBatch, _ids, jagged_lookups, lookups, row_ids, write_calls

#: Where a :class:`RemoteStore` unpickled in another process takes its bearer token from: a
#: token never travels in a pickle (nor a ``torch.save``'d module).
TOKEN_ENV = "NEARREC_TOKEN"

#: Each call's deadline in seconds when :func:`connect` is given none: a node that stops
#: answering (hung, stopped, partitioned away) fails the call with
#: :class:`~nearrec.errors.DeadlineExceeded` instead of blocking its caller for ever.
DEFAULT_TIMEOUT = 30.0


@dataclass(frozen=True)
class _Connection:
    """How a :class:`RemoteStore` was connected, less its token: what its pickle carries.
    Certificates travel as the paths they were read from; ``timeout`` is the deadline the
    calls got (:data:`DEFAULT_TIMEOUT` when none was given, ``None`` for none), so that a
    store connected again keeps it."""

    address: str
    store: str
    token: bool
    timeout: float | None
    tls_ca: str | None
    tls_cert: str | None
    tls_key: str | None
    tls_domain: str | None


@dataclass(frozen=True)
class RemoteTable:
    """A table of a remote store, as its node describes it."""

    name: str
    rows: int
    dim: int
    dtype: str


def connect(address: str, store: str = "", *, token: str | None = None,
            timeout: float | None = DEFAULT_TIMEOUT,
            tls_ca: str | os.PathLike[str] | None = None,
            tls_cert: str | os.PathLike[str] | None = None,
            tls_key: str | os.PathLike[str] | None = None,
            tls_domain: str | None = None) -> RemoteStore:
    """Connects to the store ``store`` of the node at ``address`` (``host:port``; an empty
    ``store`` is the node's only one). ``token`` is sent as a bearer token with every call;
    ``timeout`` (seconds) is each call's deadline, :data:`DEFAULT_TIMEOUT` unless given: past
    it the call raises :class:`~nearrec.errors.DeadlineExceeded` whether or not the node
    answers, and the node drops a call still waiting at it before it reads the device.
    ``timeout=None`` sets no deadline: a call then waits for the node as long as it takes
    (for ever, if the node hangs). A :meth:`RemoteStore.submit`'s deadline runs from its
    submission, and each batch of :meth:`RemoteStore.lookup_stream` is such a call, so a
    long stream is not cut off by it.

    TLS: ``tls_ca`` (a PEM file) is the CA the node's certificate must chain to, ``tls_domain``
    the name it must carry (default: the address's host); ``tls_cert`` and ``tls_key`` (PEM)
    are this client's certificate for a node that asks for one (``--tls-client-ca``)."""
    text(address, "address")
    text(store, "store")
    if token is not None:
        text(token, "token")
    if timeout is not None:
        timeout = float(timeout)
        if not timeout > 0:
            raise InvalidRequest(f"timeout is a positive number of seconds, not {timeout}")
    tls = None
    if any(x is not None for x in (tls_ca, tls_cert, tls_key, tls_domain)):
        if (tls_cert is None) != (tls_key is None):
            raise InvalidRequest("a client certificate needs both tls_cert and tls_key")
        identity = None if tls_cert is None or tls_key is None else (
            _pem(tls_cert, "tls_cert"), _pem(tls_key, "tls_key"))
        tls = (None if tls_ca is None else _pem(tls_ca, "tls_ca"),
               None if tls_domain is None else text(tls_domain, "tls_domain"), identity)
    return RemoteStore(NativeRemote(address, store, token, timeout, tls), address, _Connection(
        address, store, token is not None, timeout, _path(tls_ca), _path(tls_cert),
        _path(tls_key), tls_domain))


def _path(p: str | os.PathLike[str] | None) -> str | None:
    return None if p is None else os.fspath(p)


def _reconnect(how: _Connection) -> RemoteStore:
    """A pickled :class:`RemoteStore` connected again, its token from :data:`TOKEN_ENV`."""
    token = None
    if how.token:
        token = os.environ.get(TOKEN_ENV)
        if not token:
            raise Unauthenticated(f"this RemoteStore of {how.address} was pickled without its "
                                  f"bearer token (a token never travels in a pickle): set "
                                  f"{TOKEN_ENV} where it is loaded")
    return connect(how.address, how.store, token=token, timeout=how.timeout, tls_ca=how.tls_ca,
                   tls_cert=how.tls_cert, tls_key=how.tls_key, tls_domain=how.tls_domain)


def _pem(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        with open(regular_file(path, what), "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidRequest(f"{what}: cannot read {os.fspath(path)!r}: {e}") from None


class RemoteStore:
    """A store on a storage node (see :func:`connect`)."""

    def __init__(self, native: NativeRemote, address: str, how: _Connection | None = None):
        self._native, self.address = native, address
        self._tables: dict[str, RemoteTable] = {}
        self._read_info()
        self._how = how

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as how it was connected, less its token (a module holding it pickles,
        ``torch.save`` s and runs in a spawned process): unpickling connects again, the token
        from the environment (:data:`TOKEN_ENV`), the certificates from their paths. In a
        forked process (a DataLoader worker) the client makes its own connection."""
        if self._how is None:
            raise InvalidRequest("this RemoteStore was not made by nearrec.connect: it cannot "
                                 "be pickled")
        return (_reconnect, (dataclasses.replace(self._how, store=self.name),))

    def __copy__(self) -> RemoteStore:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> RemoteStore:
        """The same store: a copied module shares its connection."""
        return self

    def _read_info(self) -> None:
        name, tables, version, tier, writable, model, stores = self._native.info()
        self.name: str = name
        self._tables = {t[0]: RemoteTable(*t) for t in tables}
        self._version, self._tier, self._writable = int(version), str(tier), bool(writable)
        self.has_model: bool = bool(model)
        self.stores: tuple[str, ...] = tuple(stores)

    @property
    def tables(self) -> dict[str, RemoteTable]:
        """The store's tables as of the last call that changed them or :meth:`refresh`."""
        return dict(self._tables)

    def table(self, name: str) -> RemoteTable:
        if name not in self._tables:
            self._read_info()  # another client may have created it
        try:
            return self._tables[name]
        except KeyError:
            raise UnknownTable(f"unknown table {name!r}; the store has: "
                               f"{', '.join(self._tables)}", table=name) from None

    @property
    def version(self) -> int:
        """The store's version on the node now."""
        self._read_info()
        return self._version

    @property
    def tier(self) -> str:
        return self._tier

    @property
    def writable(self) -> bool:
        return self._writable

    def refresh(self) -> int:
        """Reads the store's tables and version from the node again; returns the version."""
        self._read_info()
        return self._version

    # ---- lookups --------------------------------------------------------------------------

    def lookup(self, table: str, indices: Any, offsets: Any = None,
               per_sample_weights: Any = None, mode: PoolingModeName = "sum",
               include_last_offset: bool = False, padding_idx: int | None = None,
               lengths: Any = None) -> npt.NDArray[np.float32]:
        """Pools one table's bags on the node exactly as ``torch.nn.EmbeddingBag`` does;
        returns ``[batch, dim]`` float32."""
        req = TableLookup(table, indices, offsets, lengths, per_sample_weights, mode,
                          include_last_offset, padding_idx)
        return self.lookup_many([req]).values

    def lookup_many(self, requests: Sequence[TableLookup] | Mapping[str, Any]) -> PooledBatch:
        """Several tables' bags pooled on the node in one round trip (EMB_READ): the
        ``[batch, Σ dim]`` output with per-table views, every table read at one version."""
        reqs = lookups(requests)
        values, _version = self._native.lookup(reqs)
        return self._pooled(values, reqs)

    def lookup_rows(self, requests: Sequence[TableLookup] | Mapping[str, Any]
                    ) -> list[tuple[str, npt.NDArray[np.int64], npt.NDArray[np.float32]]]:
        """Each table's distinct rows the batch reads, ``(table, ids ascending, [n, dim]
        rows)``, in request order — for a client that pools itself."""
        rows, _version = self._native.lookup_rows(lookups(requests))
        return [(str(t), ids, values) for t, ids, values in rows]

    def submit(self, requests: Sequence[TableLookup] | Mapping[str, Any]) -> RemotePending:
        """Sends :meth:`lookup_many` and returns at once; batches submitted together are in
        flight together on the one connection (RM_send_inputs / RM_read_outputs)."""
        reqs = lookups(requests)
        return RemotePending(self, self._native.submit(reqs), reqs)

    def lookup_stream(self, batches: Iterable[Sequence[TableLookup] | Mapping[str, Any]],
                      depth: int = 2) -> Iterator[PooledBatch]:
        """The results of ``batches`` in order, ``depth`` of them in flight: batch i + 1 is on
        the wire while the caller works on batch i."""
        depth = count(depth, "depth")
        if not isinstance(batches, Iterable):
            raise InvalidRequest(f"batches must be an iterable of batches, not "
                                 f"{type(batches).__name__}")
        window: deque[RemotePending] = deque()
        for b in batches:
            window.append(self.submit(b))
            if len(window) >= depth:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()

    def _pooled(self, values: npt.NDArray[np.float32], reqs: Sequence[TableLookup]
                ) -> PooledBatch:
        keys = tuple(r.table for r in reqs)
        return PooledBatch(values, keys, tuple(self.table(k).dim for k in keys))

    def read_rows(self, table: str, rows: Any) -> npt.NDArray[np.float32]:
        """The given rows of a table, decoded to float32 on the node: ``[len(rows), dim]``."""
        self.table(table)
        return self._native.read_rows(table, row_ids(table, rows))

    def infer(self, dense: Any, features: Any) -> npt.NDArray[np.float32]:
        """The model kept with the store run on the node, next to its embeddings; only its
        ``[batch, outputs]`` come back. ``dense`` and ``features`` as for
        :meth:`nearrec.Store.infer`."""
        if isinstance(features, Sequence) and not isinstance(features, str | bytes):
            reqs = lookups(features)
        else:
            reqs = jagged_lookups(features)
        if dense is not None:
            dense = np.ascontiguousarray(as_array(dense, "dense features"), dtype=np.float32)
            if dense.ndim != 2:
                raise InvalidRequest(f"dense features must be [batch, features], not shape "
                                     f"{dense.shape}")
        return self._native.infer(dense, reqs)

    # ---- writes ---------------------------------------------------------------------------

    def write(self, table: str, ids: Any, rows: Any, *, allow_nonfinite: bool = False) -> int:
        """EMB_WRITE on the node: atomic and durable when it returns; the new version."""
        return self.write_many({table: (ids, rows)}, allow_nonfinite=allow_nonfinite)

    def write_many(self, writes: Mapping[str, tuple[Any, Any]], *,
                   allow_nonfinite: bool = False) -> int:
        """Several tables' rows in one atomic call: ``{table: (ids, rows)}``."""
        return int(self._native.write_many(write_calls(writes, allow_nonfinite),
                                           flag(allow_nonfinite, "allow_nonfinite")))

    def remove(self, table: str, ids: Any) -> int:
        """EMB_REMOVE of rows on the node; the new version."""
        return int(self._native.write_many([(table, _ids(table, ids), None)], False))

    def create_table(self, name: str, rows: int, dim: int, dtype: str = "fp32", *,
                     init: str = "uniform", seed: int = 0) -> int:
        """RM_create_table on the node (as :meth:`nearrec.Store.create_table`)."""
        v = int(self._native.create_table(text(name, "name"), count(rows, "rows", minimum=0),
                                          count(dim, "dim"), text(dtype, "dtype"),
                                          text(init, "init"), count(seed, "seed", minimum=0)))
        self._read_info()
        return v

    def drop_table(self, name: str) -> int:
        """EMB_REMOVE of a table on the node."""
        v = int(self._native.drop_table(text(name, "name")))
        self._read_info()
        return v

    def swap(self, path: str, *, warm: bool = True, force: bool = False) -> int:
        """The store at ``path`` on the node's file system serves from the next request on.
        The node takes it only from under its swap root (``nearrec serve --swap-root``, by
        default the directory holding the served store; a relative ``path`` is taken from
        there), only for a caller who may read what it exposes, and — unless ``force`` — only
        if it answers every request the served store answers (:meth:`Store.swap`)."""
        v = int(self._native.swap(text(str(path), "path"), bool(warm), bool(force)))
        self._read_info()
        return v

    # ---- what it did ----------------------------------------------------------------------

    def stats(self) -> dict[str, float | str]:
        """The store's counters and latency percentiles on the node, and its ``device``."""
        values, device = self._native.stats()
        out: dict[str, float | str] = {k: float(v) for k, v in values}
        out["device"] = str(device)
        return out

    def __repr__(self) -> str:
        return (f"RemoteStore({self.address!r}, store={self.name!r}, "
                f"tables={len(self._tables)})")


class RemotePending:
    """A lookup sent to the node. :meth:`result` waits for its :class:`PooledBatch`, or raises
    the error the node answered."""

    def __init__(self, store: RemoteStore, native: NativeRemotePending,
                 reqs: list[TableLookup]):
        self._store, self._native, self._reqs = store, native, reqs

    def done(self) -> bool:
        return bool(self._native.done())

    def result(self, timeout: float | None = None) -> PooledBatch:
        return self._store._pooled(self._native.result(timeout), self._reqs)
