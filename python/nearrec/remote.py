"""A store served by a storage node: :func:`connect` returns a :class:`~nearrec.Store`, the
same class :func:`nearrec.open` returns — lookups, background lookups and streams, the stored
model's inference, writes, stats — each call one round trip to the node, the bags pooled where
the rows are read. Errors arrive as the local store raises them (``IndexOutOfRange`` naming the
table and position, ``UnknownTable``, ...) plus the node's own refusals:
:class:`~nearrec.errors.Unauthenticated` and :class:`~nearrec.errors.PermissionDenied`
(``PermissionError``), :class:`~nearrec.errors.DeadlineExceeded` (``TimeoutError``),
:class:`~nearrec.errors.Overloaded` and :class:`~nearrec.errors.Unavailable`
(``ConnectionError``: retry). The client is the native module's (Rust, tonic): no grpcio needed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._native import NativeStore
from .errors import InvalidRequest, Unauthenticated
from .request import count, regular_file, text
from .store import Pending, Store, Table

#: Where a node's store unpickled in another process takes its bearer token from: a
#: token never travels in a pickle (nor a ``torch.save``'d module).
TOKEN_ENV = "NEARREC_TOKEN"

#: Each call's deadline in seconds when :func:`connect` is given none: a node that stops
#: answering (hung, stopped, partitioned away) fails the call with
#: :class:`~nearrec.errors.DeadlineExceeded` instead of blocking its caller for ever.
DEFAULT_TIMEOUT = 30.0


@dataclass(frozen=True)
class _Connection:
    """How a node's store was connected, less its token: what its pickle carries.
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
    retries: int


def connect(address: str | Sequence[str], store: str = "", *, token: str | None = None,
            token_file: str | os.PathLike[str] | None = None,
            timeout: float | None = DEFAULT_TIMEOUT,
            tls_ca: str | os.PathLike[str] | None = None,
            tls_cert: str | os.PathLike[str] | None = None,
            tls_key: str | os.PathLike[str] | None = None,
            tls_domain: str | None = None, retries: int = 3) -> Store:
    """Connects to the store ``store`` of the node at ``address`` (``host:port``; an empty
    ``store`` is the node's only one). Several nodes serving the store are a list of
    addresses (or one comma-separated string): the client connects to the first that
    answers, and moves to the next when its node stops answering.

    Calls that change nothing — lookups, inference, info, stats — are made again, up to
    ``retries`` more times, after the node refused them for want of a connection
    (:class:`~nearrec.errors.Unavailable`) or of room (:class:`~nearrec.errors.Overloaded`),
    after a random pause that doubles from 50 ms up to 2 s, never past the call's deadline.
    Writes, created or dropped tables, swaps and compactions are never made again: one whose
    connection failed may have been applied. ``retries=0`` turns retrying off. The connection
    pings the node every 30 s, so a node that went away is noticed before a call's deadline.

    ``token`` is sent as a bearer token with every call:
    given, else read from ``token_file`` (its text, stripped), else the :data:`TOKEN_ENV`
    environment variable's, if set — so that a token need not be in code or on a command line;
    ``timeout`` (seconds) is each call's deadline, :data:`DEFAULT_TIMEOUT` unless given: past
    it the call raises :class:`~nearrec.errors.DeadlineExceeded` whether or not the node
    answers, and the node drops a call still waiting at it before it reads the device.
    ``timeout=None`` sets no deadline: a call then waits for the node as long as it takes
    (for ever, if the node hangs). A :meth:`Store.submit`'s deadline runs from its
    submission, and each batch of :meth:`Store.lookup_stream` is such a call, so a
    long stream is not cut off by it.

    TLS: ``tls_ca`` (a PEM file) is the CA the node's certificate must chain to, ``tls_domain``
    the name it must carry (default: the address's host); ``tls_cert`` and ``tls_key`` (PEM)
    are this client's certificate for a node that asks for one (``--tls-client-ca``)."""
    if not isinstance(address, str) and isinstance(address, Sequence):
        address = ",".join(text(a, "an address") for a in address)
    text(address, "address")
    text(store, "store")
    attempts = count(retries, "retries", minimum=0) + 1
    token, timeout, tls = _credentials(token, token_file, timeout, tls_ca, tls_cert, tls_key,
                                       tls_domain)
    how = _Connection(address, store, token is not None, timeout, _path(tls_ca),
                      _path(tls_cert), _path(tls_key), tls_domain, attempts - 1)
    return Store._over(NativeStore.connect(address, store, token, timeout, tls, attempts),
                       address, lambda s: _reduce(s, how))


#: TLS as the binding takes it: the CA's PEM, the domain, the client's certificate and key.
Tls = tuple[bytes | None, str | None, tuple[bytes, bytes] | None]


def _credentials(token: str | None, token_file: str | os.PathLike[str] | None,
                 timeout: float | None, tls_ca: str | os.PathLike[str] | None,
                 tls_cert: str | os.PathLike[str] | None,
                 tls_key: str | os.PathLike[str] | None,
                 tls_domain: str | None) -> tuple[str | None, float | None, Tls | None]:
    """:func:`connect`'s token (given, from its file or from :data:`TOKEN_ENV`), deadline and
    TLS, checked: what every client of a node is made with."""
    if token is not None and token_file is not None:
        raise InvalidRequest("give token or token_file, not both")
    if token_file is not None:
        token = _token_from(token_file)
    elif token is None:
        token = os.environ.get(TOKEN_ENV) or None
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
    return token, timeout, tls


def _path(p: str | os.PathLike[str] | None) -> str | None:
    return None if p is None else os.fspath(p)


def _reduce(store: Store, how: _Connection) -> tuple[Any, ...]:
    """A node's store pickled as how it was connected, less its token (a module holding it
    pickles, ``torch.save`` s and runs in a spawned process): unpickling connects again, the
    token from the environment (:data:`TOKEN_ENV`), the certificates from their paths. In a
    forked process (a DataLoader worker) the client makes its own connection."""
    return (_reconnect, (dataclasses.replace(how, store=store.name),))


def _reconnect(how: _Connection) -> Store:
    """A pickled store of a node connected again, its token from :data:`TOKEN_ENV`."""
    token = None
    if how.token:
        token = os.environ.get(TOKEN_ENV)
        if not token:
            raise Unauthenticated(f"this store of {how.address} was pickled without its "
                                  f"bearer token (a token never travels in a pickle): set "
                                  f"{TOKEN_ENV} where it is loaded")
    return connect(how.address, how.store, token=token, timeout=how.timeout, tls_ca=how.tls_ca,
                   tls_cert=how.tls_cert, tls_key=how.tls_key, tls_domain=how.tls_domain,
                   retries=how.retries)


def _token_from(path: str | os.PathLike[str]) -> str:
    """A token file's text, stripped (an empty one is refused: it would send no token)."""
    file = regular_file(path, "token_file")
    try:
        with open(file, encoding="utf-8") as f:
            token = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidRequest(f"token_file: cannot read {file!r}: {e}") from None
    if not token:
        raise InvalidRequest(f"token_file: {file!r} is empty")
    return token


def _pem(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        with open(regular_file(path, what), "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidRequest(f"{what}: cannot read {os.fspath(path)!r}: {e}") from None


#: Deprecated names of the one :class:`~nearrec.Store` (a node's store was a class of its own
#: before 0.2); kept for one release.
RemoteStore = Store
RemoteTable = Table
RemotePending = Pending
