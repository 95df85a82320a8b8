"""``nearrec bench update``'s report: write rates beside RocksDB's, lookups under writes, how soon
a write is seen, compaction, and what the delta costs a lookup."""

from __future__ import annotations

from .report import Record


def markdown(records: list[Record], command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "**(a) Durable row updates per second** (median of rounds, ± half their range): "
             "calls of 1 and 64 rows from 8 Python threads, of 4,096 from 2; `sync` returns "
             "once the rows are on disk (group commit), `async` once they are in the kernel "
             "(on disk within 10 ms). RocksDB writes the same rows as write batches, `sync` "
             "on or off. The rebuild writes every row of the table into a new store (one "
             "version, then swapped in).", "",
             "| row | rows/call | durability | nearrec rows/s | RocksDB rows/s | nearrec ÷ "
             "RocksDB |", "|---|---:|---|---:|---:|---:|"]
    writes = {(r.model, r.batch, r.dist, r.system): r for r in records
              if r.bench == "update-write"}
    for (model, k, mode, system), r in sorted(writes.items()):
        if system != "nearrec":
            continue
        rocks = writes.get((model, k, mode, "rocksdb"))
        ratio = f"{r.lookups_per_s / rocks.lookups_per_s:.2f}×" if rocks else "—"
        lines.append(f"| {model} | {k:,} | {mode} | {r.lookups_per_s:,.0f} "
                     f"±{100 * r.extra['spread']:.0f} % | "
                     + (f"{rocks.lookups_per_s:,.0f} ±{100 * rocks.extra['spread']:.0f} %"
                        if rocks else "—") + f" | {ratio} |")
    for (model, _, _mode, system), r in sorted(writes.items()):
        if system == "rebuild":
            lines.append(f"| {model} | whole table | rebuild | {r.lookups_per_s:,.0f} "
                         f"({r.extra['seconds']:.1f} s per rebuild) | — | — |")
    offered = next((r.extra["offered_batches_per_s"] for r in records
                    if r.bench == "update-load"), 0.0)
    lines += ["", "**(b) Lookups under updates, compaction and swaps** (open loop: batches "
              f"of 64 bags × 16 Zipf ids in each table, scheduled at {offered:,.0f}/s — a "
              "third of what the store serves closed-loop on the same 4 threads, halved until "
              "it keeps up alone (p99 within 10× the closed-loop latency) — each latency from "
              "its scheduled start; tier `ssd`, DRAM tiers half the tables; "
              "updates: sync calls of 64 rows paced at a share of (a)'s 128 B rate, into a "
              "delta budget they do not fill half of (no compaction starts in the window); "
              "updates 25% ×4096: the same rows per second in calls of 4,096 (1/64 of the "
              "calls and log syncs); "
              "written 25%: the rows the 25 % writer writes in a window, written before it "
              "(the delta's cost to the lookups without the writer beside them); "
              "another store 25%: the 25 % writer aimed at a third store of the same shape "
              "(what sharing the machine's two cores and one disk costs, without the store); "
              "compaction: 4,096 rows per table written and compacted, back to back, at most "
              "128 MiB/s (`compaction_rate`); swap: to the other of two versions of the store, "
              "warm, half-way through the window (the new version is opened — its DRAM tiers "
              "loaded — while the old one serves); each condition starts from the compacted "
              "first version):",
              "",
              "| condition | batches/s served | p50 µs | p99 µs (median) | p99 µs of each "
              "round | p99 ÷ idle | failed |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        if r.bench == "update-load":
            rounds = ", ".join(f"{x:,.0f}" for x in r.extra["rounds_p99_us"])
            lines.append(f"| {r.dist} | {r.samples_per_s:,.0f} | {r.p50_us:,.0f} | "
                         f"{r.p99_us:,.0f} | {rounds} | "
                         f"{r.extra['p99_vs_idle']:.2f}× | {r.extra['failed']:.0f} |")
    lines += ["", "**(c) Compaction** (whole changed tables rewritten, copy-on-write):", ""]
    for r in records:
        if r.bench == "update-compaction":
            e = r.extra
            lines.append(f"{e['bytes_per_s'] / 1e9:.2f} GB/s ±{100 * e['spread']:.0f} %, "
                         f"{100 * e['share_of_disk']:.0f} % of the disk's sequential writes "
                         f"measured beside it ({e['disk_seq_write_bytes_per_s'] / 1e9:.2f} "
                         f"GB/s).")
    lines += ["", "**(d) Acknowledgement to visible** (a write's return to the first read on "
              "another thread that returns it):", "", "| system | p50 µs | p99 µs |",
              "|---|---:|---:|"]
    for r in records:
        if r.bench == "update-visible":
            lines.append(f"| {r.system} | {r.p50_us:,.1f} | {r.p99_us:,.1f} |")
    lines += ["", "**(e) What the delta costs a lookup** (closed loop, one thread, the batches "
              "of (b); rows written uniformly over both tables and not yet compacted; median of "
              "rounds, ± half their range):", "",
              "| tier | rows in the delta | batches/s | ÷ empty delta | p50 µs | p99 µs |",
              "|---|---:|---:|---:|---:|---:|"]
    for r in records:
        if r.bench == "update-delta":
            lines.append(f"| {r.model} | {r.extra['delta_rows']:,} | {r.samples_per_s:,.0f} "
                         f"±{100 * r.extra['spread']:.0f} % | {r.extra['vs_empty']:.2f}× | "
                         f"{r.p50_us:,.0f} | {r.p99_us:,.0f} |")
    return "\n".join(lines) + "\n"


#: ``nearrec bench update``
