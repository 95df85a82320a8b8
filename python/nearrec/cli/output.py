"""What the verbs print: JSON for machines (``--json``) or lines for people, with durations,
sizes and the SSD tier's accounting written for people."""

from __future__ import annotations

import argparse
import json
from typing import Any

import humanize


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=1, default=str) if args.json else text)

def human_time(x: float) -> str:
    """A duration for people: ``214 µs``, ``26.0 ms``, ``1.18 s``."""
    return str(humanize.metric(x, "s")).replace("μ", "µ")


def human_bytes(n: float) -> str:
    """Bytes for people: ``4.5 MiB``."""
    return str(humanize.naturalsize(n, binary=True))

def format_stats(s: dict[str, float | str | bool]) -> str:
    """A store's accounting, a few lines for people: the SSD tier's reads, its DRAM tiers, its
    stage latencies, a sharded store's router — each only where the store reports it (an
    embedded store, a node's, a router's differ; ``--json`` gives every counter). Nothing
    missing is guessed."""
    def has(*keys: str) -> bool:
        return all(k in s for k in keys)

    def n(k: str) -> float:
        return float(s[k])

    lines = []
    if has("batches", "lookups", "unique_rows", "device_reads", "reads_saved_dedup",
           "reads_saved_merge", "bytes_read", "useful_bytes", "max_batch_reads"):
        how = [] if "direct_io" not in s else ["direct" if s["direct_io"] else "buffered"]
        if "block_bytes" in s:
            how.append(f"{float(s['block_bytes']):.0f} B blocks")
        device = s.get("device", "?")
        device = f"{device} ({', '.join(how)})" if how else str(device)
        amplification = (f" (amplification {n('read_amplification'):.2f})"
                         if "read_amplification" in s else "")
        lines += [f"ssd tier: {device}; {n('batches'):.0f} batches, "
                  f"{n('lookups'):,.0f} lookups, {n('unique_rows'):,.0f} distinct rows, "
                  f"{n('device_reads'):,.0f} reads ({n('reads_saved_dedup'):,.0f} saved by "
                  f"de-duplication, {n('reads_saved_merge'):,.0f} by merging)",
                  f"  read {human_bytes(n('bytes_read'))}, of which useful "
                  f"{human_bytes(n('useful_bytes'))}{amplification}; most reads in one "
                  f"batch {n('max_batch_reads'):,.0f}"]
    tiers = ("lookups_resident", "lookups_hot", "lookups_cache", "lookups_ssd")
    if has("dram_tier_bytes", *tiers) and float(s["dram_tier_bytes"]) > 0:
        served = (f" served {100 * n('dram_hit_ratio'):.1f} % of lookups"
                  if "dram_hit_ratio" in s else "")
        cache = (f"; cache admitted {n('cache_admissions'):,.0f}, turned away "
                 f"{n('cache_rejections'):,.0f}, evicted {n('cache_evictions'):,.0f}"
                 if has("cache_admissions", "cache_rejections", "cache_evictions") else "")
        lines.append(f"  dram tiers ({human_bytes(n('dram_tier_bytes'))}){served} (whole "
                     f"tables {n('lookups_resident'):,.0f}, hot rows {n('lookups_hot'):,.0f}, "
                     f"row cache {n('lookups_cache'):,.0f}; ssd {n('lookups_ssd'):,.0f})"
                     f"{cache}")
    quantiles = (("p50", "p50"), ("p95", "p95"), ("p99", "p99"), ("p99.9", "p999"))
    for stage in ("route", "io_wait", "pool", "end_to_end"):
        keys = [f"{stage}_{k}_us" for _, k in quantiles]
        if has(*keys):
            # 0: no batch timed yet (a DRAM-resident store times none)
            lines.append(f"  {stage:10} " + "  ".join(
                f"{q} {human_time(n(k) / 1e6) if float(s[k]) > 0 else '-':>9}"
                for (q, _), k in zip(quantiles, keys, strict=True)))
    router = {k: float(v) for k, v in s.items() if k.startswith("cluster_")}
    if "cluster_shards" in router:  # the shards first, then the counters
        router = {"cluster_shards": router.pop("cluster_shards"), **router}
    if router:
        lines.append("router: " + ", ".join(
            f"{k.removeprefix('cluster_').replace('_', ' ')} {v:,.0f}" for k, v in router.items()))
    return "\n".join(lines)
