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
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

import nearrec

from . import _native
from .harness import Harness
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    """A running node: its gRPC address, its metrics address and its process."""

    address: str
    metrics: str
    pid: int


@contextmanager
def node(path: Path, name: str, *flags: str, netns: str | None = None,
         host: str = "127.0.0.1", cpus: set[int] | None = None,
         extra: Sequence[str] = ()) -> Iterator[Served]:
    """``nearrec serve`` on a free port of ``host`` (in network namespace ``netns``, on
    ``cpus``), with its metrics, serving ``extra`` stores (``PATH=NAME``) beside ``path``;
    drained with SIGTERM after."""
    inside = ["ip", "netns", "exec", netns] if netns else []
    insecure = [] if host == "127.0.0.1" else ["--insecure"]  # a namespace's private address
    # its log goes to a file: a pipe nobody reads would fill under a saturation test
    logs = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([*inside, sys.executable, "-m", "nearrec.cli", "serve",
                             f"{path}={name}", *extra, "--listen", f"{host}:0",
                             "--metrics-listen", f"{host}:0", *insecure, *flags],
                            stdout=subprocess.PIPE, stderr=logs, text=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on " not in line:
        proc.kill()
        proc.wait()
        logs.seek(0)
        raise RuntimeError(f"nearrec serve did not start: {line!r} {logs.read()}")
    try:
        yield Served(line.split("listening on ")[1].split()[0],
                     line.split("metrics on http://")[1].split("/")[0], proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        logs.close()


def scrape(metrics: str) -> list[Any]:
    """The node's ``/metrics`` at ``metrics`` now, read with Prometheus's own parser: its metric
    families."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    return list(text_string_to_metric_families(text))


def stage_seconds(metrics: str) -> dict[tuple[str, str], tuple[float, float]]:
    """The node's ``nearrec_request_seconds`` now: (call, stage) → (sum s, count)."""
    out: dict[tuple[str, str], list[float]] = {}
    for family in scrape(metrics):
        if family.name != "nearrec_request_seconds":
            continue
        for sample in family.samples:
            key = (sample.labels["call"], sample.labels["stage"])
            if sample.name.endswith("_sum"):
                out.setdefault(key, [0.0, 0.0])[0] = sample.value
            elif sample.name.endswith("_count"):
                out.setdefault(key, [0.0, 0.0])[1] = sample.value
    return {k: (v[0], v[1]) for k, v in out.items()}


@contextmanager
def namespace(rate: str | None = None, index: int = 0) -> Iterator[tuple[str, str]]:
    """Network namespace ``index`` (several may stand at once) joined to this one by a veth
    pair, each end limited to ``rate`` by tc's token bucket (``None``: the veth as it is);
    (its name, its address)."""
    ns, outer, inner = f"nearrec-bench-{index}", f"nrb{index}o", f"nrb{index}i"
    here, there = f"10.231.{7 + index}.1", f"10.231.{7 + index}.2"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "link", "del", outer], capture_output=True)
    steps = [["ip", "netns", "add", ns],
             ["ip", "link", "add", outer, "type", "veth", "peer", "name", inner],
             ["ip", "link", "set", inner, "netns", ns],
             ["ip", "addr", "add", f"{here}/24", "dev", outer],
             ["ip", "link", "set", outer, "up"],
             ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{there}/24", "dev", inner],
             ["ip", "netns", "exec", ns, "ip", "link", "set", inner, "up"],
             ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]]
    if rate is not None:
        steps += [["tc", "qdisc", "add", "dev", outer, "root", "tbf", "rate", rate, "burst",
                   "256kb", "latency", "20ms"],
                  ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", inner, "root", "tbf",
                   "rate", rate, "burst", "256kb", "latency", "20ms"]]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        yield ns, there
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", outer], capture_output=True)


def can_make_namespaces() -> bool:
    probe = "nearrec-bench-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return made and shutil.which("tc") is not None


@contextmanager
def redis_server(netns: str | None = None, host: str = "127.0.0.1") -> Iterator[str]:
    """Debian's ``redis-server`` on a free port of ``host`` (in network namespace ``netns``),
    no persistence; its address."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    port = _free_port()
    inside = ["ip", "netns", "exec", netns] if netns else []
    proc = subprocess.Popen([*inside, exe, "--port", str(port), "--bind", host, "--save", "",
                             "--appendonly", "no", "--protected-mode", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection((host, port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError("redis-server did not start")
        yield f"{host}:{port}"
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


# the latency CDF's points (percentiles)
CDF_POINTS = (1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 97, 99, 99.5, 99.9)


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


def _pinned_rounds(cfg: ServeConfig, tier: Tier, mode: str, address: str, seed: int
                   ) -> list[float]:
    """Saturation rounds from a load generator in a child process on CPU 0; in ``embedded``
    mode the child's store is on CPU 1 (its threads made there)."""
    job = {"cfg": {k: v for k, v in cfg.__dict__.items() if isinstance(v, int | float | str)},
           "path": str(tier.path), "rows": tier.rows, "config": tier.config, "mode": mode,
           "address": address, "seed": seed}
    out = subprocess.run([sys.executable, "-c",
                          "import sys; from nearrec_bench.serve import pinned_child; "
                          "pinned_child(sys.argv[1])", json.dumps(job)],
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


def markdown(records: list[Record], command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "Open loop (Poisson arrivals; each latency from its intended send time), 4 "
             "connections, batches of 64 bags × 20 Zipf(1.05) ids in each of 8 tables (dim 32, "
             "fp32); node = `nearrec serve` pooling next to the data; raw = the same node "
             "returning distinct rows, pooled by the client; raw+cache25 = raw with the 25 % "
             "hottest rows of each table in the client; redis = Debian's redis-server, rows as "
             "values, one pipelined MGET per request (DRAM-resident tables only); embedded = "
             "the store in the load generator's process. Loopback unless the tier says "
             "`@RATE` (the node and Redis in a network namespace behind a veth pair that tc "
             "limits to RATE each way). The node, the peers and the load generator share this "
             "machine's 2 cores. Medians of rounds.", ""]
    for kind, title in (("serve", "Loopback"), ("serve-wire", "Over a rate-limited veth pair")):
        if not any(r.bench == f"{kind}-saturation" for r in records):
            continue
        lines += [f"### {title}", "",
                  "**Saturation** (answered requests/s under an offered load past it; "
                  "samples/s = × 64):", "", "| tier | system | requests/s | samples/s | rounds |",
                  "|---|---|---:|---:|---|"]
        for r in records:
            if r.bench == f"{kind}-saturation":
                rounds = ", ".join(f"{x:,.0f}" for x in r.extra["rounds"])
                lines.append(f"| {r.model} | {r.system} | {r.extra['requests_per_s']:,.0f} | "
                             f"{r.samples_per_s:,.0f} | {rounds} |")
        lines += ["", "**Latency against offered load** (shares of raw's saturation):", "",
                  "| tier | offered/s | system | served samples/s | p50 µs | p99 µs | p99.9 µs | "
                  "B on the wire / sample | failed |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
        for r in records:
            if r.bench == f"{kind}-load":
                lines.append(f"| {r.model} | {r.extra['offered_per_s']:,.0f} | {r.system} | "
                             f"{r.samples_per_s:,.0f} | {r.p50_us:,.0f} | {r.p99_us:,.0f} | "
                             f"{r.extra['p999_us']:,.0f} | {r.extra['bytes_per_sample']:,.0f} | "
                             f"{r.extra['failed']} |")
        lines.append("")
    lines += _pinned_markdown(records)
    cdf = [r for r in records if "cdf_us" in r.extra]
    if cdf:
        lines += ["**Latency CDF** at the load marked (EMB-SSD Fig. 7; µs at each percentile, "
                  "every round's requests together):", "",
                  "| tier | system | " + " | ".join(f"p{q:g}" for q in CDF_POINTS) + " |",
                  "|---|---|" + "---:|" * len(CDF_POINTS)]
        for r in cdf:
            lines.append(f"| {r.model} | {r.system} | "
                         + " | ".join(f"{v:,.0f}" for v in r.extra["cdf_us"]) + " |")
        lines.append("")
    stages = [r for r in records if "stages_us" in r.extra]
    if stages:
        lines += ["**Where a request's time goes** at the same load (EMB-SSD Fig. 8; mean µs "
                  "per request): queue = waiting for an engine slot, engine = route + reads + "
                  "pooling, node = the rest of the node's handler (decoding, checks, the "
                  "answer), network+client = the client's mean latency less the node's (the "
                  "wire, HTTP/2, the client's decoding and, for raw, its pooling; from "
                  "`nearrec_request_seconds`):", "",
                  "| tier | system | queue | engine | node | network+client | client mean |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for r in stages:
            st = r.extra["stages_us"]
            lines.append(f"| {r.model} | {r.system} | {st['queue']:,.0f} | {st['engine']:,.0f} "
                         f"| {st['node']:,.0f} | {st['network+client']:,.0f} | "
                         f"{sum(st.values()):,.0f} |")
        lines.append("")
    clients = [r for r in records if r.bench == "serve-clients"]
    if clients:
        rate = clients[0].extra["offered_per_s"]
        lines += [f"**1 → 64 connections** (DRAM tier): saturation, and latency at {rate:,.0f} "
                  "requests/s offered:", "",
                  "| connections | system | saturation requests/s | p50 µs | p99 µs | p99.9 µs |",
                  "|---:|---|---:|---:|---:|---:|"]
        for r in clients:
            lines.append(f"| {r.extra['connections']} | {r.system} | "
                         f"{r.extra['saturation_requests_per_s']:,.0f} | {r.p50_us:,.0f} | "
                         f"{r.p99_us:,.0f} | {r.extra['p999_us']:,.0f} |")
        lines.append("")
    coalesce = [r for r in records if r.bench == "serve-coalesce"]
    if coalesce:
        conns = coalesce[0].extra["connections"]
        lines += [f"**Coalescing** small requests ({conns} connections, SSD tier): the node's "
                  "saturation with each setting, and its latency at half the uncoalesced "
                  "node's saturation:", "",
                  "| bags / request | setting | saturation requests/s | × off | offered/s | "
                  "p50 µs | p99 µs |", "|---:|---|---:|---:|---:|---:|---:|"]
        for r in coalesce:
            off = next(o for o in coalesce if o.batch == r.batch)
            ratio = r.samples_per_s / off.samples_per_s if off.samples_per_s else 0.0
            lines.append(f"| {r.batch} | {r.dist} | "
                         f"{r.extra['saturation_requests_per_s']:,.0f} | {ratio:.2f}× | "
                         f"{r.extra['offered_per_s']:,.0f} | {r.p50_us:,.0f} | {r.p99_us:,.0f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def plot(records: list[Record], path: Path) -> Path | None:
    """The report's figures in one PNG: p99 against offered load per tier, the latency CDF,
    the stage breakdown, and the connections sweep. ``None`` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    tiers = sorted({r.model for r in records if r.bench in ("serve-load", "serve-wire-load")})
    cols = max(len(tiers), 3)
    fig, axes = plt.subplots(2, cols, figsize=(6 * cols, 9), squeeze=False)
    for ax, tier in zip(axes[0], tiers, strict=False):
        for system in dict.fromkeys(r.system for r in records if r.model == tier):
            pts = sorted((r.extra["offered_per_s"], r.p99_us) for r in records
                         if r.model == tier and r.system == system and r.bench.endswith("-load"))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] / 1000 for p in pts], "o-", label=system)
        ax.set(title=f"p99 against offered load ({tier})", xlabel="offered requests/s",
               ylabel="p99 ms", yscale="log")
        _legend(ax, 8)
    ax = axes[1][0]
    for r in records:
        if "cdf_us" in r.extra and r.bench == "serve-load":
            ax.plot([v / 1000 for v in r.extra["cdf_us"]], CDF_POINTS,
                    label=f"{r.model} {r.system}")
    ax.set(title="latency CDF (EMB-SSD Fig. 7)", xlabel="latency ms", ylabel="percentile",
           xscale="log")
    _legend(ax, 7)
    ax = axes[1][1]
    stages = [r for r in records if "stages_us" in r.extra]
    bottom = np.zeros(len(stages))
    for stage in ("queue", "engine", "node", "network+client"):
        v = np.array([r.extra["stages_us"][stage] / 1000 for r in stages])
        ax.bar([f"{r.model}\n{r.system}" for r in stages], v, bottom=bottom, label=stage)
        bottom += v
    ax.set(title="mean time per request (EMB-SSD Fig. 8)", ylabel="ms")
    _legend(ax, 8)
    ax = axes[1][2]
    clients = [r for r in records if r.bench == "serve-clients"]
    for system in ("node", "raw"):
        pts = [(r.extra["connections"], r.extra["saturation_requests_per_s"]) for r in clients
               if r.system == system]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=system)
    ax.set(title="saturation against connections (DRAM)", xlabel="connections",
           ylabel="requests/s", xscale="log")
    _legend(ax, 8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _legend(ax: Any, size: int) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=size)


def _pinned_markdown(records: list[Record]) -> list[str]:
    """The one-core-each table: each system's median, its spread, and the node's ratio to the
    embedded store round by round (rounds are interleaved, so round k of each ran side by
    side)."""
    pinned = [r for r in records if r.bench == "serve-pinned"]
    if not pinned:
        return []
    lines = ["**One core each**: the system under test alone on CPU 1, the load generator on "
             "CPU 0 (the node's gRPC client is not charged to it); answered requests/s past "
             "saturation, median of rounds; × embedded is the ratio of medians, and its range "
             "over rounds the ratio round by round:", "",
             "| tier | rows per table | system | requests/s | min–max | × embedded | "
             "× embedded by round | rounds |", "|---|---:|---|---:|---:|---:|---:|---|"]
    for r in pinned:
        emb = next((e for e in pinned if e.model == r.model and e.system == "embedded"), r)
        ratio = r.samples_per_s / emb.samples_per_s if emb.samples_per_s else 0.0
        mine, theirs = r.extra["rounds"], emb.extra["rounds"]
        by_round = [a / b for a, b in zip(mine, theirs, strict=False) if b]
        spread = (f"{min(by_round):.2f}–{max(by_round):.2f}×" if by_round and r is not emb
                  else "")
        rounds = ", ".join(f"{x:,.0f}" for x in mine)
        rows = r.extra.get("rows_per_table")
        lines.append(f"| {r.model} | {f'{rows:,}' if rows else ''} | {r.system} | "
                     f"{r.extra['requests_per_s']:,.0f} | {min(mine):,.0f}–{max(mine):,.0f} | "
                     f"{ratio:.2f}× | {spread} | {rounds} |")
    return [*lines, ""]


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


def pinned_markdown(records: list[Record], command: str) -> str:
    return "\n".join([f"Command: `{command}`", "",
                      "Batches of 64 bags × 20 Zipf(1.05) ids in each of 8 tables (dim 32, fp32; "
                      "the SSD tier with a DRAM budget of ¼ of its tables), 4 connections of "
                      "one open-loop load generator on CPU 0, offered past saturation; each "
                      "round is a fresh load generator process (one warm-up run, not counted), "
                      "node and embedded interleaved round by round. The embedded store's calls "
                      "run on threads pinned to CPU 1, as the node's run on the node's CPU.", "",
                      *_pinned_markdown(records)])


#: ``nearrec bench serve``, and ``serve-pinned`` (its one-core-each part alone, more rounds)
HARNESSES = {"serve": Harness(ServeConfig, ServeConfig.quick,
                              {"--rows": "rows", "--scratch": "scratch"}, run, markdown,
                              figure=plot),
             "serve-pinned": Harness(pinned_config, pinned_quick,
                                     {"--rows": "rows", "--scratch": "scratch"}, run_pinned,
                                     pinned_markdown)}
