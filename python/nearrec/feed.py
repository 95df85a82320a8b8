"""Delta feeds: a trainer's changed rows applied to a served store as it trains.

A producer writes delta files (``docs/format.md`` §17: Arrow IPC or Parquet rows of
``(table, id, op, values)``, named by a sequence number) into a directory; :func:`apply` applies
the files after the store's cursor, in order, each in one atomic call that also moves the feed's
cursor (``docs/live.md``, "Delta feeds"), so a feeder killed at any moment and started again
applies each file exactly once. :func:`watch` keeps doing so as files come. The store may be
embedded (``nearrec.open(..., writable=True)``) or on a node (``nearrec.connect``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .errors import InvalidRequest
from .store import Store

__all__ = ["Applied", "apply", "watch"]


@dataclass(frozen=True)
class Applied:
    """One delta file applied: its ``sequence`` and ``rows``, the store's ``version`` that
    holds it, ``applied`` (``False``: the store had it already) and ``lag_seconds`` from the
    producer's wall time to the store logging it (``None``: the file gave none)."""

    sequence: int
    rows: int
    version: int
    applied: bool
    lag_seconds: float | None


def apply(
    directory: str | os.PathLike[str],
    store: Store,
    *,
    name: str = "default",
    start: int | None = None,
    allow_nonfinite: bool = False,
) -> list[Applied]:
    """Applies the delta files of ``directory`` after ``store``'s cursor of feed ``name``, in
    sequence order, each once; ``start``: the first sequence when the store has never seen
    the feed. A gap in the sequence, or a file that does not fit the store (unknown table,
    wrong dim or dtype, a row out of range), raises :class:`InvalidRequest` naming the file,
    row and column, after the files before it; nothing of that file is applied."""
    done = store._native.feed_dir(os.fspath(directory), name, start, allow_nonfinite)
    return [Applied(*a) for a in done]


def watch(
    directory: str | os.PathLike[str],
    store: Store,
    *,
    name: str = "default",
    start: int | None = None,
    poll: float = 0.2,
    stop: threading.Event | None = None,
    on_applied: Callable[[Applied], None] | None = None,
    on_refused: Callable[[InvalidRequest], None] | None = None,
) -> int:
    """Applies ``directory``'s delta files as they come, every ``poll`` seconds, until
    ``stop`` is set (or forever); returns the files applied. A file that is refused (a gap, a
    file not whole yet, one that does not fit) is reported to ``on_refused`` and tried again
    at the next poll — a producer may still be writing it or the one before it; an error of
    the store itself ends the watch."""
    stop = stop or threading.Event()
    count = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            for a in apply(directory, store, name=name, start=start):
                count += 1
                if on_applied is not None:
                    on_applied(a)
        except InvalidRequest as e:
            if on_refused is not None:
                on_refused(e)
        stop.wait(max(0.0, poll - (time.monotonic() - started)))
    return count
