"""The DRAM tiers batch by batch (issue 67, item 3's first step): for the planner's placement
and the cache-only policies at one budget, each timed batch's latency, device reads and SSD
lookups, so that "the plan's median batch waits longer at the same hit ratio" can be read as
what it is — how many batches miss at all, and how many misses each holds — rather than from
the run's totals.

`python bench/cache_batches.py [--model rmc1] [--budget 0.25] [--batch 64]
[--traces k0,k1,zipf1.05] [--systems plan,lfu_pa,lru] [--rounds 2] [--out bench/results]`

The store, traces and warm-up split are `nearrec bench cache`'s (its scratch files are reused).
Throughput is reported two ways: the median batch's rate (batch ÷ its latency; what `bench
cache` reported until this measurement) and the mean (samples ÷ the time their batches took,
what it reports now), since the two part where batches are bimodal. The
disk's random-read rate is measured in the same run (the miss bound: that rate ÷ device reads
per sample). Systems alternate within each round.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

import nearrec
from nearrec import trace as nt
from nearrec.plan import make_plan
from nearrec_bench import _native
from nearrec_bench.cache import (
    CacheBenchConfig,
    _store,
    _timed,
    _warm,
    in_memory,
    made_trace,
    warm_part,
)
from nearrec_bench.report import environment
from nearrec_bench.ssd import drop_page_cache


def _per_batch(store: nearrec.Store, tr: nt.Trace, warm: int, batch: int,
               seconds: float) -> dict[str, list[float]]:
    """The timed part, batch by batch: latency (s), device reads, lookups the SSD tier served."""
    out: dict[str, list[float]] = {"reads": [], "ssd": []}
    before = store.stats()

    def count() -> None:
        nonlocal before
        after = store.stats()
        for key, name in (("reads", "device_reads"), ("ssd", "lookups_ssd")):
            # (a DRAM-resident store counts neither)
            out[key].append(float(after.get(name, 0)) - float(before.get(name, 0)))
        before = after

    out["lat"] = _timed(store.lookup_many, tr, warm, batch, seconds, after=count)
    return out


def _summary(got: dict[str, list[float]], batch: int, per_sample: int) -> dict[str, Any]:
    lat = np.array(got["lat"])
    reads = np.array(got["reads"])
    ssd = np.array(got["ssd"])
    missing = reads > 0

    def q(a: np.ndarray, p: float) -> float:
        return float(np.percentile(a, p)) if len(a) else 0.0

    return {
        "batches": len(lat),
        "samples_per_s_median": batch / float(np.median(lat)),
        "samples_per_s_mean": batch * len(lat) / float(lat.sum()),
        "ssd_lookup_share": float(ssd.sum()) / (len(lat) * batch * per_sample),
        "device_reads_per_sample": float(reads.sum()) / (len(lat) * batch),
        "batches_that_read": float(missing.mean()),
        "reads_per_reading_batch_p50": q(reads[missing], 50),
        "reads_per_reading_batch_p99": q(reads[missing], 99),
        "latency_us_p50": 1e6 * q(lat, 50),
        "latency_us_p99": 1e6 * q(lat, 99),
        "latency_us_p50_no_read": 1e6 * q(lat[~missing], 50),
        "latency_us_p50_read": 1e6 * q(lat[missing], 50),
        "time_share_in_reading_batches": float(lat[missing].sum() / lat.sum()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="rmc1")
    ap.add_argument("--budget", type=float, default=0.25)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--traces", default="k0,k1,zipf1.05")
    ap.add_argument("--systems", default="plan,lfu_pa,lru")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--name", default="cache-batches")
    a = ap.parse_args()
    cfg = replace(CacheBenchConfig(), models=(a.model,))
    path = _store(cfg, a.model, print)
    info = nearrec.info(path)
    budget = int(info.total_bytes * a.budget)
    spec = nearrec.model_spec(a.model)
    per_sample = spec.lookups * len(info.tables)
    files = [str(path / t.file) for t in info.tables]
    results: dict[str, Any] = {"command": "python bench/cache_batches.py " + " ".join(
        f"--{k} {v}" for k, v in vars(a).items() if k not in ("out", "name")),
        "environment": environment(), "budget_bytes": budget, "cells": {}}
    disks = []
    for tname in a.traces.split(","):
        tr = in_memory(nt.load(made_trace(cfg, a.model, tname, info.path)))
        warm = int(tr.bags * cfg.warm_share)
        plan = make_plan(info, warm_part(tr, warm), budget)
        cell: dict[str, Any] = {"plan_expected_hit_ratio": plan.expected_hit_ratio,
                                "rounds": {s: [] for s in a.systems.split(",")}}
        dram = nearrec.open(path, tier="dram")
        _warm(dram.lookup_many, tr, warm, a.batch)
        cell["all_dram"] = _summary(_per_batch(dram, tr, warm, a.batch, a.seconds), a.batch,
                                    per_sample)
        del dram
        for r in range(a.rounds):
            drop_page_cache()
            disk = _native.random_read(files, 100_000, 128)["items_per_s"]
            disks.append(disk)
            for system in cell["rounds"]:
                kw: dict[str, Any] = ({"plan": plan, "cache_policy": "lfu_pa"}
                                      if system == "plan" else {"cache_policy": system})
                s = nearrec.open(path, tier="ssd", dram_budget=budget, **kw)
                _warm(s.lookup_many, tr, warm, a.batch)
                got = _summary(_per_batch(s, tr, warm, a.batch, a.seconds), a.batch, per_sample)
                got["disk_reads_per_s"] = disk
                got["miss_bound_samples_per_s"] = (disk / got["device_reads_per_sample"]
                                                   if got["device_reads_per_sample"] else None)
                cell["rounds"][system].append(got)
                print(f"{tname} round {r} {system}: median-batch {got['samples_per_s_median']:,.0f}"
                      f" mean {got['samples_per_s_mean']:,.0f} samples/s; reads/sample "
                      f"{got['device_reads_per_sample']:.2f}; batches that read "
                      f"{got['batches_that_read']:.0%}; p50 no-read / read "
                      f"{got['latency_us_p50_no_read']:.0f} / {got['latency_us_p50_read']:.0f} µs;"
                      f" disk {disk:,.0f}/s", flush=True)
                del s
        results["cells"][tname] = cell
    results["disk_reads_per_s"] = disks
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{a.name}.json").write_text(json.dumps(results, indent=1))
    (a.out / f"{a.name}.md").write_text(markdown(results))
    print(markdown(results))


def markdown(res: dict[str, Any]) -> str:

    def med(rs: list[dict[str, Any]], k: str) -> float:
        return float(statistics.median(r[k] for r in rs))

    lines = [f"<!-- produced by: {res['command']} -->", f"Command: `{res['command']}`", "",
             f"DRAM budget {res['budget_bytes']:,} bytes; disk random reads/s in the same run: "
             + ", ".join(f"{d:,.0f}" for d in res["disk_reads_per_s"]) + ". Medians of rounds.",
             "",
             "| trace | system | samples/s (median batch) | samples/s (mean) | ÷ all-DRAM (mean) "
             "| ÷ miss bound (mean) | SSD lookups | reads / sample | batches that read "
             "| reads / reading batch p50 (p99) | batch p50 µs: no read / read "
             "| time in reading batches |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for tname, cell in res["cells"].items():
        d = cell["all_dram"]
        lines.append(f"| {tname} | all-DRAM | {d['samples_per_s_median']:,.0f} | "
                     f"{d['samples_per_s_mean']:,.0f} | 1.00 | | | | | | | |")
        for system, rs in cell["rounds"].items():
            mean = med(rs, "samples_per_s_mean")
            bound = [r["miss_bound_samples_per_s"] for r in rs if r["miss_bound_samples_per_s"]]
            lines.append(
                f"| {tname} | {system} | {med(rs, 'samples_per_s_median'):,.0f} | {mean:,.0f} | "
                f"{mean / d['samples_per_s_mean']:.2f} | "
                + (f"{mean / statistics.median(bound):.2f}" if bound else "—")
                + f" | {med(rs, 'ssd_lookup_share'):.2%} | "
                f"{med(rs, 'device_reads_per_sample'):.2f} | {med(rs, 'batches_that_read'):.0%} | "
                f"{med(rs, 'reads_per_reading_batch_p50'):.0f} "
                f"({med(rs, 'reads_per_reading_batch_p99'):.0f}) | "
                f"{med(rs, 'latency_us_p50_no_read'):.0f} / {med(rs, 'latency_us_p50_read'):.0f} | "
                f"{med(rs, 'time_share_in_reading_batches'):.0%} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
