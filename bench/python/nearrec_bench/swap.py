"""``nearrec bench cluster-swap``: what moving a served model to its next version costs, under
load — every shard of a sharded store at once (stage everywhere, switch everywhere, pin,
release: ``docs/distributed.md``, "Versions across shards") against one node swapping a
repository's versions — side by side, one store, one load, in one run.

Two versions of one store (``tables`` × ``rows`` × ``dim`` fp32; version 2 is version 1 plus
one, so every answer says which version it was read at). Systems, every node DRAM-resident and
read-only, on loopback:

- ``node``: one node serving a repository of both versions, through ``nearrec.connect``;
- ``sharded.2x2``: the store cut row-wise into two shards of two replicas (``nearrec shard``,
  version 2 published by ``nearrec shard --publish``), through the router;
- ``sharded.4x1``: four shards of one replica.

Per round and system: batches scheduled open-loop at ``rate`` a second for ``seconds``
(latency from each batch's scheduled send time: no coordinated omission), while ``swaps``
swaps alternate between the versions at even intervals. Reported: the swap's own time, the p50
/ p99 of batches scheduled during a swap (from its start to 50 ms after its end) against those
scheduled outside any, and every answer checked whole against both versions' — a batch read at
two versions would be counted (``mixed``); failures counted. Rounds in a rotated order;
medians and the rounds' spread.
"""

from __future__ import annotations

import itertools
import shutil
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
from nearrec import TableLookup, distributed

from .harness import Harness
from .report import Record, rounds_spread
from .served import node
from .update import _open_loop

#: batches scheduled this long after a swap returned still count as during it
AFTER = 0.05


@dataclass
class SwapConfig:
    tables: int = 4
    rows: int = 500_000
    dim: int = 32
    batch: int = 64
    pooling: int = 8
    rate: float = 200.0
    seconds: float = 8.0
    swaps: int = 3
    issuers: int = 8
    rounds: int = 5
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> SwapConfig:
        return cls(rows=50_000, rate=100.0, seconds=3.0, swaps=2, rounds=2)


def _batches(cfg: SwapConfig, rng: np.random.Generator, count: int = 16) -> list[list[Any]]:
    names = [f"t{i}" for i in range(cfg.tables)]
    return [[TableLookup(t, rng.integers(0, cfg.rows, cfg.batch * cfg.pooling),
                         lengths=np.full(cfg.batch, cfg.pooling)) for t in names]
            for _ in range(count)]


def _load(store: nearrec.Store, batches: list[list[Any]], answers: tuple[list[Any], list[Any]],
          cfg: SwapConfig, versions: Iterator[int]) -> dict[str, Any]:
    """Open-loop batches on ``store`` (``update._open_loop``) while a thread swaps it
    ``cfg.swaps`` times to the versions ``versions`` gives: each batch's scheduled time,
    latency (µs) and the version it read (1, 2, or 0 when neither: mixed), the swaps' spans,
    the failures."""
    start = time.perf_counter() + 0.05
    lock = threading.Lock()
    done: list[tuple[float, float, int]] = []

    def answered(i: int, at: float, took: float, pooled: Any) -> None:
        k = i % len(batches)
        read = next((v + 1 for v, want in enumerate(answers)
                     if np.allclose(pooled.values, want[k], atol=1e-4)), 0)
        with lock:
            done.append((at - start, took, read))

    spans: list[tuple[float, float]] = []

    def swap() -> None:
        for k in range(cfg.swaps):
            at = start + cfg.seconds * (k + 1) / (cfg.swaps + 1)
            time.sleep(max(0.0, at - time.perf_counter()))
            t = time.perf_counter()
            store.swap(version=next(versions))
            spans.append((t - start, time.perf_counter() - start))

    swapper = threading.Thread(target=swap)
    swapper.start()
    _, failed = _open_loop(store, batches, cfg.rate, cfg.seconds, cfg.issuers, start=start,
                           answered=answered)
    swapper.join()
    during = [lat for at, lat, _ in done
              if any(a <= at <= b + AFTER for a, b in spans)]
    steady = [lat for at, lat, _ in done
              if not any(a <= at <= b + AFTER for a, b in spans)]
    return {"during": during, "steady": steady,
            "swap_s": [b - a for a, b in spans],
            "mixed": sum(1 for *_, v in done if v == 0),
            "read": [sum(1 for *_, v in done if v == w) for w in (1, 2)],
            "failed": failed}


def run(cfg: SwapConfig, log: Callable[[str], None] = print) -> list[Record]:
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    tag = f"swap-{cfg.tables}x{cfg.rows}x{cfg.dim}"
    rng = np.random.default_rng(cfg.seed)
    names = [f"t{i}" for i in range(cfg.tables)]
    v1 = {t: rng.standard_normal((cfg.rows, cfg.dim), dtype=np.float32) for t in names}
    paths = [cfg.scratch / f"{tag}-v{k}" for k in (1, 2)]
    log(f"building {paths[0]} and {paths[1]}")
    nearrec.from_numpy(paths[0], v1, overwrite=True)
    nearrec.from_numpy(paths[1], {t: a + 1.0 for t, a in v1.items()}, overwrite=True)
    repo = cfg.scratch / f"{tag}-repo" / "s"
    shutil.rmtree(repo.parent, ignore_errors=True)
    for p in paths:
        nearrec.publish(repo, p)
    cuts = {}
    for shards, replicas in ((2, 2), (4, 1)):
        cut = cfg.scratch / f"{tag}-cut{shards}x{replicas}"
        distributed.shard(paths[0], cut, shards, replicas=replicas, scheme="row",
                          overwrite=True)
        distributed.publish(paths[1], cut)
        cuts[f"sharded.{shards}x{replicas}"] = (cut, shards, replicas)
    batches = _batches(cfg, rng)
    v1_answers, v2_answers = ([nearrec.open(p, tier="dram").lookup_many(b).values
                               for b in batches] for p in paths)
    answers = (v1_answers, v2_answers)

    def whole() -> Any:
        @contextmanager
        def opened() -> Iterator[nearrec.Store]:
            (repo / "CURRENT").unlink(missing_ok=True)
            with node(repo, "s", "--tier", "dram") as n:
                store = nearrec.connect(n.address, "s")
                store.swap(version=1)
                yield store
                store.close()
        return opened()

    def sharded(cut: Path, shards: int, replicas: int) -> Any:
        @contextmanager
        def opened() -> Iterator[nearrec.Store]:
            with ExitStack() as stack:
                addresses = [[f"{stack.enter_context(node(cut / f'shard-{k}', 's', '--tier', 'dram')).address}/s"  # noqa: E501
                              for _ in range(replicas)] for k in range(shards)]
                store = distributed.connect(cut, addresses, hedge=None)
                if store.served_version != 1:
                    store.swap(version=1)
                yield store
                store.close()
        return opened()

    systems: dict[str, Callable[[], Any]] = {"node": whole}
    for name, (cut, shards, replicas) in cuts.items():
        systems[name] = (lambda c=cut, s=shards, r=replicas: sharded(c, s, r))
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for round_ in range(cfg.rounds):
        order = list(systems)
        order = order[round_ % len(order):] + order[:round_ % len(order)]
        for name in order:
            with systems[name]() as store:
                for b in batches[:4]:
                    store.lookup_many(b)
                got = _load(store, batches, answers, cfg, itertools.cycle((2, 1)))
            results[name].append(got)
            log(f"  round {round_ + 1} {name}: swap {1e3 * statistics.median(got['swap_s']):,.0f} "
                f"ms, p99 during {np.percentile(got['during'], 99):,.0f} µs / steady "
                f"{np.percentile(got['steady'], 99):,.0f} µs, mixed {got['mixed']}, failed "
                f"{got['failed']}")
    records = []
    for name, rounds in results.items():
        def median(f: Callable[[dict[str, Any]], float], rs: list[dict[str, Any]] = rounds
                   ) -> tuple[float, list[float]]:
            values = [f(r) for r in rs]
            return statistics.median(values), values

        p50, _ = median(lambda r: float(np.percentile(r["steady"], 50)))
        p99, p99s = median(lambda r: float(np.percentile(r["steady"], 99)))
        d50, _ = median(lambda r: float(np.percentile(r["during"], 50)))
        d99, d99s = median(lambda r: float(np.percentile(r["during"], 99)))
        swap_s, swaps = median(lambda r: statistics.median(r["swap_s"]))
        records.append(Record(
            "cluster-swap", f"{cfg.tables}x{cfg.rows}x{cfg.dim}", cfg.batch, "uniform", name,
            samples_per_s=cfg.rate * cfg.batch,
            lookups_per_s=cfg.rate * cfg.batch * cfg.pooling * cfg.tables,
            p50_us=p50, p99_us=p99,
            extra={"during_p50_us": d50, "during_p99_us": d99, "rounds_during_p99_us": d99s,
                   "rounds_steady_p99_us": p99s, "swap_ms": 1e3 * swap_s,
                   "rounds_swap_ms": [1e3 * x for x in swaps],
                   "mixed": sum(r["mixed"] for r in rounds),
                   "failed": sum(r["failed"] for r in rounds),
                   "read_v1": sum(r["read"][0] for r in rounds),
                   "read_v2": sum(r["read"][1] for r in rounds),
                   "rate": cfg.rate, "seconds": cfg.seconds, "swaps": cfg.swaps,
                   "issuers": cfg.issuers, "pooling": cfg.pooling,
                   "table_bytes": cfg.tables * cfg.rows * cfg.dim * 4}))
    return records


def markdown(records: list[Record], command: str) -> str:
    e = records[0].extra
    node_ = next(r for r in records if r.system == "node")
    lines = [f"Command: `{command}`", "",
             f"Two versions of a store of `{records[0].model}` (tables × rows × dim, fp32, "
             f"{e['table_bytes'] / 2**20:,.0f} MiB a version), every node DRAM-resident, on "
             f"loopback. Batches of {records[0].batch} × {e['pooling']} ids a table scheduled "
             f"open-loop at {e['rate']:g}/s for {e['seconds']:g} s by {e['issuers']} threads "
             f"(latency from the scheduled send), while {e['swaps']} swaps alternate the "
             "versions; \"during\" = batches scheduled from a swap's start to 50 ms after its "
             "end. Every answer checked whole against both versions': `mixed` counts batches "
             "read at two. Medians of rounds; spread = half the rounds' range over their "
             "median.", "",
             "| system | swap ms (rounds) | p50 µs steady / during | p99 µs steady | "
             "p99 µs during (spread) | during p99 ÷ node's | mixed | failed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        x = r.extra
        swaps = ", ".join(f"{v:,.0f}" for v in x["rounds_swap_ms"])
        lines.append(
            f"| {r.system} | {x['swap_ms']:,.0f} ({swaps}) | {r.p50_us:,.0f} / "
            f"{x['during_p50_us']:,.0f} | {r.p99_us:,.0f} | {x['during_p99_us']:,.0f} "
            f"({rounds_spread(x['rounds_during_p99_us']):.0%}) | "
            f"{x['during_p99_us'] / node_.extra['during_p99_us']:.2f} | {x['mixed']} | "
            f"{x['failed']} |")
    return "\n".join(lines) + "\n"


#: ``nearrec bench cluster-swap``
HARNESSES = {"cluster-swap": Harness(SwapConfig, SwapConfig.quick,
                                     {"--rows": "rows", "--scratch": "scratch"}, run,
                                     markdown)}
