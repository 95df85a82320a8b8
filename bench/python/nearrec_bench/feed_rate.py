"""``nearrec bench feed``: delta files applied to a served store — rows per second against
``write_many`` of the same rows, and how fresh the served rows are under a reader's load.

A store of two tables of ``rows`` × ``dim`` rows — ``f`` in fp32, ``q`` in int8 — is served
writable (sync durability, DRAM tier) by one node, and cut row-wise into two shards, each on a
node of its own, written through the router (each call one two-phase transaction over both).
The delta files are written by pyarrow, as a trainer outside nearrec would: ``f``'s rows as
float32 lists, ``q``'s as the table's own int8 bytes (FBGEMM's fused row: 64 codes, fp32
scale and bias), so that they are written as they are.

(a) **Rows per second.** For each system, table and file size, ``files`` files of
``file_rows`` distinct random rows: ``feed`` is ``nearrec.feed.apply`` of the directory
(reading and checking each file, one call per file with its cursor); ``write_many`` is one
``Store.write_many`` per file of the same ids and float32 rows (for ``q``, the values the int8
rows decode to: ``write_many`` takes float32 and quantises). Both from this process, through
the same client; the store is compacted and the disk synced between cells (not timed); the
two alternate, in rounds.

(b) **Freshness under load** (one node). Lookups of ``batch`` bags of ``pooling`` rows of
``f`` are sent open-loop (``nearrec-loadgen``: Poisson arrivals, 4 connections, latency from
each intended send) at ``load_share`` of what the node answers offered far more, for
``seconds``, with no feed and with a feed at each of ``fresh_rates``: files of ``fresh_rows``
rows of ``f``, written ahead (a trainer writes them on its own machine), arrive — are renamed
into the directory — every ``fresh_rows / rate`` seconds, and ``nearrec feed --watch`` (its own
process, ``--poll 0.05``) applies them. A file's lag runs from its arrival to the feeder
reporting it applied (its rows are served from then on); the readers' p99 with a feed is set
against their p99 without one. Conditions rotate, in rounds.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import nearrec
import nearrec.feed
from nearrec import distributed

from . import _native
from .feed import write_delta
from .harness import Harness
from .report import Record, rounds_spread
from .served import node
from .writes import writable_node, writable_shards

SYSTEMS = ("node", "shard.2x1")
TABLES = ("f", "q")
#: the load generator's connections, and the rate offered to find what the node answers
CONNECTIONS = 4
OFFERED = 50_000.0


@dataclass
class FeedRateConfig:
    rows: int = 400_000
    dim: int = 64
    file_rows: tuple[int, ...] = (10_000, 100_000)
    #: rows each cell applies per round (files = this ÷ file_rows)
    cell_rows: int = 800_000
    rounds: int = 5
    batch: int = 64
    pooling: int = 20
    load_share: float = 0.7
    seconds: float = 10.0
    fresh_rows: int = 10_000
    #: the feeds' rates (rows per second), each a condition of its own
    fresh_rates: tuple[float, ...] = (10_000.0, 30_000.0, 100_000.0)
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> FeedRateConfig:
        return cls(rows=40_000, file_rows=(2_000, 10_000), cell_rows=20_000, rounds=1,
                   seconds=2.0, fresh_rows=2_000, fresh_rates=(10_000.0,))


def quantise(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FBGEMM's fused 8-bit rows of ``values`` (codes, then fp32 scale and bias) and the
    float32 values they decode to (``scale · code + bias`` rounded once, as the store's fused
    multiply-add does: exact in float64, then rounded)."""
    lo = values.min(axis=1, keepdims=True)
    scale = (values.max(axis=1, keepdims=True) - lo) / 255.0
    scale[scale == 0] = 1.0
    codes = np.clip(np.rint((values - lo) / scale), 0, 255).astype(np.uint8)
    tail = np.concatenate([scale, lo], axis=1).astype(np.float32).view(np.uint8)
    decoded = codes * scale.astype(np.float32).astype(np.float64) + lo.astype(np.float64)
    return np.concatenate([codes, tail], axis=1), decoded.astype(np.float32)


def publish(directory: Path, sequence: int, table: str, ids: np.ndarray,
            rows: np.ndarray) -> float:
    """Delta file ``sequence`` of ``table``'s ``ids`` (float32 ``rows``, or encoded uint8
    ones), written by pyarrow and renamed into place whole; returns when (``time.time()``)."""
    import pyarrow as pa

    if rows.dtype == np.uint8:
        width = rows.shape[1]
        values = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(width), len(ids), [None, pa.py_buffer(rows.tobytes())])
        field_ = pa.field("values", pa.binary(width), metadata={"nearrec.dtype": "int8"})
    else:
        values = pa.FixedSizeListArray.from_arrays(pa.array(rows.ravel()), rows.shape[1])
        field_ = pa.field("values", values.type)
    names = pa.DictionaryArray.from_arrays(np.zeros(len(ids), np.int32), [table])
    write_delta(directory, sequence, [names, pa.array(ids), pa.array(np.zeros(len(ids), np.int8)),
                                      values], field_)
    return time.time()


def _files(cfg: FeedRateConfig, table: str, file_rows: int, seed: int
           ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each file's (ids, rows as the file holds them, the float32 rows ``write_many`` takes)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(max(1, cfg.cell_rows // file_rows)):
        ids = rng.choice(cfg.rows, file_rows, replace=False).astype(np.int64)
        values = rng.standard_normal((file_rows, cfg.dim), dtype=np.float32)
        if table == "q":
            encoded, decoded = quantise(values)
            out.append((ids, encoded, decoded))
        else:
            out.append((ids, values, values))
    return out


def _rates(cfg: FeedRateConfig, path: Path, cut: Path, log: Callable[[str], None]
           ) -> list[Record]:
    """(a): rows per second of ``feed`` and ``write_many`` in each cell."""
    work = cfg.scratch / "feed-rate-nodes"
    deltas = cfg.scratch / "feed-rate-deltas"
    files = {(t, n): _files(cfg, t, n, cfg.seed + 10 * i + j)
             for i, t in enumerate(TABLES) for j, n in enumerate(cfg.file_rows)}
    got: dict[tuple[str, str, int, str], list[float]] = {}
    systems: dict[str, Callable[[], Any]] = {
        "node": lambda: writable_node(path, work),
        "shard.2x1": lambda: writable_shards(cut, 2, 1, work)}
    for rnd in range(cfg.rounds):
        for system, opened in systems.items():
            with opened() as store:
                sequence = 0
                for (table, n), fs in files.items():
                    ways = ["feed", "write_many"] if rnd % 2 == 0 else ["write_many", "feed"]
                    for way in ways:
                        # what the last cell wrote, folded and on the disk: its writeback is
                        # not this cell's
                        store.compact()
                        os.sync()
                        if way == "feed":
                            shutil.rmtree(deltas, ignore_errors=True)
                            deltas.mkdir(parents=True)
                            for ids, rows, _ in fs:
                                sequence += 1
                                publish(deltas, sequence, table, ids, rows)
                            t0 = time.perf_counter()
                            done = nearrec.feed.apply(deltas, store, name="bench")
                            took = time.perf_counter() - t0
                            assert len(done) == len(fs) and all(a.applied for a in done), done
                        else:
                            t0 = time.perf_counter()
                            for ids, _, rows in fs:
                                store.write_many({table: (ids, rows)})
                            took = time.perf_counter() - t0
                        # the last file's rows are what is served
                        ids, _, rows = fs[-1]
                        np.testing.assert_allclose(store.read_rows(table, ids[:64]), rows[:64],
                                                   rtol=0, atol=1e-6 if table == "f" else 0.02)
                        rate = n * len(fs) / took
                        got.setdefault((system, table, n, way), []).append(rate)
                        log(f"round {rnd + 1}: {system} {table} files of {n:,}: {way} "
                            f"{rate:,.0f} rows/s")
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(deltas, ignore_errors=True)
    records = []
    for (system, table, n, way), rates in got.items():
        rate = statistics.median(rates)
        peer = statistics.median(got[(system, table, n, "write_many")])
        records.append(Record(
            "feed-rate", f"{table}:{'fp32' if table == 'f' else 'int8'}x{cfg.dim}", n,
            "uniform", f"{system}:{way}", samples_per_s=rate / n, lookups_per_s=rate,
            extra={"rows_per_s": rate, "rounds_rows_per_s": rates,
                   "spread": rounds_spread(rates), "vs_write_many": rate / peer,
                   "files": max(1, cfg.cell_rows // n)}))
    return records


def _requests(cfg: FeedRateConfig, n: int) -> list[list[tuple[str, np.ndarray, np.ndarray]]]:
    """``n`` lookup batches of ``f`` as the load generator takes them (table, ids, lengths)."""
    rng = np.random.default_rng(cfg.seed + 99)
    return [[("f", rng.integers(0, cfg.rows, cfg.batch * cfg.pooling).astype(np.int64),
              np.full(cfg.batch, cfg.pooling, np.int64))] for _ in range(n)]


def _stage(cfg: FeedRateConfig, staging: Path, first: int, files: int) -> None:
    """Delta files ``first..first + files`` of ``fresh_rows`` rows of ``f``, written ahead
    into ``staging`` (a trainer writes them on its own machine; here they only arrive)."""
    rng = np.random.default_rng(cfg.seed + first)
    values = rng.standard_normal((cfg.fresh_rows, cfg.dim), dtype=np.float32)
    for k in range(files):
        ids = rng.permutation(cfg.rows)[:cfg.fresh_rows].astype(np.int64)
        values[:, 0] = first + k
        publish(staging, first + k, "f", ids, values)


def _arrivals(staging: Path, deltas: Path, first: int, files: int, every: float,
              renamed: dict[int, float]) -> threading.Thread:
    """Moves staged file ``first + k`` into ``deltas`` at ``k × every`` seconds from now."""

    def run() -> None:
        start = time.perf_counter()
        for k in range(files):
            wait = start + k * every - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            name = f"{first + k:020d}.arrow"
            (staging / name).rename(deltas / name)
            renamed[first + k] = time.time()

    t = threading.Thread(target=run)
    t.start()
    return t


def _cpu(pid: int | None = None) -> float:
    """CPU seconds process ``pid`` has used (``None``: every process on the host, busy)."""
    tick = os.sysconf("SC_CLK_TCK")
    if pid is None:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq = map(int, fields[:7])
        return (user + nice + system + irq + softirq) / tick
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(stat[11]) + int(stat[12])) / tick


@contextmanager
def _feeder(address: str, deltas: Path, applied: dict[int, float]) -> Iterator[int]:
    """``nearrec feed --watch`` into the node, started and settled (its imports done before
    the window); each file's report timed as it is read. Yields its pid."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "nearrec.cli", "feed", str(deltas), "s", "--remote", address,
         "--name", "fresh", "--watch", "--poll", "0.05", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            applied[json.loads(line)["sequence"]] = time.time()

    t = threading.Thread(target=read)
    t.start()
    # settled: its CPU time still for 0.3 s (it is polling an empty directory)
    before, deadline = -1.0, time.time() + 10
    while time.time() < deadline:
        time.sleep(0.3)
        now = _cpu(proc.pid)
        if now - before < 0.02:
            break
        before = now
    try:
        yield proc.pid
    finally:
        proc.terminate()
        proc.wait(30)
        t.join()


def _freshness(cfg: FeedRateConfig, path: Path, log: Callable[[str], None]) -> list[Record]:
    """(b): the readers' latency with no feed and with a feed at each rate, and each file's
    lag."""
    work = cfg.scratch / "feed-fresh"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(path, work / "store")
    deltas, staging = work / "deltas", work / "staging"
    deltas.mkdir()
    staging.mkdir()
    reqs = _requests(cfg, 256)
    conditions = ["no feed"] + [f"feed {r:,.0f} rows/s" for r in cfg.fresh_rates]
    got: dict[str, dict[str, list[float]]] = {c: {} for c in conditions}
    with node(work / "store", "s", "--writable", "--tier", "dram") as n:
        store = nearrec.connect(n.address, "s", retries=0)

        def drive(rate: float, seconds: float, seed: int) -> tuple[list[float], int]:
            out = _native.load_run("pooled", reqs, rate, seconds, target=n.address, store="s",
                                   connections=CONNECTIONS, seed=seed)
            return list(out["latencies_us"]), int(out["failed"]) + int(out["dropped"])

        drive(OFFERED, 1.0, 98)  # warm
        lat, _ = drive(OFFERED, 3.0, 99)
        closed = len(lat) / 3.0
        rate = cfg.load_share * closed
        log(f"lookups: the node answers {closed:,.0f} batches/s offered {OFFERED:,.0f}; the "
            f"load is {rate:,.0f}/s")
        sequence = 1
        for rnd in range(cfg.rounds):
            order = conditions[rnd % len(conditions):] + conditions[:rnd % len(conditions)]
            for cond in order:
                c = got[cond]
                seed = 100 * rnd + len(c.get("p50", []))
                feeder_cpu = 0.0
                if cond == "no feed":
                    cpu = (_cpu(n.pid), _cpu(), time.perf_counter())
                    lat, failed = drive(rate, cfg.seconds, seed)
                    end = (_cpu(n.pid), _cpu(), time.perf_counter())
                else:
                    fresh = cfg.fresh_rates[conditions.index(cond) - 1]
                    every = cfg.fresh_rows / fresh
                    files = max(1, round(cfg.seconds / every))
                    _stage(cfg, staging, sequence, files)
                    renamed: dict[int, float] = {}
                    applied: dict[int, float] = {}
                    with _feeder(n.address, deltas, applied) as pid:
                        mover = _arrivals(staging, deltas, sequence, files, every, renamed)
                        cpu = (_cpu(n.pid), _cpu(), time.perf_counter())
                        feeder_before = _cpu(pid)
                        lat, failed = drive(rate, cfg.seconds, seed)
                        end = (_cpu(n.pid), _cpu(), time.perf_counter())
                        feeder_cpu = _cpu(pid) - feeder_before
                        mover.join()
                        # the files still in flight land before the feeder stops
                        deadline = time.time() + 60
                        while len(applied) < files and time.time() < deadline:
                            time.sleep(0.05)
                    sequence += files
                    lags = [applied[s] - renamed[s] for s in renamed if s in applied]
                    c.setdefault("lag_p50", []).append(float(np.percentile(lags, 50)))
                    c.setdefault("lag_p99", []).append(float(np.percentile(lags, 99)))
                    c.setdefault("files", []).append(float(files))
                    c.setdefault("unapplied", []).append(float(files - len(lags)))
                    c.setdefault("offered", []).append(fresh)
                    store.compact()
                # CPU in cores over the window: the node's, the feeder's, the host's
                took = end[2] - cpu[2]
                c.setdefault("node_cores", []).append((end[0] - cpu[0]) / took)
                c.setdefault("feeder_cores", []).append(feeder_cpu / took)
                c.setdefault("host_cores", []).append((end[1] - cpu[1]) / took)
                c.setdefault("p50", []).append(float(np.percentile(lat, 50)))
                c.setdefault("p99", []).append(float(np.percentile(lat, 99)))
                c.setdefault("failed", []).append(float(failed))
                lag = (f", lag p50 {c['lag_p50'][-1]:.3f} s p99 {c['lag_p99'][-1]:.3f} s over "
                       f"{c['files'][-1]:.0f} files" if "lag_p50" in c else "")
                log(f"round {rnd + 1}: {cond}: readers p50 {c['p50'][-1]:,.0f} µs, p99 "
                    f"{c['p99'][-1]:,.0f} µs{lag}")
        store.close()
    shutil.rmtree(work, ignore_errors=True)
    base = statistics.median(got["no feed"]["p99"])
    records = []
    for cond, c in got.items():
        p99 = statistics.median(c["p99"])
        extra = {"rounds_p99_us": c["p99"], "spread_p99": rounds_spread(c["p99"]),
                 "p99_vs_no_feed": p99 / base, "offered_batches_per_s": rate,
                 "capacity_batches_per_s": closed, "failed": sum(c["failed"]),
                 "seconds": cfg.seconds, "rounds_node_cores": c["node_cores"],
                 "node_cores": statistics.median(c["node_cores"]),
                 "feeder_cores": statistics.median(c["feeder_cores"]),
                 "host_cores": statistics.median(c["host_cores"]), "cpus": os.cpu_count()}
        if "lag_p50" in c:
            extra |= {"lag_p50_s": statistics.median(c["lag_p50"]),
                      "lag_p99_s": statistics.median(c["lag_p99"]),
                      "rounds_lag_p99_s": c["lag_p99"], "files": c["files"],
                      "unapplied": c["unapplied"], "offered_rows_per_s": c["offered"][0],
                      "file_rows": cfg.fresh_rows}
        records.append(Record("feed-fresh", f"f:fp32x{cfg.dim}", cfg.batch, "uniform", cond,
                              samples_per_s=rate, lookups_per_s=rate * cfg.batch * cfg.pooling,
                              p50_us=statistics.median(c["p50"]), p99_us=p99, extra=extra))
    return records


def run(cfg: FeedRateConfig, log: Callable[[str], None] = print) -> list[Record]:
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    path = cfg.scratch / f"feed-{cfg.rows}x{cfg.dim}"
    cut = cfg.scratch / f"feed-{cfg.rows}x{cfg.dim}-cut2"
    rng = np.random.default_rng(cfg.seed)
    log(f"building {path}")
    nearrec.from_numpy(path, {t: rng.standard_normal((cfg.rows, cfg.dim), dtype=np.float32)
                              for t in TABLES}, {"f": "fp32", "q": "int8"}, overwrite=True)
    distributed.shard(path, cut, 2, scheme="row", overwrite=True)
    return _rates(cfg, path, cut, log) + _freshness(cfg, path, log)


def markdown(records: list[Record], command: str) -> str:
    rates = [r for r in records if r.bench == "feed-rate"]
    fresh = {r.system: r for r in records if r.bench == "feed-fresh"}
    lines = [f"Command: `{command}`", "",
             "(a) Rows per second applied from delta files (`nearrec.feed.apply`: read, "
             "checked, one call per file with its cursor) against `Store.write_many` of the "
             "same rows (one call per file), through one client on this machine; sync "
             "durability, DRAM tier; medians of rounds, spread = half the rounds' range over "
             "their median.", "",
             "| system | table | rows a file | feed rows/s (spread) | write_many rows/s "
             "(spread) | feed ÷ write_many |", "|---|---|---:|---:|---:|---:|"]
    cells = {(r.system.split(":")[0], r.model, r.batch, r.system.split(":")[1]): r
             for r in rates}
    for (system, model, n, way), r in cells.items():
        if way != "feed":
            continue
        peer = cells[(system, model, n, "write_many")]
        lines.append(f"| {system} | {model} | {n:,} | {r.lookups_per_s:,.0f} "
                     f"({r.extra['spread']:.0%}) | {peer.lookups_per_s:,.0f} "
                     f"({peer.extra['spread']:.0%}) | {r.extra['vs_write_many']:.2f} |")
    if fresh:
        base = fresh["no feed"]
        e = base.extra
        feeds = [r for r in fresh.values() if "lag_p50_s" in r.extra]
        lines += ["", f"(b) Readers at {e['offered_batches_per_s']:,.0f} batches/s open-loop "
                  f"(`nearrec-loadgen`, Poisson, {CONNECTIONS} connections: "
                  f"{e['offered_batches_per_s'] / e['capacity_batches_per_s']:.0%} of the "
                  f"{e['capacity_batches_per_s']:,.0f} the node answers past saturation; batch "
                  f"{base.batch}), {e['seconds']:.0f} s a window, with no feed and with a feed "
                  f"of files of {feeds[0].extra['file_rows']:,} rows arriving at each rate "
                  "(`nearrec feed --watch --poll 0.05`, its own process); a file's lag runs "
                  "from its arrival in the directory to the feeder reporting it applied; "
                  f"cores: CPU seconds a second over the window (the host has {e['cpus']}; "
                  "the load generator runs on it too).", "",
                  "| condition | readers p50 µs | p99 µs (rounds) | p99 ÷ no feed | lag p50 s "
                  "| lag p99 s (rounds) | files not applied | cores: node / feeder / host |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in [base, *feeds]:
            x = r.extra
            rounds = ", ".join(f"{v:,.0f}" for v in x["rounds_p99_us"])
            lag = (f"{x['lag_p50_s']:.3f} | {x['lag_p99_s']:.3f} ("
                   + ", ".join(f"{v:.3f}" for v in x["rounds_lag_p99_s"])
                   + f") | {sum(x['unapplied']):.0f}") if "lag_p50_s" in x else "– | – | –"
            cores = f"{x['node_cores']:.2f} / {x['feeder_cores']:.2f} / {x['host_cores']:.2f}"
            lines.append(f"| {r.system} | {r.p50_us:,.0f} | {r.p99_us:,.0f} ({rounds}) | "
                         f"{x['p99_vs_no_feed']:.2f} | {lag} | {cores} |")
    return "\n".join(lines) + "\n"


#: ``nearrec bench feed``
HARNESSES = {"feed": Harness(FeedRateConfig, FeedRateConfig.quick,
                             {"--rows": "rows", "--scratch": "scratch"}, run, markdown)}
