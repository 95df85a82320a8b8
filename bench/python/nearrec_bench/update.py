"""``nearrec bench update``: a live store's writes against the peers users have, and what they
cost the lookups served meanwhile.

(a) Durable row updates per second, 128 B and 512 B rows, 1, 64 and 4,096 rows per call, sync
    and async, from several Python threads (calls share log syncs: group commit), beside
    RocksDB (``rocksdict``: HugeCTR HPS's SSD layer) writing the same rows as write batches
    with ``sync`` on or off, and beside rebuilding the store (what users do today: the rate is
    the table's rows over the rebuild's seconds, every row changed at once).
(b) A fixed, open-loop lookup load (requests scheduled at a constant rate, each latency taken
    from its scheduled start, so a stall delays every request behind it: no coordinated
    omission): p50 / p99 alone, while updates run at 25 % and 50 % of (a)'s rate (sync, 64
    rows per call, themselves paced open-loop), with the rows of the 25 % window written before
    it and no writer (what the delta costs, apart from the writer), with the 25 % writer aimed
    at a third store instead (what sharing the machine costs, apart from the store), while
    compactions run back to back, and across a swap to another version of the store (failed
    requests counted).
(c) Compaction's write rate against the disk's sequential write rate, measured in the run.
(d) Acknowledgement to visible: from a write's return to the first lookup on another thread
    that sees it (RocksDB: a get).
(e) What the delta costs a lookup: closed-loop batches/s on one thread, DRAM and SSD tiers, with
    growing numbers of written rows not yet compacted.

Every cell is repeated (``rounds``, conditions interleaved) and reported as the median with
the spread of the rounds."""

from __future__ import annotations

import itertools
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import nearrec

from . import _native
from .harness import Harness
from .report import Record, rounds_spread
from .update_report import markdown

#: row sizes measured: bytes → fp32 dim
ROW_DIMS = {128: 32, 512: 128}
#: threads issuing the open-loop lookups, and the share of their closed-loop rate offered
ISSUERS = 4
LOAD_SHARE = 1 / 3


@dataclass
class UpdateConfig:
    table_bytes: int = 256 << 20  # per table
    per_call: tuple[int, ...] = (1, 64, 4096)
    writer_threads: int = 8
    seconds: float = 3.0
    rounds: int = 3
    load_seconds: float = 4.0
    #: bytes per second compactions write during (b) (the store's `compaction_rate`)
    compaction_rate: int = 128 << 20
    lookup_batch: int = 64
    lookup_pooling: int = 16
    visible_samples: int = 300
    #: rows written (uniformly over both tables) and left in the delta for (e)
    delta_rows: tuple[int, ...] = (0, 25_000, 100_000, 400_000)
    seed: int = 0
    scratch: Path = field(default_factory=lambda: Path("bench/scratch"))

    @classmethod
    def quick(cls) -> UpdateConfig:
        return cls(table_bytes=32 << 20, seconds=0.8, rounds=2, load_seconds=1.5,
                   visible_samples=100, delta_rows=(0, 10_000, 50_000))


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def _build(path: Path, rows: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tables = {f"r{b}": rng.standard_normal((rows[f"r{b}"], d), dtype=np.float32)
              for b, d in ROW_DIMS.items()}
    nearrec.from_numpy(path, tables, overwrite=True)
    return tables


def _threads(n: int, work: Callable[[int], int], seconds: float) -> float:
    """Runs ``work(k)`` on ``n`` threads until ``seconds`` pass (each returns the rows it
    wrote, checking the deadline itself); returns rows per second."""
    done = [0] * n

    def run(k: int) -> None:
        done[k] = work(k)

    ts = [threading.Thread(target=run, args=(k,)) for k in range(n)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(done) / (time.perf_counter() - t0)


def _nearrec_rate(store: Any, table: str, rows: int, dim: int, per_call: int, threads: int,
                  seconds: float, seed: int) -> float:
    def work(k: int) -> int:
        rng = np.random.default_rng(seed + k)
        values = rng.standard_normal((per_call, dim), dtype=np.float32)
        stop, n = time.perf_counter() + seconds, 0
        while time.perf_counter() < stop:
            store.write(table, rng.integers(0, rows, per_call), values)
            n += per_call
        return n

    return _threads(threads, work, seconds)


def _rocks_rate(db: Any, rows: int, row_bytes: int, per_call: int, threads: int,
                seconds: float, sync: bool, seed: int) -> float:
    from rocksdict import WriteBatch, WriteOptions

    opts = WriteOptions()
    opts.sync = sync
    value = bytes(row_bytes)

    def work(k: int) -> int:
        rng = np.random.default_rng(seed + k)
        stop, n = time.perf_counter() + seconds, 0
        while time.perf_counter() < stop:
            batch = WriteBatch(raw_mode=True)
            for i in rng.integers(0, rows, per_call).tolist():
                batch.put(i.to_bytes(8, "big"), value)
            db.write(batch, opts)
            n += per_call
        return n

    return _threads(threads, work, seconds)


def _write_rates(cfg: UpdateConfig, path: Path, rows: dict[str, int],
                 log: Callable[[str], None]) -> list[Record]:
    """(a): every (row size, rows per call, durability) cell, each system, rounds."""
    records: list[Record] = []
    try:
        import rocksdict  # noqa: F401

        have_rocks = True
    except ImportError:
        have_rocks = False
        log("rocksdict is not installed: RocksDB is left out (pip install rocksdict)")
    cells = [(b, k, mode) for b in ROW_DIMS for k in cfg.per_call for mode in ("sync", "async")]
    rates: dict[tuple[int, int, str, str], list[float]] = {}
    rocks_db = None
    if have_rocks:
        from rocksdict import Options, Rdict

        shutil.rmtree(cfg.scratch / "update-rocks", ignore_errors=True)
        rocks_db = Rdict(str(cfg.scratch / "update-rocks"), Options(raw_mode=True))
    for rnd in range(cfg.rounds):
        for mode in ("sync", "async"):
            store = nearrec.open(path, writable=True, tier="ssd", durability=mode,
                                 dram_budget=cfg.table_bytes // 2)
            for b, k, m in cells:
                if m != mode:
                    continue
                threads = cfg.writer_threads if k < 4096 else 2
                name, dim = f"r{b}", ROW_DIMS[b]
                r = _nearrec_rate(store, name, rows[name], dim, k, threads, cfg.seconds,
                                  cfg.seed + rnd)
                rates.setdefault((b, k, mode, "nearrec"), []).append(r)
                if rocks_db is not None:
                    rr = _rocks_rate(rocks_db, rows[name], b, k, threads, cfg.seconds,
                                     mode == "sync", cfg.seed + rnd)
                    rates.setdefault((b, k, mode, "rocksdb"), []).append(rr)
                log(f"round {rnd}: {b} B rows, {k}/call, {mode}: nearrec {r:,.0f} rows/s"
                    + (f", rocksdb {rr:,.0f}" if rocks_db is not None else ""))
            stats = store.live_stats()
            log(f"  ({mode}: {stats['log_syncs']:.0f} syncs for {stats['log_records']:.0f} "
                f"calls, {stats['compactions']:.0f} compactions)")
            del store
    if rocks_db is not None:
        rocks_db.close()
    # the rebuild: every row of the table, in one new store
    rebuild: dict[int, list[float]] = {}
    for rnd in range(cfg.rounds):
        for b, dim in ROW_DIMS.items():
            a = np.random.default_rng(rnd).standard_normal((rows[f"r{b}"], dim), np.float32)
            t0 = time.perf_counter()
            nearrec.from_numpy(cfg.scratch / "update-rebuild", {f"r{b}": a}, overwrite=True)
            rebuild.setdefault(b, []).append(len(a) / (time.perf_counter() - t0))
    shutil.rmtree(cfg.scratch / "update-rebuild", ignore_errors=True)
    for (b, k, mode, system), xs in rates.items():
        records.append(Record("update-write", f"{b}B", k, mode, system, _median(xs) / k,
                              _median(xs), extra={"rows_per_s": _median(xs),
                                                  "rounds_rows_per_s": xs,
                                                  "spread": rounds_spread(xs)}))
    for b, xs in rebuild.items():
        records.append(Record("update-write", f"{b}B", rows[f"r{b}"], "rebuild", "rebuild",
                              _median(xs) / rows[f"r{b}"], _median(xs),
                              extra={"rows_per_s": _median(xs), "rounds_rows_per_s": xs,
                                     "spread": rounds_spread(xs),
                                     "seconds": rows[f"r{b}"] / _median(xs)}))
    return records


def _requests(rows: dict[str, int], cfg: UpdateConfig, n: int) -> list[dict[str, Any]]:
    """``n`` lookup batches over both tables (Zipf-skewed ids, ``lookup_batch`` bags of
    ``lookup_pooling``)."""
    rng = np.random.default_rng(cfg.seed + 99)
    out = []
    for _ in range(n):
        batch = {}
        for name, r in rows.items():
            ids = (rng.zipf(1.1, cfg.lookup_batch * cfg.lookup_pooling) - 1) % r
            batch[name] = (ids.astype(np.int64),
                           np.arange(0, ids.size, cfg.lookup_pooling, dtype=np.int64))
        out.append(batch)
    return out


def _open_loop(store: Any, reqs: Sequence[Any], rate: float, seconds: float,
               issuers: int = ISSUERS, *, start: float | None = None,
               answered: Callable[[int, float, float, Any], None] | None = None
               ) -> tuple[list[float], int]:
    """Lookups scheduled at ``rate`` per second for ``seconds`` from ``start`` (a
    ``perf_counter`` time; by default, now); each latency (µs) is taken from its scheduled
    start. ``answered(i, scheduled, latency, pooled)`` sees each answer (request ``i`` of
    ``reqs`` cycled, its scheduled time), on the thread that got it. Returns the latencies and
    the failed requests."""
    n = max(1, int(rate * seconds))
    start = time.perf_counter() + 0.02 if start is None else start
    counter = itertools.count()
    lock = threading.Lock()
    lat: list[float] = []
    failed = [0]

    def issue() -> None:
        while True:
            with lock:
                i = next(counter)
            if i >= n:
                return
            at = start + i / rate
            wait = at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            try:
                pooled = store.lookup_many(reqs[i % len(reqs)])
                took = (time.perf_counter() - at) * 1e6
                if answered is not None:
                    answered(i, at, took, pooled)
                with lock:
                    lat.append(took)
            except Exception:  # noqa: BLE001 - any failure is what is counted
                with lock:
                    failed[0] += 1

    ts = [threading.Thread(target=issue) for _ in range(issuers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return lat, failed[0]


def _paced_writes(store: Any, rows: dict[str, int], calls_per_s: float, stop: threading.Event,
                  seed: int, per_call: int = 64) -> Callable[[], int]:
    """A thread writing calls of ``per_call`` rows (sync) at ``calls_per_s``, open-loop;
    returns a function that joins it and gives the rows written."""

    def run() -> int:
        done = 0
        rng = np.random.default_rng(seed)
        names = list(rows)
        values = {n: rng.standard_normal((per_call, ROW_DIMS[int(n[1:])]), dtype=np.float32)
                  for n in names}
        start, i = time.perf_counter(), 0
        while not stop.is_set():
            at = start + i / calls_per_s
            wait = at - time.perf_counter()
            if wait > 0:
                time.sleep(min(wait, 0.05))
                continue
            name = names[i % len(names)]
            store.write(name, rng.integers(0, rows[name], per_call), values[name])
            done += per_call
            i += 1
        return done

    return _spawn(run)


def _under_load(cfg: UpdateConfig, path: Path, twin: Path, other: Path, rows: dict[str, int],
                max_rate: float, log: Callable[[str], None]) -> list[Record]:
    """(b): the open-loop lookup load alone and beside each kind of write traffic. ``other``
    is a third store of the same shape: the 25 % writer aimed at it instead shares only the
    machine (cores, disk, page cache) with the lookups, not the store."""
    # a delta budget no update window fills half of: compactions run in their own condition,
    # not by chance at the end of an update window
    store = nearrec.open(path, writable=True, tier="ssd", durability="sync",
                         dram_budget=cfg.table_bytes // 2, delta_budget=4 * cfg.table_bytes,
                         compaction_rate=cfg.compaction_rate)
    store.compact()  # what (a) left
    elsewhere = nearrec.open(other, writable=True, tier="ssd", durability="sync",
                             dram_budget=cfg.table_bytes // 2, delta_budget=4 * cfg.table_bytes,
                             compaction_rate=cfg.compaction_rate)
    reqs = _requests(rows, cfg, 64)
    for r in reqs[:8]:
        store.lookup_many(r)  # warm
    # the load: a third of the batches the store serves closed-loop on the issuers' threads,
    # halved until the store keeps up with it alone (p99 within 10× the closed-loop latency)
    closed = _threads(ISSUERS, lambda k: _closed(store, reqs, 2.0), 2.0)
    rate = LOAD_SHARE * closed
    service_us = ISSUERS / closed * 1e6
    for _ in range(5):
        lat, _ = _open_loop(store, reqs, rate, 1.0)
        if lat and np.percentile(lat, 99) <= 10 * service_us:
            break
        rate /= 2
    log(f"lookups: {closed:,.0f} batches/s closed-loop ({service_us:,.0f} µs each on "
        f"{ISSUERS} threads); the open-loop load is {rate:,.0f}/s")
    conditions = ["idle", "updates 25%", "written 25%", "another store 25%",
                  "updates 25% ×4096", "updates 50%", "compaction", "swap"]
    got: dict[str, dict[str, list[float]]] = {c: {} for c in conditions}
    for rnd in range(cfg.rounds):
        for cond in conditions:
            stop = threading.Event()
            side: Callable[[], Any] = lambda: 0  # noqa: E731
            if cond.startswith("updates"):
                share = 0.25 if "25" in cond else 0.5
                k = 4096 if "4096" in cond else 64
                side = _paced_writes(store, rows, share * max_rate / k, stop, cfg.seed + rnd, k)
            elif cond == "written 25%":
                # the rows the 25 % writer leaves in the delta, written before the window: the
                # lookups' cost of the delta without the writer beside them
                _prefill(store, rows, 0.25 * max_rate * cfg.load_seconds, cfg.seed + rnd)
            elif cond == "another store 25%":
                side = _paced_writes(elsewhere, rows, 0.25 * max_rate / 64, stop, cfg.seed + rnd)
            elif cond == "compaction":
                side = _background(lambda: _compact_once(store, rows), stop)
            elif cond == "swap":
                side = _once(lambda: store.swap(twin, warm=True), cfg.load_seconds / 2, stop)
            lat, failed = _open_loop(store, reqs, rate, cfg.load_seconds)
            stop.set()
            extra = side()
            # every condition starts from the same store: written rows folded, the first
            # version served (not measured)
            if store.path != path:
                store.swap(path, warm=True)
            delta_rows = store.live_stats()["delta_rows"]
            store.compact()
            elsewhere.compact()
            c = got[cond]
            c.setdefault("p50", []).append(float(np.percentile(lat, 50)) if lat else 0.0)
            c.setdefault("p99", []).append(float(np.percentile(lat, 99)) if lat else 0.0)
            c.setdefault("served", []).append(len(lat) / cfg.load_seconds)
            c.setdefault("failed", []).append(float(failed))
            c.setdefault("side", []).append(float(extra or 0))
            c.setdefault("delta_rows", []).append(delta_rows)
            log(f"round {rnd}: {cond}: p50 {c['p50'][-1]:,.0f} µs, p99 {c['p99'][-1]:,.0f} µs"
                f", {failed} failed, side work {extra}, {delta_rows:,.0f} rows in the delta "
                f"at the end")
    idle_p99 = _median(got["idle"]["p99"])
    records = []
    for cond, c in got.items():
        p99 = _median(c["p99"])
        records.append(Record(
            "update-load", "r128+r512", cfg.lookup_batch, cond, "nearrec",
            _median(c["served"]), _median(c["served"]) * cfg.lookup_batch * cfg.lookup_pooling
            * 2, _median(c["p50"]), p99,
            extra={"p99_vs_idle": p99 / idle_p99 if idle_p99 else 0.0,
                   "rounds_p99_us": c["p99"], "spread_p99": rounds_spread(c["p99"]),
                   "failed": sum(c["failed"]), "side_work": c["side"],
                   "delta_rows_at_end": c["delta_rows"],
                   "offered_batches_per_s": rate}))
    return records


def _prefill(store: Any, rows: dict[str, int], n: float, seed: int) -> None:
    """Writes ``n`` rows as :func:`_paced_writes` spreads them (half per table, uniform ids),
    in calls of 4,096, as fast as they go."""
    rng = np.random.default_rng(seed)
    for name, r in rows.items():
        left = int(n) // len(rows)
        while left > 0:
            k = min(left, 4096)
            store.write(name, rng.integers(0, r, k),
                        rng.standard_normal((k, ROW_DIMS[int(name[1:])]), dtype=np.float32))
            left -= k


def _once(step: Callable[[], Any], after: float, stop: threading.Event) -> Callable[[], int]:
    """``step`` once, ``after`` seconds from now (unless ``stop`` comes first), on a thread;
    the join returns 1 if it ran."""

    def run() -> int:
        if stop.wait(after):
            return 0
        step()
        return 1

    return _spawn(run)


def _closed(store: Any, reqs: list[dict[str, Any]], seconds: float) -> int:
    stop, n = time.perf_counter() + seconds, 0
    while time.perf_counter() < stop:
        store.lookup_many(reqs[n % len(reqs)])
        n += 1
    return n


def _background(step: Callable[[], Any], stop: threading.Event) -> Callable[[], int]:
    """``step`` run again and again on a thread until ``stop``; the join returns the count."""

    def run() -> int:
        done = 0
        while not stop.is_set():
            step()
            done += 1
        return done

    return _spawn(run)


def _spawn(run: Callable[[], int]) -> Callable[[], int]:
    """``run`` on a thread of its own; returns a function that joins it and gives its count."""
    done = [0]

    def body() -> None:
        done[0] = run()

    t = threading.Thread(target=body)
    t.start()

    def join() -> int:
        t.join()
        return done[0]

    return join


def _compact_once(store: Any, rows: dict[str, int]) -> None:
    """A compaction with something to fold: 4,096 rows of each table, then ``compact()``."""
    rng = np.random.default_rng()
    for name, r in rows.items():
        dim = ROW_DIMS[int(name[1:])]
        store.write(name, rng.integers(0, r, 4096),
                    rng.standard_normal((4096, dim), dtype=np.float32))
    store.compact()


def _compaction_rate(cfg: UpdateConfig, path: Path, rows: dict[str, int],
                     log: Callable[[str], None]) -> list[Record]:
    """(c): compaction's bytes per second against the disk's sequential writes."""
    store = nearrec.open(path, writable=True, tier="ssd", durability="async",
                         auto_compact=False, dram_budget=cfg.table_bytes // 2)
    ours, disk = [], []
    total = 0
    for rnd in range(cfg.rounds):
        _compact_once(store, rows)  # fold what (a) left first
        rng = np.random.default_rng(rnd)
        for name, r in rows.items():
            dim = ROW_DIMS[int(name[1:])]
            ids = rng.choice(r, min(r, 20_000), replace=False)
            store.write(name, ids, rng.standard_normal((ids.size, dim), dtype=np.float32))
        done = store.compact()
        total = done.bytes
        ours.append(done.bytes / done.seconds)
        lim = _native.sequential_write(str(cfg.scratch), done.bytes)
        disk.append(lim["bytes_per_s"])
        log(f"round {rnd}: compaction {ours[-1] / 1e9:.2f} GB/s ({done.bytes / 1e6:.0f} MB, "
            f"{done.rows:,} rows); the disk's sequential writes {disk[-1] / 1e9:.2f} GB/s")
    return [Record("update-compaction", "r128+r512", 0, "whole tables", "nearrec",
                   0.0, 0.0, extra={"bytes_per_s": _median(ours), "rounds_bytes_per_s": ours,
                                    "disk_seq_write_bytes_per_s": _median(disk),
                                    "rounds_disk_bytes_per_s": disk,
                                    "share_of_disk": _median(ours) / _median(disk),
                                    "bytes": total, "spread": rounds_spread(ours)})]


def _visible(cfg: UpdateConfig, path: Path, rows: dict[str, int],
             log: Callable[[str], None]) -> list[Record]:
    """(d): from a write's return to the first read on another thread that sees it."""
    out = [_visible_nearrec(cfg, path, rows)]  # the store closes before RocksDB opens
    try:
        from rocksdict import Options, Rdict, WriteOptions
    except ImportError:
        return out
    rpath = cfg.scratch / "update-rocks-visible"
    shutil.rmtree(rpath, ignore_errors=True)
    db = Rdict(str(rpath), Options(raw_mode=True))
    opts = WriteOptions()
    opts.sync = True

    def rocks_write(row: int, x: float) -> None:
        db.put(row.to_bytes(8, "big"), np.full(32, x, np.float32).tobytes(), opts)

    def rocks_read(row: int) -> float:
        v = db.get(row.to_bytes(8, "big"))
        return float(np.frombuffer(v, np.float32)[0]) if v is not None else float("nan")

    out.append(_visible_one("rocksdb", rocks_write, rocks_read, rows["r128"], cfg))
    db.close()
    shutil.rmtree(rpath, ignore_errors=True)
    for r in out:
        log(f"{r.system}: acknowledgement to visible p50 {r.p50_us:,.1f} µs, "
            f"p99 {r.p99_us:,.1f} µs")
    return out


def _visible_nearrec(cfg: UpdateConfig, path: Path, rows: dict[str, int]) -> Record:
    store = nearrec.open(path, writable=True, tier="ssd", durability="sync",
                         dram_budget=cfg.table_bytes // 2)

    def read(row: int) -> float:
        return float(store.lookup("r128", [row], offsets=[0])[0, 0])

    def write(row: int, x: float) -> None:
        store.write("r128", [row], np.full((1, 32), x, np.float32))

    return _visible_one("nearrec", write, read, rows["r128"], cfg)


def _visible_one(system: str, write: Callable[[int, float], None],
                 read: Callable[[int], float], rows: int, cfg: UpdateConfig) -> Record:
    acked: list[tuple[int, float, float]] = []
    ready = threading.Event()
    seen: list[float] = []
    done = threading.Event()

    def reader() -> None:
        k = 0
        while k < cfg.visible_samples:
            ready.wait()
            row, x, t_ack = acked[k]
            while read(row) != x:
                pass
            seen.append((time.perf_counter() - t_ack) * 1e6)
            k += 1
            ready.clear()
            done.set()

    t = threading.Thread(target=reader)
    t.start()
    rng = np.random.default_rng(cfg.seed)
    for k in range(cfg.visible_samples):
        row = int(rng.integers(0, rows))
        x = float(k + 1)
        write(row, x)
        acked.append((row, x, time.perf_counter()))
        done.clear()
        ready.set()
        done.wait()
    t.join()
    return Record("update-visible", "128B", 1, "sync", system, 0.0, 0.0,
                  float(np.percentile(seen, 50)), float(np.percentile(seen, 99)),
                  extra={"samples": len(seen)})


def _delta_cost(cfg: UpdateConfig, path: Path, rows: dict[str, int],
                log: Callable[[str], None]) -> list[Record]:
    """(e): closed-loop lookups on one thread with ``cfg.delta_rows`` rows written since the
    last compaction (a delta budget that holds them all, so none is compacted meanwhile)."""
    reqs = _requests(rows, cfg, 64)
    total = sum(rows.values())
    out = []
    for tier in ("dram", "ssd"):
        got: dict[int, list[tuple[float, float, float]]] = {n: [] for n in cfg.delta_rows}
        for rnd in range(cfg.rounds):
            store = nearrec.open(path, writable=True, tier=tier, durability="async",
                                 dram_budget=cfg.table_bytes // 2, delta_budget=1 << 30)
            store.compact()
            _closed(store, reqs, cfg.seconds)  # warm: the SSD tier's row caches fill
            rng, written = np.random.default_rng(cfg.seed + rnd), 0
            for n in sorted(cfg.delta_rows):
                while written < n:
                    for name, r in rows.items():
                        k = max(1, min(4096, n - written) * r // total)
                        store.write(name, rng.integers(0, r, k),
                                    rng.standard_normal((k, ROW_DIMS[int(name[1:])]),
                                                        dtype=np.float32))
                        written += k
                for q in reqs[:8]:
                    store.lookup_many(q)  # warm
                lat: list[float] = []
                stop = time.perf_counter() + cfg.seconds
                while time.perf_counter() < stop:
                    t = time.perf_counter()
                    store.lookup_many(reqs[len(lat) % len(reqs)])
                    lat.append(time.perf_counter() - t)
                us = np.array(lat) * 1e6
                got[n].append((len(lat) / cfg.seconds, float(np.percentile(us, 50)),
                               float(np.percentile(us, 99))))
                log(f"round {rnd}: tier {tier}, {store.live_stats()['delta_rows']:,.0f} rows "
                    f"in the delta: {got[n][-1][0]:,.0f} batches/s")
            store.compact()
            del store
        idle = _median([g[0] for g in got[0]]) if 0 in got else 0.0
        for n, g in got.items():
            rate = _median([x[0] for x in g])
            out.append(Record("update-delta", tier, cfg.lookup_batch, f"{n} rows", "nearrec",
                              rate, rate * cfg.lookup_batch * cfg.lookup_pooling * 2,
                              _median([x[1] for x in g]), _median([x[2] for x in g]),
                              extra={"delta_rows": n, "spread": rounds_spread([x[0] for x in g]),
                                     "vs_empty": rate / idle if idle else 0.0}))
    return out


def run(cfg: UpdateConfig, log: Callable[[str], None] = print) -> list[Record]:
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    rows = {f"r{b}": cfg.table_bytes // b for b in ROW_DIMS}
    path, twin = cfg.scratch / "update-store", cfg.scratch / "update-twin"
    other = cfg.scratch / "update-other"
    log(f"building three stores of {len(rows)} tables ({cfg.table_bytes >> 20} MiB each)")
    _build(path, rows, cfg.seed)
    _build(twin, rows, cfg.seed + 1)
    _build(other, rows, cfg.seed + 2)
    records = _write_rates(cfg, path, rows, log)
    # the load runs beside updates at shares of the sync rate of 64-row calls of 128 B rows
    max_rate = next(r.lookups_per_s for r in records
                    if r.system == "nearrec" and r.model == "128B" and r.batch == 64
                    and r.dist == "sync")
    records += _under_load(cfg, path, twin, other, rows, max_rate, log)
    records += _compaction_rate(cfg, path, rows, log)
    records += _visible(cfg, path, rows, log)
    records += _delta_cost(cfg, path, rows, log)
    for p in (path, twin, other):
        shutil.rmtree(p, ignore_errors=True)
    shutil.rmtree(cfg.scratch / "update-rocks", ignore_errors=True)
    return records


HARNESSES = {"update": Harness(UpdateConfig, UpdateConfig.quick,
                               {"--table-bytes": "table_bytes", "--scratch": "scratch"},
                               run, markdown)}
