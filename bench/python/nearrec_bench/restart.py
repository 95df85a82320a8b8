"""``nearrec bench restart``: what a restart costs the first requests, and what start-up
warm-up gives back — side by side on one store, one trace, in one run.

A store on the SSD tier with DRAM tiers in a budget a quarter of its tables serves a trace's
first part (the previous run), then the same window of requests, timed, in batches of 64, by:

- ``steady``: the previous run itself, going on (the ceiling: a node that never restarted);
- ``cold``: a fresh open with nothing kept (what a restart serves without warm-up);
- ``warm.hot_set``: a fresh open that loads the hot set the previous run kept when it closed
  (``hot_set_dir``; the open's seconds include the warm-up);
- ``warm.trace``: a fresh open that loads the previous run's requests, recorded as a trace
  (``warm``: each table's most requested rows first).

Each fresh open starts with the page cache dropped (the SSD tier reads with direct I/O anyway).
Per system: the open's seconds, the window's DRAM hit ratio and device reads per sample, its
batches' p50 / p99 latency and samples per second. Rounds repeat the whole sequence; medians are
reported with the rounds' spread. The disk's random-read rate is measured in the same run.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import nearrec
from nearrec import trace as nt

from . import _native
from .cache import generator, in_memory, warm_part
from .harness import Harness
from .report import Record
from .ssd import drop_page_cache

SYSTEMS = ("steady", "cold", "warm.hot_set", "warm.trace")


@dataclass
class RestartConfig:
    model: str = "rmc1"
    table_bytes: int = 1 << 30
    #: the DRAM budget, as a share of the tables
    budget: float = 0.25
    trace: str = "zipf1.05"
    #: samples of the trace: the previous run serves `prior` of them, the window the rest
    bags: int = 12_000
    prior: float = 0.75
    batch: int = 64
    rounds: int = 3
    limit_reads: int = 200_000
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> RestartConfig:
        return cls(table_bytes=256 << 20, bags=4_000, rounds=2, limit_reads=30_000)


def _serve(store: nearrec.Store, tr: nt.Trace, start: int, stop: int, batch: int,
           timed: bool) -> list[float]:
    lat = []
    for b in range(start, stop - batch + 1, batch):
        reqs = tr.batch(b, b + batch)
        t = time.perf_counter()
        store.lookup_many(reqs)
        if timed:
            lat.append(time.perf_counter() - t)
    return lat


def _window(store: nearrec.Store, tr: nt.Trace, start: int, cfg: RestartConfig
            ) -> dict[str, Any]:
    """The window served, timed, with its counters."""
    before = store.stats()
    lat = _serve(store, tr, start, tr.bags, cfg.batch, True)
    after = store.stats()
    d = {k: float(after[k]) - float(before[k]) for k in
         ("device_reads", "lookups_resident", "lookups_hot", "lookups_cache", "lookups_ssd")}
    served = sum(d[f"lookups_{k}"] for k in ("resident", "hot", "cache", "ssd"))
    samples = len(lat) * cfg.batch
    return {"lat": lat, "dram_hit_ratio": 1 - d["lookups_ssd"] / max(1.0, served),
            "device_reads_per_sample": d["device_reads"] / max(1, samples)}


def run(cfg: RestartConfig, log: Callable[[str], None] = print) -> list[Record]:
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    path = cfg.scratch / f"restart-{cfg.model}-{cfg.table_bytes >> 20}m"
    try:
        fresh = nearrec.info(path).params.get("seed") != cfg.seed
    except nearrec.NearrecError:
        fresh = True
    if fresh:
        log(f"building {path} ({cfg.table_bytes >> 20} MiB)")
        nearrec.build(path, cfg.model, table_bytes=cfg.table_bytes, seed=cfg.seed,
                      overwrite=True, progress=False)
    info = nearrec.info(path)
    budget = int(info.total_bytes * cfg.budget)
    spec = nearrec.model_spec(cfg.model)
    trace_path = cfg.scratch / f"restart-{cfg.model}-{cfg.trace}-{cfg.bags}.nrtrace"
    if not trace_path.exists():
        nt.generate(nearrec.open(path, tier="ssd"), cfg.bags, spec.lookups,
                    generator(cfg.trace), seed=cfg.seed, path=trace_path, overwrite=True)
    tr = in_memory(nt.load(trace_path))
    prior = int(tr.bags * cfg.prior) // cfg.batch * cfg.batch
    recorded = cfg.scratch / "restart-prior.nrtrace"
    warm_part(tr, prior).save(recorded, overwrite=True)
    kept = cfg.scratch / "restart-hot"
    files = [str(path / t.file) for t in info.tables]
    drop_page_cache()
    disk = _native.random_read(files, cfg.limit_reads, 128)["items_per_s"]
    log(f"{info.total_bytes / 2**30:.2f} GiB of tables, DRAM budget {budget >> 20} MiB; "
        f"disk {disk:,.0f} random reads/s")
    base = nearrec.StoreConfig(tier="ssd", dram_budget=budget)
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in SYSTEMS}
    for round_ in range(cfg.rounds):
        shutil.rmtree(kept, ignore_errors=True)
        kept.mkdir()
        drop_page_cache()
        s = nearrec.open(path, base.replace(hot_set_dir=str(kept)))
        _serve(s, tr, 0, prior, cfg.batch, False)
        # the hot set as the previous run leaves it: kept at close, before the window (a
        # closed read-only store serves on)
        s.close()
        results["steady"].append({"open_s": 0.0, **_window(s, tr, prior, cfg)})
        del s
        order = list(SYSTEMS[1:])
        order = order[round_ % 3:] + order[:round_ % 3]
        for system in order:
            config = {"cold": base, "warm.hot_set": base.replace(hot_set_dir=str(kept)),
                      "warm.trace": base.replace(warm=str(recorded))}[system]
            drop_page_cache()
            t = time.perf_counter()
            s = nearrec.open(path, config)
            opened = time.perf_counter() - t
            results[system].append({"open_s": opened, **_window(s, tr, prior, cfg)})
            del s
        log(f"  round {round_ + 1}: " + "  ".join(
            f"{k}: hit {v[-1]['dram_hit_ratio']:.3f}, p99 "
            f"{1e6 * float(np.percentile(v[-1]['lat'], 99)):,.0f} µs"
            for k, v in results.items()))
    records = [Record("restart", cfg.model, 0, "-", "limit.random_read", 0.0, 0.0,
                      extra={"reads_per_s": disk, "table_bytes": info.total_bytes})]
    per_sample = spec.lookups * len(info.tables)
    for system, rounds in results.items():
        p50s = [statistics.median(r["lat"]) for r in rounds]
        p99s = [float(np.percentile(r["lat"], 99)) for r in rounds]
        med = statistics.median(p50s)
        records.append(Record(
            "restart", cfg.model, cfg.batch, f"{cfg.trace}@{round(cfg.budget * 100)}%", system,
            samples_per_s=cfg.batch / med, lookups_per_s=cfg.batch * per_sample / med,
            p50_us=1e6 * med, p99_us=1e6 * statistics.median(p99s),
            extra={"rounds_samples_per_s": [cfg.batch / x for x in p50s],
                   "rounds_p99_us": [1e6 * x for x in p99s],
                   "open_s": statistics.median(r["open_s"] for r in rounds),
                   "dram_hit_ratio": statistics.median(r["dram_hit_ratio"] for r in rounds),
                   "rounds_dram_hit_ratio": [r["dram_hit_ratio"] for r in rounds],
                   "device_reads_per_sample": statistics.median(
                       r["device_reads_per_sample"] for r in rounds),
                   "window_samples": len(rounds[0]["lat"]) * cfg.batch,
                   "prior_samples": prior, "budget_bytes": budget}))
    return records


def markdown(records: list[Record], command: str) -> str:
    disk = next(r.extra["reads_per_s"] for r in records if r.system == "limit.random_read")
    cells = {r.system: r for r in records if r.system in SYSTEMS}
    cold = cells["cold"]
    first = next(iter(cells.values()))
    lines = [f"Command: `{command}`", "",
             f"The window: {first.extra['window_samples']:,} samples of `{first.dist}` after "
             f"{first.extra['prior_samples']:,} served by the previous run, in batches of "
             f"{first.batch} ({first.model}, DRAM budget "
             f"{first.extra['budget_bytes'] >> 20} MiB, a quarter of the tables); disk "
             f"{disk:,.0f} random reads/s measured beside it. Medians of rounds; the spread is "
             "half the rounds' range over their median.", "",
             "| system | open s | DRAM hit ratio (rounds) | device reads / sample | p50 µs | "
             "p99 µs (rounds) | samples/s | p99 ÷ cold | samples/s ÷ cold |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for system in SYSTEMS:
        r = cells[system]
        e = r.extra
        hits = ", ".join(f"{x:.3f}" for x in e["rounds_dram_hit_ratio"])
        p99s = ", ".join(f"{x:,.0f}" for x in e["rounds_p99_us"])
        lines.append(f"| {system} | {e['open_s']:.2f} | {e['dram_hit_ratio']:.3f} ({hits}) | "
                     f"{e['device_reads_per_sample']:.1f} | {r.p50_us:,.0f} | "
                     f"{r.p99_us:,.0f} ({p99s}) | {r.samples_per_s:,.0f} | "
                     f"{r.p99_us / cold.p99_us:.2f} | "
                     f"{r.samples_per_s / cold.samples_per_s:.2f} |")
    return "\n".join(lines) + "\n"


#: ``nearrec bench restart``
HARNESSES = {"restart": Harness(RestartConfig, RestartConfig.quick,
                                {"--table-bytes": "table_bytes", "--scratch": "scratch"},
                                run, markdown)}
