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
import sys
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ._native import CACHE_SLOT_OVERHEAD, HOT_ROW_OVERHEAD, colocation_order, copy_store_ordered
from .errors import InvalidRequest, TraceMismatch
from .request import count, flag, path_arg, regular_file
from .store import StoreInfo, TableInfo, progress_enabled
from .store import info as store_info
from .trace import Trace, load, profile
from .units import parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Bookkeeping bytes beside the row itself, as the engine counts them: per row-cache slot, and
#: per pinned (hot) row.
SLOT_OVERHEAD = int(CACHE_SLOT_OVERHEAD)
HOT_OVERHEAD = int(HOT_ROW_OVERHEAD)
#: Splits of a table's share tried between hot partition and row cache.
SPLITS = (0.0, 0.25, 0.5, 0.75, 1.0)


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

    @property
    def bytes(self) -> int:
        if self.resident:
            return self.table_bytes
        return len(self.hot_rows) * (self.row_bytes + HOT_OVERHEAD) + self.cache_bytes


@dataclass
class Plan:
    budget: int
    tables: dict[str, TablePlan]
    trace: str = ""
    store: str = ""

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.tables.values())

    @property
    def expected_hit_ratio(self) -> float:
        lookups = sum(t.lookups for t in self.tables.values())
        hits = sum(t.lookups * t.expected_hit_ratio for t in self.tables.values())
        return hits / max(1, lookups)

    def placement(self) -> dict[str, dict[str, Any]]:
        """The ``plan=`` mapping :func:`nearrec.open` takes."""
        return {t.table: {"resident": t.resident, "hot_rows": t.hot_rows,
                          "cache_bytes": t.cache_bytes} for t in self.tables.values()}

    def save(self, path: str | Path) -> Path:
        """Writes the plan as TOML, with its hot rows in ``<path>.hot.npz`` beside it."""
        path = Path(path_arg(path, "the plan file"))
        hot = path.with_suffix(".hot.npz")
        arrays: dict[str, Any] = {t.table: t.hot_rows for t in self.tables.values()}
        np.savez(hot, **arrays)
        lines = ["# nearrec plan: DRAM placement of a store's tables for a trace",
                 f"budget_bytes = {self.budget}", f"bytes = {self.bytes}",
                 f"expected_hit_ratio = {self.expected_hit_ratio:.6f}",
                 f"trace = {_quote(self.trace)}", f"store = {_quote(self.store)}",
                 f"hot_rows_file = {_quote(hot.name)}", ""]
        for t in self.tables.values():
            lines += [f"[tables.{_quote(t.table)}]", f"type = {_quote(t.kind)}",
                      f"resident = {str(t.resident).lower()}",
                      f"hot_rows = {len(t.hot_rows)}", f"cache_bytes = {t.cache_bytes}",
                      f"bytes = {t.bytes}", f"expected_hit_ratio = {t.expected_hit_ratio:.6f}",
                      f"rows = {t.rows}", f"working_set = {t.working_set}",
                      f"locality = {t.locality:.6f}", f"lookups = {t.lookups}", ""]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("\n".join(lines))
        tmp.replace(path)
        return path

    def text(self) -> str:
        """The per-table table, for people."""
        out = [f"plan: {self.bytes / 2**20:,.1f} of {self.budget / 2**20:,.1f} MiB, expected "
               f"DRAM hit ratio {100 * self.expected_hit_ratio:.1f} %",
               f"{'table':<12} {'type':>4} {'rows':>11} {'work set':>10} {'local':>6} "
               f"{'whole':>5} {'hot rows':>10} {'cache MiB':>9} {'MiB':>8} {'hit %':>6}"]
        for t in self.tables.values():
            out.append(f"{t.table:<12} {t.kind:>4} {t.rows:>11,} {t.working_set:>10,} "
                       f"{t.locality:>6.2f} {'yes' if t.resident else '-':>5} "
                       f"{len(t.hot_rows):>10,} {t.cache_bytes / 2**20:>9.1f} "
                       f"{t.bytes / 2**20:>8.1f} {100 * t.expected_hit_ratio:>6.1f}")
        return "\n".join(out)

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


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def load_plan(path: str | Path) -> dict[str, dict[str, Any]]:
    """Reads a plan file into the ``plan=`` mapping of :func:`nearrec.open`. Anything wrong with
    the file or its ``.hot.npz`` (unreadable, not TOML, a corrupted or truncated archive, a
    ``resident`` that is not a bool, hot rows that are not 1-D integers) is an
    :class:`~nearrec.errors.InvalidRequest` naming the file and the table."""
    path = Path(regular_file(path, "the plan file"))
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise InvalidRequest(f"{path}: not a readable plan: {e}") from None
    tables, hot_name = doc.get("tables", {}), doc.get("hot_rows_file")
    if not isinstance(tables, dict) or not all(isinstance(t, dict) for t in tables.values()):
        raise InvalidRequest(f"{path}: not a plan: [tables.NAME] must be tables of settings")
    if not isinstance(hot_name, str) or not hot_name:
        raise InvalidRequest(f"{path}: not a plan: hot_rows_file must name the .hot.npz file")
    out: dict[str, dict[str, Any]] = {}
    try:
        hot = np.load(regular_file(path.parent / hot_name, f"{path}: hot_rows_file"),
                      allow_pickle=False)
        if not isinstance(hot, np.lib.npyio.NpzFile):
            raise InvalidRequest(f"{path}: {hot_name} is not an .npz archive")
        with hot:
            for name, t in tables.items():
                rows = hot[name] if name in hot.files else np.zeros(0, np.int64)
                out[name] = _plan_entry(path, name, t, rows)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise InvalidRequest(f"{path}: the hot rows in {hot_name} are unreadable: "
                             f"{type(e).__name__}: {e}") from None
    return out


def _plan_entry(path: Path, name: str, t: Mapping[str, Any], rows: Any) -> dict[str, Any]:
    """One table of a plan file, its types checked."""
    where = f"{path}: table {name!r}"
    resident = t.get("resident", False)
    if not isinstance(resident, bool):
        raise InvalidRequest(f"{where}: resident must be true or false, not {resident!r}",
                             table=name)
    try:
        cache = parse_size(t.get("cache_bytes", 0))
    except InvalidRequest as e:
        raise InvalidRequest(f"{where}: cache_bytes: {e}", table=name) from None
    if rows.dtype.kind not in "iu" or rows.ndim != 1:
        raise InvalidRequest(f"{where}: hot rows must be a 1-D integer array, not {rows.dtype} "
                             f"of shape {rows.shape}", table=name)
    count_ = t.get("hot_rows")
    if isinstance(count_, int) and not isinstance(count_, bool) and count_ != len(rows):
        raise InvalidRequest(f"{where}: the plan lists {count_} hot rows but the .hot.npz holds "
                             f"{len(rows)}", table=name)
    return {"resident": resident, "hot_rows": rows, "cache_bytes": cache}


def _check_trace(si: StoreInfo, tr: Trace, names: list[str] | None = None) -> None:
    """The trace's tables (or ``names`` of them) against the store: each one the store has,
    with the store's row count, and every row id in range -- at plan time, not at open."""
    if not isinstance(tr, Trace):
        raise InvalidRequest(f"a trace is a nearrec.trace.Trace or a trace file, not "
                             f"{type(tr).__name__}")
    by_name = {t.name: t for t in si.tables}
    for n in tr.tables if names is None else names:
        if n not in by_name:
            raise TraceMismatch(f"the trace has table {n!r}, which the store lacks (it has "
                               f"{list(by_name)})", table=n)
        t, rows = tr[n], by_name[n].rows
        if t.rows != rows:
            raise TraceMismatch(f"the trace's table {n!r} has {t.rows} rows but the store's has "
                               f"{rows}: the trace was made for another store", table=n)
        ids = np.asarray(t.indices)
        if ids.size:
            bad = (ids < 0) | (ids >= rows)
            if bad.any():
                pos = int(np.argmax(bad))
                raise TraceMismatch(f"the trace's table {n!r} reads row {int(ids[pos])} at "
                                   f"position {pos}, outside the store's {rows} rows", table=n,
                                   position=pos)


def _kind(working_set: int, rows: int, locality: float) -> str:
    small = working_set <= 0.1 * rows
    if small:
        return "A" if locality >= 0.5 else "B"
    return "C" if locality >= 0.2 else "D"


@dataclass
class _Curves:
    """One table's value of DRAM bytes, scored on the second half of the trace."""

    info: TableInfo
    lookups: int
    order: npt.NDArray[np.int64]  # rows by first-half frequency
    hot_hits: npt.NDArray[np.float64]  # second-half hits of the k first rows of `order`
    test: npt.NDArray[np.int64]
    lru: Any  # Profile of the second half
    working_set: int
    locality: float

    @property
    def slot(self) -> int:
        """Bytes of one row-cache slot."""
        return self.info.row_bytes + SLOT_OVERHEAD

    @property
    def pin(self) -> int:
        """Bytes of one pinned row."""
        return self.info.row_bytes + HOT_OVERHEAD

    def hits(self, nbytes: float) -> float:
        """Lookups served by the better of a hot partition and an LRU cache of ``nbytes``."""
        if nbytes >= self.info.data_bytes:
            return float(self.lookups)
        hot = float(self.hot_hits[min(int(nbytes // self.pin), len(self.hot_hits) - 1)])
        return max(hot, float(self.lru.lru_hit_ratio(int(nbytes // self.slot))) * self.lookups)

    def split(self, nbytes: int) -> tuple[float, int, int]:
        """The best split of ``nbytes`` into hot rows and cache bytes: (hits, hot rows, cache
        bytes)."""
        best = (-1.0, 0, 0)
        for f in SPLITS:
            k = min(int(f * nbytes // self.pin), len(self.order))
            cache = nbytes - k * self.pin
            if k:
                rest = self.test[~np.isin(self.test, self.order[:k])]
            else:
                rest = self.test
            cached = profile(rest).lru_hit_ratio(cache // self.slot) * len(rest) if len(rest) \
                else 0.0
            hits = float(self.hot_hits[k]) + cached
            if hits > best[0] + 1e-9:
                best = (hits, k, int(cache))
        return best


def _curves(info: TableInfo, indices: npt.NDArray[np.int64]) -> _Curves:
    half = len(indices) // 2
    train, test = np.asarray(indices[:half]), np.asarray(indices[half:])
    rows, counts = np.unique(train, return_counts=True)
    order = rows[np.argsort(-counts, kind="stable")]
    test_rows, test_counts = np.unique(test, return_counts=True)
    # second-half lookups of each first-half row, in first-half frequency order
    at = np.searchsorted(test_rows, order)
    found = (at < len(test_rows)) & (test_rows[np.minimum(at, len(test_rows) - 1)] == order)
    gain = np.where(found, test_counts[np.minimum(at, len(test_rows) - 1)], 0)
    hot_hits = np.concatenate([[0], np.cumsum(gain)]).astype(np.float64)
    lru = profile(test)
    ws = lru.working_set
    locality = float(lru.lru_hit_ratio(max(1, ws // 10))) if len(test) else 0.0
    return _Curves(info, len(test), order.astype(np.int64), hot_hits, test, lru, ws, locality)


def make_plan(store: str | Path | StoreInfo, trace: str | Path | Trace, budget: int | str,
              steps: int = 128) -> Plan:
    """Plans ``budget`` bytes of DRAM for ``store``'s tables from ``trace`` (see the module
    docs). Tables the trace does not cover get nothing."""
    si = store if isinstance(store, StoreInfo) else store_info(store)
    tr = trace if isinstance(trace, Trace) else load(path_arg(trace, "the trace"))
    total = parse_size(budget)
    steps = count(steps, "steps")
    _check_trace(si, tr)
    by_name = {t.name: t for t in si.tables}
    curves = {n: _curves(by_name[n], tr[n].indices) for n in tr.tables}
    chunk = max(1, total // steps)
    given = dict.fromkeys(curves, 0)
    left = total
    while left >= chunk:
        best: tuple[float, str, int] | None = None
        for n, c in curves.items():
            now = c.hits(given[n])
            # look ahead: the best gain per byte over any number of further chunks
            for k in range(1, left // chunk + 1):
                extra = k * chunk
                gain = (c.hits(given[n] + extra) - now) / extra
                if best is None or gain > best[0] + 1e-15:
                    best = (gain, n, extra)
                if given[n] + extra >= c.info.data_bytes:
                    break
        if best is None or best[0] <= 0:
            break
        _, n, extra = best
        extra = min(extra, max(0, curves[n].info.data_bytes - given[n]))
        if extra == 0:
            break
        given[n] += extra
        left -= extra
    # bytes no curve could use (the trace saw too little) still serve as row caches: spread them
    # over the tables not kept whole, in proportion to their lookups
    open_tables = [n for n in curves if given[n] < curves[n].info.data_bytes]
    weight = sum(curves[n].lookups for n in open_tables)
    leftover = dict.fromkeys(curves, 0)
    for n in open_tables:
        leftover[n] = left * curves[n].lookups // max(1, weight)
    tables: dict[str, TablePlan] = {}
    for n, c in curves.items():
        grid = np.linspace(0, min(total, c.info.data_bytes), 65)
        pins = (grid // c.pin).astype(np.int64)
        slots = (grid // c.slot).astype(np.int64)
        curve = (grid, c.hot_hits[np.minimum(pins, len(c.hot_hits) - 1)] / max(1, c.lookups),
                 np.asarray(c.lru.lru_hit_ratio(slots), dtype=np.float64))
        tp = TablePlan(n, c.info.rows, c.info.row_bytes, c.info.data_bytes, c.lookups,
                       c.working_set, c.locality,
                       _kind(c.working_set, c.info.rows, c.locality), curve=curve)
        b = given[n]
        if b >= c.info.data_bytes:
            tp.resident, tp.expected_hit_ratio = True, 1.0
        elif b + leftover[n] > 0:
            hits, k_hot, cache = c.split(b)
            tp.hot_rows = c.order[:k_hot].copy()
            tp.cache_bytes = cache + leftover[n]
            tp.expected_hit_ratio = hits / max(1, c.lookups)
        tables[n] = tp
    return Plan(total, tables, str(getattr(tr, "path", "") or ""), str(si.path))


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
    _check_trace(si, tr, names)
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
