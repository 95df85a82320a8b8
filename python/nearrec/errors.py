"""The exception tree every nearrec error belongs to.

``NearrecError`` is the root. Each class also derives from the builtin a caller would catch
without knowing nearrec: bad requests are ``ValueError`` (out-of-range indices also
``IndexError``, unknown tables also ``KeyError``), I/O failures are ``OSError``.
"""

from __future__ import annotations


class NearrecError(Exception):
    """Root of every error raised by nearrec.

    ``table`` and ``position`` name the table and the position in the caller's array the error
    is about, when there is one.
    """

    def __init__(self, message: str, table: str | None = None, position: int | None = None):
        super().__init__(message)
        self.message = message
        self.table = table
        self.position = position

    def __str__(self) -> str:
        return self.message


class InvalidRequest(NearrecError, ValueError):
    """A request or argument is malformed (shapes, dtypes, offsets, modes, weights...)."""


class IndexOutOfRange(InvalidRequest, IndexError):
    """An index is negative or not below the table's row count."""


class UnknownTable(InvalidRequest, KeyError):
    """A request names a table the store does not have."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self.message


class UnknownKey(InvalidRequest, KeyError):
    """A keyed table was asked for a key it does not hold (its unknown-key policy is "error")."""

    def __str__(self) -> str:
        return self.message


class TableFull(NearrecError):
    """A keyed table holds as many keys as its capacity allows and another was to be added."""


class StoreIOError(NearrecError, OSError):
    """Reading or writing the store failed at the operating-system level."""


class StoreNotFound(StoreIOError, FileNotFoundError):
    """There is no store at the given path."""


class StoreExists(StoreIOError, FileExistsError):
    """A store (or trace file) already exists where a new one was to be written (pass
    ``overwrite=True``)."""


class StoreCorrupted(NearrecError):
    """The store failed a check: bad magic, checksum mismatch, truncated or inconsistent files."""


class UnsupportedVersion(StoreCorrupted):
    """The store was written in a format version this nearrec cannot read."""


class InvalidTrace(NearrecError, ValueError):
    """A trace file is not one: bad magic, unknown version, truncated, or inconsistent arrays."""


class InsufficientMemory(NearrecError, MemoryError):
    """Opening or loading would take more memory than the process can have (physical memory,
    or its cgroup's limit): the message says how much was asked and how much there is."""


class ResourceExhausted(NearrecError, OSError):
    """The operating system refused a resource other than memory: threads, file descriptors,
    io_uring rings."""


class InternalError(NearrecError, RuntimeError):
    """A bug in nearrec: a check inside it failed. The message says where; please report it."""


class StoreReadOnly(NearrecError):
    """A write (``write``, ``remove``) to a store opened without ``writable=True``."""


class StoreLocked(NearrecError):
    """The store is open for writing elsewhere: a store has one writing process at a time (the
    lock ends with that process, however it ends)."""


class Unsupported(NearrecError, NotImplementedError):
    """A verb of the store's contract that this kind of store does not serve (the message
    names the verb and the store)."""


class DeltaFull(NearrecError):
    """A write that does not fit the store's ``delta_budget``: nothing of it was applied."""


class KeysFull(NearrecError):
    """A write of a new key to a keyed table that holds its cap of keys, with eviction off:
    nothing of the call was applied (``table`` and ``position`` name the key)."""


class VersionNotServed(NearrecError):
    """A lookup pinned to a version of the store's repository that the store does not hold
    (neither served nor staged beside it): never answered from another version."""


class MembershipChanged(NearrecError):
    """A write sent to a replica at another membership epoch than its sender's, or to one that
    is catching up (no member of its shard); a sharded store learns its shard's replicas again
    and retries by itself, so a caller sees this only from a replica addressed directly."""


class TraceMismatch(InvalidTrace, InvalidRequest):
    """A trace does not fit the store it is used with (a table the store lacks, another row
    count, a row id past the table): an ``InvalidTrace`` and an ``InvalidRequest`` both."""


# ---- a storage node's refusals (nearrec.connect): the node named no nearrec error, only why it
# would not serve the call -------------------------------------------------------------------


class Unauthenticated(NearrecError, PermissionError):
    """The node needs a token and the call had none, or one it does not know."""


class PermissionDenied(NearrecError, PermissionError):
    """The call's token does not grant what it asked (read, write or admin of a table)."""


class DeadlineExceeded(NearrecError, TimeoutError):
    """The call's deadline (``timeout``) passed before it was served; a request still waiting
    for the node's engine at its deadline is dropped before it reads the device."""


class Overloaded(NearrecError, ConnectionError):
    """The node's admission queue is full: nothing of the call ran. Retry later."""


class Unavailable(NearrecError, ConnectionError):
    """The node cannot be reached (no connection, or it is draining). Retry later."""


__all__ = [
    "DeadlineExceeded",
    "Overloaded",
    "PermissionDenied",
    "Unauthenticated",
    "Unavailable",
    "DeltaFull",
    "KeysFull",
    "StoreLocked",
    "StoreReadOnly",
    "TableFull",
    "UnknownKey",
    "IndexOutOfRange",
    "InsufficientMemory",
    "InternalError",
    "InvalidRequest",
    "InvalidTrace",
    "MembershipChanged",
    "NearrecError",
    "ResourceExhausted",
    "StoreCorrupted",
    "StoreExists",
    "StoreIOError",
    "StoreNotFound",
    "TraceMismatch",
    "UnknownTable",
    "Unsupported",
    "UnsupportedVersion",
    "VersionNotServed",
]
