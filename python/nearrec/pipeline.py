"""Pipelined lookups: submit a batch, get a handle, collect it later (RM-SSD's ``send_inputs`` /
``read_outputs``), so one batch's reads overlap the pooling of another and the caller's own work
(its MLPs). The native lookup releases the GIL, so a few background threads are enough: each runs
one batch through the engine while the caller goes on.

Large requests split into sub-batches of bags (:func:`split`) that flow through the same
pipeline (RM-SSD's system-level pipeline); :meth:`nearrec.Store.lookup_many` does this when given
``sub_batch``.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import InvalidRequest

if TYPE_CHECKING:
    from .request import CheckedLookup
    from .store import PooledBatch


class Pending:
    """A submitted batch. :meth:`result` waits for it and returns its :class:`PooledBatch`, or
    raises the error the lookup raised (typed, as a direct call would)."""

    def __init__(self, future: Future[PooledBatch]):
        self._future = future

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> PooledBatch:
        return self._future.result(timeout)


class Lanes:
    """The background threads of one store, rebuilt in a forked child (threads do not survive
    ``fork()``; PyTorch DataLoader workers fork)."""

    def __init__(self, depth: int):
        self.depth = max(1, depth)
        self._lock = threading.Lock()
        self._pool: tuple[int, ThreadPoolExecutor] | None = None

    def submit(self, fn: Callable[..., PooledBatch], *args: Any) -> Pending:
        with self._lock:
            if self._pool is None or self._pool[0] != os.getpid():
                self._pool = (os.getpid(), ThreadPoolExecutor(self.depth,
                                                              thread_name_prefix="nearrec-lane"))
            return Pending(self._pool[1].submit(fn, *args))


def stream(submit: Callable[[Any], Pending], batches: Iterable[Any],
           depth: int) -> Iterator[PooledBatch]:
    """Results of ``batches`` in order, with up to ``depth`` of them in flight at once."""
    window: deque[Pending] = deque()
    for b in batches:
        window.append(submit(b))
        if len(window) >= depth:
            yield window.popleft().result()
    while window:
        yield window.popleft().result()


def _bounds(r: CheckedLookup) -> tuple[np.ndarray, np.ndarray] | None:
    """Each bag's (start, end) in the flattened indices, or None where the bags are malformed
    (the request is then sent whole, so the engine names the fault). ``r`` has passed
    :func:`nearrec.request.check`: its arrays are int32 / int64, so widening them is exact."""
    idx = r.indices
    if idx.ndim == 2:
        b, size = idx.shape
        starts = np.arange(b, dtype=np.int64) * size
        return starts, starts + size
    if r.lengths is not None:
        lengths = r.lengths.astype(np.int64)
        if (lengths < 0).any() or lengths.sum() != idx.size:
            return None
        ends = np.cumsum(lengths)
        return ends - lengths, ends
    off = r.offsets.astype(np.int64)
    if off.size == 0 or off[0] != 0 or (np.diff(off) < 0).any() or off[-1] > idx.size:
        return None
    if r.include_last_offset:
        return off[:-1], off[1:]
    return off, np.append(off[1:], idx.size)


def split(requests: list[CheckedLookup], sub_batch: int) -> list[list[CheckedLookup]] | None:
    """The same bags as ``requests`` (checked) in sub-batches of at most ``sub_batch`` bags
    (each table cut at the same bags); None when they cannot be cut (malformed bags, or tables
    disagree on the batch size: the whole request then goes to the engine, which says what is
    wrong)."""
    if sub_batch < 1:
        raise InvalidRequest(f"sub_batch must be at least 1, not {sub_batch}")
    cuts = [_bounds(r) for r in requests]
    if any(c is None for c in cuts) or not cuts:
        return None
    batch = {len(c[0]) for c in cuts if c is not None}
    if len(batch) != 1:
        return None
    n = batch.pop()
    out = []
    for b0 in range(0, max(n, 1), sub_batch):
        b1 = min(b0 + sub_batch, n)
        part = []
        for r, c in zip(requests, cuts, strict=True):
            assert c is not None
            starts, ends = c
            lo, hi = (int(starts[b0]), int(ends[b1 - 1])) if b1 > b0 else (0, 0)
            w = r.per_sample_weights
            if r.indices.ndim == 2:
                part.append(r._replace(indices=r.indices[b0:b1],
                                       per_sample_weights=None if w is None else w[b0:b1]))
            else:
                part.append(r._replace(indices=r.indices[lo:hi], offsets=None,
                                       lengths=ends[b0:b1] - starts[b0:b1],
                                       include_last_offset=False,
                                       per_sample_weights=None if w is None else w[lo:hi]))
        out.append(part)
    return out
