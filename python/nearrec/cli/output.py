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
    return humanize.metric(x, "s").replace("μ", "µ")


def human_bytes(n: float) -> str:
    """Bytes for people: ``4.5 MiB``."""
    return str(humanize.naturalsize(n, binary=True))

def format_stats(s: dict[str, float | str | bool]) -> str:
    """The SSD tier's accounting, a few lines for people; what is not there is left out, not
    guessed."""
    def n(k: str) -> float:
        return float(s[k])

    how = [] if "direct_io" not in s else ["direct" if s["direct_io"] else "buffered"]
    if "block_bytes" in s:
        how.append(f"{n('block_bytes'):.0f} B blocks")
    device = f"{s['device']} ({', '.join(how)})" if how else str(s["device"])
    lines = [f"ssd tier: {device}; {n('batches'):.0f} batches, "
             f"{n('lookups'):,.0f} lookups, {n('unique_rows'):,.0f} distinct rows, "
             f"{n('device_reads'):,.0f} reads ({n('reads_saved_dedup'):,.0f} saved by "
             f"de-duplication, {n('reads_saved_merge'):,.0f} by merging)",
             f"  read {human_bytes(n('bytes_read'))}, of which useful "
             f"{human_bytes(n('useful_bytes'))} "
             f"(amplification {n('read_amplification'):.2f}); most reads in one batch "
             f"{n('max_batch_reads'):,.0f}"]
    if n("dram_tier_bytes") > 0:
        lines.append(f"  dram tiers ({human_bytes(n('dram_tier_bytes'))}) served "
                     f"{100 * n('dram_hit_ratio'):.1f} % of lookups (whole tables "
                     f"{n('lookups_resident'):,.0f}, hot rows {n('lookups_hot'):,.0f}, row cache "
                     f"{n('lookups_cache'):,.0f}; ssd {n('lookups_ssd'):,.0f}); cache admitted "
                     f"{n('cache_admissions'):,.0f}, turned away {n('cache_rejections'):,.0f}, "
                     f"evicted {n('cache_evictions'):,.0f}")
    for stage in ("route", "io_wait", "pool", "end_to_end"):
        lines.append(f"  {stage:10} " + "  ".join(
            f"{q} {human_time(n(f'{stage}_{k}_us') / 1e6):>9}"
            for q, k in (("p50", "p50"), ("p95", "p95"), ("p99", "p99"), ("p99.9", "p999"))))
    return "\n".join(lines)
