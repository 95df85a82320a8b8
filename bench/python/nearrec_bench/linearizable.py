"""Is a history of single-row writes and reads linearizable? The checker of the partition
harness (``nearrec bench partitions``), after Knossos and Porcupine: Wing and Gong's search with
Lowe's cache of (operations linearized, state) pairs, run on each key alone (a register per
row: linearizability composes over independent objects).

A history is a list of :class:`Op`, each with the time it was invoked and the time its answer
came. A write that failed for sure (the store refused it before it could take effect) took no
effect and is left out; a write whose answer never came (a timeout, a crash, a partition) may
have taken effect at any time after it was invoked, or never — its completion is taken as
infinitely late; a read with no answer says nothing and is left out. Such a write whose value no
read returned is left out too (exactly: had it taken effect, no read saw it before it was
overwritten, so the history is linearizable with it never taking effect), which keeps the search
small where many writes had no answer. A search past ``budget`` steps on one key gives up and
says so (the verdict is then neither yes nor no).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Op", "Verdict", "check"]


@dataclass(frozen=True)
class Op:
    """One call: a ``write`` of ``value`` to ``key``, or a ``read`` of ``key`` that answered
    ``value``; ``complete`` is ``None`` when no answer came, ``ok`` ``False`` when the call
    failed for sure (it took no effect)."""

    kind: Literal["write", "read"]
    key: Hashable
    value: Any
    invoke: float
    complete: float | None
    ok: bool = True
    client: int = 0


@dataclass(frozen=True)
class Verdict:
    """``ok``, or the first key whose operations no order explains, with them and the call
    the search could not get past."""

    ok: bool
    key: Hashable | None = None
    ops: tuple[Op, ...] = ()
    stuck: Op | None = None
    keys: int = 0
    #: the search on ``key`` gave up (its budget spent): neither linearizable nor not
    undecided: bool = False

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        if self.ok:
            return f"linearizable ({self.keys} keys)"
        if self.undecided:
            return (f"undecided: key {self.key!r}, {len(self.ops)} operations, past the search's "
                    f"budget")
        return (f"not linearizable: key {self.key!r}, {len(self.ops)} operations; no order "
                f"takes it past {self.stuck}")


def check(history: Iterable[Op], initial: Any = None, budget: int = 20_000_000) -> Verdict:
    """Whether ``history`` is linearizable as a set of registers, each ``initial`` at first;
    ``budget``: the search's steps on one key before it gives up."""
    by_key: dict[Hashable, list[Op]] = defaultdict(list)
    for op in history:
        if op.kind not in ("write", "read"):
            raise ValueError(f"an operation is a write or a read, not {op.kind!r}")
        if op.complete is not None and op.complete < op.invoke:
            raise ValueError(f"{op} completes before it is invoked")
        if not op.ok or (op.kind == "read" and op.complete is None):
            continue  # no effect, or no answer to check
        by_key[op.key].append(op)
    for key, ops in by_key.items():
        read = {op.value for op in ops if op.kind == "read"}
        ops = [op for op in ops if op.kind == "read" or op.complete is not None
               or op.value in read]
        try:
            stuck = _check_register(ops, initial, budget)
        except _Spent:
            return Verdict(False, key, tuple(ops), None, len(by_key), undecided=True)
        if stuck is not None:
            return Verdict(False, key, tuple(ops), stuck, len(by_key))
    return Verdict(True, keys=len(by_key))


class _Spent(Exception):
    """The search's budget ran out."""


class _Entry:
    """A call or a return in the doubly linked list of the search."""

    __slots__ = ("call", "match", "next", "op", "prev")

    def __init__(self, op: int, call: bool) -> None:
        self.op, self.call = op, call
        self.match: _Entry | None = None
        self.prev: _Entry | None = None
        self.next: _Entry | None = None


def _check_register(ops: list[Op], initial: Any, budget: int) -> Op | None:
    """``None`` when ``ops`` (one key's) linearize as a register, else the operation whose
    return the deepest search could not get past."""
    events = []
    for i, op in enumerate(ops):
        done = math.inf if op.complete is None else op.complete
        # at one instant, calls sort before returns: operations that touch are concurrent
        events.append((op.invoke, 0, i))
        events.append((done, 1, i))
    events.sort()
    head = _Entry(-1, False)
    last = head
    calls: dict[int, _Entry] = {}
    for _, kind, i in events:
        e = _Entry(i, kind == 0)
        if e.call:
            calls[i] = e
        else:
            calls[i].match = e
        last.next, e.prev = e, last
        last = e

    def lift(e: _Entry) -> None:
        for x in (e, e.match):
            assert x is not None and x.prev is not None
            x.prev.next = x.next
            if x.next is not None:
                x.next.prev = x.prev

    def unlift(e: _Entry) -> None:
        for x in (e.match, e):
            assert x is not None and x.prev is not None
            x.prev.next = x
            if x.next is not None:
                x.next.prev = x

    state, done_mask = initial, 0
    cache: set[tuple[int, Any]] = set()
    stack: list[tuple[_Entry, Any]] = []
    deepest, stuck = -1, None
    entry = head.next
    while head.next is not None:
        assert entry is not None
        budget -= 1
        if budget < 0:
            raise _Spent
        if entry.call:
            op = ops[entry.op]
            if op.kind == "write":
                fits, after = True, op.value
            else:
                fits, after = op.value == state, state
            if fits:
                mask = done_mask | (1 << entry.op)
                if (mask, after) not in cache:
                    cache.add((mask, after))
                    stack.append((entry, state))
                    state, done_mask = after, mask
                    lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
        else:
            if len(stack) > deepest:
                deepest, stuck = len(stack), ops[entry.op]
            if not stack:
                return stuck
            entry, state = stack.pop()
            done_mask &= ~(1 << entry.op)
            unlift(entry)
            entry = entry.next
    return None
