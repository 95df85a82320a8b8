"""A store on disk, read without opening it: its manifest (:func:`info`), its attachments
(:func:`attach`, :func:`read_attachment`), its checks (:func:`verify`) and what interrupted
writers left (:func:`gc`); a repository of one name's versions (:func:`publish`,
:func:`versions`). Opening a store to serve it is :mod:`nearrec.store`'s."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._native import (
    read_manifest,
    repo_publish,
    repo_versions,
    scrub_store,
    store_attach,
    store_gc,
    store_read_attachment,
    table_layout,
    verify_store,
)
from .errors import InvalidRequest
from .request import flag, path_arg, progress_enabled
from .units import parse_size

StorePath = str | os.PathLike[str]


@dataclass(frozen=True)
class QuantError:
    """How far a table's stored rows are from the float rows it was built from."""

    #: the largest absolute difference of one value
    max_abs: float
    #: the mean absolute difference over every value encoded
    mean_abs: float
    #: how many values were encoded
    values: int


@dataclass(frozen=True)
class TableInfo:
    """One table of a store, as its manifest records it."""

    name: str
    rows: int
    dim: int
    dtype: str
    file: str
    row_bytes: int
    block_bytes: int
    data_bytes: int
    data_crc32c: int
    #: for a co-located table (see :func:`nearrec.plan.colocate`): its order file and checksum
    order: Any = None
    #: its sector checksums' file and checksum (format version 3); None in older stores
    sums: Any = None
    #: a keyed table's keys file and checksum (format version 5): its rows are found by raw
    #: 64-bit key; None for a table addressed by position
    keys: Any = None
    #: the encoding error of a lossy dtype's rows against the float rows the builder was given;
    #: None for fp32 rows and for rows given already encoded (a quantised model's bytes)
    quant_error: QuantError | None = None

    @property
    def keyed(self) -> bool:
        """Whether lookups name keys (format version 5), not row positions."""
        return self.keys is not None

    @property
    def protected(self) -> bool:
        """Whether reads of single rows are checked as they land (format version 3 stores
        keep a checksum of every 512-byte sector; older ones are unprotected on the SSD tier)."""
        return self.sums is not None

    @property
    def colocated(self) -> bool:
        """Whether the table's rows are stored in a co-located order (format version 2)."""
        return self.order is not None

    @property
    def padding_ratio(self) -> float:
        """Share of the data region lost to block padding (0.0 for power-of-two rows)."""
        return table_layout(self.rows, self.dim, self.dtype, self.block_bytes)[3]


@dataclass(frozen=True)
class StoreInfo:
    """A store's manifest: where it is, its tables and how it was made."""

    path: Path
    format_version: int
    created_by: str
    params: Any
    tables: tuple[TableInfo, ...]
    #: names of the blobs kept with the tables (:func:`attach`)
    attachments: tuple[str, ...] = ()

    @classmethod
    def _from_json(cls, path: StorePath, text: str) -> StoreInfo:
        m = json.loads(text)
        return cls(
            path=Path(path),
            format_version=m["format_version"],
            created_by=m["created_by"],
            params=m.get("params"),
            tables=tuple(TableInfo(**{**t, "quant_error": QuantError(**t["quant_error"])})
                         if "quant_error" in t else TableInfo(**t) for t in m["tables"]),
            attachments=tuple(a["name"] for a in m.get("attachments", [])),
        )

    @property
    def total_bytes(self) -> int:
        return sum(t.data_bytes for t in self.tables)


def info(path: StorePath) -> StoreInfo:
    """Reads and validates a store's manifest and table headers without loading any rows; of a
    repository of versions, the served version's (as :func:`nearrec.open` opens it)."""
    held = versions(path)
    if held is not None:
        path = Path(path_arg(path)) / str(held.current)
    return StoreInfo._from_json(path, read_manifest(path_arg(path)))


def attach(path: StorePath, name: str, data: bytes) -> StoreInfo:
    """Keeps ``data`` with the store's tables as attachment ``name`` (replacing one of that name),
    atomically and checksummed: a model's dense weights, its configuration. The store becomes
    format version 2."""
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"an attachment name is a non-empty str, not {name!r}")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise InvalidRequest(f"attachment {name!r}: data must be bytes, not {type(data).__name__}")
    return StoreInfo._from_json(path, store_attach(path_arg(path), name, bytes(data)))


def read_attachment(path: StorePath, name: str) -> bytes | None:
    """Attachment ``name``'s bytes, checked against their checksum (``None`` if there is none)."""
    if not isinstance(name, str):
        raise InvalidRequest(f"an attachment name is a str, not {name!r}")
    return store_read_attachment(path_arg(path), name)


@dataclass(frozen=True)
class TableCheck:
    table: str
    bytes: int
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


def verify(path: StorePath, progress: bool | None = None) -> list[TableCheck]:
    """Checks every data byte of every table against its CRC-32C and its sector checksums,
    every attachment, and lists what interrupted writes left in the store (``orphan PATH``,
    removed by :func:`gc`)."""
    return [TableCheck(*c)
            for c in verify_store(path_arg(path), progress_enabled(progress))]


def scrub(path: StorePath, rate: int | str = 0, progress: bool | None = None
          ) -> list[TableCheck]:
    """One pass of a scrub: every table's data read from the device (not the page cache, where
    a copy cached before the damage would hide it) at most ``rate`` bytes a second (a size such
    as ``"64MiB"``; 0: as fast as the disk goes) and checked against its sector checksums and
    CRC-32C — on a store another process may be serving, beside its lookups. A store opened
    with ``scrub_rate`` runs such passes by itself, in the background (``scrub_*`` in its
    stats)."""
    return [TableCheck(*c) for c in scrub_store(path_arg(path), parse_size(rate),
                                                progress_enabled(progress))]


@dataclass(frozen=True)
class Leftover:
    """A file or directory a killed writer left (see :func:`gc`)."""

    path: Path
    bytes: int
    reason: str


@dataclass(frozen=True)
class GcReport:
    removed: tuple[Leftover, ...]
    kept: tuple[Leftover, ...]

    @property
    def removed_bytes(self) -> int:
        return sum(x.bytes for x in self.removed)


def gc(path: StorePath) -> GcReport:
    """Removes what killed writers left: at a store, the blobs of interrupted attaches (its
    manifest does not name them; never while another process writes to it) and the stale build
    temporaries beside it; at any other directory, the stale build temporaries in it. A
    temporary is stale when its writer is gone (it held a lock on it), not by age. A temporary
    holding a finished store whose target is missing is kept and reported: an interrupted
    commit, the only copy."""
    removed, kept = store_gc(path_arg(path))
    return GcReport(tuple(Leftover(Path(p), b, r) for p, b, r in removed),
                    tuple(Leftover(Path(p), b, r) for p, b, r in kept))


@dataclass(frozen=True)
class Versions:
    """A repository of versions (``REPO/NAME/1``, ``2``, ... and its ``CURRENT`` pointer): the
    versions it holds (lowest first), the one served, and those served before it (most recent
    last: what a rollback goes back to)."""

    versions: tuple[int, ...]
    current: int
    history: tuple[int, ...]


def publish(repository: StorePath, store: StorePath, *, move: bool = False) -> int:
    """Adds the closed store at ``store`` (built offline: :func:`nearrec.build`,
    :func:`nearrec.from_state_dict`, ...) to the repository at ``repository`` (made if missing)
    as its next version; returns the version's number, one above every version the repository
    has held. Its files are copied in (``move=True``: the directory is renamed in, on the same
    file system), then the version appears whole under its number. It is served once a swap
    names it (``store.swap(version=N)``, ``nearrec swap --version N``); a store opened from a
    repository that has never been swapped serves its newest version."""
    return repo_publish(path_arg(repository, "the repository"), path_arg(store, "the store"),
                        flag(move, "move"))


def versions(repository: StorePath) -> Versions | None:
    """The repository at ``repository``'s versions, or ``None`` if it is not one (a store, an
    empty or plain directory)."""
    found = repo_versions(path_arg(repository, "the repository"))
    if found is None:
        return None
    held, current, history = found
    # what was pruned since it was served is no version to go back to
    return Versions(tuple(held), current, tuple(v for v in history if v in held))
