"""``nearrec bench soak``: one node under many clients for a long time, and what it holds.

A node (``nearrec serve --writable``, SSD tier) serves two stores: ``main``, a model's tables
with the model kept beside them, and ``live``, which a few clients write. Every client has its
own connection and its own open-loop schedule (Poisson arrivals; a call's latency counts from
when it was due, so a node that falls behind shows it: no coordinated omission). The offered
rate is ``load`` × the capacity measured first, closed-loop, on the same mix:

- readers (most clients): pooled lookups of every ``main`` table (``1 − infer``), or the kept
  model run on the node (``infer``), or a lookup of ``live``'s tables nobody writes;
- writers (one client in ten): upserts of rows in a range of ``live``'s first table that only
  they write, each applied, once acknowledged, to an embedded reference (a copy of ``live``
  opened in this process).

One answer in ``check_every`` is checked against an embedded reference of the same data (a
writer's reads of its own rows: exactly; pooled sums and model outputs within float tolerance).
Half-way, ``main`` is swapped to a copy of itself built offline, and a little later ``live``
is compacted: answers must not change. Every ``sample_s`` the node's RSS, open descriptors
and threads are read from ``/proc``.

The record: calls and errors by kind, answers checked and wrong, p50 / p99 per minute, RSS
(max and slope after the warm-up fifth), descriptors and threads (min and max), the events.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import nearrec

from . import _native
from .harness import Harness
from .report import Record
from .served import node

KINDS = ("lookup", "infer", "live", "write")


@dataclass
class SoakConfig:
    minutes: float = 30.0
    clients: int = 64
    #: the offered rate, as a share of the capacity measured first
    load: float = 0.7
    model: str = "rmc1"
    rows: int = 500_000
    live_rows: int = 100_000
    #: bags per table in a lookup, ids per bag
    batch: int = 16
    pooling: int = 8
    #: of a reader's calls: model runs, and lookups of ``live``
    infer: float = 0.15
    live: float = 0.10
    #: rows per write
    write_rows: int = 8
    dram_budget: str = "64MiB"
    check_every: int = 10
    sample_s: float = 10.0
    probe_s: float = 20.0
    seed: int = 0
    #: random reads of ``main``'s files (queue depth 128) that measure the disk before and
    #: after the run
    disk_reads: int = 100_000
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> SoakConfig:
        return cls(minutes=1.0, clients=8, rows=20_000, live_rows=8_000, sample_s=2.0,
                   probe_s=3.0, check_every=3, disk_reads=5_000)


@dataclass
class Tally:
    """What the clients did, shared under a lock."""

    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    errors: dict[str, int] = field(default_factory=dict)
    checked: int = 0
    wrong: list[str] = field(default_factory=list)
    #: (due, latency s, kind)
    latencies: list[tuple[float, float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def error(self, kind: str, e: Exception) -> None:
        key = f"{kind}: {type(e).__name__}"
        with self.lock:
            self.errors[key] = self.errors.get(key, 0) + 1


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= 1e-5 * (1 + np.abs(a) + np.abs(b))))


class Client:
    """One client: its connection, its schedule and its share of the calls."""

    def __init__(self, k: int, cfg: SoakConfig, address: str, refs: dict[str, Any],
                 dense: int, writer: bool, tally: Tally) -> None:
        self.k, self.cfg, self.refs, self.dense, self.writer = k, cfg, refs, dense, writer
        self.tally = tally
        self.store = nearrec.connect(address, "main", timeout=30)
        self.live = nearrec.connect(address, "live", timeout=30)
        self.rng = np.random.default_rng([cfg.seed, k])
        self.main_tables = list(refs["main"].tables)
        self.live_tables = list(refs["live"].tables)
        span = cfg.live_rows // max(1, cfg.clients)
        self.mine = (k * span, (k + 1) * span)
        self.n = 0

    def close(self) -> None:
        self.store.close()
        self.live.close()

    def _bags(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        cfg = self.cfg
        # a skewed draw: most ids among the first hundredth of the rows
        hot = self.rng.random(cfg.batch * cfg.pooling) < 0.8
        ids = np.where(hot, self.rng.integers(0, max(1, rows // 100), hot.size),
                       self.rng.integers(0, rows, hot.size)).astype(np.int64)
        return ids, np.full(cfg.batch, cfg.pooling, np.int64)

    def one(self) -> str:
        """One call, its answer checked when its turn comes; the kind of call it was."""
        self.n += 1
        check = self.n % self.cfg.check_every == 0
        if self.writer:
            self._write(check)
            return "write"
        r = self.rng.random()
        if r < self.cfg.infer:
            self._infer(check)
            return "infer"
        if r < self.cfg.infer + self.cfg.live:
            self._read(self.live, "live", self.live_tables[1:], self.cfg.live_rows, check)
            return "live"
        self._read(self.store, "main", self.main_tables, self.cfg.rows, check)
        return "lookup"

    def _lookups(self, tables: list[str], rows: int) -> list[nearrec.TableLookup]:
        out = []
        for t in tables:
            ids, lengths = self._bags(rows)
            out.append(nearrec.TableLookup(t, ids, lengths=lengths))
        return out

    def _read(self, store: Any, ref: str, tables: list[str], rows: int, check: bool) -> None:
        reqs = self._lookups(tables, rows)
        got = store.lookup_many(reqs).values
        if check:
            self._compare(f"{ref} lookup", got, self.refs[ref].lookup_many(reqs).values)

    def _infer(self, check: bool) -> None:
        reqs = self._lookups(self.main_tables, self.cfg.rows)
        dense = self.rng.standard_normal((self.cfg.batch, self.dense)).astype(np.float32)
        got = self.store.infer(dense, reqs)
        if check:
            self._compare("infer", got, self.refs["main"].infer(dense, reqs))

    def _write(self, check: bool) -> None:
        lo, hi = self.mine
        ids = np.unique(self.rng.integers(lo, hi, self.cfg.write_rows)).astype(np.int64)
        table = self.live_tables[0]
        dim = self.refs["live"].tables[table].dim
        rows = self.rng.standard_normal((ids.size, dim)).astype(np.float32)
        self.live.write(table, ids, rows)
        # acknowledged: the reference applies it too (only this client writes these rows)
        with self.tally.lock:
            self.refs["live"].write(table, ids, rows)
        if check:
            one = np.ones(ids.size, np.int64)
            got = self.live.lookup(table, ids, lengths=one)
            want = self.refs["live"].lookup(table, ids, lengths=one)
            self._compare("write read back", got, want, exact=True)

    def _compare(self, what: str, got: np.ndarray, want: np.ndarray, exact: bool = False
                 ) -> None:
        ok = np.array_equal(got, want) if exact else _same(got, want)
        with self.tally.lock:
            self.tally.checked += 1
            if not ok:
                self.tally.wrong.append(f"client {self.k}, call {self.n}: {what} differs")


def _drive(clients: list[Client], seconds: float, rate: float | None, tally: Tally) -> float:
    """Each client's calls for ``seconds``: open-loop at ``rate`` calls/s in all (each client
    its share, Poisson), or closed-loop as fast as each can; the calls answered per second."""
    stop = time.monotonic() + seconds
    answered = [0] * len(clients)

    def loop(i: int, c: Client) -> None:
        rnd = random.Random(c.k)
        due = time.monotonic()
        while True:
            if rate is not None:
                due += rnd.expovariate(rate / len(clients))
                now = time.monotonic()
                if due > now:
                    time.sleep(due - now)
            else:
                due = time.monotonic()
            if due >= stop:
                return
            kind = "?"
            try:
                kind = c.one()
            except Exception as e:  # noqa: BLE001 - every failure is counted, by kind
                tally.error(kind if kind != "?" else ("write" if c.writer else "read"), e)
                continue
            done = time.monotonic()
            answered[i] += 1
            with tally.lock:
                tally.calls[kind] += 1
                tally.latencies.append((due, done - due, kind))

    threads = [threading.Thread(target=loop, args=(i, c), daemon=True)
               for i, c in enumerate(clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(answered) / (time.monotonic() - start)


def _proc(pid: int) -> tuple[float, int, int]:
    """The process's RSS (MiB), open descriptors and threads now."""
    rss, threads = 0.0, 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


def _slope(samples: list[tuple[float, float, int, int]]) -> float:
    """RSS growth in MiB per hour over the samples after the first fifth (least squares)."""
    kept = samples[len(samples) // 5:]
    if len(kept) < 3:
        return 0.0
    t = np.array([s[0] for s in kept]) / 3600
    y = np.array([s[1] for s in kept])
    return float(np.polyfit(t, y, 1)[0])


def _minutes(lat: list[tuple[float, float, str]], t0: float) -> list[dict[str, float]]:
    by: dict[int, list[float]] = {}
    for due, s, _kind in lat:
        by.setdefault(int((due - t0) // 60), []).append(s)
    return [{"minute": m, "calls": len(v), "p50_us": float(np.percentile(v, 50)) * 1e6,
             "p99_us": float(np.percentile(v, 99)) * 1e6} for m, v in sorted(by.items())]


def _build(cfg: SoakConfig, log: Callable[[str], None]) -> tuple[Path, Path, Path, Path, int]:
    import nearrec.models

    # absolute: a swap's relative path is the node's, taken from its swap root
    root = (cfg.scratch / f"soak-{cfg.model}-{cfg.rows}").resolve()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    main, again, live, ref = (root / n for n in ("main", "main-again", "live", "live-ref"))
    log(f"building {main} ({cfg.rows:,} rows a table) and {live} ({cfg.live_rows:,})")
    nearrec.build(main, cfg.model, rows=cfg.rows, seed=cfg.seed, progress=False)
    model = nearrec.models.build(cfg.model, nearrec.open(main), seed=cfg.seed + 1).eval()
    nearrec.models.save(model, main)
    shutil.copytree(main, again)  # the swap's target: the same rows and model, another store
    nearrec.build(live, cfg.model, rows=cfg.live_rows, seed=cfg.seed + 2, progress=False)
    shutil.copytree(live, ref)
    return main, again, live, ref, int(model.dense_features)


def _disk(cfg: SoakConfig, store: Path) -> float:
    """The disk's random reads a second now (direct I/O, queue depth 128, ``store``'s
    files): what the node's reads share, measured beside the run."""
    files = sorted(str(p) for p in store.glob("*.nrt"))
    return float(_native.random_read(files, cfg.disk_reads, 128)["items_per_s"])


def run(cfg: SoakConfig, log: Callable[[str], None] = print) -> list[Record]:
    main, again, live, ref, dense = _build(cfg, log)
    disk = [_disk(cfg, main)]
    log(f"disk: {disk[0]:,.0f} random reads/s")
    refs = {"main": nearrec.open(main, tier="dram"),
            "live": nearrec.open(ref, tier="dram", writable=True, durability="async")}
    tally = Tally()
    samples: list[tuple[float, float, int, int]] = []
    events: list[dict[str, Any]] = []
    # the swap's target is a store beside main, not a version of a repository: the node is
    # given their directory as its swap root
    flags = ("--writable", "--tier", "ssd", "--dram-budget", cfg.dram_budget, "--swap-root",
             str(main.parent))
    with node(main, "main", *flags, extra=[f"{live}=live"]) as served:
        writers = max(1, cfg.clients // 10)
        clients = [Client(k, cfg, served.address, refs, dense, k < writers, tally)
                   for k in range(cfg.clients)]
        try:
            log(f"capacity: {cfg.clients} clients closed-loop for {cfg.probe_s:.0f} s")
            probe = Tally()
            for c in clients:
                c.tally = probe
            capacity = _drive(clients, cfg.probe_s, None, probe)
            for c in clients:
                c.tally = tally
            rate = cfg.load * capacity
            log(f"  {capacity:,.0f} calls/s; offering {rate:,.0f} calls/s for "
                f"{cfg.minutes:g} min")
            seconds = cfg.minutes * 60
            t0 = time.monotonic()
            done = threading.Event()

            def watch() -> None:
                while not done.is_set():
                    samples.append((time.monotonic() - t0, *_proc(served.pid)))
                    done.wait(cfg.sample_s)

            def events_at() -> None:
                admin = nearrec.connect(served.address, "main", timeout=300)
                lively = nearrec.connect(served.address, "live", timeout=300)
                for at, what, act in ((0.5, "swap main to a copy of itself",
                                       lambda: admin.swap(again)),
                                      (0.6, "compact live", lively.compact)):
                    if done.wait(max(0.0, t0 + at * seconds - time.monotonic())):
                        break
                    began = time.monotonic()
                    try:
                        act()
                        ok = "done"
                    except Exception as e:  # noqa: BLE001 - an event that failed is recorded
                        ok = f"failed: {e}"
                    events.append({"at_s": round(began - t0, 1), "event": what, "result": ok,
                                   "seconds": round(time.monotonic() - began, 3)})
                    log(f"  {events[-1]}")
                admin.close()
                lively.close()

            side = [threading.Thread(target=f, daemon=True) for f in (watch, events_at)]
            for t in side:
                t.start()
            achieved = _drive(clients, seconds, rate, tally)
            done.set()
            for t in side:
                t.join()
        finally:
            for c in clients:
                c.close()
    disk.append(_disk(cfg, main))
    log(f"disk after: {disk[1]:,.0f} random reads/s")
    lat = [x for x in tally.latencies if x[0] >= t0]
    minutes = _minutes(lat, t0)
    after = samples[len(samples) // 5:] or samples
    all_s = np.array([s for _, s, _ in lat]) if lat else np.zeros(1)
    full = [m for m in minutes if m["calls"] >= 100]  # the last, cut short, left out
    p99s = [m["p99_us"] for m in full] or [0.0]
    warm = [m["p99_us"] for m in full[1:]] or p99s  # after the first minute (warming up)
    extra = {
        "minutes": cfg.minutes, "clients": cfg.clients, "writers": max(1, cfg.clients // 10),
        "capacity_per_s": round(capacity, 1), "offered_per_s": round(rate, 1),
        "achieved_per_s": round(achieved, 1), "calls": tally.calls,
        "errors": tally.errors, "error_count": sum(tally.errors.values()),
        "checked": tally.checked, "wrong": len(tally.wrong), "wrong_first": tally.wrong[:5],
        "probe": {"checked": probe.checked, "wrong": len(probe.wrong),
                  "errors": sum(probe.errors.values())},
        "rss_max_mib": round(max(s[1] for s in samples), 1) if samples else 0.0,
        "rss_first_mib": round(samples[0][1], 1) if samples else 0.0,
        "rss_slope_mib_per_h": round(_slope(samples), 2),
        "fds": [min(s[2] for s in after), max(s[2] for s in after)] if after else [],
        "threads": [min(s[3] for s in after), max(s[3] for s in after)] if after else [],
        "samples": [[round(t, 1), round(r, 1), f, th] for t, r, f, th in samples],
        "per_minute": minutes,
        "p99_minute_spread": round(max(p99s) / max(min(p99s), 1e-9), 2),
        "p99_minute_spread_after_first": round(max(warm) / max(min(warm), 1e-9), 2),
        "events": events,
        "disk_reads_per_s": [round(d) for d in disk],
    }
    lookups = tally.calls["lookup"] * cfg.batch * cfg.pooling * len(refs["main"].tables)
    return [Record("soak", cfg.model, cfg.batch, "skewed", "nearrec node", achieved,
                   lookups / max(seconds, 1e-9), float(np.percentile(all_s, 50)) * 1e6,
                   float(np.percentile(all_s, 99)) * 1e6, extra)]


def markdown(records: list[Record], command: str) -> str:
    r = records[0]
    x = r.extra
    calls = ", ".join(f"{k} {v:,}" for k, v in x["calls"].items())
    share = x["offered_per_s"] / max(x["capacity_per_s"], 1e-9)
    span = {k: f"{x[k][0]}–{x[k][1]}" if x[k] else "—" for k in ("fds", "threads")}
    rows = [
        ("calls answered", f"{sum(x['calls'].values()):,} ({calls})"),
        ("errors", f"{x['error_count']} {x['errors'] or ''}"),
        ("answers checked against the embedded reference / wrong",
         f"{x['checked']:,} / {x['wrong']}"),
        ("latency p50 / p99 (from when each call was due)",
         f"{r.p50_us / 1e3:.2f} / {r.p99_us / 1e3:.2f} ms"),
        ("p99 per minute, largest / smallest (after the first minute)",
         f"{x['p99_minute_spread']}× ({x.get('p99_minute_spread_after_first', '—')}×)"),
        ("RSS first / max", f"{x['rss_first_mib']} / {x['rss_max_mib']} MiB"),
        ("RSS slope after the first fifth", f"{x['rss_slope_mib_per_h']} MiB/h"),
        ("open descriptors, min–max after the first fifth", span["fds"]),
        ("threads, min–max after the first fifth", span["threads"]),
        ("the disk's random reads/s before / after (QD 128)",
         " / ".join(f"{d:,}" for d in x.get("disk_reads_per_s", [])) or "—"),
    ]
    lines = [
        "# Soak: one node under many clients",
        "",
        f"`{command}`",
        "",
        f"{x['clients']} clients ({x['writers']} writing) for {x['minutes']:g} minutes, "
        f"open-loop at {x['offered_per_s']:,.0f} calls/s ({share:.0%} of the"
        f" {x['capacity_per_s']:,.0f} measured closed-loop first); a swap and a compaction "
        "in the middle.",
        "",
        "| what | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in rows),
        "",
        "| event | at | took | result |",
        "|---|---|---|---|",
        *(f"| {e['event']} | {e['at_s']} s | {e['seconds']} s | {e['result']} |"
          for e in x["events"]),
        "",
        "| minute | calls | p50 ms | p99 ms |",
        "|---|---|---|---|",
        *(f"| {m['minute']} | {m['calls']:,} | {m['p50_us'] / 1e3:.2f} | "
          f"{m['p99_us'] / 1e3:.2f} |" for m in x["per_minute"]),
    ]
    return "\n".join(lines) + "\n"


HARNESSES = {"soak": Harness(SoakConfig, SoakConfig.quick,
                             {"--scratch": "scratch", "--minutes": "minutes",
                              "--clients": "clients"}, run, markdown)}
