"""``nearrec bench ssd-dtypes``: the SSD tier on one table stored in each dtype (fp32, row-wise
int8 / int4 / int2, fp8), at one DRAM budget in bytes for all, beside the disk's own limit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import nearrec

from . import _native
from .harness import Harness
from .report import Record, ratio_text
from .sls import zipf_rows
from .ssd import drop_page_cache, time_calls


@dataclass
class SsdDtypeConfig:
    #: rows of the one table, the same in every dtype and dim (fp32 at dim 64: 1 GiB)
    rows: int = 4 << 20
    dims: tuple[int, ...] = (64, 128)
    dtypes: tuple[str, ...] = ("fp32", "int8", "int4", "int2", "fp8")
    #: DRAM budgets as shares of the fp32 table's bytes: one byte budget for every dtype
    budgets: tuple[float, ...] = (0.0, 0.1)
    batches: tuple[int, ...] = (16, 256)
    lookups: int = 40
    seconds: float = 3.0
    rounds: int = 3
    queue_depth: int = 128
    #: batches of a cell (and as many again to warm the DRAM tiers on)
    distinct_batches: int = 200
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> SsdDtypeConfig:
        return cls(rows=1 << 20, batches=(64,), seconds=0.6)


def _dtype_store(cfg: SsdDtypeConfig, dtype: str, dim: int, log: Callable[[str], None]) -> Path:
    """One table of ``cfg.rows`` rows of ``dim`` seeded random values stored as ``dtype``."""
    path = cfg.scratch / f"ssd-dtype-{dtype}-{dim}-{cfg.rows}"
    try:
        info = nearrec.info(path)
        if info.params.get("seed") == cfg.seed:
            return path
    except nearrec.NearrecError:
        pass
    log(f"building {path}")
    w = nearrec._native.NativeStoreWriter(str(path), True, f'{{"seed": {cfg.seed}}}', 0, False)
    w.begin_table("t", cfg.rows, dim, dtype, 4096)
    w.write_random(cfg.seed, 0)
    w.finish_table(None)
    w.commit()
    return path


def run_dtypes(cfg: SsdDtypeConfig, log: Callable[[str], None] = print) -> list[Record]:
    """One table in each dtype at each dim, on the SSD tier behind one DRAM byte budget (a share
    of the fp32 table's bytes, the same for every dtype): lookups/s, the device's reads, the
    useful rows each read brought, with the disk's random-read rate measured in every round
    beside them and the dtypes interleaved."""
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(cfg.seed)
    records: list[Record] = []
    L = cfg.lookups
    for dim in cfg.dims:
        paths = {d: _dtype_store(cfg, d, dim, log) for d in cfg.dtypes}
        infos = {d: nearrec.info(p) for d, p in paths.items()}
        files = [str(paths[d] / i.tables[0].file) for d, i in infos.items()]
        row_bytes = {d: i.tables[0].row_bytes for d, i in infos.items()}
        fp32_bytes = cfg.rows * 4 * dim
        for budget in cfg.budgets:
            stores = {d: nearrec.open(p, tier="ssd", io_queue_depth=cfg.queue_depth,
                                      dram_budget=int(budget * fp32_bytes))
                      for d, p in paths.items()}
            for batch in cfg.batches:
                offsets = np.arange(0, batch * L, L, dtype=np.int64)
                # one trace for every dtype: Zipf 1.05 over the rows, so that a budget helps;
                # batches to warm the DRAM tiers on, then others, never repeated within a round
                # of one dtype, to time
                perm = rng.permutation(cfg.rows)
                n = cfg.distinct_batches
                ids = zipf_rows(rng, cfg.rows, 1.05, 2 * n * batch * L, perm)
                bags = [[nearrec.TableLookup("t", part, offsets)]
                        for part in np.split(ids, 2 * n)]
                warm, reqs = bags[:n], bags[n:]
                for st in stores.values():
                    for w in warm:
                        st.lookup_many(w)
                lats: dict[str, list[float]] = {d: [] for d in stores}
                rounds: dict[str, list[float]] = {d: [] for d in stores}
                io = {d: np.zeros(3) for d in stores}  # device reads, bytes read, useful bytes
                disk: list[float] = []
                order = list(stores)
                for k in range(cfg.rounds):
                    disk.append(_native.random_read(files, 20_000, cfg.queue_depth)["items_per_s"])
                    for d in order[k % len(order):] + order[:k % len(order)]:
                        st = stores[d]
                        drop_page_cache()
                        before = st.stats()
                        lat = time_calls(lambda i, st=st, reqs=reqs: st.lookup_many(reqs[i]),
                                    cfg.seconds / cfg.rounds, 1, len(reqs))
                        after = st.stats()
                        io[d] += [float(after[x]) - float(before[x])
                                  for x in ("device_reads", "bytes_read", "useful_bytes")]
                        lats[d] += lat
                        rounds[d].append(batch * len(lat) / sum(lat))
                disk_rate = float(np.median(disk))
                for d in stores:
                    lat_a = np.array(lats[d])
                    secs, calls = float(lat_a.sum()), len(lat_a)
                    reads, _, useful = (float(x) for x in io[d])
                    lookups = calls * batch * L
                    sps = float(np.median(rounds[d]))
                    p50, p99 = (float(x) for x in np.percentile(lat_a * 1e6, [50, 99]))
                    records.append(Record(
                        "ssd.dtype", f"dim{dim}", batch, f"budget{budget:g}", f"nearrec[{d}]",
                        samples_per_s=sps, lookups_per_s=sps * L, p50_us=p50, p99_us=p99,
                        extra={"dtype": d, "dim": dim, "row_bytes": row_bytes[d],
                               "budget": budget, "dram_budget_bytes": int(budget * fp32_bytes),
                               "table_bytes": infos[d].total_bytes,
                               "reads_per_lookup": reads / lookups,
                               "useful_rows_per_read": (useful / row_bytes[d] / reads
                                                        if reads else 0.0),
                               "reads_per_s": reads / secs, "disk_reads_per_s": disk_rate,
                               "of_device_limit": reads / secs / disk_rate,
                               "rounds_disk_reads_per_s": disk,
                               "rounds_samples_per_s": rounds[d]}))
                cell = records[-len(stores):]
                log(f"  dim {dim} budget {budget:g} B={batch}: disk {disk_rate:,.0f} reads/s; "
                    + ", ".join(f"{r.extra['dtype']} {r.lookups_per_s:,.0f} lookups/s "
                                f"({r.extra['reads_per_lookup']:.2f} reads a lookup)"
                                for r in cell))
            del stores
    return records


def dtype_markdown(records: list[Record], command: str) -> str:
    lines = [f"Command: `{command}`", "",
             "One table (the same rows in every dtype) on the SSD tier, read with O_DIRECT (the "
             "page cache dropped before every system and round), behind one DRAM byte budget "
             "given as a share of the fp32 table's bytes — the same bytes for every dtype, so a "
             "narrower dtype holds more of its table in them. Zipf 1.05 bags of 40 lookups, sum "
             "pooling, the dtypes interleaved round by round; the disk's random-read rate "
             "(direct, 512 B, the engine's queue depth) measured in every round beside them "
             "(median). `useful rows / read`: rows the device's reads brought that a lookup "
             "used, per read; `of disk`: the store's reads/s ÷ the disk's rate.", "",
             "| dim | budget | batch | dtype | row B | table MiB | lookups/s | × fp32 | "
             "reads / lookup | useful rows / read | reads/s (of disk) | p50 / p99 ms |",
             "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    cells: dict[tuple[str, str, int], dict[str, Record]] = {}
    for r in records:
        if r.bench == "ssd.dtype":
            cells.setdefault((r.model, r.dist, r.batch), {})[r.extra["dtype"]] = r
    for (_, _, batch), c in cells.items():
        base = c.get("fp32")
        for d, r in c.items():
            e = r.extra
            lines.append(
                f"| {e['dim']} | {100 * e['budget']:g} % | {batch} | {d} | {e['row_bytes']} | "
                f"{e['table_bytes'] / 2**20:,.0f} | {r.lookups_per_s:,.0f} | "
                f"{ratio_text(r, base) if base is not None and d != 'fp32' else '—'} | "
                f"{e['reads_per_lookup']:.3f} | {e['useful_rows_per_read']:.2f} | "
                f"{e['reads_per_s']:,.0f} ({100 * e['of_device_limit']:.0f} %) | "
                f"{r.p50_us / 1e3:,.2f} / {r.p99_us / 1e3:,.2f} |")
    return "\n".join(lines) + "\n"


#: ``nearrec bench ssd``, ``ssd-dtypes``, ``ssd-tuning``, ``ssd-verify`` and ``ssd-cost``


HARNESSES = {"ssd-dtypes": Harness(SsdDtypeConfig, SsdDtypeConfig.quick, {"--scratch": "scratch"},
                                   run_dtypes, dtype_markdown)}
