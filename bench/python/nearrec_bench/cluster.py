"""``nearrec bench cluster``: a store sharded over nodes, against one node and against the
embedded store — side by side, one store, one trace, in one run.

A DLRM-shaped store (DRAM-resident everywhere: what is measured is the path a batch takes, not
the disk) is served by:

- ``embedded``: ``nearrec.open`` in this process (the floor);
- ``node``: one ``nearrec serve`` of the whole store, through ``nearrec.connect`` (the direct
  single node the router's overhead is a ratio to);
- ``sharded.table.N``: the store cut table-wise into N shards (``nearrec shard``), a node per
  shard, through ``nearrec.distributed.connect`` (the Rust router); ``N = 1`` is the router's
  own cost over ``node``;
- ``sharded.row.N``: every table cut row-wise over N shards (each bag split and merged);
- ``sharded.row-hot.N``: the same with each table's hottest rows (by the trace) on every shard,
  for the fan-out they save (the shards a bag reaches, from the router's counters);
- ``ray.table.N``: the table-wise cut launched by ``nearrec.ray`` (nodes as Ray actors on a
  local Ray instance): the same data path, so any cost Ray adds shows here.

Every system serves the same batches of a Zipf trace. Per round: each batch alone, one after
the other (p50 / p99 of a batch with nothing else in flight), then ``clients`` threads each
sending batches back to back for the samples per second. Rounds repeat; medians are reported
with the rounds' spread. All of it on loopback on this machine: nodes, router and client share
its cores, so what scales with cores past one machine is not what this measures (the
projection is a separate, simulated table).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import nearrec
from nearrec import distributed
from nearrec import trace as nt

from .cache import generator, in_memory
from .harness import Harness
from .report import Record, rounds_spread
from .served import can_make_namespaces, namespace, node


@dataclass
class ClusterConfig:
    model: str = "rmc1"
    table_bytes: int = 512 << 20
    trace: str = "zipf1.05"
    batch: int = 64
    #: batches timed one at a time per round
    requests: int = 400
    #: threads sending batches back to back, and for how long (seconds)
    clients: int = 4
    seconds: float = 4.0
    rounds: int = 3
    shards: tuple[int, ...] = (1, 2, 4)
    #: hot rows per table kept on every shard (sharded.row-hot), and the pooling of the
    #: second trace the fan-out is also counted on (bags of few ids are those hot rows keep
    #: on one shard)
    hot_rows: int = 2000
    fanout_pooling: int = 4
    ray: bool = True
    #: the largest cut's nodes also each in a network namespace of its own (``*.netns``), where
    #: the machine allows (root, ``ip netns``)
    netns: bool = True
    #: ``cluster-load``: offered rates as shares of one node's closed-loop batches/s, each held
    #: for load_seconds, by load_issuers threads
    load_rates: tuple[float, ...] = (0.25, 0.5, 0.8)
    load_seconds: float = 4.0
    load_issuers: int = 8
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> ClusterConfig:
        return cls(table_bytes=64 << 20, requests=120, seconds=1.5, rounds=2, shards=(1, 2),
                   hot_rows=500, ray=False, netns=False, load_seconds=1.5)


def _timed(store: nearrec.Store, batches: list[list[Any]], requests: int) -> list[float]:
    lat = []
    for k in range(requests):
        t = time.perf_counter()
        store.lookup_many(batches[k % len(batches)])
        lat.append(time.perf_counter() - t)
    return lat


def _throughput(store: nearrec.Store, batches: list[list[Any]], clients: int,
                seconds: float) -> float:
    """Batches per second of ``clients`` threads, each sending back to back."""
    done = [0] * clients
    end = time.perf_counter() + seconds

    def send(i: int) -> None:
        k = i
        while time.perf_counter() < end:
            store.lookup_many(batches[k % len(batches)])
            done[i] += 1
            k += clients

    threads = [threading.Thread(target=send, args=(i,)) for i in range(clients)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sum(done) / (time.perf_counter() - t)


@contextmanager
def _sharded(path: Path, cut: Path, trace: Path, shards: int, scheme: str, hot: int,
             netns: bool = False) -> Iterator[nearrec.Store]:
    """The store cut into ``shards`` by ``scheme``, a node per shard, through the router; with
    ``netns`` each node in a network namespace of its own, reached over a veth pair."""
    if not (cut / "shards.json").exists():
        distributed.shard(path, cut, shards, scheme=scheme, trace=trace, replicate_hot=hot,
                          overwrite=True)
    plan = distributed.load_plan(cut)
    with ExitStack() as nodes:
        served = []
        for k in range(plan.shards):
            where: dict[str, Any] = {}
            if netns:
                ns, there = nodes.enter_context(namespace(index=k))
                where = {"netns": ns, "host": there}
            served.append(nodes.enter_context(
                node(cut / f"shard-{k}", "s", "--tier", "dram", **where)))
        replicas = [[f"{n.address}/s"] for n in served]
        store = distributed.connect(plan, replicas, hedge=None)
        yield store
        store.close()


@contextmanager
def _on_ray(cut: Path, name: str) -> Iterator[nearrec.Store]:
    import ray

    from nearrec.ray import ShardedStore

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    try:
        store = ShardedStore.launch(cut, name=name, tier="dram", num_cpus=1, hedge=None)
        try:
            yield store
        finally:
            ShardedStore.shutdown(name)
    finally:
        ray.shutdown()


@dataclass
class _Prepared:
    path: Path
    tag: str
    trace_path: Path
    batches: list[list[Any]]
    few_batches: list[list[Any]]
    info: Any
    spec: Any


def _prepare(cfg: ClusterConfig, log: Callable[[str], None]) -> _Prepared:
    """The store (built once for its seed), its trace, and the trace's batches."""
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    tag = f"cluster-{cfg.model}-{cfg.table_bytes >> 20}m"
    path = cfg.scratch / tag
    try:
        fresh = nearrec.info(path).params.get("seed") != cfg.seed
    except nearrec.NearrecError:
        fresh = True
    if fresh:
        log(f"building {path} ({cfg.table_bytes >> 20} MiB)")
        nearrec.build(path, cfg.model, table_bytes=cfg.table_bytes, seed=cfg.seed,
                      overwrite=True, progress=False)
        for old in cfg.scratch.glob(f"{tag}-cut-*"):
            import shutil

            shutil.rmtree(old)
    spec = nearrec.model_spec(cfg.model)
    trace_path = cfg.scratch / f"{tag}-{cfg.trace}.nrtrace"
    if fresh or not trace_path.exists():
        nt.generate(nearrec.open(path, tier="ssd"), 20 * cfg.batch, spec.lookups,
                    generator(cfg.trace), seed=cfg.seed, path=trace_path, overwrite=True)
    tr = in_memory(nt.load(trace_path))
    batches = [tr.batch(b, b + cfg.batch) for b in range(0, tr.bags - cfg.batch + 1, cfg.batch)]
    few = nt.generate({t.name: t.rows for t in nearrec.info(path).tables}, 20 * cfg.batch,
                      cfg.fanout_pooling, generator(cfg.trace), seed=cfg.seed)
    few_batches = [few.batch(b, b + cfg.batch) for b in range(0, few.bags, cfg.batch)]
    info = nearrec.info(path)
    log(f"{info.total_bytes / 2**20:.0f} MiB of tables ({len(info.tables)}), batches of "
        f"{cfg.batch}, {spec.lookups} lookups a bag and table")
    return _Prepared(path, tag, trace_path, batches, few_batches, info, spec)


def run(cfg: ClusterConfig, log: Callable[[str], None] = print) -> list[Record]:
    p = _prepare(cfg, log)
    path, tag, trace_path, batches, few_batches, info, spec = (
        p.path, p.tag, p.trace_path, p.batches, p.few_batches, p.info, p.spec)

    systems: dict[str, Callable[[], Any]] = {
        "embedded": lambda: _held(nearrec.open(path, tier="dram")),
        "node": lambda: _connected(path),
    }
    for n in cfg.shards:
        cut = cfg.scratch / f"{tag}-cut-table-{n}"
        systems[f"sharded.table.{n}"] = (
            lambda n=n, cut=cut: _sharded(path, cut, trace_path, n, "table", 0))
        if n > 1:
            for scheme, hot in (("row", 0), ("row-hot", cfg.hot_rows)):
                cut = cfg.scratch / f"{tag}-cut-{scheme}-{n}"
                systems[f"sharded.{scheme}.{n}"] = (
                    lambda n=n, cut=cut, hot=hot: _sharded(path, cut, trace_path, n, "row", hot))
    if cfg.netns and can_make_namespaces():
        n = max(cfg.shards)
        for scheme in ("table", "row"):
            cut = cfg.scratch / f"{tag}-cut-{scheme}-{n}"
            systems[f"sharded.{scheme}.{n}.netns"] = (
                lambda n=n, cut=cut, scheme=scheme: _sharded(path, cut, trace_path, n, scheme, 0,
                                                             netns=True))
    if cfg.ray:
        n = max(cfg.shards)
        cut = cfg.scratch / f"{tag}-cut-table-{n}"
        systems[f"ray.table.{n}"] = lambda cut=cut: _on_ray(cut, "bench")

    results: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for round_ in range(cfg.rounds):
        names = list(systems)
        names = names[round_ % len(names):] + names[:round_ % len(names)]
        for system in names:
            with systems[system]() as store:
                store.lookup_many(batches[0])  # connections made, caches touched
                before = _fanout(store)
                lat = _timed(store, batches, cfg.requests)
                rate = _throughput(store, batches, cfg.clients, cfg.seconds)
                after = _fanout(store)
                for b in few_batches:
                    store.lookup_many(b)
                fewer = _fanout(store)
            bags, few_bags = after[1] - before[1], fewer[1] - after[1]
            results[system].append({
                "lat": lat, "batches_per_s": rate,
                "fanout": (after[0] - before[0]) / bags if bags else None,
                "fanout_few": (fewer[0] - after[0]) / few_bags if few_bags else None})
        log(f"  round {round_ + 1}: " + "  ".join(
            f"{s}: p50 {1e6 * statistics.median(v[-1]['lat']):,.0f} µs"
            for s, v in results.items()))
    # the router's own cost once more, its requests interleaved with the node's in blocks of
    # 100 (each system's block in a round drifts with the machine; blocks side by side do not)
    interleaved: dict[str, list[float]] = {"node": [], "sharded.table.1": []}
    if "sharded.table.1" in systems:
        with systems["node"]() as direct, systems["sharded.table.1"]() as routed:
            for chunk in range(max(1, cfg.requests * cfg.rounds // 100)):
                for name, store in (("node", direct), ("sharded.table.1", routed)):
                    for k in range(100):
                        t = time.perf_counter()
                        store.lookup_many(batches[(chunk * 100 + k) % len(batches)])
                        interleaved[name].append(time.perf_counter() - t)
    per_sample = spec.lookups * len(info.tables)
    records = []
    for system, rounds in results.items():
        p50s = [statistics.median(r["lat"]) for r in rounds]
        p99s = [float(np.percentile(r["lat"], 99)) for r in rounds]
        rates = [r["batches_per_s"] * cfg.batch for r in rounds]
        rate = statistics.median(rates)
        fanouts = [r["fanout"] for r in rounds if r["fanout"] is not None]
        few_fanouts = [r["fanout_few"] for r in rounds if r["fanout_few"] is not None]
        records.append(Record(
            "cluster", cfg.model, cfg.batch, cfg.trace, system,
            samples_per_s=rate, lookups_per_s=rate * per_sample,
            p50_us=1e6 * statistics.median(p50s), p99_us=1e6 * statistics.median(p99s),
            extra={"rounds_samples_per_s": rates, "rounds_p50_us": [1e6 * x for x in p50s],
                   "rounds_p99_us": [1e6 * x for x in p99s],
                   "shards_per_bag": statistics.median(fanouts) if fanouts else None,
                   "shards_per_bag_few": (statistics.median(few_fanouts) if few_fanouts
                                          else None),
                   "fanout_pooling": cfg.fanout_pooling, "pooling": spec.lookups,
                   "clients": cfg.clients, "requests": cfg.requests,
                   "table_bytes": info.total_bytes, "tables": len(info.tables),
                   "interleaved_p50_us": (1e6 * statistics.median(interleaved[system])
                                          if interleaved.get(system) else None)}))
    return records


def run_load(cfg: ClusterConfig, log: Callable[[str], None] = print) -> list[Record]:
    """``cluster-load``: latency under load, open-loop — batches sent at a fixed offered rate
    (the same for every system: shares of one node's closed-loop rate, measured first), each
    latency taken from its scheduled send time, so a system that falls behind shows it."""
    from .update import _open_loop

    p = _prepare(cfg, log)
    n = max(s for s in cfg.shards if s > 1) if any(s > 1 for s in cfg.shards) else 1
    systems: dict[str, Callable[[], Any]] = {
        "embedded": lambda: _held(nearrec.open(p.path, tier="dram")),
        "node": lambda: _connected(p.path),
        f"sharded.table.{n}": lambda: _sharded(p.path, cfg.scratch / f"{p.tag}-cut-table-{n}",
                                               p.trace_path, n, "table", 0),
        f"sharded.row.{n}": lambda: _sharded(p.path, cfg.scratch / f"{p.tag}-cut-row-{n}",
                                             p.trace_path, n, "row", 0),
    }
    with _connected(p.path) as store:
        store.lookup_many(p.batches[0])
        capacity = _throughput(store, p.batches, cfg.clients, cfg.seconds)
    rates = [share * capacity for share in cfg.load_rates]
    log(f"one node's closed-loop rate: {capacity:,.0f} batches/s; offered: "
        + ", ".join(f"{r:,.0f}/s" for r in rates))
    results: dict[tuple[str, float], list[tuple[list[float], int]]] = {
        (s, r): [] for s in systems for r in rates}
    for round_ in range(cfg.rounds):
        names = list(systems)
        names = names[round_ % len(names):] + names[:round_ % len(names)]
        for system in names:
            with systems[system]() as store:
                store.lookup_many(p.batches[0])
                for rate in rates:
                    results[(system, rate)].append(_open_loop(
                        store, p.batches, rate, cfg.load_seconds, cfg.load_issuers))
        log(f"  round {round_ + 1}: " + "  ".join(
            f"{s}@{r:,.0f}: p99 {np.percentile(v[-1][0], 99):,.0f} µs"
            for (s, r), v in results.items()))
    records = []
    for (system, rate), rounds in results.items():
        p50s = [float(np.percentile(lat, 50)) for lat, _ in rounds]
        p99s = [float(np.percentile(lat, 99)) for lat, _ in rounds]
        records.append(Record(
            "cluster-load", cfg.model, cfg.batch, cfg.trace, system,
            samples_per_s=rate * cfg.batch,
            lookups_per_s=rate * cfg.batch * p.spec.lookups * len(p.info.tables),
            p50_us=statistics.median(p50s), p99_us=statistics.median(p99s),
            extra={"offered_batches_per_s": rate, "share_of_node": rate / capacity,
                   "node_capacity_batches_per_s": capacity, "rounds_p50_us": p50s,
                   "rounds_p99_us": p99s, "failed": sum(f for _, f in rounds),
                   "seconds": cfg.load_seconds, "issuers": cfg.load_issuers,
                   "table_bytes": p.info.total_bytes}))
    return records


def markdown_load(records: list[Record], command: str) -> str:
    e = records[0].extra
    lines = [f"Command: `{command}`", "",
             f"Open loop: batches of {records[0].batch} samples of `{records[0].dist}` "
             f"scheduled at a fixed rate (the same for every system: shares of one node's "
             f"closed-loop {e['node_capacity_batches_per_s']:,.0f} batches/s), each held "
             f"{e['seconds']:g} s by {e['issuers']} threads; every latency from the batch's "
             "scheduled send time (no coordinated omission). Medians of rounds. Everything on "
             "this machine's cores, over loopback.", "",
             "| system | offered batches/s (share of node) | p50 µs | p99 µs (rounds) | failed |",
             "|---|---:|---:|---:|---:|"]
    for r in sorted(records, key=lambda r: (r.extra["offered_batches_per_s"], r.system)):
        x = r.extra
        p99s = ", ".join(f"{v:,.0f}" for v in x["rounds_p99_us"])
        lines.append(f"| {r.system} | {x['offered_batches_per_s']:,.0f} "
                     f"({x['share_of_node']:.0%}) | {r.p50_us:,.0f} | {r.p99_us:,.0f} ({p99s}) | "
                     f"{x['failed']} |")
    return "\n".join(lines) + "\n"


@contextmanager
def _held(store: nearrec.Store) -> Iterator[nearrec.Store]:
    yield store


@contextmanager
def _connected(path: Path) -> Iterator[nearrec.Store]:
    with node(path, "s", "--tier", "dram") as served:
        yield nearrec.connect(served.address, "s", retries=0)


def _fanout(store: nearrec.Store) -> tuple[float, float]:
    """The router's (shards reached by the bags of split tables, those bags) so far; zeros for
    a store without a router, or no split table."""
    stats = store.stats()
    return float(stats.get("cluster_bag_shards", 0.0)), float(stats.get("cluster_split_bags", 0.0))


def markdown(records: list[Record], command: str) -> str:
    cells = {r.system: r for r in records}
    node_ = cells["node"]
    first = records[0]
    e = first.extra
    lines = [f"Command: `{command}`", "",
             f"{e['tables']} tables, {e['table_bytes'] / 2**20:.0f} MiB, DRAM-resident on every "
             f"node; batches of {first.batch} samples of `{first.dist}`; {e['requests']} batches "
             f"timed one at a time per round (p50 / p99), then {e['clients']} clients back to "
             "back (samples/s). Nodes, router and client on this machine's cores, over "
             "loopback. Medians of rounds; spread = half the rounds' range over their median.",
             "",
             f"Shards / bag: the shards a bag of a split table reached, on this trace "
             f"({e['pooling']} ids a bag) and on one of {e['fanout_pooling']} ids a bag (the "
             "fan-out that hot rows kept on every shard save).", "",
             f"| system | shards / bag ({e['pooling']}; {e['fanout_pooling']} ids) | p50 µs "
             "(rounds) | p99 µs | p50 ÷ node | samples/s (spread) | samples/s ÷ node |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        x = r.extra
        fan = "-" if x["shards_per_bag"] is None else (
            f"{x['shards_per_bag']:.2f}; {x['shards_per_bag_few']:.2f}")
        p50s = ", ".join(f"{v:,.0f}" for v in x["rounds_p50_us"])
        lines.append(f"| {r.system} | {fan} | {r.p50_us:,.0f} ({p50s}) | {r.p99_us:,.0f} | "
                     f"{r.p50_us / node_.p50_us:.2f} | {r.samples_per_s:,.0f} "
                     f"({rounds_spread(x['rounds_samples_per_s']):.0%}) | "
                     f"{r.samples_per_s / node_.samples_per_s:.2f} |")
    one = cells.get("sharded.table.1")
    if one is not None:
        lines += ["", f"The router's own cost at batch {first.batch}: `sharded.table.1` p50 ÷ "
                  f"`node` p50 = **{one.p50_us / node_.p50_us:.2f}×** (goal ≤ 1.25×, moonshot "
                  "1.1×)."]
        a, b = node_.extra.get("interleaved_p50_us"), one.extra.get("interleaved_p50_us")
        if a and b:
            lines += ["", f"The same with the two systems' requests interleaved in blocks of "
                      f"100 (a round's blocks drift with the machine): node {a:,.0f} µs, "
                      f"router {b:,.0f} µs, **{b / a:.2f}×**."]
    return "\n".join(lines) + "\n"


#: ``nearrec bench cluster`` and ``nearrec bench cluster-load``
HARNESSES = {"cluster": Harness(ClusterConfig, ClusterConfig.quick,
                                {"--table-bytes": "table_bytes", "--scratch": "scratch"},
                                run, markdown),
             "cluster-load": Harness(ClusterConfig, ClusterConfig.quick,
                                     {"--table-bytes": "table_bytes", "--scratch": "scratch"},
                                     run_load, markdown_load)}
