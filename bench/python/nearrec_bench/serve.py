"""``nearrec bench serve``: the storage node against host-side pooling, Redis and the embedded
store, on the same requests and tables (EMB-SSD's Figs. 7–8).

Systems, each driven by the same open-loop load generator (``nearrec-loadgen``: Poisson
arrivals at a fixed offered rate, every latency from the intended send time, several
connections), on the same batches (64 bags × 20 Zipf ids in each of 8 tables):

(a) ``node``: ``nearrec serve``, pooling next to the data; only ``[batch, Σ dim]`` comes back.
(b) ``raw``: the same node returning each table's distinct rows; the client pools them
    (host-side pooling: rows cross the network). ``raw+cache25``: the client also keeps the 25 %
    hottest rows of each table and asks only for the others (EMB-SSD's Host-Caching baseline).
(c) ``redis``: a real ``redis-server`` (Debian's), each row a value, one pipelined ``MGET`` per
    request for every table's distinct ids, the client pools (HPS's distributed tier) — on the
    DRAM-resident tables only, which fit its memory.
(d) ``embedded``: the store in the load generator's process, no network (the floor).

Tables DRAM-resident, and on the SSD tier with a DRAM budget a quarter of the tables. For each
system: its saturation (answered requests/s under an offered load past it), then p50 / p99 /
p99.9 at offered loads that are shares of (b)'s saturation, and bytes on the wire per sample.
Everything runs on loopback on this 2-core machine: the node, the peers and the load generator
share the cores (see the report's notes).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import nearrec

from . import _native
from .report import Record

Batch = list[tuple[str, np.ndarray, np.ndarray]]


@dataclass
class ServeConfig:
    tables: int = 8
    rows: int = 250_000  # per table, DRAM-resident (8 × 250k × 128 B = 256 MiB)
    ssd_rows: int = 2_000_000  # per table on the SSD tier (2 GiB, DRAM budget 512 MiB)
    dim: int = 32
    bags: int = 64
    pooling: int = 20
    zipf: float = 1.05
    distinct_batches: int = 64
    seconds: float = 3.0
    saturation_seconds: float = 2.0
    shares: tuple[float, ...] = (0.1, 0.3, 0.5, 0.7, 0.9)
    connections: int = 4
    rounds: int = 3
    tiers: tuple[str, ...] = ("dram", "ssd")
    scratch: Path = Path("bench/scratch")
    seed: int = 0
    systems: tuple[str, ...] = ("node", "raw", "raw+cache25", "redis", "embedded")

    @classmethod
    def quick(cls) -> ServeConfig:
        return cls(rows=20_000, ssd_rows=80_000, seconds=0.8, saturation_seconds=0.8,
                   shares=(0.3, 0.7), rounds=1, distinct_batches=16)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def node(path: Path, name: str, *flags: str) -> Iterator[str]:
    """``nearrec serve`` on a free loopback port; its address. Drained with SIGTERM after."""
    proc = subprocess.Popen([sys.executable, "-m", "nearrec.cli", "serve", f"{path}={name}",
                             "--listen", "127.0.0.1:0", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on " not in line:
        proc.kill()
        raise RuntimeError(f"nearrec serve did not start: {line!r} "
                           f"{proc.stderr.read() if proc.stderr else ''}")
    try:
        yield line.split("listening on ")[1].split()[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def redis_server() -> Iterator[str]:
    """Debian's ``redis-server`` on a free loopback port, no persistence; its address."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    port = _free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--protected-mode", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError("redis-server did not start")
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


def zipf_ids(rng: np.random.Generator, rows: int, n: int, a: float, perm: np.ndarray
             ) -> np.ndarray:
    """Zipf-ranked ids over a permutation of the rows (rank r → row perm[r])."""
    ranks = rng.zipf(a, n) - 1
    return perm[ranks % rows].astype(np.int64)


def batches(cfg: ServeConfig, rows: int, perms: list[np.ndarray]) -> list[Batch]:
    rng = np.random.default_rng(cfg.seed)
    out = []
    for _ in range(cfg.distinct_batches):
        b = []
        for t in range(cfg.tables):
            lengths = np.full(cfg.bags, cfg.pooling, np.int64)
            b.append((f"t{t}", zipf_ids(rng, rows, cfg.bags * cfg.pooling, cfg.zipf, perms[t]),
                      lengths))
        out.append(b)
    return out


def build_store(cfg: ServeConfig, path: Path, rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(cfg.seed + 1)
    tables = {f"t{t}": rng.standard_normal((rows, cfg.dim), dtype=np.float32)
              for t in range(cfg.tables)}
    nearrec.from_numpy(path, tables, overwrite=True)
    return tables


@dataclass
class Cell:
    system: str
    tier: str
    offered: float
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    p999: list[float] = field(default_factory=list)
    served: list[float] = field(default_factory=list)
    failed: int = 0
    dropped: int = 0
    bytes_per_sample: float = 0.0


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else 0.0


def run(cfg: ServeConfig, log: Callable[[str], None] = print) -> list[Record]:
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    records: list[Record] = []
    for tier in cfg.tiers:
        rows = cfg.rows if tier == "dram" else cfg.ssd_rows
        path = cfg.scratch / f"serve-{tier}-{rows}"
        log(f"{tier}: building {cfg.tables} tables × {rows:,} rows × {cfg.dim}")
        tables = build_store(cfg, path, rows)
        perms = [np.random.default_rng(cfg.seed + 10 + t).permutation(rows)
                 for t in range(cfg.tables)]
        work = batches(cfg, rows, perms)
        table_bytes = cfg.tables * rows * cfg.dim * 4
        config = 'tier = "dram"' if tier == "dram" else \
            f'tier = "ssd"\ndram_budget = {table_bytes // 4}'
        flags = ["--tier", tier] + ([] if tier == "dram" else ["--dram-budget",
                                                              str(table_bytes // 4)])
        # the client's cache: each table's 25 % hottest rows (the head of its Zipf ranking)
        head = rows // 4
        cache = {f"t{t}": (np.sort(perms[t][:head]).astype(np.int64),
                           tables[f"t{t}"][np.sort(perms[t][:head])])
                 for t in range(cfg.tables)}
        dims = {f"t{t}": cfg.dim for t in range(cfg.tables)}
        systems = [s for s in cfg.systems if not (s == "redis" and tier != "dram")]
        embedded = _native.EmbeddedStore(str(path), config)
        with node(path, "s", *flags) as address, _maybe_redis("redis" in systems) as redis:
            if redis:
                log(f"{tier}: loading redis")
                _native.redis_load(redis, tables)
            del tables
            drive = _driver(cfg, work, address, redis, cache, embedded, dims)

            # every system answers the same first batch with the same vectors
            ref = None
            for system in systems:
                first = drive(system, 50.0, 0.2, 0)["first"]
                if ref is None:
                    ref = first
                elif first is None or not np.allclose(first, ref, rtol=1e-4, atol=1e-5):
                    raise AssertionError(f"{system} answers differently from {systems[0]}")
            # saturation: answered requests/s under a load past every system's
            saturation: dict[str, float] = {}
            for system in systems:
                got = []
                for rnd in range(cfg.rounds):
                    out = drive(system, 20_000.0, cfg.saturation_seconds, 100 + rnd)
                    got.append(len(out["latencies_us"]) / max(out["seconds"], 1e-9))
                saturation[system] = _median(got)
                log(f"{tier}: {system} saturates at {saturation[system]:,.0f} requests/s "
                    f"(rounds {', '.join(f'{g:,.0f}' for g in got)})")
                records.append(Record("serve-saturation", tier, cfg.bags, "zipf", system,
                                      saturation[system] * cfg.bags,
                                      saturation[system] * cfg.bags * cfg.pooling * cfg.tables,
                                      extra={"requests_per_s": saturation[system],
                                             "rounds": got}))
            base = saturation.get("raw", max(saturation.values()))
            for share in cfg.shares:
                rate = share * base
                for system in systems:
                    c = Cell(system, tier, rate)
                    wire, samples = 0, 0
                    for rnd in range(cfg.rounds):
                        out = drive(system, rate, cfg.seconds, 200 + rnd)
                        lat = out["latencies_us"]
                        if len(lat):
                            c.p50.append(float(np.percentile(lat, 50)))
                            c.p99.append(float(np.percentile(lat, 99)))
                            c.p999.append(float(np.percentile(lat, 99.9)))
                        c.served.append(len(lat) / max(out["seconds"], 1e-9))
                        c.failed += out["failed"]
                        c.dropped += out["dropped"]
                        wire += out["wire_bytes"]
                        samples += out["samples"]
                    c.bytes_per_sample = wire / samples if samples else 0.0
                    log(f"{tier}: {system} at {share:.0%} of raw's saturation ({rate:,.0f}/s): "
                        f"p50 {_median(c.p50):,.0f} µs, p99 {_median(c.p99):,.0f} µs, "
                        f"p99.9 {_median(c.p999):,.0f} µs; {c.bytes_per_sample:,.0f} B/sample"
                        f"{f'; {c.failed} failed' if c.failed else ''}"
                        f"{f'; {c.dropped} dropped' if c.dropped else ''}")
                    records.append(Record(
                        "serve-load", tier, cfg.bags, f"{share:.2f}", system,
                        _median(c.served) * cfg.bags,
                        _median(c.served) * cfg.bags * cfg.pooling * cfg.tables,
                        _median(c.p50), _median(c.p99),
                        extra={"p999_us": _median(c.p999), "offered_per_s": rate,
                               "rounds_p99_us": c.p99, "failed": c.failed,
                               "dropped": c.dropped, "bytes_per_sample": c.bytes_per_sample,
                               "share_of_raw_saturation": share}))
        shutil.rmtree(path, ignore_errors=True)
    return records


def _driver(cfg: ServeConfig, work: list[Batch], address: str, redis: str,
            cache: dict[str, tuple[np.ndarray, np.ndarray]], embedded: Any, dims: dict[str, int]
            ) -> Callable[[str, float, float, int], dict[str, Any]]:
    """``drive(system, rate, seconds, seed)``: one open-loop run of ``system``."""
    modes = {"node": "pooled", "raw": "raw", "raw+cache25": "raw_cached", "redis": "redis",
             "embedded": "embedded"}

    def drive(system: str, rate: float, seconds: float, seed: int) -> dict[str, Any]:
        return _native.load_run(
            modes[system], work, rate, seconds,
            target=redis if system == "redis" else address, store="s",
            connections=cfg.connections, seed=seed,
            cache=cache if system == "raw+cache25" else None,
            embedded=embedded if system == "embedded" else None, dims=dims)

    return drive


@contextmanager
def _maybe_redis(wanted: bool) -> Iterator[str]:
    if not wanted:
        yield ""
        return
    with redis_server() as address:
        yield address


def markdown(records: list[Record], command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "Open loop (Poisson arrivals; each latency from its intended send time), 4 "
             "connections, batches of 64 bags × 20 Zipf(1.05) ids in each of 8 tables (dim 32, "
             "fp32); node = `nearrec serve` pooling next to the data; raw = the same node "
             "returning distinct rows, pooled by the client; raw+cache25 = raw with the 25 % "
             "hottest rows of each table in the client; redis = Debian's redis-server, rows as "
             "values, one pipelined MGET per request (DRAM-resident tables only); embedded = "
             "the store in the load generator's process. Loopback; the node, the peers and the "
             "load generator share this machine's 2 cores. Medians of rounds.", "",
             "**Saturation** (answered requests/s under an offered load past it; samples/s = "
             "× 64):", "", "| tier | system | requests/s | samples/s | rounds |",
             "|---|---|---:|---:|---|"]
    for r in records:
        if r.bench == "serve-saturation":
            rounds = ", ".join(f"{x:,.0f}" for x in r.extra["rounds"])
            lines.append(f"| {r.model} | {r.system} | {r.extra['requests_per_s']:,.0f} | "
                         f"{r.samples_per_s:,.0f} | {rounds} |")
    lines += ["", "**Latency against offered load** (shares of raw's saturation):", "",
              "| tier | offered/s | system | served samples/s | p50 µs | p99 µs | p99.9 µs | "
              "B on the wire / sample | failed |", "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        if r.bench == "serve-load":
            lines.append(f"| {r.model} | {r.extra['offered_per_s']:,.0f} | {r.system} | "
                         f"{r.samples_per_s:,.0f} | {r.p50_us:,.0f} | {r.p99_us:,.0f} | "
                         f"{r.extra['p999_us']:,.0f} | {r.extra['bytes_per_sample']:,.0f} | "
                         f"{r.extra['failed']} |")
    return "\n".join(lines) + "\n"
