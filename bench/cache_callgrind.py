"""One thread pooling RMC1's shapes (fp32, dim 32, 80 lookups a bag, 8 tables of 1M rows) on the
SSD tier with every lookup served by one DRAM tier — the row cache (``cache``) or the hot
partition (``hot``) — or from the whole table in DRAM (``dram``), for counting the instructions a
lookup costs in the bag loop under callgrind (``bench/sls_callgrind.py`` counts torch's):

    python bench/cache_callgrind.py count --out bench/results/cache-instructions

runs each tier twice under callgrind (4 and 12 timed calls) and divides the difference of the
bag loop's inclusive instructions (``fast::run_found``; ``fast::run`` for ``dram``) by the
difference of the lookups: warm-up and set-up cancel, so the count is a hit's. It writes JSON +
Markdown. One tier alone, for a rough look at its speed (no valgrind): ``python
bench/cache_callgrind.py cache``.
Each table's lookups draw from ``--rows-used`` rows, which its cache holds with room to spare;
every timed lookup is checked to have been a hit.

``--hit-ratio H`` (``cache`` only) makes the row cache serve a share ``H`` of the lookups: the
others are rows drawn afresh from the rest of the table, which the SSD tier reads — from a
simulated drive held in memory (``--device rm-ssd``, the default then), so that the miss path's
CPU is timed and no disk wait is — and which the cache, admitting nothing into a full set
(``lfu_pa`` at p = 0) and never asked for them again, does not keep in place of the rows it
serves. The ratio met is printed beside the time:

    python bench/cache_callgrind.py cache --hit-ratio 0.9 --reps 20
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import nearrec
from nearrec.plan import SLOT_OVERHEAD


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tier", choices=["cache", "hot", "dram", "count"])
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--out", type=Path, default=Path("bench/results/cache-instructions"))
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rows-used", type=int, default=20_000)
    p.add_argument("--scratch", default="bench/scratch/sls-callgrind")
    p.add_argument("--hit-ratio", type=float, default=1.0,
                   help="cache: the share of lookups its rows serve (the rest miss)")
    p.add_argument("--device", default=None,
                   help="the SSD tier's simulated drive (default: rm-ssd when lookups miss)")
    args = p.parse_args()
    if args.tier == "count":
        count(args)
        return
    spec = nearrec.model_spec("rmc1")
    rows = 1_000_000
    path = Path(args.scratch)
    if not path.exists():
        nearrec.build(path, "rmc1", rows=rows, seed=1, progress=False)
    info = nearrec.info(path)
    names = [t.name for t in info.tables]
    rng = np.random.default_rng(0)
    used = {t: np.sort(rng.choice(rows, args.rows_used, replace=False)) for t in names}
    if args.tier == "dram":
        store = nearrec.open(path, tier="dram", threads=1)
    else:
        # room for 4x the rows used: a 16-way set overflows (and misses) once in a blue moon
        slot = info.tables[0].row_bytes + SLOT_OVERHEAD
        plan = {t: {"resident": False,
                    "hot_rows": used[t] if args.tier == "hot" else np.zeros(0, np.int64),
                    "cache_bytes": 0 if args.tier == "hot" else 4 * args.rows_used * slot}
                for t in names}
        misses = args.tier == "cache" and args.hit_ratio < 1.0
        device = args.device or ("rm-ssd" if misses else None)
        store = nearrec.open(path, tier="ssd", plan=plan, threads=1,
                             cache_policy="lfu_pa" if misses else "lfu",
                             admission_probability=0.0, device=device)
    lookups, batch = spec.lookups, args.batch
    n = batch * lookups
    hit = args.hit_ratio if args.tier == "cache" else 1.0

    def draw(t: str) -> np.ndarray:
        """A batch's lookups of table `t`: a share `hit` of the rows used, the rest fresh."""
        rows_: np.ndarray = rng.choice(used[t], n)
        fresh = rng.random(n) >= hit
        others = rng.integers(0, rows, fresh.sum())
        # a fresh row is one the cache never held (a row used stays a hit)
        others = others[~np.isin(others, used[t])]
        rows_[np.flatnonzero(fresh)[:others.size]] = others
        return rows_

    # the warm-up's first half asks only for the rows used, so that the cache holds them all
    # before rows that miss take its free slots
    sets = [[rng.choice(used[t], n) for t in names] for _ in range(4)]
    if hit < 1.0:
        sets += [[draw(t) for t in names] for _ in range(4 + args.reps)]
    offsets = np.arange(0, n, lookups, dtype=np.int64)
    reqs = [[nearrec.TableLookup(t, i, offsets) for t, i in zip(names, s, strict=True)]
            for s in sets]
    # warm-up: the cache takes every row it misses (lfu admits all; lfu_pa at p = 0 fills its
    # free slots only), twice over (with misses: the rows used, then rows that miss)
    for k in range(8):
        store.lookup_many(reqs[k % len(reqs)])
    before = served(store)
    start = time.perf_counter()
    for k in range(args.reps):
        store.lookup_many(reqs[(8 + k) % len(reqs)])
    took = time.perf_counter() - start
    after = served(store)
    timed = args.reps * n * len(names)
    tier = {"cache": "lookups_cache", "hot": "lookups_hot"}.get(args.tier)
    ratio = (after["lookups_cache"] - before["lookups_cache"]) / timed
    if hit < 1.0:
        print(f"cache: {timed:,} timed lookups, {ratio:.1%} served by the row cache "
              f"(asked {hit:.0%}); {took / timed * 1e9:.2f} ns a lookup (pid {os.getpid()})")
        return
    if tier is not None and after[tier] - before[tier] != timed:
        raise SystemExit(f"only {after[tier] - before[tier]:,} of {timed:,} timed lookups "
                         f"were {args.tier} hits: {after}")
    total = (8 + args.reps) * n * len(names)
    print(f"{args.tier}: {total:,} lookups (warm-up included), every timed one a hit; "
          f"{took / timed * 1e9:.2f} ns a lookup (pid {os.getpid()})")


LOOPS = {"cache": "fast::run_found", "hot": "fast::run_found", "dram": "fast::run"}


def count(args: argparse.Namespace) -> None:
    """Instructions a lookup costs in each tier's bag loop (see the module docs)."""
    rows = []
    for tier, loop in LOOPS.items():
        runs = [callgrind(args, tier, reps, loop) for reps in (4, 12)]
        (i4, n4), (i12, n12) = runs
        rows.append({"tier": tier, "loop": loop, "instructions_per_lookup": (i12 - i4) / (n12 - n4),
                     "runs": [{"reps": r, "instructions": i, "lookups": n}
                              for r, (i, n) in zip((4, 12), runs, strict=True)]})
        print(f"{tier}: {rows[-1]['instructions_per_lookup']:.1f} instructions a lookup",
              flush=True)
    command = " ".join(["python", *sys.argv])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"command": command, "rows_used": args.rows_used, "batch": args.batch,
         "tiers": rows}, indent=2) + "\n")
    lines = [f"<!-- produced by: {command} -->",
             "# Instructions a lookup costs in the bag loop (callgrind)", "",
             f"Command: `{command}`. RMC1 shapes (fp32, dim 32, 80 lookups a bag, batch "
             f"{args.batch}, 8 tables of 1M rows), one thread; each table's lookups draw from "
             f"{args.rows_used:,} rows. Instructions of the bag loop (inclusive) over 12 timed "
             "calls minus those over 4, divided by the lookups between: a hit's cost, warm-up "
             "and set-up cancelled.", "",
             "| tier | bag loop | instructions a lookup |", "|---|---|---|"]
    lines += [f"| {r['tier']} | `{r['loop']}` | {r['instructions_per_lookup']:.1f} |" for r in rows]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def callgrind(args: argparse.Namespace, tier: str, reps: int, loop: str) -> tuple[int, int]:
    """The bag loop's inclusive instructions and the lookups of one run under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
             __file__, tier, "--reps", str(reps), "--batch", str(args.batch),
             "--rows-used", str(args.rows_used), "--scratch", args.scratch],
            capture_output=True, text=True, check=True)
        printed = re.search(r"^\w+: ([\d,]+) lookups", run.stdout, re.M)
        if printed is None:
            raise SystemExit(f"{tier} printed no lookup count: {run.stdout!r}")
        lookups = int(printed[1].replace(",", ""))
        notes = subprocess.run(["callgrind_annotate", "--inclusive=yes", str(out)],
                               capture_output=True, text=True, check=True).stdout
    # the multiversioned loop's dispatcher line counts the version it ran, inclusive
    pattern = rf"^\s*([\d,]+) \([^)]*\)\s+\S+:nearrec_kernels::{loop} \["
    found = re.search(pattern, notes, re.M)
    if found is None:
        raise SystemExit(f"no {loop} in the callgrind profile of {tier}")
    return int(found[1].replace(",", "")), lookups


def served(store: nearrec.Store) -> dict[str, int]:
    """Lookups each tier served so far, over every table."""
    keys = ("lookups_hot", "lookups_cache", "lookups_ssd")
    return {k: sum(int(r[k]) for r in store.tier_report()) for k in keys}


if __name__ == "__main__":
    main()
