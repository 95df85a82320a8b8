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

import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

import nearrec

from . import _native
from .harness import Harness
from .report import Record
from .serve_report import CDF_POINTS, markdown, pinned_markdown, plot
from .served import (
    can_make_namespaces,
    namespace,
    node,
    redis_server,
    stage_seconds,
)

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
    # the load whose latency CDF and stage breakdown are reported (a share of raw's saturation)
    cdf_share: float = 0.7
    # clients: connections of one load generator, node and raw at cdf_share and past saturation
    client_counts: tuple[int, ...] = (1, 4, 16, 64)
    # coalescing (SSD tier: DRAM-resident lookups do not coalesce): requests of these many bags
    # from coalesce_connections connections, the node with each setting (its flags)
    coalesce_bags: tuple[int, ...] = (1, 4, 16, 64)
    coalesce_connections: int = 16
    coalesce_settings: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("off", ("--coalesce-bags", "0")),
        ("64 bags, no wait", ("--coalesce-bags", "64")),
        ("256 bags, no wait (default)", ("--coalesce-bags", "256")),
        ("64 bags, 200 µs", ("--coalesce-bags", "64", "--coalesce-window-us", "200")))
    # the wire: the node (and Redis) in a network namespace behind a veth pair limited to this
    # rate with tc (skipped where namespaces cannot be made)
    wire_rate: str = "1gbit"
    wire: bool = True
    # saturation of the node and of the embedded store each given CPU 1 alone, the load
    # generator CPU 0 (the node's load generator is not charged to it)
    pinned: bool = True

    @classmethod
    def quick(cls) -> ServeConfig:
        return cls(rows=20_000, ssd_rows=80_000, seconds=0.8, saturation_seconds=0.8,
                   shares=(0.3, 0.7), rounds=1, distinct_batches=16, client_counts=(1, 16),
                   coalesce_bags=(1, 16), wire=False)


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
    """One system at one offered load, over rounds."""

    system: str
    offered: float
    p50: list[float] = field(default_factory=list)
    p99: list[float] = field(default_factory=list)
    p999: list[float] = field(default_factory=list)
    served: list[float] = field(default_factory=list)
    failed: int = 0
    dropped: int = 0
    wire: int = 0
    samples: int = 0
    latencies: list[np.ndarray] = field(default_factory=list)

    def add(self, out: dict[str, Any]) -> None:
        lat = out["latencies_us"]
        if len(lat):
            self.p50.append(float(np.percentile(lat, 50)))
            self.p99.append(float(np.percentile(lat, 99)))
            self.p999.append(float(np.percentile(lat, 99.9)))
            self.latencies.append(np.asarray(lat))
        self.served.append(_answered_per_s(out))
        self.failed += out["failed"]
        self.dropped += out["dropped"]
        self.wire += out["wire_bytes"]
        self.samples += out["samples"]

    def summary(self) -> str:
        return (f"p50 {_median(self.p50):,.0f} µs, p99 {_median(self.p99):,.0f} µs, "
                f"p99.9 {_median(self.p999):,.0f} µs; {self.bytes_per_sample:,.0f} B/sample"
                f"{f'; {self.failed} failed' if self.failed else ''}"
                f"{f'; {self.dropped} dropped' if self.dropped else ''}")

    @property
    def bytes_per_sample(self) -> float:
        return self.wire / self.samples if self.samples else 0.0

    def extra(self) -> dict[str, Any]:
        return {"p999_us": _median(self.p999), "offered_per_s": self.offered,
                "rounds_p99_us": self.p99, "failed": self.failed, "dropped": self.dropped,
                "bytes_per_sample": self.bytes_per_sample}


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else 0.0




@dataclass
class Tier:
    """One tier's store and the requests every system is driven with."""

    name: str
    path: Path
    rows: int
    work: list[Batch]
    perms: list[np.ndarray]
    flags: list[str]
    config: str
    cache: dict[str, tuple[np.ndarray, np.ndarray]]
    tables: dict[str, np.ndarray[Any, np.dtype[np.float32]]] | None  # for Redis (DRAM only)
    dims: dict[str, int]


def _tier(cfg: ServeConfig, tier: str, log: Callable[[str], None]) -> Tier:
    rows = cfg.rows if tier == "dram" else cfg.ssd_rows
    path = cfg.scratch / f"serve-{tier}-{rows}"
    log(f"{tier}: building {cfg.tables} tables × {rows:,} rows × {cfg.dim}")
    tables = build_store(cfg, path, rows)
    perms, work = requests(cfg, rows)
    table_bytes = cfg.tables * rows * cfg.dim * 4
    config = 'tier = "dram"' if tier == "dram" else \
        f'tier = "ssd"\ndram_budget = {table_bytes // 4}'
    flags = ["--tier", tier] + ([] if tier == "dram" else ["--dram-budget",
                                                          str(table_bytes // 4)])
    # the client's cache: each table's 25 % hottest rows (the head of its Zipf ranking)
    heads = [np.sort(perms[t][:rows // 4]).astype(np.int64) for t in range(cfg.tables)]
    cache = {f"t{t}": (heads[t], tables[f"t{t}"][heads[t]]) for t in range(cfg.tables)}
    return Tier(tier, path, rows, work, perms, flags, config, cache,
                tables if tier == "dram" else None, dims(cfg))


def requests(cfg: ServeConfig, rows: int) -> tuple[list[np.ndarray], list[Batch]]:
    """Each table's Zipf ranking of its rows and the batches every system is driven with (the
    same for a given configuration, in any process)."""
    perms = [np.random.default_rng(cfg.seed + 10 + t).permutation(rows)
             for t in range(cfg.tables)]
    return perms, batches(cfg, rows, perms)


def dims(cfg: ServeConfig) -> dict[str, int]:
    return {f"t{t}": cfg.dim for t in range(cfg.tables)}


def _answered_per_s(out: dict[str, Any]) -> float:
    """A run's answered requests per second."""
    return float(len(out["latencies_us"]) / max(out["seconds"], 1e-9))


def _tiers(cfg: ServeConfig, log: Callable[[str], None]) -> Iterator[Tier]:
    """Each of ``cfg``'s tiers built in turn, its store removed once the caller moves on."""
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    for name in cfg.tiers:
        tier = _tier(cfg, name, log)
        yield tier
        shutil.rmtree(tier.path, ignore_errors=True)


def run(cfg: ServeConfig, log: Callable[[str], None] = print) -> list[Record]:
    records: list[Record] = []
    for tier in _tiers(cfg, log):
        records += _systems(cfg, tier, log)
        if cfg.pinned and _can_pin():
            records += _pinned(cfg, tier, log)
        if tier.name == "ssd":  # lookups that read a device are the ones that coalesce
            records += _coalescing(cfg, tier, log)
        if tier.name == "dram":
            records += _clients(cfg, tier, log)
            if cfg.wire and can_make_namespaces():
                records += _systems(cfg, tier, log, wire=True)
            elif cfg.wire:
                log("wire: skipped (no network namespaces or no tc on this host)")
    return records


def _systems(cfg: ServeConfig, tier: Tier, log: Callable[[str], None], wire: bool = False
             ) -> list[Record]:
    """Every system past saturation and at shares of raw's saturation, side by side; at
    ``cdf_share`` also each one's latency CDF and, for the node's calls, where the time went.
    ``wire``: the node and Redis in a namespace behind a rate-limited veth pair."""
    records: list[Record] = []
    where = f"{tier.name}@{cfg.wire_rate}" if wire else tier.name
    kind = "serve-wire" if wire else "serve"
    systems = [s for s in cfg.systems if not (s == "redis" and tier.tables is None)
               and not (wire and s == "embedded")]
    with namespace(cfg.wire_rate) if wire else nullcontext() as ns:
        netns, host = ns if ns else (None, "127.0.0.1")
        embedded = None if wire else _native.EmbeddedStore(str(tier.path), tier.config)
        with node(tier.path, "s", *tier.flags, netns=netns, host=host) as served, \
                _maybe_redis("redis" in systems, netns, host) as redis:
            if redis and tier.tables is not None:
                log(f"{where}: loading redis")
                _native.redis_load(redis, tier.tables)
            drive = _driver(cfg, tier, served.address, redis, embedded)
            # every system answers the same first batch with the same vectors
            ref = None
            for system in systems:
                first = drive(system, 50.0, 0.2, 0)["first"]
                if ref is None:
                    ref = first
                elif first is None or not np.allclose(first, ref, rtol=1e-4, atol=1e-5):
                    raise AssertionError(f"{system} answers differently from {systems[0]}")
            saturation = {}
            for system, (rate, got) in _saturations(cfg, drive, systems).items():
                saturation[system] = rate
                log(f"{where}: {system} saturates at {rate:,.0f} requests/s "
                    f"(rounds {', '.join(f'{g:,.0f}' for g in got)})")
                records.append(Record(f"{kind}-saturation", where, cfg.bags, "zipf", system,
                                      rate * cfg.bags, rate * cfg.bags * cfg.pooling * cfg.tables,
                                      extra={"requests_per_s": rate, "rounds": got}))
            base = saturation.get("raw", max(saturation.values()))
            for share in cfg.shares:
                rate = share * base
                cells = {system: Cell(system, rate) for system in systems}
                spent: dict[str, dict[tuple[str, str], tuple[float, float]]] = {
                    system: {} for system in systems}
                # rounds interleaved across the systems, so that a drifting disk or a noisy
                # neighbour falls on all of them alike
                for rnd in range(cfg.rounds):
                    for system in systems:
                        before = stage_seconds(served.metrics) if system in ("node", "raw") \
                            else None
                        cells[system].add(drive(system, rate, cfg.seconds, 200 + rnd))
                        if before is not None:
                            _spend(spent[system], before, stage_seconds(served.metrics))
                for system, c in cells.items():
                    log(f"{where}: {system} at {share:.0%} of raw's saturation ({rate:,.0f}/s): "
                        f"{c.summary()}")
                    extra = c.extra() | {"share_of_raw_saturation": share}
                    if abs(share - cfg.cdf_share) < 1e-9 and c.latencies:
                        every = np.concatenate(c.latencies)
                        extra["cdf_us"] = [float(np.percentile(every, q)) for q in CDF_POINTS]
                        if spent[system]:
                            extra["stages_us"] = _stages(spent[system], float(np.mean(every)))
                    records.append(Record(f"{kind}-load", where, cfg.bags, f"{share:.2f}", system,
                                          _median(c.served) * cfg.bags,
                                          _median(c.served) * cfg.bags * cfg.pooling * cfg.tables,
                                          _median(c.p50), _median(c.p99), extra=extra))
    return records


def _can_pin() -> bool:
    """Whether CPUs 0 and 1, the load generator's and the system under test's, are ours."""
    return {0, 1} <= os.sched_getaffinity(0)


def _pinned(cfg: ServeConfig, tier: Tier, log: Callable[[str], None]) -> list[Record]:
    """The node and the embedded store each on CPU 1 alone, the load generator on CPU 0: the
    throughput each gets from the same core, the node's client not charged to it (on a shared
    pair of cores the load generator's gRPC client takes as much CPU as the node's server)."""
    got: dict[str, list[float]] = {"node": [], "embedded": []}
    one = replace(cfg, rounds=1)
    with node(tier.path, "s", *tier.flags, cpus={1}) as served:
        for rnd in range(cfg.rounds):  # interleaved, as everywhere
            got["node"] += _pinned_rounds(one, tier, "pooled", served.address, 100 + rnd)
            got["embedded"] += _pinned_rounds(one, tier, "embedded", "", 100 + rnd)
    records: list[Record] = []
    for system, rounds in got.items():
        rate = _median(rounds)
        log(f"{tier.name}: {system} on one core saturates at {rate:,.0f} requests/s "
            f"(rounds {', '.join(f'{g:,.0f}' for g in rounds)})")
        records.append(Record("serve-pinned", tier.name, cfg.bags, "zipf", system,
                              rate * cfg.bags, rate * cfg.bags * cfg.pooling * cfg.tables,
                              extra={"requests_per_s": rate, "rounds": rounds,
                                     "rows_per_table": tier.rows}))
    return records


def pinned_command(cfg: ServeConfig, tier: Tier, mode: str, address: str, seed: int
                   ) -> list[str]:
    """The command of a load generator on CPU 0 (:func:`pinned_child`) driving ``mode`` at
    ``address``; it prints each of ``cfg.rounds`` rounds' answered requests/s."""
    job = {"cfg": {k: v for k, v in cfg.__dict__.items() if isinstance(v, int | float | str)},
           "path": str(tier.path), "rows": tier.rows, "config": tier.config, "mode": mode,
           "address": address, "seed": seed}
    return [sys.executable, "-c",
            "import sys; from nearrec_bench.serve import pinned_child; "
            "pinned_child(sys.argv[1])", json.dumps(job)]


def _pinned_rounds(cfg: ServeConfig, tier: Tier, mode: str, address: str, seed: int
                   ) -> list[float]:
    """Saturation rounds from a load generator in a child process on CPU 0; in ``embedded``
    mode the child's store is on CPU 1 (its threads made there)."""
    out = subprocess.run(pinned_command(cfg, tier, mode, address, seed),
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"the pinned load generator failed: {out.stderr}")
    rates: list[float] = json.loads(out.stdout.strip().splitlines()[-1])
    return rates


def pinned_child(job_json: str) -> None:
    """The child of :func:`_pinned_rounds`: prints each round's answered requests/s."""
    job = json.loads(job_json)
    cfg = replace(ServeConfig(), **job["cfg"])
    _, work = requests(cfg, job["rows"])

    def drive(rate: float, seconds: float, seed: int) -> dict[str, Any]:
        return _native.load_run(job["mode"], work, rate, seconds, target=job["address"],
                                store="s", connections=cfg.connections, seed=seed, cache=None,
                                embedded=embedded, dims=dims(cfg))

    embedded = None
    if job["mode"] == "embedded":
        # the store's threads (its pool is made at its first lookup) on CPU 1
        os.sched_setaffinity(0, {1})
        embedded = _native.EmbeddedStore(job["path"], job["config"])
        drive(50.0, 0.2, 0)
    os.sched_setaffinity(0, {0})  # the load generator's threads, made per run, on CPU 0
    drive(20_000.0, min(cfg.saturation_seconds, 1.0), 99)  # warms the caches, not counted
    got = []
    for rnd in range(cfg.rounds):
        got.append(_answered_per_s(drive(20_000.0, cfg.saturation_seconds, job["seed"] + rnd)))
    print(json.dumps(got))


def _spend(spent: dict[tuple[str, str], tuple[float, float]],
           before: dict[tuple[str, str], tuple[float, float]],
           after: dict[tuple[str, str], tuple[float, float]]) -> None:
    """Adds what the node's histograms grew by between two scrapes to ``spent``."""
    for key, (s1, n1) in after.items():
        s0, n0 = before.get(key, (0.0, 0.0))
        s, n = spent.get(key, (0.0, 0.0))
        spent[key] = (s + s1 - s0, n + n1 - n0)


def _stages(spent: dict[tuple[str, str], tuple[float, float]], client_mean_us: float
            ) -> dict[str, float]:
    """Mean µs per request of Lookup's stages over a system's runs (EMB-SSD's Fig. 8): waiting
    for the engine, the engine (route, reads, pooling), the rest of the node's handler
    (decoding, checks, the answer's message), and what is left of the client's latency
    (network, HTTP/2, the client's decoding and, for raw, its pooling)."""
    def mean(stage: str) -> float:
        s, n = spent.get(("Lookup", stage), (0.0, 0.0))
        return 1e6 * s / n if n else 0.0

    queue, engine, total = mean("queue"), mean("engine"), mean("total")
    return {"queue": queue, "engine": engine, "node": max(total - queue - engine, 0.0),
            "network+client": max(client_mean_us - total, 0.0)}


def _saturations(cfg: ServeConfig, drive: Callable[..., dict[str, Any]], systems: list[str],
                 connections: int | None = None, offered: float = 20_000.0
                 ) -> dict[str, tuple[float, list[float]]]:
    """Each system's answered requests/s under an offered load past it: the median of rounds
    interleaved across the systems, after one round each that warms caches and is not
    counted."""
    for system in systems:
        drive(system, offered, min(cfg.saturation_seconds, 1.0), 99, connections)
    got: dict[str, list[float]] = {system: [] for system in systems}
    for rnd in range(cfg.rounds):
        for system in systems:
            out = drive(system, offered, cfg.saturation_seconds, 100 + rnd, connections)
            got[system].append(_answered_per_s(out))
    return {system: (_median(g), g) for system, g in got.items()}


def _clients(cfg: ServeConfig, tier: Tier, log: Callable[[str], None]) -> list[Record]:
    """1 → 64 connections of one load generator: the node and raw past saturation and at
    ``cdf_share`` of raw's saturation with the default connections."""
    records: list[Record] = []
    with node(tier.path, "s", *tier.flags) as served:
        drive = _driver(cfg, tier, served.address, "", None)
        base, _ = _saturations(cfg, drive, ["raw"])["raw"]
        rate = cfg.cdf_share * base
        for connections in cfg.client_counts:
            sats = _saturations(cfg, drive, ["node", "raw"], connections)
            cells = {system: Cell(system, rate) for system in sats}
            for rnd in range(cfg.rounds):
                for system, c in cells.items():
                    c.add(drive(system, rate, cfg.seconds, 300 + rnd, connections))
            for system, c in cells.items():
                sat, got = sats[system]
                log(f"clients: {system} with {connections} connections saturates at "
                    f"{sat:,.0f} requests/s; at {rate:,.0f}/s {c.summary()}")
                records.append(Record("serve-clients", tier.name, cfg.bags, str(connections),
                                      system, _median(c.served) * cfg.bags,
                                      _median(c.served) * cfg.bags * cfg.pooling * cfg.tables,
                                      _median(c.p50), _median(c.p99),
                                      extra=c.extra() | {"connections": connections,
                                                         "saturation_requests_per_s": sat,
                                                         "saturation_rounds": got}))
    return records


def _coalescing(cfg: ServeConfig, tier: Tier, log: Callable[[str], None]) -> list[Record]:
    """Small requests from many connections, the node with each coalescing setting: its
    saturation and its latency at half of the uncoalesced node's saturation."""
    records: list[Record] = []
    for bags in cfg.coalesce_bags:
        small = replace(cfg, bags=bags, distinct_batches=max(cfg.distinct_batches, 4096 // bags))
        work = batches(small, tier.rows, tier.perms)
        rate = 0.0
        for setting, flags in cfg.coalesce_settings:
            with node(tier.path, "s", *tier.flags, *flags) as served:
                drive = _driver(small, replace(tier, work=work), served.address, "", None)
                # small requests go past 20k/s: offer more
                sat, got = _saturations(small, drive, ["node"], cfg.coalesce_connections,
                                        offered=100_000.0)["node"]
                if not rate:
                    rate = 0.5 * sat  # half the uncoalesced node's saturation
                c = Cell("node", rate)
                for rnd in range(cfg.rounds):
                    c.add(drive("node", rate, cfg.seconds, 400 + rnd, cfg.coalesce_connections))
            log(f"coalescing: {bags}-bag requests, {setting}: saturates at {sat:,.0f} "
                f"requests/s; at {rate:,.0f}/s {c.summary()}")
            records.append(Record("serve-coalesce", tier.name, bags, setting, "node",
                                  sat * bags, sat * bags * cfg.pooling * cfg.tables,
                                  _median(c.p50), _median(c.p99),
                                  extra=c.extra() | {"saturation_rounds": got,
                                                     "saturation_requests_per_s": sat,
                                                     "connections": cfg.coalesce_connections}))
    return records


def _driver(cfg: ServeConfig, tier: Tier, address: str, redis: str, embedded: Any
            ) -> Callable[..., dict[str, Any]]:
    """``drive(system, rate, seconds, seed, connections=None)``: one open-loop run."""
    modes = {"node": "pooled", "raw": "raw", "raw+cache25": "raw_cached", "redis": "redis",
             "embedded": "embedded"}

    def drive(system: str, rate: float, seconds: float, seed: int,
              connections: int | None = None) -> dict[str, Any]:
        return _native.load_run(
            modes[system], tier.work, rate, seconds,
            target=redis if system == "redis" else address, store="s",
            connections=connections or cfg.connections, seed=seed,
            cache=tier.cache if system == "raw+cache25" else None,
            embedded=embedded if system == "embedded" else None, dims=tier.dims)

    return drive


@contextmanager
def _maybe_redis(wanted: bool, netns: str | None = None, host: str = "127.0.0.1"
                 ) -> Iterator[str]:
    if not wanted:
        yield ""
        return
    with redis_server(netns, host) as address:
        yield address


def pinned_config() -> ServeConfig:
    """``serve-pinned``: only the one-core-each comparison, with rounds enough for a spread."""
    return ServeConfig(rounds=9)


def pinned_quick() -> ServeConfig:
    return replace(ServeConfig.quick(), rounds=2)


def run_pinned(cfg: ServeConfig, log: Callable[[str], None] = print) -> list[Record]:
    """The node and the embedded store, each on a core of its own, round by round."""
    if not _can_pin():
        # what pinning would have failed with, said before any store is built
        raise OSError(errno.EINVAL, f"serve-pinned runs the load generator on CPU 0 and the "
                      f"system under test on CPU 1; this process may use CPUs "
                      f"{sorted(os.sched_getaffinity(0))}")
    return [r for tier in _tiers(cfg, log) for r in _pinned(cfg, tier, log)]


HARNESSES = {"serve": Harness(ServeConfig, ServeConfig.quick,
                              {"--rows": "rows", "--scratch": "scratch"}, run, markdown,
                              figure=plot),
             "serve-pinned": Harness(pinned_config, pinned_quick,
                                     {"--rows": "rows", "--scratch": "scratch"}, run_pinned,
                                     pinned_markdown)}
