"""The planner: from a trace, where each table's rows should live in a DRAM budget.

Per table it measures, on a trace:

- the frequency histogram and the **hot-partition curve**: the share of lookups that the ``k``
  most frequent rows would serve if pinned (RecSSD's static partition);
- the **LRU hit-ratio curve** from Mattson stack distances (a dynamic row cache of ``c`` rows);
- the working set, and EMB-SSD's table type: **A** (small working set, high locality),
  **B** (small working set, low locality), **C** (large working set, moderate locality), or
  **D** (large working set, low locality: caching buys little).

To keep itself honest the planner ranks rows on the first half of the trace and scores every
curve on the second half (rows that were hot once but not later earn nothing). It then splits
the budget across tables greedily by marginal gain: each step gives the next slice of bytes to
the table whose lookups it saves most reads for (misses cost a device read each), looking ahead
past steps such as "keep the whole table". Each table's share is then split between a hot
partition and a row cache by trying a few splits on the trace with the hot rows taken out.
Bytes no curve could use (the trace was too short to show their value) become row caches,
spread by lookups. The curves are LRU's; the engine's caches may run LFU or admission, which
the benchmark compares.

``Plan.save`` writes a TOML file (and the hot rows beside it, ``.hot.npz``) that
``nearrec.open(path, plan=...)`` applies; ``Plan.plot`` draws the curves with the chosen points.

:func:`colocate` (row co-location, after Bandana) writes a copy of a store whose rows sit in an
order learnt from a trace, so that rows read together share blocks and one read serves several
lookups; row ids do not change.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ._native import (
    CACHE_SLOT_OVERHEAD,
    HOT_ROW_OVERHEAD,
    colocation_order,
    copy_store_ordered,
    plan_check_trace,
    plan_load,
    plan_make,
)
from .errors import InvalidRequest
from .keyed import index_bytes
from .manifest import StoreInfo
from .manifest import info as store_info
from .request import count, flag, path_arg, progress_enabled, regular_file
from .store import Store, open_store
from .trace import TableTrace, Trace, load
from .units import parse_size

#: Bookkeeping bytes beside the row itself, as the engine counts them: per row-cache slot, and
#: per pinned (hot) row.
SLOT_OVERHEAD = int(CACHE_SLOT_OVERHEAD)
HOT_OVERHEAD = int(HOT_ROW_OVERHEAD)


@dataclass
class TablePlan:
    table: str
    rows: int
    row_bytes: int
    table_bytes: int
    #: lookups of this table in the scored half of the trace
    lookups: int
    working_set: int
    #: LRU hit ratio with a cache of 10 % of the working set
    locality: float
    kind: str
    resident: bool = False
    hot_rows: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    cache_bytes: int = 0
    #: the share of lookups the plan expects DRAM to serve (on the scored half)
    expected_hit_ratio: float = 0.0
    #: (bytes, hot-partition hit ratio, LRU hit ratio) on a grid, for the plot
    curve: tuple[npt.NDArray[np.float64], ...] = ()
    #: DRAM the table takes: the whole table, or pinned rows plus the row cache
    bytes: int = 0


@dataclass
class Plan:
    """What the planner decided (``nearrec-plan``'s ``Plan``), table by table."""

    budget: int
    tables: dict[str, TablePlan]
    trace: str = ""
    store: str = ""
    _native: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def _from_native(cls, native: Any) -> Plan:
        tables = {}
        for (name, rows, row_bytes, table_bytes, lookups, working_set, locality, kind), \
                (resident, hot_rows, cache_bytes, hit_ratio, nbytes), curve in native.tables():
            tables[name] = TablePlan(name, rows, row_bytes, table_bytes, lookups, working_set,
                                     locality, kind, resident, hot_rows.astype(np.int64),
                                     cache_bytes, hit_ratio, tuple(curve), nbytes)
        return cls(native.budget, tables, native.trace, native.store, native)

    @property
    def bytes(self) -> int:
        return int(self._native.bytes)

    @property
    def expected_hit_ratio(self) -> float:
        return float(self._native.expected_hit_ratio)

    def placement(self) -> dict[str, dict[str, Any]]:
        """The ``plan=`` mapping :func:`nearrec.open` takes."""
        return {t.table: {"resident": t.resident, "hot_rows": t.hot_rows,
                          "cache_bytes": t.cache_bytes} for t in self.tables.values()}

    def save(self, path: str | Path) -> Path:
        """Writes the plan as TOML, with its hot rows in ``<path>.hot.npz`` beside it (both
        atomically; the file ``nearrec.open(path, plan=FILE)`` and ``--config`` apply)."""
        path = Path(path_arg(path, "the plan file"))
        self._native.save(str(path))
        return path

    def text(self) -> str:
        """The per-table table, for people."""
        return str(self._native.text())

    def plot(self, path: str | Path) -> Path:
        """Saves the hit-ratio curves of every table with the chosen operating points (PNG)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        tables = list(self.tables.values())
        cols = min(4, len(tables))
        rows = (len(tables) + cols - 1) // cols
        fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
        for ax, t in zip(axes.flat, tables, strict=False):
            size, hot, lru = t.curve
            ax.plot(size / 2**20, hot, label="hot partition")
            ax.plot(size / 2**20, lru, label="LRU cache")
            ax.axvline(t.bytes / 2**20, color="k", lw=0.8, ls="--")
            ax.plot([t.bytes / 2**20], [t.expected_hit_ratio], "ko")
            ax.set_title(f"{t.table} (type {t.kind})")
            ax.set_xlabel("MiB")
            ax.set_ylabel("hit ratio")
            ax.set_ylim(0, 1.02)
        for ax in list(axes.flat)[len(tables):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return Path(path)


def load_plan(path: str | Path) -> dict[str, dict[str, Any]]:
    """Reads a plan file into the ``plan=`` mapping of :func:`nearrec.open`. Anything wrong with
    the file or its ``.hot.npz`` (unreadable, not TOML, a corrupted or truncated archive, a
    ``resident`` that is not a bool, hot rows that are not 1-D integers) is an
    :class:`~nearrec.errors.InvalidRequest` naming the file and the table."""
    placement = json.loads(plan_load(regular_file(path, "the plan file")))
    return {name: {"resident": t["resident"], "hot_rows": np.asarray(t["hot_rows"], np.int64),
                   "cache_bytes": t["cache_bytes"]}
            for name, t in placement["tables"].items()}


def _tables(si: StoreInfo) -> list[tuple[str, int, int, int]]:
    return [(t.name, t.rows, t.row_bytes, t.data_bytes) for t in si.tables]


def _trace(tr: Trace, names: list[str] | None = None) -> list[tuple[str, int, Any, bool]]:
    if not isinstance(tr, Trace):
        raise InvalidRequest(f"a trace is a nearrec.trace.Trace or a trace file, not "
                             f"{type(tr).__name__}")
    return [(n, tr[n].rows, np.ascontiguousarray(tr[n].indices, dtype=np.int64), tr[n].keys)
            for n in (tr.tables if names is None else names)]


def _rows_of_keys(tr: Trace, store: Store) -> Trace:
    """``tr`` with each keyed table's keys mapped to the rows they hold in ``store`` now
    (:meth:`Store.key_rows`); keys it does not hold are dropped (a lookup of one reads no row),
    each bag keeping the rest."""
    tables = dict(tr.tables)
    for name, t in tr.tables.items():
        if not t.keys:
            continue
        rows = store.key_rows(name, np.ascontiguousarray(t.indices, dtype=np.int64))
        held = rows >= 0
        kept = np.concatenate([[0], np.cumsum(held, dtype=np.int64)])
        tables[name] = TableTrace(name, store.table(name).rows, t.pooling,
                                  kept[np.asarray(t.offsets)], rows[held], t.generator,
                                  t.first_reference_share)
    return Trace(tables, tr.batch_size, tr.seed, tr.path, tr.verified)


def make_plan(store: str | Path | StoreInfo | Store, trace: str | Path | Trace,
              budget: int | str, steps: int = 128) -> Plan:
    """Plans ``budget`` bytes of DRAM for ``store``'s tables from ``trace`` (see the module
    docs; the planner is ``nearrec-plan``'s). Tables the trace does not cover get nothing.

    A keyed table's trace holds keys: they are mapped to the rows they hold now through the
    store's key index, with the store open (an open embedded ``Store`` given is used as it is;
    a path is opened on the SSD tier for the mapping and closed); keys it does not hold are
    dropped. A key keeps its row while it is held, so the plan's hot rows stay its keys' until
    they are let go of. A keyed table's key index takes its part of the DRAM budget when the
    store is open (:func:`nearrec.keyed.index_bytes`), so the tiers are planned in what is left.
    """
    tr = trace if isinstance(trace, Trace) else load(path_arg(trace, "the trace"))
    if isinstance(store, Store):
        si = store.info
        if any(t.keys for t in tr.tables.values()):
            tr = _rows_of_keys(tr, store)
    else:
        si = store if isinstance(store, StoreInfo) else store_info(store)
        if any(t.keys for t in tr.tables.values()):
            with open_store(si.path, tier="ssd", progress=False) as opened:
                tr = _rows_of_keys(tr, opened)
    budget = parse_size(budget)
    index = sum(index_bytes(t.rows - 1) for t in si.tables if t.keyed)
    if index and index >= budget:
        raise InvalidRequest(f"the keyed tables' key indexes take {index} bytes of DRAM, all of "
                             f"the budget of {budget}: nothing is left to plan")
    native = plan_make(_tables(si), _trace(tr), budget - index, count(steps, "steps"),
                               str(getattr(tr, "path", "") or ""), str(si.path))
    return Plan._from_native(native)


def as_placement(plan: str | Path | Plan | Mapping[str, Mapping[str, Any]]
                 ) -> Mapping[str, Mapping[str, Any]]:
    """A plan file, a :class:`Plan` or a mapping, as the ``plan=`` mapping."""
    if isinstance(plan, Plan):
        return plan.placement()
    if isinstance(plan, str | Path):
        return load_plan(plan)
    return plan


#: How :func:`colocate` orders rows: most-read first, or in the order the trace first reads them.
COLOCATIONS = ("frequency", "first_touch")


def colocate(store: str | Path, trace: str | Path | Trace, out: str | Path,
             how: str = "frequency", tables: list[str] | None = None, overwrite: bool = False,
             progress: bool | None = None) -> StoreInfo:
    """Writes a copy of ``store`` at ``out`` in which each table the trace covers (or each of
    ``tables``; the others keep the order they have) stores its rows in the order ``how``
    derives from ``trace``: ``"frequency"`` puts the most-read rows first, ``"first_touch"``
    puts rows in the order the trace first reads them (rows read in the same bags and batches
    end up side by side). Rows the trace never reads follow in id order. Lookups keep their row
    ids; the SSD tier maps them to where the rows now sit, so a batch's rows that share a block
    cost one read (with read merging on, the default). The copy is format version 2, which
    builds that read only version 1 refuse.

    The source is checked against its checksums first; the copy appears atomically. Learn the
    order on one part of a trace and measure on another: ids first read later gain nothing.
    """
    if how not in COLOCATIONS:
        raise InvalidRequest(f"unknown co-location {how!r}; expected one of {COLOCATIONS}")
    if tables is not None and (isinstance(tables, str) or not all(isinstance(n, str)
                                                                   for n in tables)):
        raise InvalidRequest(f"tables is a list of table names, not {tables!r}")
    si = store_info(store)
    tr = trace if isinstance(trace, Trace) else load(path_arg(trace, "the trace"))
    names = list(tr.tables) if tables is None else list(tables)
    by_name = {t.name: t for t in si.tables}
    for n in names:
        if n not in by_name:
            raise InvalidRequest(f"no table {n!r} in the store (it has {list(by_name)})", table=n)
        if n not in tr.tables:
            raise InvalidRequest(f"the trace has no table {n!r}", table=n)
    if keyed := [n for n in names if tr[n].keys]:
        raise InvalidRequest(f"table {keyed[0]!r} is keyed: its rows are found by key, so it is "
                             "not co-located (give tables= without it)", table=keyed[0])
    plan_check_trace(_tables(si), _trace(tr, names))
    orders = [colocation_order(t.name, t.rows, np.ascontiguousarray(tr[t.name].indices),
                               how) if t.name in names else None
              for t in si.tables]
    params = {"source": si.params, "colocated": {
        "from": str(si.path), "trace": str(getattr(tr, "path", "") or ""), "how": how,
        "tables": names}}
    text = copy_store_ordered(path_arg(store), path_arg(out, "out"), orders,
                              flag(overwrite, "overwrite"),
                              json.dumps(params), progress_enabled(progress))
    return StoreInfo._from_json(out, text)


__all__ = ["COLOCATIONS", "Plan", "TablePlan", "as_placement", "colocate", "load_plan",
           "make_plan"]
