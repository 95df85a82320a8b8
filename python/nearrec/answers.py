"""What a store's calls answer: a table as it is served (:class:`Table`), a pooled batch
(:class:`PooledBatch`), what :meth:`~nearrec.Store.changes_since`, :meth:`~nearrec.Store.sync_table`
and :meth:`~nearrec.Store.compact` tell; and a batch's dense features as the engine takes them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import InvalidRequest, UnknownTable
from .request import as_array


@dataclass(frozen=True)
class Table:
    """One table as a store serves it now (its manifest's full record, an embedded store's, is
    :attr:`Store.info`)."""

    name: str
    rows: int
    dim: int
    dtype: str
    #: a keyed table's keys (its rows but the row of zeros unknown keys may pool as); None for
    #: a table addressed by position. A keyed table's lookups name keys, not rows.
    keys: int | None = None

    @property
    def keyed(self) -> bool:
        return self.keys is not None

    @property
    def entries(self) -> int:
        """What its ids address: a keyed table's keys, another's rows (TorchRec's
        ``num_embeddings``)."""
        return self.rows if self.keys is None else self.keys


@dataclass(frozen=True)
class PooledBatch:
    """The pooled output of a batched lookup: ``values`` is ``[batch, Σ dim]``, tables in request
    order; ``batch[name]`` is that table's ``[batch, dim]`` view (TorchRec's KeyedTensor shape)
    and ``batch.block(i)`` the ``i``-th request's. A table requested more than once in the batch
    (two features sharing it) has no single view: ``batch[name]`` then raises
    :class:`~nearrec.errors.InvalidRequest` naming the requests, and ``block(i)`` picks one.
    It is array-like too: ``np.asarray(batch)`` (``torch.as_tensor`` through numpy) is
    ``values``, and ``shape`` and ``dtype`` are its: float32, or the ``out_dtype`` asked."""

    values: npt.NDArray[Any]
    keys: tuple[str, ...]
    dims: tuple[int, ...]

    def block(self, i: int) -> npt.NDArray[Any]:
        """The ``[batch, dim]`` columns of request ``i`` (its position in the batch)."""
        if not -len(self.keys) <= i < len(self.keys):
            raise InvalidRequest(f"request {i} is not in a batch of {len(self.keys)}",
                                 position=i)
        i %= len(self.keys)
        at = sum(self.dims[:i])
        return self.values[:, at:at + self.dims[i]]

    def __getitem__(self, table: str) -> npt.NDArray[Any]:
        where = [i for i, k in enumerate(self.keys) if k == table]
        if not where:
            raise UnknownTable(f"table {table!r} is not in this batch; it has: "
                               f"{', '.join(self.keys)}", table=table)
        if len(where) > 1:
            raise InvalidRequest(f"table {table!r} is in this batch {len(where)} times (requests "
                                 f"{where}): take each with block(i)", table=table,
                                 position=where[1])
        return self.block(where[0])

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys)

    def to_dict(self) -> dict[str, npt.NDArray[Any]]:
        return {k: self[k] for k in self.keys}

    @property
    def shape(self) -> tuple[int, ...]:
        """``values``' shape, ``(batch, Σ dim)``."""
        return tuple(self.values.shape)

    @property
    def dtype(self) -> np.dtype[np.float32]:
        return self.values.dtype

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> npt.NDArray[Any]:
        """``np.asarray(batch)`` is ``values`` (no copy unless ``dtype`` or ``copy`` ask)."""
        if dtype is not None and np.dtype(dtype) != self.values.dtype:
            if copy is False:
                raise ValueError(f"a {np.dtype(dtype)} array of a float32 batch needs a copy")
            return self.values.astype(dtype)
        return self.values.copy() if copy else self.values


def dense_features(dense: Any) -> npt.NDArray[np.float32] | None:
    """A batch's dense features as the engine takes them: a contiguous float32 ``[batch,
    features]`` array (None stays None)."""
    if dense is None:
        return None
    given = as_array(dense, "dense features")
    if given.dtype.kind not in "fiu":
        raise InvalidRequest(f"dense features must be numbers (float32), not {given.dtype}")
    out: npt.NDArray[np.float32] = np.ascontiguousarray(given, dtype=np.float32)
    if out.ndim != 2:
        raise InvalidRequest(f"dense features must be [batch, features], not shape {out.shape}")
    return out


@dataclass(frozen=True)
class Changes:
    """What :meth:`Store.changes_since` tells a cache kept above the store: the store's
    ``version``, the ``base`` version its table files hold, the id of the ``engine`` serving it
    (it changes with a swap or a created or dropped table), and per table the ``rows`` written
    or removed since the version asked about — ``None`` when that cannot be told any more
    (then everything cached must go, as it must when ``engine`` changed)."""

    version: int
    base: int
    engine: int
    rows: dict[str, npt.NDArray[np.int64]] | None


@dataclass(frozen=True)
class Synced:
    """What :meth:`Store.sync_table` did: rows ``compared``, rows ``written`` (those that
    differed), write ``calls`` made, and the store's ``version`` after them."""

    compared: int
    written: int
    calls: int
    version: int


@dataclass(frozen=True)
class Compaction:
    """What :meth:`Store.compact` did: the ``version`` the table files hold now, the ``tables``
    rewritten, the ``rows`` folded into them, the ``bytes`` written and the ``seconds`` taken."""

    version: int
    tables: int
    rows: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class FeedCursor:
    """Where a delta feed stands in a store (:meth:`Store.feed_status`): the ``sequence`` of
    the last delta file it applied, the producer's ``step`` and ``wall_time_ms`` as that file
    said (``None`` when it did not), the store's ``applied_ms`` when it logged the file's rows
    (ms since the Unix epoch) and the file's ``rows``."""

    sequence: int
    step: int | None
    wall_time_ms: int | None
    applied_ms: int
    rows: int

    @property
    def lag_seconds(self) -> float | None:
        """From the producer writing the file to the store logging it (``None``: the file gave
        no wall time)."""
        if self.wall_time_ms is None:
            return None
        return max(0, self.applied_ms - self.wall_time_ms) / 1000.0
