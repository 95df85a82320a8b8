"""``nearrec bench serve``'s report: its Markdown (saturations, latency at offered loads, bytes
on the wire, the stages a request spent its time in, the pinned rounds) and its figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .report import Record

# the latency CDF's points (percentiles)
CDF_POINTS = (1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 97, 99, 99.5, 99.9)


def markdown(records: list[Record], command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "Open loop (Poisson arrivals; each latency from its intended send time), 4 "
             "connections, batches of 64 bags × 20 Zipf(1.05) ids in each of 8 tables (dim 32, "
             "fp32); node = `nearrec serve` pooling next to the data; raw = the same node "
             "returning distinct rows, pooled by the client; raw+cache25 = raw with the 25 % "
             "hottest rows of each table in the client; redis = Debian's redis-server, rows as "
             "values, one pipelined MGET per request (DRAM-resident tables only); embedded = "
             "the store in the load generator's process. Loopback unless the tier says "
             "`@RATE` (the node and Redis in a network namespace behind a veth pair that tc "
             "limits to RATE each way). The node, the peers and the load generator share this "
             "machine's 2 cores. Medians of rounds.", ""]
    for kind, title in (("serve", "Loopback"), ("serve-wire", "Over a rate-limited veth pair")):
        if not any(r.bench == f"{kind}-saturation" for r in records):
            continue
        lines += [f"### {title}", "",
                  "**Saturation** (answered requests/s under an offered load past it; "
                  "samples/s = × 64):", "", "| tier | system | requests/s | samples/s | rounds |",
                  "|---|---|---:|---:|---|"]
        for r in records:
            if r.bench == f"{kind}-saturation":
                rounds = ", ".join(f"{x:,.0f}" for x in r.extra["rounds"])
                lines.append(f"| {r.model} | {r.system} | {r.extra['requests_per_s']:,.0f} | "
                             f"{r.samples_per_s:,.0f} | {rounds} |")
        lines += ["", "**Latency against offered load** (shares of raw's saturation):", "",
                  "| tier | offered/s | system | served samples/s | p50 µs | p99 µs | p99.9 µs | "
                  "B on the wire / sample | failed |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
        for r in records:
            if r.bench == f"{kind}-load":
                lines.append(f"| {r.model} | {r.extra['offered_per_s']:,.0f} | {r.system} | "
                             f"{r.samples_per_s:,.0f} | {r.p50_us:,.0f} | {r.p99_us:,.0f} | "
                             f"{r.extra['p999_us']:,.0f} | {r.extra['bytes_per_sample']:,.0f} | "
                             f"{r.extra['failed']} |")
        lines.append("")
    lines += _pinned_markdown(records)
    cdf = [r for r in records if "cdf_us" in r.extra]
    if cdf:
        lines += ["**Latency CDF** at the load marked (EMB-SSD Fig. 7; µs at each percentile, "
                  "every round's requests together):", "",
                  "| tier | system | " + " | ".join(f"p{q:g}" for q in CDF_POINTS) + " |",
                  "|---|---|" + "---:|" * len(CDF_POINTS)]
        for r in cdf:
            lines.append(f"| {r.model} | {r.system} | "
                         + " | ".join(f"{v:,.0f}" for v in r.extra["cdf_us"]) + " |")
        lines.append("")
    stages = [r for r in records if "stages_us" in r.extra]
    if stages:
        lines += ["**Where a request's time goes** at the same load (EMB-SSD Fig. 8; mean µs "
                  "per request): queue = waiting for an engine slot, engine = route + reads + "
                  "pooling, node = the rest of the node's handler (decoding, checks, the "
                  "answer), network+client = the client's mean latency less the node's (the "
                  "wire, HTTP/2, the client's decoding and, for raw, its pooling; from "
                  "`nearrec_request_seconds`):", "",
                  "| tier | system | queue | engine | node | network+client | client mean |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for r in stages:
            st = r.extra["stages_us"]
            lines.append(f"| {r.model} | {r.system} | {st['queue']:,.0f} | {st['engine']:,.0f} "
                         f"| {st['node']:,.0f} | {st['network+client']:,.0f} | "
                         f"{sum(st.values()):,.0f} |")
        lines.append("")
    clients = [r for r in records if r.bench == "serve-clients"]
    if clients:
        rate = clients[0].extra["offered_per_s"]
        lines += [f"**1 → 64 connections** (DRAM tier): saturation, and latency at {rate:,.0f} "
                  "requests/s offered:", "",
                  "| connections | system | saturation requests/s | p50 µs | p99 µs | p99.9 µs |",
                  "|---:|---|---:|---:|---:|---:|"]
        for r in clients:
            lines.append(f"| {r.extra['connections']} | {r.system} | "
                         f"{r.extra['saturation_requests_per_s']:,.0f} | {r.p50_us:,.0f} | "
                         f"{r.p99_us:,.0f} | {r.extra['p999_us']:,.0f} |")
        lines.append("")
    coalesce = [r for r in records if r.bench == "serve-coalesce"]
    if coalesce:
        conns = coalesce[0].extra["connections"]
        lines += [f"**Coalescing** small requests ({conns} connections, SSD tier): the node's "
                  "saturation with each setting, and its latency at half the uncoalesced "
                  "node's saturation:", "",
                  "| bags / request | setting | saturation requests/s | × off | offered/s | "
                  "p50 µs | p99 µs |", "|---:|---|---:|---:|---:|---:|---:|"]
        for r in coalesce:
            off = next(o for o in coalesce if o.batch == r.batch)
            ratio = r.samples_per_s / off.samples_per_s if off.samples_per_s else 0.0
            lines.append(f"| {r.batch} | {r.dist} | "
                         f"{r.extra['saturation_requests_per_s']:,.0f} | {ratio:.2f}× | "
                         f"{r.extra['offered_per_s']:,.0f} | {r.p50_us:,.0f} | {r.p99_us:,.0f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def plot(records: list[Record], path: Path) -> Path | None:
    """The report's figures in one PNG: p99 against offered load per tier, the latency CDF,
    the stage breakdown, and the connections sweep. ``None`` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    tiers = sorted({r.model for r in records if r.bench in ("serve-load", "serve-wire-load")})
    cols = max(len(tiers), 3)
    fig, axes = plt.subplots(2, cols, figsize=(6 * cols, 9), squeeze=False)
    for ax, tier in zip(axes[0], tiers, strict=False):
        for system in dict.fromkeys(r.system for r in records if r.model == tier):
            pts = sorted((r.extra["offered_per_s"], r.p99_us) for r in records
                         if r.model == tier and r.system == system and r.bench.endswith("-load"))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] / 1000 for p in pts], "o-", label=system)
        ax.set(title=f"p99 against offered load ({tier})", xlabel="offered requests/s",
               ylabel="p99 ms", yscale="log")
        _legend(ax, 8)
    ax = axes[1][0]
    for r in records:
        if "cdf_us" in r.extra and r.bench == "serve-load":
            ax.plot([v / 1000 for v in r.extra["cdf_us"]], CDF_POINTS,
                    label=f"{r.model} {r.system}")
    ax.set(title="latency CDF (EMB-SSD Fig. 7)", xlabel="latency ms", ylabel="percentile",
           xscale="log")
    _legend(ax, 7)
    ax = axes[1][1]
    stages = [r for r in records if "stages_us" in r.extra]
    bottom = np.zeros(len(stages))
    for stage in ("queue", "engine", "node", "network+client"):
        v = np.array([r.extra["stages_us"][stage] / 1000 for r in stages])
        ax.bar([f"{r.model}\n{r.system}" for r in stages], v, bottom=bottom, label=stage)
        bottom += v
    ax.set(title="mean time per request (EMB-SSD Fig. 8)", ylabel="ms")
    _legend(ax, 8)
    ax = axes[1][2]
    clients = [r for r in records if r.bench == "serve-clients"]
    for system in ("node", "raw"):
        pts = [(r.extra["connections"], r.extra["saturation_requests_per_s"]) for r in clients
               if r.system == system]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=system)
    ax.set(title="saturation against connections (DRAM)", xlabel="connections",
           ylabel="requests/s", xscale="log")
    _legend(ax, 8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _legend(ax: Any, size: int) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=size)


def _pinned_markdown(records: list[Record]) -> list[str]:
    """The one-core-each table: each system's median, its spread, and the node's ratio to the
    embedded store round by round (rounds are interleaved, so round k of each ran side by
    side)."""
    pinned = [r for r in records if r.bench == "serve-pinned"]
    if not pinned:
        return []
    lines = ["**One core each**: the system under test alone on CPU 1, the load generator on "
             "CPU 0 (the node's gRPC client is not charged to it); answered requests/s past "
             "saturation, median of rounds; × embedded is the ratio of medians, and its range "
             "over rounds the ratio round by round:", "",
             "| tier | rows per table | system | requests/s | min–max | × embedded | "
             "× embedded by round | rounds |", "|---|---:|---|---:|---:|---:|---:|---|"]
    for r in pinned:
        emb = next((e for e in pinned if e.model == r.model and e.system == "embedded"), r)
        ratio = r.samples_per_s / emb.samples_per_s if emb.samples_per_s else 0.0
        mine, theirs = r.extra["rounds"], emb.extra["rounds"]
        by_round = [a / b for a, b in zip(mine, theirs, strict=False) if b]
        spread = (f"{min(by_round):.2f}–{max(by_round):.2f}×" if by_round and r is not emb
                  else "")
        rounds = ", ".join(f"{x:,.0f}" for x in mine)
        rows = r.extra.get("rows_per_table")
        lines.append(f"| {r.model} | {f'{rows:,}' if rows else ''} | {r.system} | "
                     f"{r.extra['requests_per_s']:,.0f} | {min(mine):,.0f}–{max(mine):,.0f} | "
                     f"{ratio:.2f}× | {spread} | {rounds} |")
    return [*lines, ""]


def pinned_markdown(records: list[Record], command: str) -> str:
    return "\n".join([f"Command: `{command}`", "",
                      "Batches of 64 bags × 20 Zipf(1.05) ids in each of 8 tables (dim 32, fp32; "
                      "the SSD tier with a DRAM budget of ¼ of its tables), 4 connections of "
                      "one open-loop load generator on CPU 0, offered past saturation; each "
                      "round is a fresh load generator process (one warm-up run, not counted), "
                      "node and embedded interleaved round by round. The embedded store's calls "
                      "run on threads pinned to CPU 1, as the node's run on the node's CPU.", "",
                      *_pinned_markdown(records)])


#: ``nearrec bench serve``, and ``serve-pinned`` (its one-core-each part alone, more rounds)
