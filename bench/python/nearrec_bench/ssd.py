"""``nearrec bench ssd``: pooled lookups served from SSD, nearrec side by side with the naive
baseline and the device's own limit, on the same requests, in one run.

Systems: ``naive.pread xT`` — for every lookup one synchronous ``O_DIRECT`` pread of the 512 B
blocks holding the row, then pooling on the host, on T threads (RM-SSD's C++ SLS baseline);
``nearrec[no-dedup,no-merge]`` — nearrec's SSD tier reading every lookup's row on its own;
``nearrec[no-verify]`` — the SSD tier without checking reads against the sector checksums
(``verify_reads=False``: what the check costs); ``nearrec`` — the SSD tier as shipped.
Limits, measured by the harness itself beside them: the disk's random-read rate with direct
I/O at nearrec's queue depth and at depth 1 (what fio's ``randread --direct=1`` reports). The
page cache is dropped before every system and cell; every system reads with ``O_DIRECT``, so it
plays no part either way.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import nearrec

from . import _native
from .harness import Harness
from .report import SPREAD_LIMIT, Record, ratio_text
from .sls import zipf_rows


@dataclass
class SsdConfig:
    model: str = "rmc1"
    #: bytes of tables in the store (several times this machine's free memory would be ideal;
    #: the default is what fits a session's time to build)
    table_bytes: int = 16 << 30
    batches: tuple[int, ...] = (1, 16, 64, 256)
    dists: tuple[str, ...] = ("uniform", "zipf1.05")
    #: seconds each system runs per cell, split over `rounds` (at least `min_calls` batches a
    #: round); each round starts at the next system, so with `rounds` a multiple of the five
    #: systems every system runs in every position once
    seconds: float = 5.0
    rounds: int = 5
    min_calls: int = 1
    queue_depth: int = 128
    limit_reads: int = 200_000
    distinct_batches: int = 4
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> SsdConfig:
        return cls(table_bytes=1 << 30, batches=(1, 16, 64), seconds=1.0, limit_reads=50_000)


def drop_page_cache() -> bool:
    """Drops clean pages (root only); says whether it could."""
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def _store(cfg: SsdConfig, log: Callable[[str], None]) -> Path:
    path = cfg.scratch / f"ssd-{cfg.model}-{cfg.table_bytes >> 20}m"
    try:
        info = nearrec.info(path)
        # (a store from before format version 3 has no sector checksums to check)
        if info.params.get("seed") == cfg.seed and all(t.protected for t in info.tables):
            log(f"reusing {path}")
            return path
    except nearrec.NearrecError:
        pass
    log(f"building {path} ({cfg.table_bytes / 2**30:.1f} GiB)")
    nearrec.build(path, cfg.model, table_bytes=cfg.table_bytes, seed=cfg.seed, overwrite=True,
                  progress=False)
    return path


def time_calls(fn: Callable[[int], Any], seconds: float, min_calls: int, n: int) -> list[float]:
    lat: list[float] = []
    start = time.perf_counter()
    i = 0
    while i < min_calls or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        fn(i % n)
        lat.append(time.perf_counter() - t)
        i += 1
    return lat


def run(cfg: SsdConfig, log: Callable[[str], None] = print) -> list[Record]:
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    path = _store(cfg, log)
    spec = nearrec.model_spec(cfg.model)
    info = nearrec.info(path)
    names = [t.name for t in info.tables]
    rows = [t.rows for t in info.tables]
    row_bytes = info.tables[0].row_bytes
    L = spec.lookups
    files = [str(path / t.file) for t in info.tables]
    dropped = drop_page_cache()
    # The disk's rate drifts on a shared machine: measure it at the start and again at the end
    # of the run and hold the systems to the better of the two.
    limit = _native.random_read(files, cfg.limit_reads, cfg.queue_depth)
    qd1 = _native.random_read(files, max(cfg.limit_reads // 50, 500), 1)
    qd1_us = 1e6 / qd1["items_per_s"]
    log(f"disk: {limit['items_per_s']:,.0f} random reads/s at QD {cfg.queue_depth}, "
        f"{qd1['items_per_s']:,.0f}/s at QD 1 ({qd1_us:.0f} µs)")
    records = [
        Record("ssd", cfg.model, 0, "-", "limit.random_read", samples_per_s=0.0,
               lookups_per_s=0.0, extra={"reads_per_s": limit["items_per_s"],
                                         "queue_depth": cfg.queue_depth,
                                         "table_bytes": info.total_bytes}),
        Record("ssd", cfg.model, 0, "-", "limit.random_read_qd1", samples_per_s=0.0,
               lookups_per_s=0.0, extra={"reads_per_s": qd1["items_per_s"],
                                         "latency_us": qd1_us}),
    ]
    stores = {
        "nearrec[no-dedup,no-merge]": nearrec.open(path, tier="ssd", dedup=False, merge=False,
                                                   io_queue_depth=cfg.queue_depth),
        "nearrec[no-verify]": nearrec.open(path, tier="ssd", verify_reads=False,
                                           io_queue_depth=cfg.queue_depth),
        "nearrec": nearrec.open(path, tier="ssd", io_queue_depth=cfg.queue_depth),
    }
    assert stores["nearrec"].stats()["unprotected_tables"] == 0
    log(f"nearrec reads through {stores['nearrec'].stats()['device']}")
    rng = np.random.default_rng(cfg.seed)
    perms: list[np.ndarray] = []
    for dist in cfg.dists:
        if dist != "uniform" and not perms:
            perms = [rng.permutation(n) for n in rows]
        for batch in cfg.batches:
            sets = []
            for _ in range(cfg.distinct_batches):
                per_table = []
                for t, n_rows in enumerate(rows):
                    if dist == "uniform":
                        idx = rng.integers(0, n_rows, batch * L)
                    else:
                        idx = zipf_rows(rng, n_rows, float(dist[4:]), batch * L, perms[t])
                    per_table.append(idx.astype(np.int64))
                sets.append(per_table)
            offsets = np.arange(0, batch * L, L, dtype=np.int64)
            reqs = [[nearrec.TableLookup(n, i, offsets) for n, i in zip(names, s, strict=True)]
                    for s in sets]
            systems: dict[str, Callable[[int], Any]] = {}
            for threads in (1, 2):
                systems[f"naive.pread x{threads}"] = (
                    lambda i, t=threads, s=sets: _native.naive_sls(path, s[i], L, t))
            for name, st in stores.items():
                systems[name] = lambda i, st=st, r=reqs: st.lookup_many(r[i]).values
            # the same answer from every system, before timing them
            want = systems["naive.pread x2"](0)
            for name, fn in systems.items():
                np.testing.assert_allclose(fn(0), want, rtol=1e-4, atol=1e-5, err_msg=name)
            # Rounds, each system in turn, with the disk's own rate measured beside them in
            # every round: the disk drifts by 3x within minutes here, so a limit measured once
            # per run says little about any one cell.
            lats: dict[str, list[float]] = {n: [] for n in systems}
            io = {n: np.zeros(3) for n in systems}  # reads, bytes read, useful bytes
            per_round: dict[str, list[float]] = {n: [] for n in systems}
            disk, disk_qd1_us = [], []
            n_limit = max(batch * L * len(names), 20_000)
            # Each round starts at the next system: the disk serves the first system of a round
            # faster than the last (a burst allowance?), which would otherwise favour one.
            order = list(systems.items())
            for k in range(cfg.rounds):
                disk.append(_native.random_read(files, n_limit,
                                                        cfg.queue_depth)["items_per_s"])
                disk_qd1_us.append(1e6 / _native.random_read(files, 300, 1)["items_per_s"])
                for name, fn in order[k % len(order):] + order[:k % len(order)]:
                    drop_page_cache()
                    before = stores[name].stats() if name in stores else None
                    lat = time_calls(fn, cfg.seconds / cfg.rounds, cfg.min_calls, len(sets))
                    lats[name] += lat
                    per_round[name].append(batch * len(lat) / sum(lat))
                    if before is not None:
                        after = stores[name].stats()
                        io[name] += [float(after[k]) - float(before[k])
                                     for k in ("device_reads", "bytes_read", "useful_bytes")]
                    else:  # one read of the 512 B blocks holding the row per lookup
                        lookups = len(lat) * batch * L * len(names)
                        io[name] += [lookups, lookups * 512 * -(-row_bytes // 512),
                                     lookups * row_bytes]
            disk_rate, qd1_us = float(np.median(disk)), float(np.median(disk_qd1_us))
            records.append(Record("ssd", cfg.model, batch, dist, "disk.random_read",
                                  samples_per_s=0.0, lookups_per_s=0.0,
                                  extra={"reads_per_s": disk_rate, "rounds_reads_per_s": disk,
                                         "qd1_latency_us": qd1_us}))
            cell: dict[str, float] = {}
            for name in systems:
                lat_a = np.array(lats[name])
                calls, secs = len(lat_a), float(lat_a.sum())
                reads, read_bytes, useful = (float(x) for x in io[name])
                lookups = calls * batch * L * len(names)
                sps = batch * calls / secs
                floor_us = reads / calls / disk_rate * 1e6 + qd1_us
                p50, p99 = (float(x) for x in np.percentile(lat_a * 1e6, [50, 99]))
                cell[name] = sps
                records.append(Record(
                    "ssd", cfg.model, batch, dist, name, samples_per_s=sps,
                    lookups_per_s=sps * L * len(names), p50_us=p50, p99_us=p99,
                    extra={"calls": calls, "reads_per_s": reads / secs,
                           "reads_per_lookup": reads / lookups,
                           "bytes_per_useful_byte": read_bytes / useful if useful else 0.0,
                           "io_floor_us": floor_us, "p99_over_floor": p99 / floor_us,
                           "of_device_limit": reads / secs / disk_rate,
                           "page_cache_dropped": dropped,
                           "rounds_samples_per_s": per_round[name]}))
            log(f"  {dist:9} B={batch:4}: disk {disk_rate:,.0f} reads/s; "
                + ", ".join(f"{k} {v:,.0f}/s" for k, v in cell.items())
                + f"  (x{cell['nearrec'] / cell['naive.pread x2']:.2f} vs naive x2)")
    again = _native.random_read(files, cfg.limit_reads, cfg.queue_depth)
    log(f"disk at the end: {again['items_per_s']:,.0f} random reads/s")
    records[0].extra["end_reads_per_s"] = again["items_per_s"]
    for r in records:
        if r.system == "nearrec" and r.batch:
            for peer in ("naive.pread x1", "naive.pread x2", "nearrec[no-dedup,no-merge]",
                         "nearrec[no-verify]"):
                other = next(o for o in records if o.system == peer and o.batch == r.batch
                             and o.dist == r.dist)
                r.extra[f"ratio_vs_{peer}"] = round(r.samples_per_s / other.samples_per_s, 3)
    return records


def markdown(records: list[Record], command: str) -> str:
    lim = next(r for r in records if r.system == "limit.random_read")
    qd1 = next(r for r in records if r.system == "limit.random_read_qd1")
    disk = {(r.dist, r.batch): r.extra for r in records if r.system == "disk.random_read"}
    systems = ["naive.pread x1", "naive.pread x2", "nearrec[no-dedup,no-merge]",
               "nearrec[no-verify]", "nearrec"]
    lines = [
        f"Command: `{command}`", "",
        f"{lim.model.upper()} shapes, {lim.extra['table_bytes'] / 2**30:.1f} GiB of fp32 tables "
        "read with O_DIRECT (the page cache dropped before every system and cell), sum pooling. "
        f"The disk's random-read rate (direct, {lim.extra['queue_depth']} in flight, 512 B) was "
        f"{lim.extra['reads_per_s']:,.0f}/s at the start of the run and "
        f"{lim.extra['end_reads_per_s']:,.0f}/s at the end ({qd1.extra['reads_per_s']:,.0f}/s, "
        f"{qd1.extra['latency_us']:.0f} µs, at depth 1); it drifts that much, so every cell "
        "measures it again in each round beside the systems (the `disk` column, median), and "
        "\"% of disk\" and the I/O floor (the batch's reads ÷ that rate + one depth-1 read) use "
        "the cell's own figure.", "",
        "| dist | batch | disk reads/s | system | samples/s | lookups/s | p50 / p99 ms | "
        "reads / lookup | bytes read / useful byte | reads/s (% of disk) | p99 ÷ I/O floor |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        if not r.batch or r.system not in systems:
            continue
        e = r.extra
        lines.append(
            f"| {r.dist} | {r.batch} | {disk[(r.dist, r.batch)]['reads_per_s']:,.0f} | "
            f"{r.system} | {r.samples_per_s:,.1f} | "
            f"{r.lookups_per_s:,.0f} | {r.p50_us / 1e3:,.2f} / {r.p99_us / 1e3:,.2f} | "
            f"{e['reads_per_lookup']:.3f} | {e['bytes_per_useful_byte']:.2f} | "
            f"{e['reads_per_s']:,.0f} ({100 * e['of_device_limit']:.0f} %) | "
            f"{e['p99_over_floor']:.2f} |")
    lines += ["", "nearrec's ratios (× no-verify: the sector-checksum check's cost, 1.00 = none; "
              "unreliable where either system's rounds spread beyond "
              f"±{100 * SPREAD_LIMIT:.0f} %):",
              "",
              "| dist | batch | × naive x1 | × naive x2 | × no-dedup,no-merge | × no-verify |",
              "|---|---:|---:|---:|---:|---:|"]
    peers = ("naive.pread x1", "naive.pread x2", "nearrec[no-dedup,no-merge]",
             "nearrec[no-verify]")
    for r in records:
        if r.system == "nearrec" and r.batch:
            cell = {o.system: o for o in records if (o.batch, o.dist) == (r.batch, r.dist)}
            lines.append(f"| {r.dist} | {r.batch} | " + " | ".join(
                ratio_text(r, cell[p]) if "rounds_samples_per_s" in r.extra
                else f"{r.extra[f'ratio_vs_{p}']:.2f}" for p in peers) + " |")
    return "\n".join(lines) + "\n"


def run_tuning(cfg: SsdConfig, log: Callable[[str], None] = print) -> list[Record]:
    """How the SSD tier's knobs behave on this disk: reads/s by queue depth, and what
    pipelining (``lookup_stream``) gains when the caller has its own work per batch (a dense
    layer standing in for the model's MLPs, sized to take about as long as one lookup)."""
    path = _store(cfg, log)
    spec = nearrec.model_spec(cfg.model)
    info = nearrec.info(path)
    names, rows, L = [t.name for t in info.tables], [t.rows for t in info.tables], spec.lookups
    rng = np.random.default_rng(cfg.seed + 1)

    def batches(batch: int, n: int) -> list[list[nearrec.TableLookup]]:
        off = np.arange(0, batch * L, L)
        return [[nearrec.TableLookup(t, rng.integers(0, r, batch * L), off)
                 for t, r in zip(names, rows, strict=True)] for _ in range(n)]

    records: list[Record] = []
    reqs = batches(64, 4)
    for qd in (8, 16, 32, 64, 128, 256, 512):
        store = nearrec.open(path, tier="ssd", io_queue_depth=qd)
        drop_page_cache()
        timed = time_calls(lambda i, s=store: s.lookup_many(reqs[i]), cfg.seconds, 2, len(reqs))
        lat = np.asarray(timed, dtype=np.float64)
        reads = float(store.stats()["device_reads"])
        records.append(Record("ssd-tuning", cfg.model, 64, "uniform", f"queue_depth={qd}",
                              samples_per_s=64 * len(lat) / float(lat.sum()),
                              lookups_per_s=64 * L * len(names) * len(lat) / float(lat.sum()),
                              p50_us=float(np.median(lat) * 1e6),
                              p99_us=float(np.percentile(lat, 99) * 1e6),
                              extra={"reads_per_s": reads / float(lat.sum())}))
        log(f"  queue depth {qd:4}: {records[-1].extra['reads_per_s']:,.0f} reads/s")
    store = nearrec.open(path, tier="ssd", io_queue_depth=cfg.queue_depth)
    for batch in (16, 64):
        reqs = batches(batch, 8)
        store.lookup_many(reqs[0])  # warm: rings, staging buffers
        calls = time_calls(lambda i, r=reqs: store.lookup_many(r[i]), 0.0, 3, 3)
        lookup_s = statistics.median(calls)
        # a dense layer over the pooled batch, repeated to last about one lookup
        w = rng.standard_normal((len(names) * spec.dim, 512)).astype(np.float32)
        t0 = time.perf_counter()
        x = np.ones((batch, len(names) * spec.dim), np.float32)
        reps = 0
        while time.perf_counter() - t0 < lookup_s and reps < 100_000:
            x @ w
            reps += 1

        def mlp(pooled: np.ndarray, reps: int = reps, w: np.ndarray = w) -> None:
            for _ in range(reps):
                pooled @ w

        for name, depth in (("sequential", 0), ("stream depth 2", 2), ("stream depth 4", 4)):
            drop_page_cache()
            t0 = time.perf_counter()
            if depth == 0:
                for r in reqs:
                    mlp(store.lookup_many(r).values)
            else:
                for out in store.lookup_stream(reqs, depth=depth):
                    mlp(out.values)
            secs = time.perf_counter() - t0
            records.append(Record("ssd-tuning", cfg.model, batch, "uniform", name,
                                  samples_per_s=batch * len(reqs) / secs,
                                  lookups_per_s=batch * L * len(names) * len(reqs) / secs,
                                  extra={"mlp_ms": lookup_s * 1e3}))
            log(f"  B={batch} {name}: {records[-1].samples_per_s:,.0f} samples/s")
    return records


def tuning_markdown(records: list[Record], command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "Reads/s of the SSD tier by io_uring queue depth (RMC1, batch 64, uniform):", "",
             "| queue depth | reads/s | samples/s | p50 / p99 ms |", "|---:|---:|---:|---:|"]
    for r in records:
        if r.system.startswith("queue_depth="):
            lines.append(f"| {r.system.split('=')[1]} | {r.extra['reads_per_s']:,.0f} | "
                         f"{r.samples_per_s:,.1f} | {r.p50_us / 1e3:,.1f} / "
                         f"{r.p99_us / 1e3:,.1f} |")
    lines += ["", "Pipelining: the caller runs a dense layer on every pooled batch that takes "
              "about as long as one lookup; `lookup_stream` keeps the next batches' reads in "
              "flight meanwhile.", "",
              "| batch | loop | samples/s | × sequential |", "|---:|---|---:|---:|"]
    base: dict[int, float] = {}
    for r in records:
        if r.system == "sequential":
            base[r.batch] = r.samples_per_s
        if not r.system.startswith("queue_depth="):
            lines.append(f"| {r.batch} | {r.system} (dense layer {r.extra['mlp_ms']:.0f} ms) | "
                         f"{r.samples_per_s:,.1f} | {r.samples_per_s / base[r.batch]:.2f} |")
    return "\n".join(lines) + "\n"


def run_verify(cfg: SsdConfig, log: Callable[[str], None] = print,
               rounds: int = 16) -> list[Record]:
    """What checking every read against the sector checksums costs (``verify_reads``): the SSD
    tier with and without the check over the same store, batch by batch in turn (the order
    swapped every round), on the same requests. Two measures: throughput, whose ratio carries
    the disk's drift (the median of the per-round ratios, and their spread, are given), and the
    pooling stage's time per batch — the completion callbacks, where the check runs — which is
    CPU time and drifts much less."""
    path = _store(cfg, log)
    spec = nearrec.model_spec(cfg.model)
    info = nearrec.info(path)
    names, rows, L = [t.name for t in info.tables], [t.rows for t in info.tables], spec.lookups
    rng = np.random.default_rng(cfg.seed + 2)
    records: list[Record] = []
    for batch in (16, 64, 256):
        off = np.arange(0, batch * L, L)
        reqs = [[nearrec.TableLookup(t, rng.integers(0, r, batch * L), off)
                 for t, r in zip(names, rows, strict=True)] for _ in range(cfg.distinct_batches)]
        stores = {"nearrec[no-verify]": nearrec.open(path, tier="ssd", verify_reads=False,
                                                     io_queue_depth=cfg.queue_depth),
                  "nearrec": nearrec.open(path, tier="ssd", io_queue_depth=cfg.queue_depth)}
        want = stores["nearrec[no-verify]"].lookup_many(reqs[0]).values
        np.testing.assert_allclose(stores["nearrec"].lookup_many(reqs[0]).values, want,
                                   rtol=1e-5, atol=1e-6)
        lats: dict[str, list[float]] = {n: [] for n in stores}
        ratios = []
        drop_page_cache()
        for k in range(rounds):
            order = list(stores) if k % 2 == 0 else list(reversed(stores))
            this: dict[str, float] = {}
            for name in order:
                t = time.perf_counter()
                stores[name].lookup_many(reqs[k % len(reqs)])
                this[name] = time.perf_counter() - t
                lats[name].append(this[name])
            ratios.append(this["nearrec[no-verify]"] / this["nearrec"])
        for name, st in stores.items():
            lat = np.array(lats[name])
            stats = st.stats()
            records.append(Record(
                "ssd-verify", cfg.model, batch, "uniform", name,
                samples_per_s=batch / float(np.median(lat)),
                lookups_per_s=batch * L * len(names) / float(np.median(lat)),
                p50_us=float(np.median(lat) * 1e6), p99_us=float(np.percentile(lat, 99) * 1e6),
                extra={"rounds": rounds, "pool_p50_us": stats["pool_p50_us"],
                       "corrupt_reads": stats["corrupt_reads"],
                       "unprotected_tables": stats["unprotected_tables"],
                       "reads_per_batch": float(stats["device_reads"])
                       / float(stats["batches"])}))
        on = records[-1]
        on.extra.update(ratio_median=float(np.median(ratios)), ratio_min=float(min(ratios)),
                        ratio_max=float(max(ratios)))
        off_rec = records[-2]
        log(f"  B={batch}: samples/s {on.samples_per_s:,.1f} with the check vs "
            f"{off_rec.samples_per_s:,.1f} without (× {on.extra['ratio_median']:.3f}, rounds "
            f"{on.extra['ratio_min']:.2f}-{on.extra['ratio_max']:.2f}); pooling per batch "
            f"{on.extra['pool_p50_us']:,.0f} vs {off_rec.extra['pool_p50_us']:,.0f} µs")
    return records


def verify_markdown(records: list[Record], command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "The sector-checksum check on the SSD tier's read path (`verify_reads`, on by "
             "default) against the same tier without it: RMC1 shapes, uniform ids, "
             f"{records[0].extra['rounds']} batches of each, taken in turn (the order swapped "
             "every round), `O_DIRECT`. × = the check's throughput over no check's (median of "
             "the per-round ratios, with their range: the disk drifts within a round too). "
             "Pooling = the stage where rows are checked and pooled as their reads land (p50 "
             "per batch), CPU time the disk's drift touches less.", "",
             "| batch | reads / batch | samples/s with / without | × (range) | p50 / p99 ms "
             "with | p50 / p99 ms without | pooling p50 µs with / without |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(r.batch, r.system): r for r in records}
    for batch in sorted({r.batch for r in records}):
        on, off = by[(batch, "nearrec")], by[(batch, "nearrec[no-verify]")]
        e = on.extra
        lines.append(
            f"| {batch} | {e['reads_per_batch']:,.0f} | {on.samples_per_s:,.1f} / "
            f"{off.samples_per_s:,.1f} | {e['ratio_median']:.3f} ({e['ratio_min']:.2f}–"
            f"{e['ratio_max']:.2f}) | {on.p50_us / 1e3:,.1f} / {on.p99_us / 1e3:,.1f} | "
            f"{off.p50_us / 1e3:,.1f} / {off.p99_us / 1e3:,.1f} | "
            f"{e['pool_p50_us']:,.0f} / {off.extra['pool_p50_us']:,.0f} |")
    return "\n".join(lines) + "\n"


#: ``bench ssd-cost``'s cells: (device, verify) per batch size
COST_SYSTEMS = (("memory", True), ("memory", False), ("disk", True))


@dataclass
class SsdCostConfig(SsdConfig):
    """``bench ssd-cost``'s: a 1 GiB store whatever the ssd default (the memory device holds the
    tables in DRAM), its cells taken in turn ``rounds`` times, ``seconds`` each."""

    table_bytes: int = 1 << 30
    rounds: int = 3
    seconds: float = 1.5

    @classmethod
    def quick(cls) -> SsdCostConfig:
        return cls(rounds=2, seconds=0.5)


def run_cost(cfg: SsdCostConfig, log: Callable[[str], None] = print,
             batches: tuple[int, ...] = (16, 64, 256)) -> list[Record]:
    """The SSD tier's CPU time per device read (``_native.read_cost``): the engine as shipped,
    no DRAM tiers, one pooling thread, uniform rows (so almost every lookup is a read), on a
    zero-latency device — the table files in memory, read through the same ``BlockDevice``
    path — and on the disk with direct I/O. The cells are taken in turn, ``cfg.rounds`` times; the
    median round is reported with the spread of the rounds. CPU time is the process's, user +
    system, all threads."""
    path = _store(cfg, log)
    spec = nearrec.model_spec(cfg.model)
    runs: dict[tuple[int, str, bool], list[dict[str, float]]] = {}
    for k in range(cfg.rounds):
        for batch in batches:
            for device, verify in COST_SYSTEMS:
                r = _native.read_cost(str(path), batch, spec.lookups, cfg.seconds, device=device,
                                      threads=1, verify=verify, seed=cfg.seed + k)
                runs.setdefault((batch, device, verify), []).append(r)
    records: list[Record] = []
    for (batch, device, verify), rs in runs.items():
        per_read = sorted(r["cpu_s"] / r["reads"] for r in rs)
        mid = min(rs, key=lambda r: abs(r["cpu_s"] / r["reads"] - per_read[len(rs) // 2]))
        reads, us = mid["reads"], 1e6 / mid["reads"]
        wall = mid["wall_s"]
        records.append(Record(
            "ssd-cost", cfg.model, batch, "uniform",
            device + ("" if verify else "[no-verify]"),
            samples_per_s=mid["batches"] * batch / wall, lookups_per_s=mid["lookups"] / wall,
            extra={"rounds": cfg.rounds, "reads_per_batch": reads / mid["batches"],
                   "cpu_us_per_read": mid["cpu_s"] * us,
                   "cpu_us_per_read_min": per_read[0] * 1e6,
                   "cpu_us_per_read_max": per_read[-1] * 1e6,
                   "user_us_per_read": mid["user_s"] * us,
                   "system_us_per_read": mid["system_s"] * us,
                   "wall_us_per_read": wall * us,
                   "route_us_per_read": mid["route_s"] * us,
                   "pool_us_per_read": mid["pool_s"] * us,
                   "io_us_per_read": mid["io_wait_s"] * us,
                   "reads_per_core_s": mid["reads"] / mid["cpu_s"]}))
        e = records[-1].extra
        log(f"  B={batch} {records[-1].system}: {e['cpu_us_per_read']:.3f} µs CPU per read "
            f"(user {e['user_us_per_read']:.3f}, system {e['system_us_per_read']:.3f}; rounds "
            f"{e['cpu_us_per_read_min']:.3f}–{e['cpu_us_per_read_max']:.3f})")
    return records


def cost_markdown(records: list[Record], command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "The SSD tier's CPU time per device read: the engine as shipped (no DRAM tiers, one "
             "pooling thread, sector checks on unless marked), uniform ids on RMC1 shapes, so "
             "nearly every lookup is a 512 B read. `memory`: a zero-latency device, the table "
             "files held in memory and read through the same `BlockDevice` path (its I/O stage "
             "is the copy out of memory, which a drive's DMA does on real hardware); `disk`: "
             "this VM's virtio disk with io_uring and `O_DIRECT`, whose system time is the "
             "kernel's I/O path. CPU = the process's user + system time, all threads; the "
             f"median of {records[0].extra['rounds']} rounds taken in turn, with their range. "
             "Stages per read: route (DRAM side + planning), I/O (the device call less the "
             "pooling inside it), pool (checking and pooling rows as they land).", "",
             "| batch | device | reads / batch | CPU µs / read (range) | user / system µs | "
             "route / I/O / pool µs | reads/s per core | wall µs / read |",
             "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(records, key=lambda r: (r.batch, r.system)):
        e = r.extra
        lines.append(
            f"| {r.batch} | {r.system} | {e['reads_per_batch']:,.0f} | "
            f"{e['cpu_us_per_read']:.3f} ({e['cpu_us_per_read_min']:.3f}–"
            f"{e['cpu_us_per_read_max']:.3f}) | {e['user_us_per_read']:.3f} / "
            f"{e['system_us_per_read']:.3f} | {e['route_us_per_read']:.3f} / "
            f"{e['io_us_per_read']:.3f} / {e['pool_us_per_read']:.3f} | "
            f"{e['reads_per_core_s']:,.0f} | {e['wall_us_per_read']:.3f} |")
    return "\n".join(lines) + "\n"


# ---- row dtypes on the SSD tier ----------------------------------------------------------------

_FLAGS = {"--table-bytes": "table_bytes", "--scratch": "scratch"}
HARNESSES = {
    "ssd": Harness(SsdConfig, SsdConfig.quick, _FLAGS, run, markdown),
    "ssd-tuning": Harness(SsdConfig, SsdConfig.quick, _FLAGS, run_tuning, tuning_markdown),
    "ssd-verify": Harness(SsdConfig, SsdConfig.quick, _FLAGS, run_verify, verify_markdown),
    "ssd-cost": Harness(SsdCostConfig, SsdCostConfig.quick, _FLAGS, run_cost, cost_markdown)}
