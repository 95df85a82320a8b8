"""``nearrec bench cluster-write``: what a write costs through a sharded store — one node, one
shard of two replicas, two shards — against the same write to one node, side by side, in one
run.

A store of ``tables`` tables (``rows`` × ``dim`` fp32) is cut row-wise into two shards; every
node serves its copy writable (sync durability: a write is on the disk when it answers). Each
write call sets ``rows_per_write`` rows of one table, drawn at random, so that a call's rows
fall on both shards of a two-shard cut. Systems:

- ``node``: the whole store on one node, through ``nearrec.connect`` (one round trip, one
  fsync);
- ``shard.1x1``: a one-shard cut on one node through the router (the router's plain path);
- ``shard.1x2``: one shard on two replicas (two-phase commit, so that both replicas take every
  router's writes in one order);
- ``shard.2x1``: two shards, one replica each (two-phase commit across shards);
- ``shard.2x2``: two shards of two replicas each.

Each call alone, ``writes`` per system and round, rounds in a rotated order; p50 / p99 and the
rounds' spread. Every node and the router share this machine's cores and its one disk. Two
ways, each system in each round: **back to back** (the next call as soon as one answers), and
**apart** (``gap_us`` between calls, not timed: a two-phase write answers once its decider
committed, its other replicas' commits on their way after — back to back, the next call meets
them on the one disk).
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import nearrec
from nearrec import distributed

from .harness import Harness
from .report import Record, rounds_spread
from .served import node


@dataclass
class WriteConfig:
    tables: int = 4
    rows: int = 200_000
    dim: int = 32
    rows_per_write: int = 64
    writes: int = 300
    rounds: int = 3
    #: the pause after each call in the calls made apart
    gap_us: int = 3000
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> WriteConfig:
        return cls(rows=20_000, writes=60, rounds=2)


@contextmanager
def _nodes(dirs: list[list[Path]]) -> Iterator[list[list[str]]]:
    """A writable node on each directory: ``[shard][replica]`` addresses (``ADDR/s``)."""
    with ExitStack() as stack:
        yield [[f"{stack.enter_context(node(d, 's', '--writable', '--tier', 'dram')).address}/s"
                for d in shard] for shard in dirs]


def _copies(cut: Path, shards: int, replicas: int, into: Path) -> list[list[Path]]:
    """A fresh writable copy of each shard for each replica."""
    if into.exists():
        shutil.rmtree(into)
    out = []
    for k in range(shards):
        row = []
        for r in range(replicas):
            d = into / f"shard-{k}-{r}"
            shutil.copytree(cut / f"shard-{k}", d)
            row.append(d)
        out.append(row)
    return out


@contextmanager
def writable_node(path: Path, work: Path) -> Iterator[nearrec.Store]:
    """A fresh copy of the store at ``path`` (under ``work``, emptied first) served writable
    from DRAM by one node, through ``nearrec.connect``."""
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(path, work / "whole")
    with node(work / "whole", "s", "--writable", "--tier", "dram") as n:
        store = nearrec.connect(n.address, "s", retries=0)
        yield store
        store.close()


@contextmanager
def writable_shards(cut: Path, shards: int, replicas: int, work: Path
                    ) -> Iterator[nearrec.Store]:
    """A fresh copy (under ``work``) of each of ``cut``'s ``shards`` for each of ``replicas``,
    each on a writable node, through the router."""
    with _nodes(_copies(cut, shards, replicas, work)) as addresses:
        store = distributed.connect(cut, addresses, hedge=None)
        yield store
        store.close()


def run(cfg: WriteConfig, log: Callable[[str], None] = print) -> list[Record]:
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    tag = f"writes-{cfg.tables}x{cfg.rows}x{cfg.dim}"
    path = cfg.scratch / tag
    rng = np.random.default_rng(cfg.seed)
    names = [f"t{i}" for i in range(cfg.tables)]
    log(f"building {path}")
    nearrec.from_numpy(path, {t: rng.standard_normal((cfg.rows, cfg.dim), dtype=np.float32)
                              for t in names}, overwrite=True)
    cuts = {n: cfg.scratch / f"{tag}-cut{n}" for n in (1, 2)}
    for n, cut in cuts.items():
        distributed.shard(path, cut, n, scheme="row", overwrite=True)
    calls = [(names[k % len(names)],
              rng.choice(cfg.rows, cfg.rows_per_write, replace=False).astype(np.int64),
              rng.standard_normal((cfg.rows_per_write, cfg.dim), dtype=np.float32))
             for k in range(64)]
    work = cfg.scratch / f"{tag}-nodes"

    systems: dict[str, Callable[[], Any]] = {
        "node": lambda: writable_node(path, work),
        "shard.1x1": lambda: writable_shards(cuts[1], 1, 1, work),
        "shard.1x2": lambda: writable_shards(cuts[1], 1, 2, work),
        "shard.2x1": lambda: writable_shards(cuts[2], 2, 1, work),
        "shard.2x2": lambda: writable_shards(cuts[2], 2, 2, work)}
    def timed(store: nearrec.Store, gap: float) -> list[float]:
        lat = []
        for k in range(cfg.writes):
            table, ids, rows = calls[k % len(calls)]
            t = time.perf_counter()
            store.write(table, ids, rows)
            lat.append(time.perf_counter() - t)
            if gap:
                time.sleep(gap)
        return lat

    results: dict[str, list[list[float]]] = {s: [] for s in systems}
    apart: dict[str, list[list[float]]] = {s: [] for s in systems}
    for round_ in range(cfg.rounds):
        order = list(systems)
        order = order[round_ % len(order):] + order[:round_ % len(order)]
        for name in order:
            with systems[name]() as store:
                for table, ids, rows in calls[:5]:
                    store.write(table, ids, rows)
                results[name].append(timed(store, 0.0))
                apart[name].append(timed(store, cfg.gap_us / 1e6))
                # what was written is what is read
                table, ids, rows = calls[(cfg.writes - 1) % len(calls)]
                np.testing.assert_array_equal(store.read_rows(table, ids), rows)
        log(f"  round {round_ + 1}: " + "  ".join(
            f"{s}: p50 {1e6 * statistics.median(v[-1]):,.0f} µs "
            f"({1e6 * statistics.median(apart[s][-1]):,.0f} apart)"
            for s, v in results.items()))
    shutil.rmtree(work, ignore_errors=True)

    def p50s(rounds: list[list[float]]) -> list[float]:
        return [1e6 * statistics.median(r) for r in rounds]

    def p99s(rounds: list[list[float]]) -> list[float]:
        return [1e6 * float(np.percentile(r, 99)) for r in rounds]

    records = []
    for name, rounds in results.items():
        rate = 1.0 / statistics.median([statistics.mean(r) for r in rounds])
        records.append(Record(
            "cluster-write", f"{cfg.tables}x{cfg.rows}x{cfg.dim}", cfg.rows_per_write,
            "uniform", name, samples_per_s=rate, lookups_per_s=rate * cfg.rows_per_write,
            p50_us=statistics.median(p50s(rounds)), p99_us=statistics.median(p99s(rounds)),
            extra={"rounds_p50_us": p50s(rounds), "rounds_p99_us": p99s(rounds),
                   "apart_p50_us": statistics.median(p50s(apart[name])),
                   "apart_p99_us": statistics.median(p99s(apart[name])),
                   "apart_rounds_p50_us": p50s(apart[name]), "gap_us": cfg.gap_us,
                   "writes": cfg.writes, "rows_per_write": cfg.rows_per_write,
                   "dim": cfg.dim}))
    return records


def markdown(records: list[Record], command: str) -> str:
    cells = {r.system: r for r in records}
    node_ = cells["node"]
    e = records[0].extra
    lines = [f"Command: `{command}`", "",
             f"Write calls of {e['rows_per_write']} random rows × dim {e['dim']} (fp32) of one "
             f"table of `{records[0].model}` (tables × rows × dim), cut row-wise; every node "
             "writable, sync durability, on this machine's one disk. Each call alone, "
             f"{e['writes']} per system and round, back to back and then apart "
             f"({e['gap_us']:,} µs between calls, not timed); medians of rounds, spread = half "
             "the rounds' range over their median.", "",
             "| system | back to back: p50 µs (rounds) | p99 µs | p50 ÷ node (spread) | calls/s "
             "| apart: p50 µs (rounds) | p99 µs | p50 ÷ node (spread) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]

    def cell(p50: float, rounds: list[float], p99: float, node_p50: float) -> str:
        each = ", ".join(f"{v:,.0f}" for v in rounds)
        return (f"{p50:,.0f} ({each}) | {p99:,.0f} | {p50 / node_p50:.2f} "
                f"({rounds_spread(rounds):.0%})")

    for r in records:
        x = r.extra
        together = cell(r.p50_us, x["rounds_p50_us"], r.p99_us, node_.p50_us)
        alone = cell(x["apart_p50_us"], x["apart_rounds_p50_us"], x["apart_p99_us"],
                     node_.extra["apart_p50_us"])
        lines.append(f"| {r.system} | {together} | {r.samples_per_s:,.0f} | {alone} |")
    return "\n".join(lines) + "\n"


#: ``nearrec bench cluster-write``
HARNESSES = {"cluster-write": Harness(WriteConfig, WriteConfig.quick,
                                      {"--rows": "rows", "--scratch": "scratch"}, run, markdown)}
