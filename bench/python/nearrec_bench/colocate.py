"""``nearrec bench colocate``: the device reads row co-location saves, with and without read
merging, in front of no DRAM tier and of the planner's DRAM tiers.

Per (trace, DRAM) cell, on the same requests: the store as built (rows by id), and co-located
copies whose order was learnt from the trace's warm-up part (``frequency``: most-read rows first;
``first_touch``: rows in the order the warm-up first reads them), each served by the SSD tier
with read merging on (the default: rows in one block, or in neighbouring blocks, share a read)
and off (every distinct row its own read). DRAM: ``none`` (the SSD tier alone), or the
planner's plan at a share of the table bytes, made from the same warm-up part. Reads and
rows are counted on the timed part only; orders and plans never see it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import nearrec
from nearrec import trace as nt
from nearrec.plan import COLOCATIONS, colocate, make_plan

from .cache import (
    CacheBenchConfig,
    Cell,
    _record,
    _store,
    _timed,
    _warm,
    in_memory,
    made_trace,
    warm_part,
)
from .harness import Harness
from .report import Record
from .ssd import drop_page_cache


@dataclass
class ColocateBenchConfig(CacheBenchConfig):
    """The cache benchmark's store, traces and warm-up split (so both reuse them)."""

    models: tuple[str, ...] = ("rmc1",)
    traces: tuple[str, ...] = ("zipf1.05", "k1", "k1-recssd")
    #: DRAM in front of the SSD tier: 0 = none, else the plan at this share of table bytes
    drams: tuple[float, ...] = (0.0, 0.06, 0.25)
    batch: int = 64
    seconds: float = 6.0

    @classmethod
    def quick(cls) -> ColocateBenchConfig:
        return cls(table_bytes=512 << 20, bags={"rmc1": 3_000}, seconds=1.0,
                   drams=(0.0, 0.25), traces=("zipf1.05", "k1-recssd"))


def run(cfg: ColocateBenchConfig, log: Callable[[str], None] = print) -> list[Record]:
    model = cfg.models[0]
    path = _store(cfg, model, log)
    info = nearrec.info(path)
    spec = nearrec.model_spec(model)
    per_sample = spec.lookups * len(info.tables)
    records: list[Record] = []
    for tname in cfg.traces:
        tr = in_memory(nt.load(made_trace(cfg, model, tname, info.path, log)))
        warm = int(tr.bags * cfg.warm_share)
        head = warm_part(tr, warm)
        stores = {"by_id": path}
        for how in COLOCATIONS:
            out = cfg.scratch / f"colocate-{model}-{tname}-{how}"
            colocate(path, head, out, how=how, overwrite=True, progress=False)
            stores[how] = out
        for dram in cfg.drams:
            budget = int(info.total_bytes * dram)
            plan = make_plan(info, head, budget) if budget else None
            cell = Cell(model, dram, tname, cfg.batch)
            for layout, spath in stores.items():
                for merge in (True, False):
                    drop_page_cache()
                    s = nearrec.open(spath, tier="ssd", plan=plan, dram_budget=budget,
                                     merge=merge)

                    def fn(reqs: list[Any], s: nearrec.Store = s) -> Any:
                        return s.lookup_many(reqs)

                    _warm(fn, tr, warm, cfg.batch)
                    before = s.stats()
                    lat = _timed(fn, tr, warm, cfg.batch, cfg.seconds)
                    after = s.stats()
                    n = max(1, len(lat) * cfg.batch)
                    d = {k: (float(after[k]) - float(before[k])) / n
                         for k in ("device_reads", "unique_rows", "bytes_read")}
                    system = f"{layout}{'' if merge else '.nomerge'}"
                    records.append(_record(cell, system, lat, per_sample, {
                        "dram_bytes": budget, "layout": layout, "merge": merge,
                        "device_reads_per_sample": d["device_reads"],
                        "rows_read_per_sample": d["unique_rows"],
                        "bytes_read_per_sample": d["bytes_read"],
                        "dram_hit_ratio": float(after["dram_hit_ratio"])}))
                    del s
                    r = records[-1]
                    log(f"  {tname:>9} dram {round(dram * 100):>2}% {system:<20} "
                        f"reads/sample {d['device_reads']:7.1f}  rows/sample "
                        f"{d['unique_rows']:7.1f}  {r.samples_per_s:7,.0f} samples/s")
    return records


def markdown(records: list[Record], command: str) -> str:
    from .report import environment

    env = environment()
    lines = [f"# nearrec bench colocate — {env['time']}", "",
             f"Command: `{command}`; machine: {env['cpus']} CPUs.", "",
             "Device reads per sample on the timed part of each trace (RMC1, batch "
             f"{records[0].batch if records else 64}), by row layout; orders and plans learnt "
             "from the warm-up part only. DRAM: none, or the planner's plan at that share of "
             "the table bytes. *saved*: reads saved against the rows-by-id store with the same "
             "merging. Samples/s are medians of batches; the disk drifts between cells.", "",
             "| trace | DRAM | layout | merge | rows read/sample | reads/sample | saved | "
             "samples/s | p99 µs |", "|---|---|---|---|---|---|---|---|---|"]
    base: dict[tuple[str, bool], float] = {}
    for r in records:
        merge = bool(r.extra["merge"])
        if r.extra["layout"] == "by_id":
            base[(r.dist, merge)] = r.extra["device_reads_per_sample"]
        b = base.get((r.dist, merge), 0.0)
        reads = r.extra["device_reads_per_sample"]
        saved = f"{100 * (1 - reads / b):.1f} %" if b else "—"
        trace, _, dram = r.dist.partition("@")
        lines.append(f"| {trace} | {'none' if dram == '0%' else dram} | {r.extra['layout']} | "
                     f"{'on' if merge else 'off'} | {r.extra['rows_read_per_sample']:.1f} | "
                     f"{reads:.1f} | {saved} | {r.samples_per_s:,.0f} | {r.p99_us:,.0f} |")
    return "\n".join(lines) + "\n"


#: ``nearrec bench colocate``
HARNESSES = {"colocate": Harness(ColocateBenchConfig, ColocateBenchConfig.quick,
                                 {"--table-bytes": "table_bytes", "--traces": "traces",
                                  "--budgets": "drams", "--scratch": "scratch"},
                                 run, markdown)}


__all__ = ["HARNESSES", "ColocateBenchConfig", "markdown", "run"]
