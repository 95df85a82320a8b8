"""One cell of ``nearrec bench cache`` (RMC1, 25 % budget, batch 64) served over and over by one
system, for a profiler (``perf record``) or a quick look at one change, where the benchmark's
whole run is too coarse:

    python bench/cache_loop.py k0-recssd plan --seconds 8
    perf record -g -o perf.data python bench/cache_loop.py k1-recssd lfu --seconds 8
    python bench/cache_loop.py k1-recssd lfu --ways 8
    python bench/cache_loop.py k0-recssd plan --plan-tables cache

``--plan-tables cache`` serves the plan's tables with their pinned rows' bytes given to the row
cache instead, ``hot`` with their row cache dropped: the same split of the budget with one
structure a table, to time what a second one costs every lookup (issue 67, item 3).

It reuses the benchmark's store and trace under ``bench/scratch`` (run ``nearrec bench cache``
with the trace first), warms the system on the trace's warm-up part and then serves the timed
part in a loop, printing each batch's median and mean latency. Its numbers are a diagnostic, not
a result: the benchmark records those.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

import nearrec
import nearrec.trace as nt
from nearrec.plan import HOT_OVERHEAD, Plan, make_plan
from nearrec_bench import cache as cb


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="a cache benchmark trace: k0-recssd, k1-recssd, zipf1.05, ...")
    p.add_argument("system", choices=["plan", *cb.POLICIES, "dram"])
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--ways", type=int, default=16)
    p.add_argument("--threads", type=int, default=0, help="pooling threads (0: every core)")
    p.add_argument("--plan-tables", choices=["as-planned", "cache", "hot"], default="as-planned",
                   help="plan: each table's pinned rows as row-cache bytes (cache), or its row "
                        "cache dropped (hot)")
    p.add_argument("--scratch", type=Path, default=Path("bench/scratch"))
    args = p.parse_args()

    cfg = cb.CacheBenchConfig(models=("rmc1",), scratch=args.scratch)
    path = cb._store(cfg, "rmc1", lambda _: None)
    info = nearrec.info(path)
    tp = cb.trace_file(cfg, "rmc1", args.trace)
    if not tp.exists():
        raise SystemExit(f"{tp} is missing: run `nearrec bench cache --models rmc1 "
                         f"--traces {args.trace}` first")
    tr = cb.in_memory(nt.load(tp))
    warm = int(tr.bags * cfg.warm_share)
    budget = int(info.total_bytes * 0.25)
    if args.system == "dram":
        store = nearrec.open(path, tier="dram", threads=args.threads)
    elif args.system == "plan":
        plan = make_plan(info, cb.warm_part(tr, warm), budget)
        store = nearrec.open(path, tier="ssd", dram_budget=budget,
                             plan=_one_structure(plan, args.plan_tables),
                             cache_policy="lfu_pa", cache_ways=args.ways, threads=args.threads)
    else:
        store = nearrec.open(path, tier="ssd", dram_budget=budget, cache_policy=args.system,
                             cache_ways=args.ways, threads=args.threads)
    cb._warm(store.lookup_many, tr, warm, 64)
    lat: list[float] = []
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        lat += cb._timed(store.lookup_many, tr, warm, 64, float("inf"))
    print(f"{args.trace} {args.system} ({args.plan_tables}) ways={args.ways} "
          f"threads={args.threads}: "
          f"{len(lat)} batches of 64, "
          f"p50 {statistics.median(lat) * 1e6:,.0f} µs, mean {statistics.mean(lat) * 1e6:,.0f} µs")


def _one_structure(plan: Plan, keep: str) -> dict[str, dict[str, Any]]:
    """The plan's placement, each table not kept whole served by one structure (`keep`)."""
    out = plan.placement()
    for name, t in plan.tables.items():
        if keep == "as-planned" or t.resident:
            continue
        pinned = len(t.hot_rows) * (t.row_bytes + HOT_OVERHEAD)
        out[name] = ({"hot_rows": np.zeros(0, np.int64), "cache_bytes": t.cache_bytes + pinned}
                     if keep == "cache" else {"hot_rows": t.hot_rows, "cache_bytes": 0})
    return out


if __name__ == "__main__":
    main()
