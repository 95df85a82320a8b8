"""``nearrec bench cache``: the DRAM tiers in front of the SSD tier, side by side with all-DRAM
serving and RM-SSD's SSD-S baseline, on the same requests, in one run.

Systems, per (model, DRAM budget, trace, batch):

- ``dram.nearrec`` / ``dram.torch``: every table in DRAM (nearrec's DRAM tier; ``nn.EmbeddingBag``
  with its own copy of the weights) — the ceiling;
- ``ssds`` (RM-SSD's SSD-S): the table files memory-mapped, rows faulted in through the page
  cache, pooled on the host, in a child process whose memory cgroup (v1) caps its page cache to
  the same budget (``memory.limit_in_bytes`` = the child's own memory + the budget; emptied before
  each cell); ``MADV_RANDOM`` + ``POSIX_FADV_RANDOM`` so read-ahead fetches nothing unasked.
  ``ssds.readahead`` is the same with the kernel's default read-ahead, reported apart;
- ``nearrec.<policy>``: the SSD tier with DRAM tiers in the budget, split by size (small tables
  whole, the rest row caches) with each cache policy;
- ``nearrec.plan``: the planner's placement, made from the trace's warm-up part only.

Each trace is cut into a warm-up part (served untimed by every system; the planner sees only
it) and a timed part. Device reads and hit ratios are counted on the timed part. The disk's
random-read rate is measured in the same run: the miss-bound ceiling of a cell is that rate
divided by the device reads per sample.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import nearrec
from nearrec import trace as nt
from nearrec.config import CachePolicy
from nearrec.plan import make_plan

from . import _native
from .harness import Harness
from .report import Record
from .ssd import drop_page_cache

POLICIES = tuple(p.value for p in CachePolicy)
CGROUP = Path("/sys/fs/cgroup/memory/nearrec-bench-ssds")


def generator(name: str) -> nt.Generator:
    """``k1`` (stack distance, whole table), ``k1-recssd`` (RecSSD's strided ids),
    ``zipf1.05``."""
    if name.startswith("zipf"):
        return nt.Generator.zipf(float(name[4:]))
    k, _, ids = name[1:].partition("-")
    return nt.Generator.stack_distance(float(k), ids="recssd" if ids else "full")


@dataclass
class CacheBenchConfig:
    models: tuple[str, ...] = ("rmc1", "rmc2", "rmc3")
    #: bytes of tables per model store (4x the 25 % budget by construction; 1 GiB keeps the
    #: SSD-S warm-ups within a session)
    table_bytes: int = 1 << 30
    #: DRAM budgets as shares of the table bytes (RM-SSD's SSD-S: 25 %)
    budgets: tuple[float, ...] = (0.25, 0.06)
    traces: tuple[str, ...] = ("k0", "k1", "k2", "k0-recssd", "k1-recssd", "k2-recssd",
                               "zipf0.9", "zipf1.05", "zipf1.1")
    batches: tuple[int, ...] = (1, 16, 64, 256)
    #: the full grid runs on the first model at the first budget; the batch sweep on these
    #: traces; other models and budgets at batch 64 on `focus` traces
    focus: tuple[str, ...] = ("k1", "zipf1.05")
    #: samples per trace, by model (RMC2's 32 tables x 120 lookups make big traces)
    bags: dict[str, int] = field(default_factory=lambda: {"rmc1": 4_000, "rmc2": 2_000,
                                                          "rmc3": 8_000})
    #: samples served untimed before timing (the planner sees only these)
    warm_share: float = 0.15
    #: most seconds a system spends on a cell's timed part (it may run out of requests first)
    seconds: float = 1.0
    #: SSD-S runs only where the budget is at least this share: at 6 % its cgroup thrashes (one
    #: batch of 64 took over five minutes here), which no session can wait for
    ssds_min_budget: float = 0.1
    #: most seconds SSD-S may spend warming up: in a small cgroup it thrashes at a few samples/s
    #: (the share it got through is recorded)
    ssds_warm_seconds: float = 120.0
    #: where each finished cell's records are appended (JSON lines), so a long run that stops
    #: early keeps what it measured
    progress_file: Path | None = None
    limit_reads: int = 200_000
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> CacheBenchConfig:
        return cls(models=("rmc1",), table_bytes=512 << 20, budgets=(0.25,),
                   traces=("k1", "zipf1.05"), batches=(64,), bags={"rmc1": 3_000},
                   seconds=0.5, limit_reads=30_000)


@dataclass
class Cell:
    model: str
    budget: float
    trace: str
    batch: int


def cells(cfg: CacheBenchConfig) -> list[Cell]:
    out = []
    for mi, model in enumerate(cfg.models):
        for bi, budget in enumerate(cfg.budgets):
            full = mi == 0 and bi == 0
            if not full and bi > 0 and mi > 0:
                continue
            for tr in cfg.traces if full else cfg.focus:
                for batch in cfg.batches:
                    if batch == 64 or (full and tr in cfg.focus):
                        out.append(Cell(model, budget, tr, batch))
    return out


def _store(cfg: CacheBenchConfig, model: str, log: Callable[[str], None]) -> Path:
    path = cfg.scratch / f"cache-{model}-{cfg.table_bytes >> 20}m"
    try:
        if nearrec.info(path).params.get("seed") == cfg.seed:
            log(f"reusing {path}")
            return path
    except nearrec.NearrecError:
        pass
    log(f"building {path} ({cfg.table_bytes / 2**30:.1f} GiB)")
    nearrec.build(path, model, table_bytes=cfg.table_bytes, seed=cfg.seed, overwrite=True,
                  progress=False)
    return path


def trace_file(cfg: CacheBenchConfig, model: str, trace: str) -> Path:
    """Where the benchmark keeps `model`'s trace `trace` (shared with ``bench colocate``)."""
    return cfg.scratch / f"cache-{model}-{trace}-{cfg.bags[model]}-{cfg.seed}.nrtrace"


def made_trace(cfg: CacheBenchConfig, model: str, trace: str, store: Path,
               log: Callable[[str], None] = print) -> Path:
    """`model`'s trace `trace` ([`trace_file`]), generated over the store at `store` the first
    time it is asked for."""
    tp = trace_file(cfg, model, trace)
    if not tp.exists():
        log(f"  trace {trace}")
        nt.generate(nearrec.open(store, tier="ssd"), cfg.bags[model],
                    nearrec.model_spec(model).lookups, generator(trace), seed=cfg.seed, path=tp,
                    overwrite=True)
    return tp


def in_memory(tr: nt.Trace) -> nt.Trace:
    """`tr` with its offsets and indices copied into memory: no system pays for reading the
    trace file."""
    return nt.Trace({n: nt.TableTrace(n, t.rows, t.pooling, np.array(t.offsets),
                                      np.array(t.indices), t.generator, t.first_reference_share)
                     for n, t in tr.tables.items()}, tr.batch_size, tr.seed)


def warm_part(tr: nt.Trace, warm: int) -> nt.Trace:
    """The first `warm` samples of `tr`: all the planner may see."""
    return nt.Trace({n: nt.TableTrace(n, t.rows, t.pooling, t.offsets[:warm + 1],
                                      t.indices[:t.offsets[warm]])
                     for n, t in tr.tables.items()})


def _batches(tr: nt.Trace, start: int, stop: int, batch: int) -> Iterator[list[Any]]:
    for b in range(start, stop, batch):
        yield tr.batch(b, min(stop, b + batch))


def _warm(fn: Callable[[list[Any]], Any], tr: nt.Trace, warm: int, batch: int,
          seconds: float = float("inf")) -> int:
    """Serves the warm-up part, untimed (in batches of at least 64), for at most `seconds`;
    returns the samples served."""
    start, done = time.perf_counter(), 0
    for b in _batches(tr, 0, warm, max(batch, 64)):
        fn(b)
        done += len(b[0].offsets)
        if time.perf_counter() - start > seconds:
            break
    return done


def _timed(fn: Callable[[list[Any]], Any], tr: nt.Trace, warm: int, batch: int,
           seconds: float, after: Callable[[], None] | None = None) -> list[float]:
    """Serves the timed part until it ends or `seconds` pass; each batch's latency (`after`
    called after each batch, untimed)."""
    lat: list[float] = []
    start = time.perf_counter()
    for b in _batches(tr, warm, tr.bags, batch):
        if len(b[0].offsets) < batch:
            break
        t = time.perf_counter()
        fn(b)
        lat.append(time.perf_counter() - t)
        if after is not None:
            after()
        if time.perf_counter() - start > seconds and len(lat) >= 4:
            break
    return lat


def _serve(fn: Callable[[list[Any]], Any], tr: nt.Trace, warm: int, batch: int,
           seconds: float) -> list[float]:
    _warm(fn, tr, warm, batch)
    return _timed(fn, tr, warm, batch, seconds)


def _record(cell: Cell, system: str, lat: list[float], lookups_per_sample: int,
            extra: dict[str, Any] | None = None) -> Record:
    """Throughput is the samples over the time they took (the mean batch), not the median
    batch's rate: where a few batches read thousands of rows and the rest none (RecSSD's K = 0
    trace: 2 % of batches, 35–45 % of the time; `bench/cache_batches.py`), the median batch
    says nothing of them. The median batch's rate stays in `extra`."""
    med = statistics.median(lat) if lat else float("inf")
    mean = statistics.fmean(lat) if lat else float("inf")
    halves = [lat[: len(lat) // 2], lat[len(lat) // 2:]] if len(lat) >= 4 else [lat]
    rounds = [cell.batch / statistics.fmean(h) for h in halves if h]
    return Record("cache", cell.model, cell.batch, f"{cell.trace}@{round(cell.budget * 100)}%",
                  system, samples_per_s=cell.batch / mean,
                  lookups_per_s=cell.batch * lookups_per_sample / mean,
                  p50_us=1e6 * med, p99_us=1e6 * float(np.percentile(lat, 99)) if lat else 0.0,
                  extra={"batches": len(lat), "rounds_samples_per_s": rounds,
                         "samples_per_s_median_batch": cell.batch / med, **(extra or {})})


# ---- SSD-S: a child process in a memory cgroup -------------------------------------------


def _ssds_worker() -> None:
    """Child entry: reads a job from stdin, serves it through mapped tables in its cgroup."""
    job = json.loads(sys.stdin.read())
    cg = Path(job["cgroup"])
    (cg / "cgroup.procs").write_text(str(os.getpid()))
    tr = nt.load(job["trace"])
    # the requests in anonymous memory, so the page cache holds table pages only
    tables = {n: nt.TableTrace(n, t.rows, t.pooling, np.array(t.offsets), np.array(t.indices))
              for n, t in tr.tables.items()}
    tr = nt.Trace(tables, tr.batch_size, tr.seed)
    mapped = _native.MappedStore(job["store"], job["random"])
    ids = {t.name: i for i, t in enumerate(nearrec.info(job["store"]).tables)}
    (cg / "memory.force_empty").write_text("0")
    usage = int((cg / "memory.usage_in_bytes").read_text())
    (cg / "memory.limit_in_bytes").write_text(str(usage + job["budget"]))

    def fn(reqs: list[Any]) -> Any:
        return mapped.pool([(ids[r.table], r.indices, np.append(r.offsets, len(r.indices)))
                            for r in reqs])

    warmed = _warm(fn, tr, job["warm"], job["batch"], job["warm_seconds"])
    lat = _timed(fn, tr, job["warm"], job["batch"], job["seconds"])
    print(json.dumps({"lat": lat, "usage": int((cg / "memory.usage_in_bytes").read_text()),
                      "limit": usage + job["budget"], "warmed_samples": warmed}))


def ssds_available() -> str | None:
    """Why SSD-S cannot run here, or None."""
    if os.geteuid() != 0:
        return "not root (the memory cgroup needs it)"
    if not CGROUP.parent.is_dir():
        return "no cgroup v1 memory controller at /sys/fs/cgroup/memory"
    return None


def _ssds(store: Path, trace: Path, cell: Cell, budget: int, warm: int, random: bool,
          seconds: float, warm_seconds: float) -> dict[str, Any]:
    CGROUP.mkdir(exist_ok=True)
    (CGROUP / "memory.limit_in_bytes").write_text("-1")
    job = {"cgroup": str(CGROUP), "store": str(store), "trace": str(trace), "budget": budget,
           "warm": warm, "batch": cell.batch, "random": random, "seconds": seconds,
           "warm_seconds": warm_seconds}
    res = subprocess.run([sys.executable, "-c",
                          "from nearrec_bench.cache import _ssds_worker; _ssds_worker()"],
                         input=json.dumps(job), capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"SSD-S worker failed: {res.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


# ---- the run ----------------------------------------------------------------------------------


def run(cfg: CacheBenchConfig, log: Callable[[str], None] = print) -> list[Record]:
    import torch

    cfg.scratch.mkdir(parents=True, exist_ok=True)
    records: list[Record] = []
    why_not = ssds_available()
    if why_not:
        log(f"SSD-S skipped: {why_not}")
    todo = cells(cfg)
    for model in cfg.models:
        mcells = [c for c in todo if c.model == model]
        if not mcells:
            continue
        path = _store(cfg, model, log)
        info = nearrec.info(path)
        total = info.total_bytes
        files = [str(path / t.file) for t in info.tables]
        drop_page_cache()
        disk = _native.random_read(files, cfg.limit_reads, 128)["items_per_s"]
        log(f"{model}: {total / 2**30:.2f} GiB of tables; disk {disk:,.0f} random reads/s")
        records.append(Record("cache", model, 0, "-", "limit.random_read", 0.0, 0.0,
                              extra={"reads_per_s": disk, "table_bytes": total}))
        dram = nearrec.open(path, tier="dram")
        ebags = {t.name: torch.nn.EmbeddingBag.from_pretrained(
            torch.from_numpy(np.array(dram.table_array(t.name))), mode="sum")
            for t in info.tables}
        spec = nearrec.model_spec(model)
        per_sample = spec.lookups * len(info.tables)
        traces = {tname: made_trace(cfg, model, tname, info.path, log)
                  for tname in sorted({c.trace for c in mcells})}
        for cell in mcells:
            tr = in_memory(nt.load(traces[cell.trace]))
            warm = int(tr.bags * cfg.warm_share)
            budget = int(total * cell.budget)
            shares = {t.name: t.first_reference_share for t in tr.tables.values()}
            first_ref = statistics.mean(v for v in shares.values() if v is not None) \
                if any(v is not None for v in shares.values()) else None
            common = {"budget_bytes": budget, "first_reference_share": first_ref,
                      "warm_samples": warm}

            def torch_fn(reqs: list[Any], ebags: dict[str, Any] = ebags) -> Any:
                with torch.inference_mode():
                    return [ebags[r.table](torch.from_numpy(np.asarray(r.indices)),
                                          torch.from_numpy(np.asarray(r.offsets)))
                            for r in reqs]

            for name, fn in (("dram.nearrec", dram.lookup_many), ("dram.torch", torch_fn)):
                records.append(_record(cell, name, _serve(fn, tr, warm, cell.batch,
                                                          cfg.seconds), per_sample, common))
            if not why_not and cell.budget >= cfg.ssds_min_budget:
                variants = [("ssds", True)]
                if cell.batch == 64 and cell.trace in cfg.focus:
                    variants.append(("ssds.readahead", False))
                for name, random in variants:
                    drop_page_cache()
                    res = _ssds(path, traces[cell.trace], cell, budget, warm, random,
                                cfg.seconds, cfg.ssds_warm_seconds)
                    records.append(_record(cell, name, res["lat"], per_sample,
                                           common | {"cgroup_limit": res["limit"],
                                                     "cgroup_usage": res["usage"],
                                                     "warmed_samples": res["warmed_samples"]}))
            plan = make_plan(info, warm_part(tr, warm), budget)
            systems: list[tuple[str, dict[str, Any]]] = [
                (f"nearrec.{p}", {"cache_policy": p}) for p in POLICIES]
            systems.append(("nearrec.plan", {"plan": plan, "cache_policy": "lfu_pa"}))
            for name, kw in systems:
                s = nearrec.open(path, tier="ssd", dram_budget=budget, **kw)

                def fn(reqs: list[Any], s: nearrec.Store = s) -> Any:
                    return s.lookup_many(reqs)

                # the counters of the timed part alone
                _warm(fn, tr, warm, cell.batch)
                warm_stats = s.stats()
                lat = _timed(fn, tr, warm, cell.batch, cfg.seconds)
                st = s.stats()
                n = len(lat) * cell.batch
                d = {k: float(st[k]) - float(warm_stats[k]) for k in
                     ("device_reads", "lookups_resident", "lookups_hot", "lookups_cache",
                      "lookups_ssd", "bytes_read")}
                served = sum(d[k] for k in ("lookups_resident", "lookups_hot", "lookups_cache",
                                            "lookups_ssd"))
                reads_per_sample = d["device_reads"] / max(1, n)
                extra = common | {
                    "dram_tier_bytes": st["dram_tier_bytes"],
                    "hit_ratio": {k: d[f"lookups_{k}"] / max(1.0, served)
                                  for k in ("resident", "hot", "cache")},
                    "dram_hit_ratio": 1 - d["lookups_ssd"] / max(1.0, served),
                    "device_reads_per_sample": reads_per_sample,
                    "miss_bound_samples_per_s": disk / reads_per_sample if reads_per_sample
                    else float("inf"),
                    # where an SSD batch's time goes (validation and planning, waiting on the
                    # device, pooling), p50 and p99 in µs over every batch since the store opened
                    # (warm-up included: the engine's histograms are not reset)
                    "stages_us": {f"{k}_{q}": float(st[f"{k}_{q}_us"])
                                  for k in ("route", "io_wait", "pool", "end_to_end")
                                  for q in ("p50", "p99")}}
                if name == "nearrec.plan":
                    extra["plan_expected_hit_ratio"] = plan.expected_hit_ratio
                    extra["plan_bytes"] = plan.bytes
                records.append(_record(cell, name, lat, per_sample, extra))
                del s
            by = {r.system: r for r in records if r.model == cell.model and r.batch == cell.batch
                  and r.dist == f"{cell.trace}@{round(cell.budget * 100)}%"}
            if cfg.progress_file:
                with open(cfg.progress_file, "a") as f:
                    for r in by.values():
                        f.write(json.dumps(asdict(r)) + "\n")
            log(f"  {cell.trace:>10} {round(cell.budget * 100):>3}% B={cell.batch:<4} "
                + "  ".join(f"{k}={v.samples_per_s:,.0f}" for k, v in by.items()))
        del dram, ebags
    records.extend(hit_rate_table(cfg, log))
    return records


def hit_rate_table(cfg: CacheBenchConfig, log: Callable[[str], None]) -> list[Record]:
    """HS-Rec's Table 5 shape: each policy's hit ratio at 10 / 20 / 40 / 60 / 80 % of a trace's
    working set, on one table of a Zipf and a stack-distance trace (the cache alone, no I/O)."""
    out = []
    rows = 1_000_000
    for tname in ("zipf1.05", "k1"):
        t = nt.generate_table("t", rows, 80, 20_000, generator(tname), seed=cfg.seed)
        prof = t.profile()
        ws = prof.working_set
        for share in (0.1, 0.2, 0.4, 0.6, 0.8):
            cap = int(ws * share)
            ratios = {}
            for p in POLICIES:
                h, m, *_ = nearrec._native.cache_simulate(np.asarray(t.indices), cap, p)
                ratios[p] = h / (h + m)
            ratios["lru_full_assoc"] = float(prof.lru_hit_ratio(cap))
            out.append(Record("cache-hits", "-", 0, tname, f"cache={round(share * 100)}%",
                              0.0, 0.0, extra={"capacity_rows": cap, "working_set": ws,
                                               "hit_ratio": ratios}))
            log(f"  hits {tname} {round(share * 100)}%: "
                + " ".join(f"{k}={v:.3f}" for k, v in ratios.items()))
    return out


def markdown(records: list[Record], command: str) -> str:
    from .report import SPREAD_LIMIT, environment, ratio_text

    env = environment()
    lines = [f"# nearrec bench cache — {env['time']}", "",
             f"Command: `{command}`; machine: {env['cpus']} CPUs, torch {env.get('torch')}.",
             "", "Throughput in samples/s (the samples over the time they took; the median "
             "batch's rate is in the JSON); ratios are nearrec.plan ÷ peer. "
             "Cells: trace@budget (share of table bytes). DRAM %: lookups the DRAM tiers "
             "served in the timed part (a row repeated inside a batch is read once but counts "
             "as an SSD lookup). Miss-bound: the disk's rate ÷ the plan's device reads per "
             f"sample. A ratio whose systems' batches spread beyond ±{100 * SPREAD_LIMIT:.0f} % is "
             "marked unreliable instead of given.", ""]
    limits = {r.model: r.extra for r in records if r.system == "limit.random_read"}
    for model, lim in limits.items():
        lines.append(f"- {model}: {lim['table_bytes'] / 2**30:.2f} GiB of tables; disk "
                     f"{lim['reads_per_s']:,.0f} random reads/s (QD 128, same run)")
    lines.append("")
    cells_: dict[tuple[str, int, str], dict[str, Record]] = {}
    for r in records:
        if r.bench == "cache" and r.batch:
            cells_.setdefault((r.model, r.batch, r.dist), {})[r.system] = r
    systems = ["dram.nearrec", "dram.torch", "ssds", "ssds.readahead",
               *[f"nearrec.{p}" for p in POLICIES], "nearrec.plan"]
    lines.append("| model | batch | trace@budget | " + " | ".join(systems)
                 + " | plan DRAM % | reads/sample | plan ÷ ssds | plan ÷ dram | plan ÷ miss-bound "
                 "| p99 plan µs |")
    lines.append("|" + "---|" * (len(systems) + 9))
    for (model, batch, dist), c in cells_.items():
        row = [model, str(batch), dist]
        row += [f"{c[s].samples_per_s:,.0f}" if s in c else "—" for s in systems]
        plan = c.get("nearrec.plan")
        if plan:
            hr = plan.extra.get("dram_hit_ratio", 0.0)
            ss = c.get("ssds")
            ceiling = plan.extra.get("miss_bound_samples_per_s", float("inf"))
            row += [f"{100 * hr:.1f}", f"{plan.extra['device_reads_per_sample']:.1f}",
                    ratio_text(plan, ss) if ss else "—",
                    ratio_text(plan, c["dram.nearrec"]) if "dram.nearrec" in c else "—",
                    f"{plan.samples_per_s / ceiling:.2f}" if ceiling != float("inf") else "—",
                    f"{plan.p99_us:,.0f}"]
        else:
            row += ["—"] * 6
        lines.append("| " + " | ".join(row) + " |")
    hits = [r for r in records if r.bench == "cache-hits"]
    if hits:
        lines += ["", "Hit ratio of one 1M-row table's cache (16-way sets) at a share of the "
                  "trace's working set (HS-Rec Table 5 shape; the cache alone, no I/O):", "",
                  "| trace | cache | rows | " + " | ".join([*POLICIES, "LRU fully assoc."])
                  + " |", "|---|---|---|" + "---|" * (len(POLICIES) + 1)]
        for r in hits:
            hr = r.extra["hit_ratio"]
            lines.append(f"| {r.dist} | {r.system[6:]} | {r.extra['capacity_rows']:,} | "
                         + " | ".join(f"{100 * hr[k]:.1f}" for k in
                                      [*POLICIES, "lru_full_assoc"]) + " |")
    return "\n".join(lines) + "\n"


#: ``nearrec bench cache``
HARNESSES = {"cache": Harness(CacheBenchConfig, CacheBenchConfig.quick,
                              {"--models": "models", "--table-bytes": "table_bytes",
                               "--budgets": "budgets", "--traces": "traces",
                               "--batches": "batches", "--scratch": "scratch"},
                              run, markdown, progress=True)}


__all__ = ["HARNESSES", "CacheBenchConfig", "cells", "markdown", "run"]
