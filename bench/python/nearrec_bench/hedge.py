"""``nearrec bench cluster-hedge``: hedged reads against a replica slowed on purpose (Dean and
Barroso, *The Tail at Scale*), side by side with hedging off, in one run.

One shard, two replicas: two ``nearrec serve`` of the same shard directory (read-only, DRAM
tier) on loopback. One is slowed the way a node is slowed in production by a collector, a
compaction or a noisy neighbour: it is paused (SIGSTOP) for a heavy-tailed while (Pareto,
``pause_ms`` × (1 + Pareto(``pause_shape``)), at most ``pause_cap_ms``), then runs for an
exponential while of mean ``run_ms``, over and over. (The issue asked for ``tc netem`` on the
slow replica's link; this machine's kernel has no netem qdisc — ``tc qdisc add ... netem``
answers "qdisc kind is unknown" — so the slowing is the node's, not the wire's.) The router
(``nearrec.distributed.connect``) reads the replicas in turn, so half the reads meet the slow
one. Systems:

- ``fast-only``: the replica that is never paused, alone (the floor);
- ``hedge.off``: both replicas, no hedging;
- ``hedge.pNN``: both, a read sent to the other replica too once it has not answered after the
  shard's observed NN-th percentile (the first answer wins, the other is cancelled).

Each round connects every system afresh, warms it (the percentile needs reads to learn from),
then times ``requests`` batches one after the other. What a hedge costs is the share of reads
sent twice (``cluster_hedges`` ÷ ``cluster_reads``). Rounds repeat, systems in a rotated order;
medians are reported with the rounds' spread.
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
from .served import node


@dataclass
class HedgeConfig:
    model: str = "rmc1"
    table_bytes: int = 128 << 20
    trace: str = "zipf1.05"
    batch: int = 64
    #: batches timed one at a time, per system and round
    requests: int = 2000
    warmup: int = 200
    rounds: int = 3
    #: the slow replica's pauses: pause_ms × (1 + Pareto(pause_shape)), at most pause_cap_ms,
    #: each after an exponential run of mean run_ms
    pause_ms: float = 1.0
    pause_shape: float = 1.5
    pause_cap_ms: float = 50.0
    run_ms: float = 20.0
    hedges: tuple[str, ...] = ("off", "p95", "p90")
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> HedgeConfig:
        return cls(table_bytes=32 << 20, requests=400, warmup=100, rounds=2)


def _read_stats(store: nearrec.Store) -> tuple[float, float, float]:
    s = store.stats()
    return (float(s.get("cluster_reads", 0.0)), float(s.get("cluster_hedges", 0.0)),
            float(s.get("cluster_hedge_wins", 0.0)))


def run(cfg: HedgeConfig, log: Callable[[str], None] = print) -> list[Record]:
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    tag = f"hedge-{cfg.model}-{cfg.table_bytes >> 20}m"
    path = cfg.scratch / tag
    cut = cfg.scratch / f"{tag}-cut"
    try:
        fresh = nearrec.info(path).params.get("seed") != cfg.seed
    except nearrec.NearrecError:
        fresh = True
    if fresh:
        log(f"building {path} ({cfg.table_bytes >> 20} MiB)")
        nearrec.build(path, cfg.model, table_bytes=cfg.table_bytes, seed=cfg.seed,
                      overwrite=True, progress=False)
    if fresh or not (cut / "shards.json").exists():
        distributed.shard(path, cut, 1, scheme="table", overwrite=True)
    spec = nearrec.model_spec(cfg.model)
    trace = nt.generate({t.name: t.rows for t in nearrec.info(path).tables}, 40 * cfg.batch,
                        spec.lookups, generator(cfg.trace), seed=cfg.seed)
    tr = in_memory(trace)
    batches = [tr.batch(b, b + cfg.batch) for b in range(0, tr.bags, cfg.batch)]
    plan = distributed.load_plan(cut)
    shard = cut / "shard-0"
    log(f"one shard of {plan.tables[0].rows:,} rows × {len(plan.tables)} tables, two replicas; "
        f"the slow one paused {cfg.pause_ms} ms × (1 + Pareto({cfg.pause_shape})) every "
        f"~{cfg.run_ms} ms")

    systems = ["fast-only", *(f"hedge.{h}" for h in cfg.hedges)]
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    with (node(shard, "s", "--tier", "dram") as fast,
          node(shard, "s", "--tier", "dram") as slow, _paused(slow.pid, cfg) as paused):
        for round_ in range(cfg.rounds):
            order = systems[round_ % len(systems):] + systems[:round_ % len(systems)]
            for system in order:
                replicas = [[f"{fast.address}/s"]]
                hedge: str | None = None
                if system != "fast-only":
                    replicas = [[f"{fast.address}/s", f"{slow.address}/s"]]
                    h = system.split(".", 1)[1]
                    hedge = None if h == "off" else h
                store = distributed.connect(plan, replicas, hedge=hedge, timeout=30.0)
                try:
                    for k in range(cfg.warmup):
                        store.lookup_many(batches[k % len(batches)])
                    before = _read_stats(store)
                    lat = []
                    for k in range(cfg.requests):
                        t = time.perf_counter()
                        store.lookup_many(batches[k % len(batches)])
                        lat.append(time.perf_counter() - t)
                    after = _read_stats(store)
                finally:
                    store.close()
                reads, hedges, wins = (a - b for a, b in zip(after, before, strict=True))
                results[system].append({"lat": lat, "reads": reads, "hedges": hedges,
                                        "wins": wins})
            log(f"  round {round_ + 1}: " + "  ".join(
                f"{s}: p50 {1e6 * statistics.median(v[-1]['lat']):,.0f} µs p99 "
                f"{1e6 * float(np.percentile(v[-1]['lat'], 99)):,.0f} µs"
                for s, v in results.items()))
    records = []
    for system, rounds in results.items():
        p50s = [statistics.median(r["lat"]) for r in rounds]
        p99s = [float(np.percentile(r["lat"], 99)) for r in rounds]
        extra_share = [r["hedges"] / r["reads"] if r["reads"] else 0.0 for r in rounds]
        won = [r["wins"] / r["hedges"] if r["hedges"] else 0.0 for r in rounds]
        rate = cfg.batch / statistics.median([statistics.mean(r["lat"]) for r in rounds])
        records.append(Record(
            "cluster-hedge", cfg.model, cfg.batch, cfg.trace, system,
            samples_per_s=rate, lookups_per_s=rate * spec.lookups * len(plan.tables),
            p50_us=1e6 * statistics.median(p50s), p99_us=1e6 * statistics.median(p99s),
            extra={"rounds_p50_us": [1e6 * x for x in p50s],
                   "rounds_p99_us": [1e6 * x for x in p99s],
                   "extra_requests": statistics.median(extra_share),
                   "rounds_extra_requests": extra_share,
                   "hedge_wins": statistics.median(won), "paused": paused[0],
                   "pause": f"{cfg.pause_ms} ms × (1 + Pareto({cfg.pause_shape})), at most "
                            f"{cfg.pause_cap_ms} ms, after runs of mean {cfg.run_ms} ms",
                   "requests": cfg.requests, "rounds": cfg.rounds}))
    return records


@contextmanager
def _paused(pid: int, cfg: HedgeConfig) -> Iterator[list[float]]:
    """Pauses process ``pid`` as the config says, on a thread, until the block ends; yields
    (then holds) the share of the time it was paused."""
    stop = threading.Event()
    share = [0.0]
    rng = random.Random(cfg.seed)

    def stall() -> None:
        begun, paused = time.perf_counter(), 0.0
        while not stop.wait(rng.expovariate(1000.0 / cfg.run_ms)):
            pause = min(cfg.pause_cap_ms, cfg.pause_ms * (1 + rng.paretovariate(cfg.pause_shape)))
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(pause / 1000)
            finally:
                os.kill(pid, signal.SIGCONT)
            paused += pause / 1000
        share[0] = paused / (time.perf_counter() - begun)

    thread = threading.Thread(target=stall, daemon=True)
    thread.start()
    try:
        yield share
    finally:
        stop.set()
        thread.join()


def markdown(records: list[Record], command: str) -> str:
    cells = {r.system: r for r in records}
    off = cells["hedge.off"]
    e = records[0].extra
    lines = [f"Command: `{command}`", "",
             f"One shard, two replicas serving one directory (DRAM tier) on loopback; one "
             f"paused (SIGSTOP) {e['pause']} ({e['paused']:.0%} of the time): this kernel has "
             f"no `tc netem`. Batches of {records[0].batch} samples of `{records[0].dist}`, "
             f"{e['requests']} timed one at a time per system and round, {e['rounds']} rounds; "
             "medians of rounds, spread = half the rounds' range over their median. Extra "
             "requests: reads sent to a second replica ÷ reads.", "",
             "| system | p50 µs | p99 µs (rounds) | p99 ÷ hedge.off (spread) | extra requests "
             "| hedges won |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in records:
        x = r.extra
        p99s = ", ".join(f"{v:,.0f}" for v in x["rounds_p99_us"])
        lines.append(f"| {r.system} | {r.p50_us:,.0f} | {r.p99_us:,.0f} ({p99s}) | "
                     f"{r.p99_us / off.p99_us:.2f} ({rounds_spread(x['rounds_p99_us']):.0%}) | "
                     f"{x['extra_requests']:.1%} | {x['hedge_wins']:.0%} |")
    hedged = [r for r in records if r.system.startswith("hedge.p")]
    if hedged:
        within = [r for r in hedged if r.extra["extra_requests"] <= 0.05]
        best = min(within or hedged, key=lambda r: r.p99_us)
        lines += ["", f"Goal: p99 cut ≥ 30 % for ≤ 5 % extra requests. `{best.system}`: p99 "
                  f"{1 - best.p99_us / off.p99_us:.0%} below `hedge.off` for "
                  f"{best.extra['extra_requests']:.1%} extra requests."]
    return "\n".join(lines) + "\n"


#: ``nearrec bench cluster-hedge``
HARNESSES = {"cluster-hedge": Harness(HedgeConfig, HedgeConfig.quick,
                                      {"--table-bytes": "table_bytes", "--scratch": "scratch"},
                                      run, markdown)}
