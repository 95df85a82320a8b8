"""``nearrec bench flash-repro``: the papers' device-level results re-run on the flash device
model (simulated time, so the run is short and repeatable), each beside the paper's own figure.

Every experiment is a list of ``nearrec.simulate.run`` calls; the Markdown report puts the
paper's number next to ours, and ``docs/reproductions.md`` says why they differ where they do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import nearrec.trace as nt
from nearrec import simulate as sim

from . import _native
from .harness import Harness
from .report import Record

GiB = 1 << 30
#: Criteo Kaggle's 26 categorical cardinalities (EMB-SSD's workload is Criteo).
CRITEO_ROWS = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
               3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)


@dataclass
class FlashReproConfig:
    #: total table bytes per model (RM-SSD: 30 GB)
    table_bytes: int = 30 * GiB
    batches: int = 40
    warmup: int = 160
    #: timings of the engine's kernels per point (EMB-SSD Figs. 9(b), 10), median taken
    kernel_reps: int = 21
    out: Path = Path("bench/results")

    @classmethod
    def quick(cls) -> FlashReproConfig:
        return cls(table_bytes=2 * GiB, batches=10, warmup=20, kernel_reps=5)


def _figure(exp: str) -> str:
    """The paper's figure an experiment reproduces, as ``paper.figN``: ``rmssd-fig12`` →
    ``rmssd.fig12``, ``recssd-fig8-seq`` → ``recssd.fig8``."""
    paper, fig = exp.split("-")[:2]
    return f"{paper}.{fig}"


def _rec(exp: str, r: dict[str, Any], **extra: Any) -> Record:
    return Record("flash-repro", r["model"], r["batch"], exp, r["mode"],
                  samples_per_s=r["throughput"],
                  lookups_per_s=r["throughput"] * r["lookups"] / max(r["samples"], 1),
                  p50_us=r["latency_p50_ms"] * 1e3, p99_us=r["latency_p99_ms"] * 1e3,
                  extra={**r, "figure": _figure(exp), **extra})


def trace_shares(gen: nt.Generator, rows: int, accesses: int, top: int = 10_000,
                 seed: int = 0) -> dict[str, float]:
    """RM-SSD Fig. 4's two numbers for one table's trace drawn by ``gen``: the share of
    accesses to ids met only once in it, and the share that goes to its ``top`` most frequent
    ids (plus distinct ids ÷ accesses, the other reading of "unique")."""
    t = nt.generate_table("t", rows, 80, max(1, accesses // 80), gen, seed=seed)
    return index_shares(t.indices, top)


def index_shares(indices: np.ndarray, top: int) -> dict[str, float]:
    """:func:`trace_shares`' numbers for the accesses ``indices``."""
    _, counts = np.unique(indices, return_counts=True)
    n = int(counts.sum())
    return {"accesses": n, "once_share": float((counts == 1).sum() / n),
            "distinct_share": float(len(counts) / n),
            "top_share": float(np.sort(counts)[::-1][:top].sum() / n), "top": top}


#: the eight benchmark models (RecSSD Fig. 9)
EIGHT_MODELS = ("rmc1", "rmc2", "rmc3", "wnd", "mtwnd", "din", "dien", "ncf")

#: RM-SSD Fig. 3's page-cache sizes (SSD-S's host DRAM)
FIG3_DRAM = (1 << 30, 256 << 20, 64 << 20, 16 << 20, 4 << 20)


def _rm_ssd_device(table_bytes: int) -> dict[str, Any]:
    # SSD-S and RecSSD's host side get 1/4 of the tables in DRAM (RM-SSD §III-B, §VI-A).
    return sim.device("rm-ssd", host__dram_bytes=table_bytes // 4)


def rm_ssd(cfg: FlashReproConfig, log: Callable[[str], None]) -> list[Record]:
    """RM-SSD Table IV, Fig. 10, Figs. 12–13, Fig. 14, Table V."""
    out: list[Record] = []
    dev = _rm_ssd_device(cfg.table_bytes)
    common: dict[str, Any] = {"batches": cfg.batches, "warmup": cfg.warmup,
                              "table_bytes": cfg.table_bytes}
    log("RM-SSD Table IV and Figs. 12-13: RMC1-3 x batch x design")
    for model in ("rmc1", "rmc2", "rmc3"):
        for batch in (1, 2, 4, 8, 16, 32):
            for mode in ("ssd-s", "emb-vectorsum", "recssd", "rm-ssd"):
                r = sim.run(model, dev, mode, batch=batch, k=0.3, **common)
                out.append(_rec("rmssd-fig12", r))
    log("RM-SSD Fig. 10: the SLS operator alone, RMC1")
    for mode in ("ssd-s", "emb-mmio", "emb-pagesum", "emb-vectorsum"):
        r = sim.run("rmc1", dev, mode, batch=1, k=0.3, **common)
        out.append(_rec("rmssd-fig10a", r))
    for pooling in (20, 40, 80, 160):
        r = sim.run("rmc1", dev, "emb-vectorsum", batch=1, pooling=pooling, k=0.3, **common)
        out.append(_rec("rmssd-fig10b", r))
    log("RM-SSD Fig. 14: RecSSD vs RM-SSD over the trace's locality K")
    for model in ("rmc1", "rmc2", "rmc3"):
        for k in (0.0, 0.3, 1.0, 2.0):
            for mode in ("recssd", "rm-ssd"):
                r = sim.run(model, dev, mode, batch=8, k=k, **common)
                out.append(_rec("rmssd-fig14", r))
    log("RM-SSD Fig. 3: SSD-S read amplification against its DRAM")
    # DRAM against what the run touches (a few hundred MiB of pages), not against the tables:
    # a run of a few hundred batches never fills gigabytes of page cache
    for model in ("rmc1", "rmc2", "rmc3"):
        for dram in FIG3_DRAM:
            d = sim.device("rm-ssd", host__dram_bytes=dram)
            r = sim.run(model, d, "ssd-s", batch=1, k=0.3, **common)
            out.append(_rec("rmssd-fig3", r, dram_bytes=dram))
    log("RM-SSD Fig. 4: unique and top-10k shares of the traces")
    rows = cfg.table_bytes // 8 // 128  # one of RMC1's eight tables, 128-byte rows
    gens = [(f"K = {k:g}", nt.Generator.stack_distance(k=k)) for k in (0.0, 0.3, 1.0, 2.0)]
    for name, gen in gens + [("Zipf 1.05", nt.Generator.zipf(1.05))]:
        got = trace_shares(gen, rows, accesses=1_000_000)
        out.append(Record("flash-repro", "rmc1", 0, "rmssd-fig4", name, samples_per_s=0.0,
                          lookups_per_s=0.0, extra={"figure": "rmssd.fig4", "trace": name,
                                                    "rows": rows, **got}))
    log("RM-SSD Fig. 11: end to end per SLS design, batch 1")
    for model in ("rmc1", "rmc2", "rmc3"):
        for mode in ("ssd-s", "emb-mmio", "emb-pagesum", "emb-vectorsum"):
            r = sim.run(model, dev, mode, batch=1, k=0.3, **common)
            out.append(_rec("rmssd-fig11", r))
    log("RM-SSD Fig. 15: NCF and WnD against SSD-S and RecSSD")
    for model in ("ncf", "wnd"):
        for mode in ("ssd-s", "recssd", "rm-ssd"):
            r = sim.run(model, dev, mode, batch=1, k=0.3, **common)
            out.append(_rec("rmssd-fig15", r))
    return out


def _cosmos(**overrides: Any) -> dict[str, Any]:
    return sim.device("cosmos-plus", **overrides)


def recssd(cfg: FlashReproConfig, log: Callable[[str], None]) -> list[Record]:
    """RecSSD Fig. 8 (SLS alone, SEQ vs STR), Fig. 9 (NDP alone, the eight models), Fig. 10
    (caches over K; d-f with the host's static partition) and Fig. 11 (model parameters)."""
    out: list[Record] = []
    # The baseline issues conventional NVMe reads through UNVMe (a user-space driver) on
    # many queues, with a host page buffer; RecSSD's NDP runs alone (no caches) in Fig. 8.
    base = _cosmos(host__kernel_io_ns=2_000, host__io_threads=8, host__dram_bytes=64 << 20)
    ndp = _cosmos(controller__dram_cache_bytes=0)
    log("RecSSD Fig. 8: SLS alone, sequential and strided ids, batch sweep")
    for pattern in ("seq", "str"):
        for batch in (1, 4, 16, 64):
            for mode, dev in (("ssd-s", base), ("recssd", ndp)):
                r = sim.run("rmc1", dev, mode, batch=batch, rows=1_000_000,
                            sequential=pattern == "seq", stride=128 if pattern == "str" else None,
                            k=1.0, batches=cfg.batches, warmup=cfg.warmup)
                out.append(_rec(f"recssd-fig8-{pattern}", r))
    log("RecSSD Fig. 10(a-c): host LRU baseline vs RecSSD with its SSD-side cache, over K")
    # One vector per 16 KiB page; the host caches 2K rows per table (RecSSD §5).
    for model in ("rmc1", "rmc2", "rmc3"):
        tables = len(sim.workload(model)["tables"])
        lru = _cosmos(host__kernel_io_ns=2_000, host__io_threads=8,
                      host__dram_bytes=2048 * tables * 4096)
        for k in (0.0, 1.0, 2.0):
            for batch in (1, 8, 32):
                for mode, dev in (("ssd-s", lru), ("recssd", ndp | {"controller": {
                        **ndp["controller"], "dram_cache_bytes": 64 << 20}})):
                    r = sim.run(model, dev, mode, batch=batch, k=k, rows=1_000_000,
                                variant="recssd", placement="one-per-page",
                                batches=cfg.batches, warmup=cfg.warmup)
                    out.append(_rec("recssd-fig10", r))
    log("RecSSD Fig. 10(d-f): + the host's static partition, against the same DRAM as an LRU")
    # RecSSD's traces use 7,812 profile ids (a 1M-row table's ids strided by 128), so 2K rows
    # a table are about 25 % of the ids in use: here, tables of that many rows, one per page.
    # (Strided ids themselves would put every row of a table on one die of this model, where
    # the baseline's synchronous threads serialise; the table's size is what the figure needs.)
    used_ids = 1_000_000 // nt.RECSSD_STRIDE
    for model in ("rmc1", "rmc2", "rmc3"):
        w = sim.workload(model, rows=used_ids, variant="recssd", placement="one-per-page")
        tables, row_bytes = len(w["tables"]), w["tables"][0]["dim"] * 4
        # the same 2K rows a table on both sides: the LRU's 4 KiB pages, the partition's rows
        lru = _cosmos(host__kernel_io_ns=2_000, host__io_threads=8,
                      host__dram_bytes=2048 * tables * 4096)
        part = _cosmos(controller__dram_cache_bytes=64 << 20,
                       host__dram_bytes=2048 * tables * row_bytes)
        for k in (0.0, 1.0, 2.0):
            for batch in (1, 8, 32):
                for mode, dev in (("ssd-s", lru), ("recssd", part)):
                    r = sim.run(model, dev, mode, batch=batch, k=k, rows=used_ids,
                                variant="recssd", placement="one-per-page",
                                batches=cfg.batches, warmup=cfg.warmup)
                    out.append(_rec("recssd-fig10d", r))
    log("RecSSD Fig. 9: NDP alone across the eight models, uniform ids")
    for model in EIGHT_MODELS:
        for batch in (1, 8, 32):
            for mode, dev in (("ssd-s", base), ("recssd", ndp)):
                r = sim.run(model, dev, mode, batch=batch, k=None, variant="recssd",
                            placement="one-per-page", batches=cfg.batches, warmup=cfg.warmup)
                out.append(_rec("recssd-fig9", r))
    log("RecSSD Fig. 11: feature size and dtype; lookups per table and tables (RM1, batch 8)")
    for dtype in ("fp32", "int8"):
        for dim in (16, 32, 64, 128, 256, 512, 1024):
            for mode, dev in (("ssd-s", base), ("recssd", ndp)):
                r = sim.run("rmc1", dev, mode, batch=8, k=None, variant="recssd", dim=dim,
                            dtype=dtype, placement="one-per-page", batches=cfg.batches,
                            warmup=cfg.warmup)
                out.append(_rec("recssd-fig11a", r, dtype=dtype))
    for tables in (8, 16, 32):
        for pooling in (20, 40, 80, 120):
            for mode, dev in (("ssd-s", base), ("recssd", ndp)):
                r = sim.run("rmc1", dev, mode, batch=8, k=None, variant="recssd", tables=tables,
                            pooling=pooling, placement="one-per-page", batches=cfg.batches,
                            warmup=cfg.warmup)
                out.append(_rec("recssd-fig11b", r))
    return out


def emb_ssd(cfg: FlashReproConfig, log: Callable[[str], None]) -> list[Record]:
    """EMB-SSD Fig. 9(a): NAND reads for 26 tables × batch 64, with merging and caching."""
    log("EMB-SSD Fig. 9: NAND reads, base / merging / merging + caching")
    w = {"tables": [{"name": f"C{i + 1}", "rows": n, "dim": 512, "row_bytes": 2048}
                    for i, n in enumerate(CRITEO_ROWS)],
         "bottom": [13, 512, 256, 64], "top": [26 * 512 + 64, 512, 256, 1],
         "placement": "packed"}
    dev = _cosmos(controller__dram_cache_bytes=52 << 20)
    out = []
    for mode in ("emb-ssd:base", "emb-ssd:merge", "emb-ssd"):
        r = sim.run(w, dev, mode, batch=64, pooling=1, k=1.0, batches=cfg.batches,
                    warmup=cfg.warmup)
        r["model"] = "criteo-26"
        out.append(_rec("embssd-fig9", r))
    return out


#: EMB-SSD Fig. 10's vector dimensions
EMB_SSD_DIMS = (256, 512, 1024)


def emb_ssd_engine(cfg: FlashReproConfig, log: Callable[[str], None]) -> list[Record]:
    """EMB-SSD Figs. 9(b) and 10 with the engine's own kernels on this machine's CPU (wall
    time, not simulated): one EMB_READ's embedding operation — 64 samples, each the sum of its
    26 tables' vectors — by the fast kernel and by its plain scalar twin, over a 256 MiB table
    of random rows."""
    log("EMB-SSD Figs. 9(b) and 10: the engine's pooling, fast against plain, over dimension")
    out = []
    for dim in EMB_SSD_DIMS:
        rows = (256 << 20) // (4 * dim)
        fast, plain = _native.kernel_cost(dim, "fp32", rows, bags=64, pooling=26,
                                          reps=cfg.kernel_reps)
        for exp in ("embssd-fig9b", "embssd-fig10"):
            out.append(Record("flash-repro", "criteo-26", 64, exp, "engine",
                              samples_per_s=64 / fast, lookups_per_s=64 * 26 / fast,
                              p50_us=fast * 1e6,
                              extra={"figure": _figure(exp), "dim": dim, "fast_s": fast,
                                     "plain_s": plain, "gain": plain / fast,
                                     "reps": cfg.kernel_reps}))
    return out


def run(cfg: FlashReproConfig, log: Callable[[str], None] = print) -> list[Record]:
    records = (rm_ssd(cfg, log) + recssd(cfg, log) + emb_ssd(cfg, log)
               + emb_ssd_engine(cfg, log))
    plots = cfg.out / "flash"
    for model in ("rmc1", "rmc2", "rmc3"):
        reps = [r.extra for r in records if r.dist == "rmssd-fig12" and r.model == model]
        sim.plot(reps, "batch", "throughput", plots / f"rmssd-fig12-{model}.png",
                 title=f"RM-SSD Fig. 12, {model}: samples/s over batch (simulated)", logy=True)
        sim.plot(reps, "batch", "latency_p50_ms", plots / f"rmssd-fig13-{model}.png",
                 title=f"RM-SSD Fig. 13, {model}: p50 latency over batch (simulated)", logy=True)
    reps = [r.extra for r in records if r.dist == "rmssd-fig14"]
    sim.plot(reps, "k", "throughput", plots / "rmssd-fig14.png",
             title="RM-SSD Fig. 14: samples/s over K (simulated, batch 8)", logy=True)
    return records


# --- report --------------------------------------------------------------------------------

def _get(records: list[Record], exp: str, **match: Any) -> list[dict[str, Any]]:
    return [r.extra for r in records if r.dist == exp
            and all(r.extra.get(k) == v for k, v in match.items())]


def _one(records: list[Record], exp: str, **match: Any) -> dict[str, Any]:
    got = _get(records, exp, **match)
    if len(got) != 1:
        raise KeyError(f"{exp} {match}: {len(got)} records")
    return got[0]


def _ndp_gain(records: list[Record], exp: str, **match: Any) -> str:
    """The baseline's mean batch latency ÷ RecSSD's at one point of ``exp``."""
    b = _one(records, exp, mode="ssd-s", **match)["latency_mean_ms"]
    return f"{b / _one(records, exp, mode='recssd', **match)['latency_mean_ms']:.2f}×"


def markdown(records: list[Record], command: str) -> str:
    md = [f"Command: `{command}`", "",
          "Simulated time on the flash device model; every number below is the model's. The "
          "papers' numbers are beside ours; `docs/reproductions.md` discusses each.", ""]
    # Table IV
    md += ["## RM-SSD Table IV: read I/O traffic reduction over SSD-S (batch 1)", "",
           "| model | RecSSD (paper) | RecSSD (ours) | EMB-VectorSum (paper) "
           "| EMB-VectorSum (ours) "
           "| RM-SSD (paper) | RM-SSD (ours) |", "|---|---:|---:|---:|---:|---:|---:|"]
    paper4 = {"rmc1": (1989, 1989, 31826), "rmc2": (1071, 1071, 137142),
              "rmc3": (546, 546, 10914)}
    for model, (p_rec, p_vec, p_rm) in paper4.items():
        base = _one(records, "rmssd-fig12", model=model, batch=1, mode="ssd-s")
        red = {m: base["link_read_bytes"] / max(1, _one(records, "rmssd-fig12", model=model,
                                                         batch=1, mode=m)["link_read_bytes"])
               for m in ("recssd", "emb-vectorsum", "rm-ssd")}
        md.append(f"| {model} | {p_rec:,} | {red['recssd']:,.0f} | {p_vec:,} | "
                  f"{red['emb-vectorsum']:,.0f} | {p_rm:,} | {red['rm-ssd']:,.0f} |")
    # Fig 10
    md += ["", "## RM-SSD Fig. 10(a): SLS time, RMC1, batch 1", "",
           "| design | SLS ms (ours) | ÷ SSD-S (ours) | paper |", "|---|---:|---:|---|"]
    paper10 = {"ssd-s": "1", "emb-mmio": "≈ 0.6", "emb-pagesum": "between",
               "emb-vectorsum": "≈ 1/16"}
    base_ms = _one(records, "rmssd-fig10a", mode="ssd-s")["embed_ms"]
    for mode, p in paper10.items():
        ms = _one(records, "rmssd-fig10a", mode=mode)["embed_ms"]
        md.append(f"| {mode} | {ms:.3f} | {ms / base_ms:.3f} (1/{base_ms / ms:.1f}) | {p} |")
    md += ["", "Fig. 10(b), EMB-VectorSum's SLS time over lookups per table (paper: linear):", "",
           "| lookups / table | SLS ms | ms per lookup (µs) |", "|---:|---:|---:|"]
    for r in sorted(_get(records, "rmssd-fig10b"), key=lambda r: r["pooling"]):
        md.append(f"| {r['pooling']} | {r['embed_ms']:.3f} | "
                  f"{r['embed_ms'] * 1e3 * r['samples'] / r['lookups']:.2f} |")
    # Fig 12/13
    md += ["", "## RM-SSD Figs. 12–13: throughput (samples/s) and p50 latency (ms) over batch", "",
           "| model | batch | SSD-S | EMB-VectorSum | RecSSD | RM-SSD | RM-SSD ÷ SSD-S | "
           "RM-SSD ÷ RecSSD | RM-SSD latency vs VectorSum |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for model in ("rmc1", "rmc2", "rmc3"):
        for batch in sorted({r["batch"] for r in _get(records, "rmssd-fig12", model=model)}):
            c = {m: _one(records, "rmssd-fig12", model=model, batch=batch, mode=m)
                 for m in ("ssd-s", "emb-vectorsum", "recssd", "rm-ssd")}
            t = {m: r["throughput"] for m, r in c.items()}
            lat = {m: r["latency_p50_ms"] for m, r in c.items()}
            md.append(
                f"| {model} | {batch} | " + " | ".join(
                    f"{t[m]:,.0f} ({lat[m]:.2f})" for m in ("ssd-s", "emb-vectorsum", "recssd",
                                                           "rm-ssd"))
                + f" | {t['rm-ssd'] / t['ssd-s']:.1f}× | {t['rm-ssd'] / t['recssd']:.2f}× | "
                f"{(lat['rm-ssd'] / lat['emb-vectorsum'] - 1) * 100:+.0f} % |")
    md += ["", "Paper: RM-SSD up to 36× SSD-S's throughput with 97 % lower latency; 1.5–2.6× "
           "RecSSD; latency 42–65 % below EMB-VectorSum; RMC1/2 flat over batch; RMC3 rising "
           "from batch 1 to 4, then flat (embedding-bound from batch 4).", ""]
    # Table V
    md += ["## RM-SSD Table V: kernel sizes the kernel search picks", "",
           "| model | ours (b0 b1 [b2] b e t1 t2) | paper | rule three's batch |",
           "|---|---|---|---:|"]
    paper5 = {"rmc1": "4×2 2×4 4×2 4×2 2×4 4", "rmc2": "4×2 2×4 4×2 4×2 2×4 4",
              "rmc3": "16×8 8×2 2×4 4×2 4×2 2×4 4"}
    for model, p in paper5.items():
        r = _one(records, "rmssd-fig12", model=model, batch=1, mode="rm-ssd")
        ours = " ".join(k for _, k in r["kernels"])
        md.append(f"| {model} | {ours} | {p} | {r['n_batch']} |")
    # Fig 14
    md += ["", "## RM-SSD Fig. 14: samples/s over the trace's locality K (batch 8)", "",
           "| model | K | RecSSD | RM-SSD | RecSSD host hits |", "|---|---:|---:|---:|---:|"]
    for model in ("rmc1", "rmc2", "rmc3"):
        for k in (0.0, 0.3, 1.0, 2.0):
            rec = _one(records, "rmssd-fig14", model=model, k=k, mode="recssd")
            rm = _one(records, "rmssd-fig14", model=model, k=k, mode="rm-ssd")
            md.append(f"| {model} | {k:g} | {rec['throughput']:,.0f} | {rm['throughput']:,.0f} | "
                      f"{rec['host_hits'] / max(rec['lookups'], 1):.0%} |")
    md += ["", "Paper: RecSSD's throughput falls as K grows (host hits 80 % → 30 %); RM-SSD "
           "stays flat.", ""]
    # Fig 3
    md += ["## RM-SSD Fig. 3: SSD-S read amplification against its DRAM (batch 1, K = 0.3)", "",
           "| model | " + " | ".join(f"{d >> 20} MiB" for d in FIG3_DRAM) + " |",
           "|---|" + "---:|" * len(FIG3_DRAM)]
    for model in ("rmc1", "rmc2", "rmc3"):
        by_dram = sorted(_get(records, "rmssd-fig3", model=model), key=lambda r: -r["dram_bytes"])
        md.append(f"| {model} | " + " | ".join(f"{r['read_amplification']:.1f}×" for r in by_dram)
                  + " |")
    md += ["", "Bytes off the flash ÷ bytes of the rows looked up (1× is the paper's *Ideal*, a "
           "byte-addressable device). Paper: it grows as DRAM shrinks, up to dozens of times.",
           ""]
    # Fig 4
    md += ["## RM-SSD Fig. 4: the traces' access pattern (one RMC1 table, 1M accesses)", "",
           "| trace | accesses to ids met once | distinct ids ÷ accesses | top-10k ids' share |",
           "|---|---:|---:|---:|"]
    for r in _get(records, "rmssd-fig4"):
        md.append(f"| {r['trace']} | {r['once_share']:.1%} | {r['distinct_share']:.1%} | "
                  f"{r['top_share']:.1%} |")
    md += ["", "Paper (its production-like trace): unique accesses 84.74 %, the top 10,000 "
           "indices 59.2 % of accesses.", ""]
    # Fig 11
    md += ["## RM-SSD Fig. 11: end to end per SLS design (batch 1, ms a batch)", "",
           "| model | design | embeddings | MLPs | total (p50) | SSD-S ÷ this |",
           "|---|---|---:|---:|---:|---:|"]
    for model in ("rmc1", "rmc2", "rmc3"):
        base = _one(records, "rmssd-fig11", model=model, mode="ssd-s")["latency_p50_ms"]
        for mode in ("ssd-s", "emb-mmio", "emb-pagesum", "emb-vectorsum"):
            r = _one(records, "rmssd-fig11", model=model, mode=mode)
            md.append(f"| {model} | {mode} | {r['embed_ms']:.2f} | {r['mlp_ms']:.2f} | "
                      f"{r['latency_p50_ms']:.2f} | {base / r['latency_p50_ms']:.1f}× |")
    md += ["", "Paper: EMB-VectorSum up to 17× SSD-S end to end; on RMC3 the MLPs dominate.", ""]
    # Fig 15
    md += ["## RM-SSD Fig. 15: NCF and WnD (batch 1, samples/s)", "",
           "| model | SSD-S | RecSSD | RM-SSD | RM-SSD ÷ SSD-S | RM-SSD ÷ RecSSD |",
           "|---|---:|---:|---:|---:|---:|"]
    for model in ("ncf", "wnd"):
        t = {m: _one(records, "rmssd-fig15", model=model, mode=m)["throughput"]
             for m in ("ssd-s", "recssd", "rm-ssd")}
        md.append(f"| {model} | {t['ssd-s']:,.0f} | {t['recssd']:,.0f} | {t['rm-ssd']:,.0f} | "
                  f"{t['rm-ssd'] / t['ssd-s']:.1f}× | {t['rm-ssd'] / t['recssd']:.1f}× |")
    md += ["", "Paper: RM-SSD ≈ 100× SSD-S and 6–15× RecSSD on NCF and WnD.", ""]
    # RecSSD Fig 8
    md += ["## RecSSD Fig. 8: the SLS operator alone on Cosmos+ (RM1 table shape)", "",
           "| pattern | batch | baseline ms | NDP ms | NDP speedup | NDP flash reads / lookup |",
           "|---|---:|---:|---:|---:|---:|"]
    for pattern in ("seq", "str"):
        for batch in (1, 4, 16, 64):
            b = _one(records, f"recssd-fig8-{pattern}", batch=batch, mode="ssd-s")
            n = _one(records, f"recssd-fig8-{pattern}", batch=batch, mode="recssd")
            md.append(f"| {pattern.upper()} | {batch} | {b['embed_ms']:.2f} | {n['embed_ms']:.2f} "
                      f"| {b['embed_ms'] / n['embed_ms']:.2f}× | "
                      f"{n['flash_reads'] / n['lookups']:.3f} |")
    md += ["", "Paper: NDP up to ≈ 4× on STR; on SEQ the baseline is faster (NDP < 1×).", ""]
    # RecSSD Fig 10
    md += ["## RecSSD Fig. 10(a–c): RecSSD (SSD-side cache) ÷ baseline (host LRU), end to end",
           "", "| model | K | batch 1 | batch 8 | batch 32 | baseline host hits "
           "| RecSSD SSD-cache hits |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for model in ("rmc1", "rmc2", "rmc3"):
        for k in (0.0, 1.0, 2.0):
            cells = [_ndp_gain(records, "recssd-fig10", model=model, k=k, batch=batch)
                     for batch in (1, 8, 32)]
            # hit rates at batch 32
            b = _one(records, "recssd-fig10", model=model, k=k, batch=32, mode="ssd-s")
            n = _one(records, "recssd-fig10", model=model, k=k, batch=32, mode="recssd")
            md.append(f"| {model} | {k:g} | " + " | ".join(cells)
                      + f" | {b['host_hits'] / b['lookups']:.0%} | "
                      f"{n['device_hits'] / n['lookups']:.0%} |")
    md += ["", "Paper: with high locality (K = 0) the baseline wins; with low locality RecSSD "
           "wins, up to 1.5×; baseline LRU hits 84 / 44 / 28 % at K = 0 / 1 / 2.", ""]
    # RecSSD Fig 10 d-f
    md += ["## RecSSD Fig. 10(d–f): + the host's static partition (same 2K rows a table as the "
           "LRU), end to end", "",
           "| model | K | batch 1 | batch 8 | batch 32 | baseline LRU hits | RecSSD partition "
           "hits | RecSSD SSD-cache hits |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for model in ("rmc1", "rmc2", "rmc3"):
        for k in (0.0, 1.0, 2.0):
            ratios = [_ndp_gain(records, "recssd-fig10d", model=model, k=k, batch=batch)
                      for batch in (1, 8, 32)]
            b = _one(records, "recssd-fig10d", model=model, k=k, batch=32, mode="ssd-s")
            n = _one(records, "recssd-fig10d", model=model, k=k, batch=32, mode="recssd")
            md.append(f"| {model} | {k:g} | " + " | ".join(ratios)
                      + f" | {b['host_hits'] / b['lookups']:.0%} | "
                      f"{n['host_hits'] / n['lookups']:.0%} | "
                      f"{n['device_hits'] / n['lookups']:.0%} |")
    md += ["", "Hit rates at batch 32. Paper: RecSSD 2× the baseline where the LRU's hit rate is "
           "low; its partition's hit rate approaches 25 % (its size against the ids in use) as "
           "batch and lookups grow.", ""]
    # RecSSD Fig 9
    md += ["## RecSSD Fig. 9: NDP alone across the eight models (uniform ids, no caches)", "",
           "| model | batch 1 | batch 8 | batch 32 | MLP share of NDP's time (batch 8) |",
           "|---|---:|---:|---:|---:|"]
    for model in EIGHT_MODELS:
        ratios = [_ndp_gain(records, "recssd-fig9", model=model, batch=batch)
                  for batch in (1, 8, 32)]
        n = _one(records, "recssd-fig9", model=model, batch=8, mode="recssd")
        md.append(f"| {model} | " + " | ".join(ratios)
                  + f" | {n['mlp_ms'] / n['latency_mean_ms']:.0%} |")
    md += ["", "Paper: no gain on some models, up to 7× on embedding-bound ones.", ""]
    # RecSSD Fig 11
    md += ["## RecSSD Fig. 11(a): feature size and dtype (RM1, batch 8, NDP ÷ baseline)", "",
           "| dtype | " + " | ".join(f"dim {d}" for d in (16, 32, 64, 128, 256, 512, 1024))
           + " |", "|---|" + "---:|" * 7]
    for dtype in ("fp32", "int8"):
        cells = [_ndp_gain(records, "recssd-fig11a", dtype=dtype, dim=dim)
                 for dim in (16, 32, 64, 128, 256, 512, 1024)]
        md.append(f"| {dtype} | " + " | ".join(cells) + " |")
    md += ["", "## RecSSD Fig. 11(b): lookups per table × tables (RM1 shapes, batch 8)", "",
           "| tables | 20 lookups | 40 | 80 | 120 |", "|---:|---:|---:|---:|---:|"]
    for tables in (8, 16, 32):
        cells = [_ndp_gain(records, "recssd-fig11b", tables=tables, pooling=pooling)
                 for pooling in (20, 40, 80, 120)]
        md.append(f"| {tables} | " + " | ".join(cells) + " |")
    md += ["", "Paper: (a) the gain falls as the vector grows against the page; (b) more tables "
           "lower it (one NDP command a table), more lookups a table raise it.", ""]
    # EMB-SSD Fig 9
    md += ["## EMB-SSD Fig. 9(a): NAND reads per batch (26 tables × 64 samples)", "",
           "| technique | NAND reads / batch (ours) | vs base (ours) | paper |",
           "|---|---:|---:|---|"]
    base_reads = _one(records, "embssd-fig9", mode="emb-ssd:base")["flash_reads"]
    paper9 = {"emb-ssd:base": "1,664", "emb-ssd:merge": "−58 %", "emb-ssd": "−85 %"}
    for mode, p in paper9.items():
        r = _one(records, "embssd-fig9", mode=mode)
        per = r["flash_reads"] / r["batches"]
        md.append(f"| {mode} | {per:,.0f} | {(r['flash_reads'] / base_reads - 1) * 100:+.0f} % "
                  f"| {p} |")
    md += ["", "## EMB-SSD Figs. 9(b) and 10: the embedding operation on the engine's kernels",
           "", "Wall time on this machine's CPU, not simulated: 64 samples, each the sum of 26 "
           "fp32 vectors, over a 256 MiB table; median of the timings, fast and plain "
           "alternated.", "",
           "| dim | fast kernel (µs) | plain scalar twin (µs) | fast ÷ plain speed-up |",
           "|---:|---:|---:|---:|"]
    for r in sorted(_get(records, "embssd-fig10"), key=lambda r: r["dim"]):
        md.append(f"| {r['dim']} | {r['fast_s'] * 1e6:,.0f} | {r['plain_s'] * 1e6:,.0f} | "
                  f"{r['gain']:.1f}× |")
    md += ["", "Paper (ARM Cortex-A53 in the drive): SIMD 3.4× (Fig. 9(b)); the operation grows "
           "linearly with dimension, about 1.7 ms at 256 to 6 ms at 1,024 (Fig. 10).", ""]
    return "\n".join(md) + "\n"


# --- the cross-check against the engine on this machine's disk ---------------------------

@dataclass
class FlashCheckConfig:
    """``nearrec bench flash-check``: the SSD-tier benchmark's cells (RMC1, uniform and Zipf
    1.05, batch 1 / 16 / 64 / 256, direct I/O, no DRAM tiers) measured on the disk and predicted
    by the model fitted to the disk: once at the start of the run, and again just before each
    cell (this disk's rate drifts by 2× within minutes)."""

    model: str = "rmc1"
    table_bytes: int = 4 * GiB
    batches: tuple[int, ...] = (1, 16, 64, 256)
    dists: tuple[str, ...] = ("uniform", "zipf1.05")
    #: the fit's queue depths: 1 fixes a read's latency, the deep ones the rates the engine runs
    #: at; the engine keeps up to 128 reads in flight in every cell, so that depth counts
    #: `deep_weight` times (the model's knee is sharper than this disk's: it cannot match 32, 64
    #: and 128 at once)
    depths: tuple[int, ...] = (1, 32, 64, 128)
    deep_weight: float = 4.0
    seconds: float = 3.0
    min_calls: int = 3
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> FlashCheckConfig:
        return cls(table_bytes=1 * GiB, batches=(1, 64), seconds=1.0)


def check(cfg: FlashCheckConfig, log: Callable[[str], None] = print) -> list[Record]:
    import time

    import numpy as np

    import nearrec

    from .sls import zipf_rows
    from .ssd import SsdConfig, _store, drop_page_cache

    path = _store(SsdConfig(model=cfg.model, table_bytes=cfg.table_bytes, seed=cfg.seed,
                            scratch=cfg.scratch), log)
    info = nearrec.info(path)
    files = [str(path / t.file) for t in info.tables]
    names = [t.name for t in info.tables]
    rows = [t.rows for t in info.tables]
    L = nearrec.model_spec(cfg.model).lookups
    drop_page_cache()
    log("calibrating the model to the disk (direct 512 B random reads at each depth)")
    weights = {max(cfg.depths): cfg.deep_weight}
    fitted, points = sim.calibrate(files, cfg.depths, seed=cfg.seed, weights=weights)
    for p in points:
        log(f"  QD {p['queue_depth']:3}: {p['reads_per_s']:9,.0f} reads/s measured, "
            f"{p['predicted_reads_per_s']:9,.0f} predicted")
    records = [Record("flash-check", cfg.model, 0, "-", "calibration", 0.0, 0.0,
                      extra={"device": fitted, "points": points})]
    real = nearrec.open(path, tier="ssd", io_queue_depth=128)
    start_model = nearrec.open(path, tier="ssd", device=fitted)
    rng = np.random.default_rng(cfg.seed)
    perms = [rng.permutation(n) for n in rows]
    probes = iter(range(1, 1_000_000))
    for dist in cfg.dists:
        for batch in cfg.batches:
            offsets = np.arange(0, batch * L, L, dtype=np.int64)

            def fresh(batch: int = batch, dist: str = dist,
                      offsets: np.ndarray = offsets) -> list[nearrec.TableLookup]:
                # A new batch for every call: a repeat could be served by a cache under the disk.
                out = []
                for t, n in enumerate(rows):
                    idx = (rng.integers(0, n, batch * L) if dist == "uniform"
                           else zipf_rows(rng, n, float(dist[4:]), batch * L, perms[t]))
                    out.append(nearrec.TableLookup(names[t], idx.astype(np.int64), offsets))
                return out

            first = fresh()
            np.testing.assert_allclose(start_model.lookup_many(first).values,
                                       real.lookup_many(first).values, rtol=1e-4, atol=1e-6)
            cell_fit, cell_points = sim.calibrate(files, cfg.depths, seed=next(probes),
                                                  weights=weights)
            cell_model = nearrec.open(path, tier="ssd", device=cell_fit)
            disk = cell_points[-1]["reads_per_s"]
            # measured: the engine on the disk, each call a batch never read before
            lat: list[float] = []
            used: list[list[nearrec.TableLookup]] = []
            start = time.perf_counter()
            while len(lat) < cfg.min_calls or time.perf_counter() - start < cfg.seconds:
                req = fresh()
                t = time.perf_counter()
                real.lookup_many(req)
                lat.append(time.perf_counter() - t)
                used.append(req)
            measured = batch * len(lat) / sum(lat)

            # predicted: the same batches on the fitted model; the engine's own work is real,
            # the time to fetch the bytes is the model's
            def predict(model: nearrec.Store, used: list[list[nearrec.TableLookup]] = used
                        ) -> list[float]:
                pred: list[float] = []
                for req in used:
                    before = model.flash_stats()
                    t = time.perf_counter()
                    model.lookup_many(req)
                    wall = time.perf_counter() - t
                    after = model.flash_stats()
                    assert before is not None and after is not None
                    # the engine's work outside the device, plus the device's time with the
                    # pooling of each row run as its read completes (overlapping the rest)
                    d = {k: (after[k] - before[k]) / 1e9
                         for k in ("served_ns", "inner_ns", "callback_ns")}
                    pred.append(max(wall - d["inner_ns"] - d["callback_ns"], 0.0)
                                + d["served_ns"])
                return pred

            pred = predict(cell_model)
            predicted = batch * len(pred) / sum(pred)
            at_start = predict(start_model)
            predicted_start = batch * len(at_start) / sum(at_start)
            del cell_model
            ratio = predicted / measured
            log(f"  {dist:9} B={batch:4}: measured {measured:9,.1f}/s, predicted "
                f"{predicted:9,.1f}/s ({ratio:.2f}x; {predicted_start / measured:.2f}x with the "
                f"start's fit); disk {disk:,.0f} reads/s")
            records.append(Record(
                "flash-check", cfg.model, batch, dist, "nearrec", samples_per_s=measured,
                lookups_per_s=measured * L * len(names),
                p50_us=float(np.percentile(np.array(lat) * 1e6, 50)),
                p99_us=float(np.percentile(np.array(lat) * 1e6, 99)),
                extra={"predicted_samples_per_s": predicted, "predicted_over_measured": ratio,
                       "predicted_p50_us": float(np.percentile(np.array(pred) * 1e6, 50)),
                       "start_fit_samples_per_s": predicted_start,
                       "start_fit_over_measured": predicted_start / measured,
                       "cell_device": cell_fit, "cell_points": cell_points,
                       "disk_reads_per_s": disk, "calls": len(lat)}))
    again = _native.random_read(files, 20_000, 128, next(probes))["items_per_s"]
    records[0].extra["end_reads_per_s"] = again
    log(f"disk at the end: {again:,.0f} reads/s at QD 128")
    return records


def check_markdown(records: list[Record], command: str) -> str:
    cal = records[0].extra
    md = [f"Command: `{command}`", "",
          "The model fitted to this disk in the same run (direct 512 B random reads at each "
          "queue depth), then the SSD-tier benchmark's cells run on the disk by the engine and "
          "predicted: the same batches through the engine on the fitted model — its own CPU "
          "work real, the reads the model's simulated time, the pooling of each row started "
          "when the model says its read completes (as it overlaps the reads on the disk).", "",
          "| queue depth | measured reads/s | model reads/s | model ÷ measured |",
          "|---:|---:|---:|---:|"]
    for p in cal["points"]:
        md.append(f"| {p['queue_depth']} | {p['reads_per_s']:,.0f} | "
                  f"{p['predicted_reads_per_s']:,.0f} | "
                  f"{p['predicted_reads_per_s'] / p['reads_per_s']:.2f} |")
    dev = cal["device"]
    f = dev["flash"]
    md += ["", f"Fitted: {f['channels']} parallel units, {f['page_read_ns'] / 1e3:.0f} µs per "
           f"page read, {dev['controller']['command_ns'] / 1e3:.1f} µs of command handling, "
           f"{dev['host']['user_io_ns'] / 1e3:.1f} µs of host I/O work per read. The disk read "
           f"{cal.get('end_reads_per_s', 0):,.0f}/s at depth 128 at the end of the run.", "",
           "Each cell: the disk measured and the model fitted again just before it (\"cell's "
           "fit\"), the engine timed on the disk, then the same batches predicted by the cell's "
           "fit and by the fit from the start of the run.", "",
           "| dist | batch | measured samples/s (p50 ms) | predicted, cell's fit | ÷ measured | "
           "within ±25 % | predicted, start's fit | ÷ measured | disk reads/s at QD 128 "
           "before the cell |", "|---|---:|---:|---:|---:|:---:|---:|---:|---:|"]
    for r in records[1:]:
        x = r.extra
        ok = "yes" if abs(x["predicted_over_measured"] - 1) <= 0.25 else "no"
        md.append(f"| {r.dist} | {r.batch} | {r.samples_per_s:,.1f} ({r.p50_us / 1e3:.1f}) | "
                  f"{x['predicted_samples_per_s']:,.1f} | {x['predicted_over_measured']:.2f} | "
                  f"{ok} | {x['start_fit_samples_per_s']:,.1f} | "
                  f"{x['start_fit_over_measured']:.2f} | {x['disk_reads_per_s']:,.0f} |")
    return "\n".join(md) + "\n"


#: ``nearrec bench flash-repro`` (its records' figures under ``--out``) and ``flash-check``
HARNESSES = {
    "flash-repro": Harness(FlashReproConfig, FlashReproConfig.quick,
                           {"--table-bytes": "table_bytes", "--out": "out"}, run, markdown),
    "flash-check": Harness(FlashCheckConfig, FlashCheckConfig.quick,
                           {"--table-bytes": "table_bytes", "--batches": "batches",
                            "--scratch": "scratch"},
                           check, check_markdown)}
