"""Benchmark records and their JSON / Markdown reports."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Record:
    """One measured cell: a system on one (model, batch, distribution)."""

    bench: str
    model: str
    batch: int
    dist: str
    system: str
    samples_per_s: float
    lookups_per_s: float
    p50_us: float = 0.0
    p99_us: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {"machine": platform.machine(), "cpus": os.cpu_count(),
                           "python": platform.python_version(),
                           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    try:
        import nearrec

        env["nearrec"] = nearrec.__version__
    except ImportError:
        pass
    return env


#: A cell whose rounds spread more than this (half their range over their median), for nearrec
#: or for a peer, is marked unreliable instead of giving a ratio: on a shared machine a few slow
#: rounds of one system can make it look hundreds of times slower than it is.
SPREAD_LIMIT = 0.5


def rounds_spread(xs: list[float]) -> float:
    """Half the range of a cell's rounds (of any measure) as a share of their median; 0 for one
    round."""
    m = float(statistics.median(xs)) if xs else 0.0
    return (max(xs) - min(xs)) / (2 * m) if len(xs) > 1 and m > 0 else 0.0


def spread(r: Record) -> float | None:
    """Half the range of a cell's per-round throughputs over their median (None: one round)."""
    rounds = r.extra.get("rounds_samples_per_s") or []
    if len(rounds) < 2 or r.samples_per_s <= 0:
        return None
    return float(max(rounds) - min(rounds)) / 2 / float(r.samples_per_s)


def reliable(*records: Record) -> bool:
    return all((spread(r) or 0.0) <= SPREAD_LIMIT for r in records)


def ratio_text(ours: Record, peer: Record) -> str:
    """``ours ÷ peer`` for a table, or why there is none."""
    if not reliable(ours, peer):
        worst = max(spread(ours) or 0.0, spread(peer) or 0.0)
        return f"unreliable (±{100 * worst:.0f} %)"
    return f"{ours.samples_per_s / peer.samples_per_s:.2f}"


def summarise(records: list[Record]) -> None:
    """Adds each cell's ratio to every peer (nearrec ÷ peer) into nearrec's record, and marks
    the ratios whose rounds spread too far to be trusted (``unreliable_vs_PEER``)."""
    cells: dict[tuple[str, str, int, str], dict[str, Record]] = {}
    for r in records:
        cells.setdefault((r.bench, r.model, r.batch, r.dist), {})[r.system] = r
    for cell in cells.values():
        ours = cell.get("nearrec")
        if ours is None:
            continue
        for name, peer in cell.items():
            if name != "nearrec" and peer.samples_per_s > 0:
                ours.extra[f"ratio_vs_{name}"] = round(ours.samples_per_s / peer.samples_per_s, 3)
                if not reliable(ours, peer):
                    ours.extra[f"unreliable_vs_{name}"] = True


def write(records: list[Record], out_dir: Path, name: str, command: str,
          markdown: str) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    js = out_dir / f"{name}.json"
    md = out_dir / f"{name}.md"
    js.write_text(json.dumps({"command": command, "environment": environment(),
                              "records": [asdict(r) for r in records]}, indent=1))
    md.write_text(f"<!-- produced by: {command} -->\n" + markdown)
    return js, md


def _spread(r: Record) -> str:
    """Half the range of a cell's per-round throughputs, as a share of their median."""
    s = spread(r)
    return "—" if s is None else f"±{100 * s:.0f} %"


def sls_dtype_markdown(records: list[Record], command: str) -> str:
    """``bench sls-dtypes``: each cell's samples/s per dtype, nearrec's ratio to FBGEMM's
    int-n-bit TBE on the same bytes, and to nearrec's own fp32 and int8 tables."""
    dtypes = list(dict.fromkeys(r.extra["dtype"] for r in records if r.bench == "sls.dtype"))
    lines = [f"Command: `{command}`", "",
             "The same float tables quantised once by FBGEMM's own operators into each dtype; "
             "nearrec's store of those bytes (DRAM tier, 2 threads) against FBGEMM's CPU "
             "inference TBE (`IntNBitTableBatchedEmbeddingBagsCodegen`, what TorchRec's "
             "quantised collections run; its scalar reference kernel, one thread, on this "
             "machine) holding the same bytes. Samples/s, median of interleaved rounds; "
             "`× TBE`: nearrec ÷ TBE in the same dtype; `× fp32` / `× int8`: nearrec in the "
             "dtype ÷ nearrec's fp32 / int8 tables of the same shape. TBE cells with more than "
             "2M lookups a call are not run (minutes each). A ratio whose rounds spread beyond "
             f"±{100 * SPREAD_LIMIT:.0f} % is marked unreliable.", "",
             "| model | dist | batch | dtype | row B | nearrec | TBE | × TBE | × fp32 | × int8 "
             "| nearrec p50 / p99 µs |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    cells: dict[tuple[str, str, int], dict[str, Record]] = {}
    for r in records:
        if r.bench == "sls.dtype":
            cells.setdefault((r.model, r.dist, r.batch), {})[r.system] = r
    for (model, dist, batch), c in cells.items():
        for d in dtypes:
            ours = c.get(f"nearrec[{d}]")
            if ours is None:
                continue
            tbe = c.get(f"fbgemm.IntNBitTBE[{d}]")
            base = {b: c.get(f"nearrec[{b}]") for b in ("fp32", "int8")}
            ratio = {b: ratio_text(ours, r) if r is not None and d != b else "—"
                     for b, r in base.items()}
            lines.append(
                f"| {model} | {dist} | {batch} | {d} | {ours.extra['row_bytes']} "
                f"| {ours.samples_per_s:,.0f} "
                f"| {f'{tbe.samples_per_s:,.0f}' if tbe else '—'} "
                f"| {ratio_text(ours, tbe) if tbe else '—'} | {ratio['fp32']} | {ratio['int8']} "
                f"| {ours.p50_us:,.0f} / {ours.p99_us:,.0f} |")
    return "\n".join(lines) + "\n"


def sls_markdown(records: list[Record], command: str) -> str:
    systems = ["nearrec", "torch.EmbeddingBag", "torch.EmbeddingBag[shared]", "fbgemm.SplitTBE",
               "torchrec.IntNBitTBE"]
    present = [s for s in systems if any(r.system == s for r in records)]
    lines = [f"Command: `{command}`", "",
             "Samples/s (median of rounds), nearrec p50/p99 latency per batch, nearrec's ratio to "
             "each peer, and the spread of the rounds (half the max−min range over the median) "
             "for nearrec and torch.EmbeddingBag. Tables in DRAM, sum pooling, 2 threads. "
             "`torch.EmbeddingBag` holds its own copy of the weights (torch's allocator, as a user "
             "loads them); `[shared]` runs on a zero-copy view of nearrec's resident tables (same "
             "bytes, same huge pages), so its ratio compares kernels and threading alone. A ratio "
             f"whose rounds (nearrec's or the peer's) spread beyond ±{100 * SPREAD_LIMIT:.0f} % is "
             "marked unreliable instead of given. `of gather limit`: the lookups/s of nearrec and "
             "of torch.EmbeddingBag as a share of `limit.random_gather` (the machine's prefetched "
             "random gather of rows of the model's size from DRAM, on the same threads, measured "
             "in the same run): near 1 the loop waits on memory; well above 1 (Zipf) the rows "
             "come from the CPU's caches, where instructions bound it.", "",
             "| model | dist | batch | " + " | ".join(present) + " | nearrec p50 / p99 µs | "
             + " | ".join(f"× {s}" for s in present[1:]) + " | spread nearrec / torch | "
             "of gather limit: nearrec / torch |",
             "|---|---|---:|" + "---:|" * len(present) + "---:|" + "---:|" * (len(present) - 1)
             + "---:|---:|"]
    limit = {r.model: r.lookups_per_s for r in records if r.system == "limit.random_gather"}
    cells: dict[tuple[str, str, int], dict[str, Record]] = {}
    for r in records:
        if r.batch:
            cells.setdefault((r.model, r.dist, r.batch), {})[r.system] = r
    for (model, dist, batch), c in cells.items():
        ours = c["nearrec"]
        vals = [f"{c[s].samples_per_s:,.0f}" if s in c else "—" for s in present]
        ratios = [ratio_text(ours, c[s]) if s in c else "—" for s in present[1:]]
        spread = " / ".join(_spread(c[s]) if s in c else "—"
                            for s in ("nearrec", "torch.EmbeddingBag"))
        of_limit = " / ".join(f"{c[s].lookups_per_s / limit[model]:.2f}"
                              if s in c and limit.get(model) else "—"
                              for s in ("nearrec", "torch.EmbeddingBag"))
        lines.append(f"| {model} | {dist} | {batch} | " + " | ".join(vals)
                     + f" | {ours.p50_us:,.0f} / {ours.p99_us:,.0f} | " + " | ".join(ratios)
                     + f" | {spread} | {of_limit} |")
    lines += ["", "Limits measured in the same run:", ""]
    for r in records:
        if r.system.startswith("limit."):
            bps = r.extra.get("bytes_per_s", 0) / 1e9
            what = (f"{r.lookups_per_s / 1e6:,.1f}M rows/s of {r.extra.get('row_bytes')} B "
                    if r.system == "limit.random_gather" else "")
            lines.append(f"- {r.model} {r.system}: {what}{bps:.1f} GB/s")
    best: dict[str, float] = {}
    # Uniform cells only: under Zipf the hot rows come from the caches, not from DRAM.
    for (model, dist, batch), c in cells.items():
        if batch >= 64 and dist == "uniform":
            best[model] = max(best.get(model, 0.0), c["nearrec"].extra["useful_bytes_per_s"])
    for model, b in best.items():
        stream = next((r.extra["bytes_per_s"] for r in records
                       if r.model == model and r.system == "limit.stream_read"), 0.0)
        if stream:
            lines.append(f"- {model}: best nearrec useful bytes (uniform, batch ≥ 64) "
                         f"{b / 1e9:.1f} GB/s = "
                         f"{100 * b / stream:.0f} % of streaming read")
    return "\n".join(lines) + "\n"
