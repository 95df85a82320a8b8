"""``nearrec bench cluster-catch-up``: what a replica's catch-up costs its shard's writes.

One shard on two writable nodes (``nearrec serve --writable``, DRAM tier, sync durability)
behind a router whose own background catch-up is off. A writer writes ``rows_per_write``
random rows of the one table, open loop at ``rate`` calls a second (each call's latency counts
from when it was due, so a call held up delays the ones due behind it: no coordinated
omission). One replica is paused (SIGSTOP) for ``behind`` seconds: the router leaves it out at
its first write that times out, and the writes go on to the other alone. Resumed, it is caught
up (``nearrec.distributed.catch_up``) while the writer goes on: the rows that differ are copied
while writes go on, then the member is fenced — its writes wait — for a last pass, and the
replica is admitted, which lifts the fence (``docs/distributed.md``, "A replica catching up").

Measured per ``behind`` and round: the rows copied before the fence and under it, how long the
member was fenced, and the writes' p50 / p99 / worst latency before the pause and during the
catch-up call; medians of rounds. The peer is the same writes with nothing caught up: the
calls before the pause.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
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
class CatchUpConfig:
    rows: int = 500_000
    dim: int = 32
    rows_per_write: int = 16
    #: write calls a second, open loop
    rate: float = 100.0
    #: seconds the replica is paused, one cell each
    behind: tuple[float, ...] = (1.0, 4.0, 10.0)
    rounds: int = 3
    #: the router's call timeout (a write to the paused replica waits it out once)
    timeout: float = 0.5
    lease: float = 10.0
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> CatchUpConfig:
        return cls(rows=50_000, behind=(1.0, 3.0), rounds=1)


class Writer(threading.Thread):
    """Writes at ``rate`` calls a second until stopped: each call's (due, began, ended, ok) in
    ``perf_counter`` seconds."""

    def __init__(self, store: nearrec.Store, cfg: CatchUpConfig, rng: np.random.Generator):
        super().__init__(daemon=True)
        self.store, self.cfg = store, cfg
        self.calls = [(rng.choice(cfg.rows, cfg.rows_per_write, replace=False).astype(np.int64),
                       rng.standard_normal((cfg.rows_per_write, cfg.dim), dtype=np.float32))
                      for _ in range(256)]
        self.log: list[tuple[float, float, float, bool]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        every = 1.0 / self.cfg.rate
        due = time.perf_counter()
        k = 0
        while not self.stop.is_set():
            now = time.perf_counter()
            if now < due:
                time.sleep(due - now)
            began = time.perf_counter()
            ids, rows = self.calls[k % len(self.calls)]
            try:
                # new values each call: a row written again differs from what it held
                self.store.write("t0", ids, rows + np.float32(k))
                ok = True
            except nearrec.NearrecError:
                ok = False
            self.log.append((due, began, time.perf_counter(), ok))
            due += every
            k += 1

    def between(self, a: float, b: float) -> list[float]:
        """The answered calls due in ``[a, b)``: their latencies from when they were due."""
        return [end - due for due, _, end, ok in self.log if a <= due < b and ok]


def _quantiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {"p50_ms": 1e3 * float(np.percentile(xs, 50)),
            "p99_ms": 1e3 * float(np.percentile(xs, 99)), "max_ms": 1e3 * max(xs)}


def one(cfg: CatchUpConfig, cut: Path, work: Path, behind: float, seed: int,
        log: Callable[[str], None]) -> dict[str, Any]:
    """One round of one cell: pause, resume, catch up under writes."""
    shutil.rmtree(work, ignore_errors=True)
    dirs = []
    for r in range(2):
        shutil.copytree(cut / "shard-0", work / f"r{r}")
        dirs.append(work / f"r{r}")
    with ExitStack() as stack:
        nodes = [stack.enter_context(node(d, "s", "--writable", "--tier", "dram")) for d in dirs]
        store = distributed.connect(cut, [[f"{n.address}/s" for n in nodes]], hedge=None,
                                    timeout=cfg.timeout, catch_up_every=None)
        writer = Writer(store, cfg, np.random.default_rng(seed))
        writer.start()
        time.sleep(2.0)
        paused = time.perf_counter()
        os.kill(nodes[1].pid, signal.SIGSTOP)
        time.sleep(behind)
        os.kill(nodes[1].pid, signal.SIGCONT)
        resumed = time.perf_counter()
        time.sleep(0.5)
        began = time.perf_counter()
        [done] = distributed.catch_up(store, lease=cfg.lease)
        ended = time.perf_counter()
        time.sleep(1.0)
        writer.stop.set()
        writer.join()
        stats = store.stats()
        store.close()
    shutil.rmtree(work, ignore_errors=True)
    if done.error is not None:
        raise RuntimeError(f"the catch-up failed: {done.error}")
    calls_behind = sum(1 for due, _, _, ok in writer.log if paused <= due < resumed and ok)
    out: dict[str, Any] = {"behind_s": behind, "rows_before_fence": done.rows_before_fence,
           "rows_fenced": done.rows_fenced, "fenced_s": done.fenced_seconds,
           "catch_up_s": ended - began, "rows_written_behind": calls_behind * cfg.rows_per_write,
           "writes_failed": sum(1 for *_, ok in writer.log if not ok),
           "stale_after": stats.get("cluster_stale_replicas"),
           "before": _quantiles(writer.between(paused - 1.5, paused)),
           "catching_up": _quantiles(writer.between(began, ended))}
    log(f"  behind {behind:.0f} s: {out['rows_before_fence']:,} rows before the fence, "
        f"{out['rows_fenced']:,} under it; fenced {1e3 * out['fenced_s']:.1f} ms; writes p99 "
        f"{out['before']['p99_ms']:.1f} ms before, {out['catching_up']['p99_ms']:.1f} ms "
        f"catching up (worst {out['catching_up']['max_ms']:.1f})")
    return out


def run(cfg: CatchUpConfig, log: Callable[[str], None] = print) -> list[Record]:
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    tag = f"catch-up-{cfg.rows}x{cfg.dim}"
    path, cut = cfg.scratch / tag, cfg.scratch / f"{tag}-cut"
    rng = np.random.default_rng(cfg.seed)
    log(f"building {path}")
    nearrec.from_numpy(path, {"t0": rng.standard_normal((cfg.rows, cfg.dim), dtype=np.float32)},
                       overwrite=True)
    distributed.shard(path, cut, 1, scheme="row", overwrite=True)
    records = []
    for behind in cfg.behind:
        rounds = [one(cfg, cut, cfg.scratch / f"{tag}-nodes", behind, cfg.seed + k, log)
                  for k in range(cfg.rounds)]

        def med(f: Callable[[dict[str, Any]], float], rounds: list[dict[str, Any]] = rounds
                ) -> float:
            return statistics.median(f(r) for r in rounds)

        records.append(Record(
            "cluster-catch-up", f"1x2 {cfg.rows}x{cfg.dim}", cfg.rows_per_write,
            f"behind {behind:g} s", "nearrec", samples_per_s=cfg.rate,
            lookups_per_s=cfg.rate * cfg.rows_per_write,
            p50_us=1e3 * med(lambda r: r["catching_up"]["p50_ms"]),
            p99_us=1e3 * med(lambda r: r["catching_up"]["p99_ms"]),
            extra={"rounds": rounds, "behind_s": behind, "rate": cfg.rate,
                   "rows_per_write": cfg.rows_per_write, "timeout_s": cfg.timeout,
                   "fenced_ms": 1e3 * med(lambda r: r["fenced_s"]),
                   "rows_fenced": med(lambda r: r["rows_fenced"]),
                   "rows_before_fence": med(lambda r: r["rows_before_fence"]),
                   "rows_written_behind": med(lambda r: r["rows_written_behind"]),
                   "before_p50_ms": med(lambda r: r["before"]["p50_ms"]),
                   "before_p99_ms": med(lambda r: r["before"]["p99_ms"]),
                   "worst_ms": med(lambda r: r["catching_up"]["max_ms"]),
                   "fenced_spread": rounds_spread([r["fenced_s"] for r in rounds])}))
    return records


def markdown(records: list[Record], command: str) -> str:
    e = records[0].extra
    lines = [f"Command: `{command}`", "",
             f"One shard on two writable nodes of `{records[0].model}` (rows × dim fp32), a "
             f"writer at {e['rate']:g} calls/s of {e['rows_per_write']} random rows, open loop; "
             f"one replica paused for the time given, then caught up while the writes go on. "
             f"Medians of {len(e['rounds'])} round(s); latencies from when each call was due.",
             "", "| paused | rows written meanwhile | rows copied before the fence | under it | "
             "fenced ms (spread) | writes p50 / p99 ms before | p50 / p99 / worst ms while "
             "catching up |", "|---|---:|---:|---:|---:|---|---|"]
    for r in records:
        x = r.extra
        lines.append(f"| {x['behind_s']:g} s | {x['rows_written_behind']:,.0f} | "
                     f"{x['rows_before_fence']:,.0f} | {x['rows_fenced']:,.0f} | "
                     f"{x['fenced_ms']:.1f} ({x['fenced_spread']:.0%}) | "
                     f"{x['before_p50_ms']:.1f} / {x['before_p99_ms']:.1f} | "
                     f"{r.p50_us / 1e3:.1f} / {r.p99_us / 1e3:.1f} / {x['worst_ms']:.1f} |")
    return "\n".join(lines) + "\n"


#: ``nearrec bench cluster-catch-up``
HARNESSES = {"cluster-catch-up": Harness(CatchUpConfig, CatchUpConfig.quick,
                                         {"--rows": "rows", "--scratch": "scratch"}, run,
                                         markdown)}
