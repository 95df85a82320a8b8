"""``nearrec bench keyed``: keyed tables (rows by raw 64-bit ids) side by side, on the same
requests (ids random 64-bit values, drawn Zipf(1.05) over the table):

From DRAM:

- ``store.keyed.dram``: a keyed table kept in a store (``from_numpy(keys=)``), the DRAM tier:
  ids resolved through its index, rows pooled where they lie;
- ``store.rows.dram``: the same rows by their row numbers (what resolving ids costs);
- ``keyed``: :class:`nearrec.KeyedTable`, the in-process keyed table (rows in its own hash table);
- ``torch.searchsorted``: what a PyTorch user does without a hash table: ids mapped to rows
  with ``torch.searchsorted`` over the sorted ids, then ``nn.EmbeddingBag``.

From SSD, at a DRAM budget of 10 % and 25 % of the table's rows (direct I/O for every system):

- ``store.keyed.ssd``: the keyed table on the SSD tier — its index takes its share of the
  budget, the row caches the rest; ``store.keyed.ssd+index``: the same with the index's bytes
  added to the budget, so that its row caches are the dense store's (the index's cost apart);
- ``store.rows.ssd``: the same rows by row number, all of the budget for caches;
- ``rocksdb.multiget``: RocksDB (``rocksdict``; what FBGEMM's SSD path keeps rows in), one
  ``multi_get`` of the batch's ids, the rows pooled by the client; its block cache the same
  budget (index and filter blocks inside it), direct reads;
- ``limit.random_read``: the disk's random 4 KiB reads a second, measured beside them.

Every pass (the warm-up, each round) has batches of its own, drawn from one trace.

Durable inserts of new keys (group ``inserts``): calls of ``insert_batch`` new keys each into a
live keyed table with room for them (``capacity``), each call synced before it returns (the
store's default ``durability = "sync"``; compactions in the background as the delta fills):

- ``store.keyed.insert``: writes by key (each new key given a free row as its record is logged);
- ``store.rows.write``: the same rows written by row number into a dense live table (what
  deciding the keys' rows costs);
- ``rocksdb.put``: a RocksDB ``WriteBatch`` of the keys' rows per call, ``sync=True``.

With ``--scale-keys N``: a keyed table of N keys (fp16 rows) built, opened and looked up on the
SSD tier — build time, index memory per key, lookups a second against the disk's limit.
"""

from __future__ import annotations

import gc
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import nearrec
from nearrec import trace as nt
from nearrec.keyed import index_bytes as key_index_bytes

from . import _native
from .harness import Harness
from .report import Record
from .ssd import drop_page_cache


@dataclass
class KeyedBenchConfig:
    rows: int = 1_000_000
    dim: int = 64
    batch: int = 256
    pooling: int = 40
    batches: int = 40
    rounds: int = 5
    budgets: tuple[float, ...] = (0.10, 0.25)
    limit_reads: int = 200_000
    rocks: bool = True
    #: the inserts: keys the table starts with, calls per round, new keys a call
    insert_base: int = 100_000
    insert_calls: int = 100
    insert_batch: int = 256
    #: keys of the scale run (0: none)
    scale_keys: int = 0
    scale_dim: int = 16
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> KeyedBenchConfig:
        return cls(rows=100_000, batches=10, rounds=3, limit_reads=50_000, insert_base=10_000,
                   insert_calls=30)


def _time(fn: Callable[[int], Any], batches: int, threads: int = 1, first: int = 0) -> float:
    """Seconds to serve batches `first .. first + batches` split over `threads` caller
    threads."""
    def work(t: int) -> None:
        for b in range(first + t, first + batches, threads):
            fn(b)

    start = time.perf_counter()
    if threads == 1:
        work(0)
    else:
        ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
    return time.perf_counter() - start


def _rocks(path: Path, keys: np.ndarray, values: np.ndarray, budget: int) -> Any:
    """A RocksDB of `keys` (8 bytes, little-endian) to their fp32 rows, compacted, opened with
    a block cache of `budget` bytes holding index and filter blocks too, and direct reads."""
    from rocksdict import BlockBasedOptions, Cache, Options, Rdict, WriteBatch

    def options() -> Any:
        o = Options(raw_mode=True)
        o.set_use_direct_reads(True)
        o.set_use_direct_io_for_flush_and_compaction(True)
        t = BlockBasedOptions()
        t.set_block_cache(Cache(max(budget, 1 << 20)))
        t.set_cache_index_and_filter_blocks(True)
        t.set_bloom_filter(10, False)
        o.set_block_based_table_factory(t)
        return o

    if not (path / "CURRENT").exists():
        shutil.rmtree(path, ignore_errors=True)
        db = Rdict(str(path), options())
        kb = keys.astype("<i8").tobytes()
        vb = np.ascontiguousarray(values, "<f4").tobytes()
        rb = values.shape[1] * 4
        for i in range(0, len(keys), 10_000):
            wb = WriteBatch(raw_mode=True)
            for j in range(i, min(len(keys), i + 10_000)):
                wb.put(kb[8 * j:8 * j + 8], vb[rb * j:rb * (j + 1)])
            db.write(wb)
        db.flush()
        db.compact_range(None, None)
        db.close()
    return Rdict(str(path), options())


def _rocks_fn(db: Any, ids: list[np.ndarray], offsets: list[np.ndarray],
              dim: int) -> Callable[[int], Any]:
    def fn(b: int) -> Any:
        got = db.get([k.tobytes() for k in ids[b].astype("<i8")])
        rows = np.frombuffer(b"".join(got), "<f4").reshape(-1, dim)
        return np.add.reduceat(rows, offsets[b], axis=0)
    return fn


def _measure(name: str, group: str, fn: Callable[[int], Any], cfg: KeyedBenchConfig,
             model: str, log: Callable[[str], None], threads: int = 1,
             extra: dict[str, Any] | None = None) -> Record:
    lookups = cfg.batch * cfg.pooling * cfg.batches
    # every pass its own batches: a round repeating the last one's would find them all cached
    _time(fn, cfg.batches, threads)  # warm
    rounds = [lookups / _time(fn, cfg.batches, threads, (r + 1) * cfg.batches)
              for r in range(cfg.rounds)]
    med = statistics.median(rounds)
    log(f"  {group:<9} {name:<20} {med / 1e6:6.2f} M lookups/s  (rounds "
        + ", ".join(f"{r / 1e6:.2f}" for r in rounds) + ")")
    return Record("keyed", model, cfg.batch, "zipf1.05", name,
                  samples_per_s=med / cfg.pooling, lookups_per_s=med,
                  extra={"rounds_lookups_per_s": rounds, "threads": threads, "group": group,
                         **(extra or {})})


def run(cfg: KeyedBenchConfig, log: Callable[[str], None] = print) -> list[Record]:
    import torch

    cfg.scratch.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(cfg.seed)
    keys = np.unique(rng.integers(-(2**63), 2**63 - 1, cfg.rows, dtype=np.int64))
    values = rng.standard_normal((len(keys), cfg.dim)).astype(np.float32)
    order = rng.permutation(len(keys))  # keys in the store in no order of theirs
    keys_in, values_in = keys[order], values[order]
    model = f"{len(keys)}x{cfg.dim}"
    keyed_path = cfg.scratch / f"keyed-{model}"
    rows_path = cfg.scratch / f"keyed-rows-{model}"
    nearrec.from_numpy(keyed_path, {"ids": values_in}, keys={"ids": keys_in}, overwrite=True)
    nearrec.from_numpy(rows_path, {"ids": values_in}, overwrite=True)
    table = nearrec.KeyedTable.from_arrays("ids", keys_in, values_in, capacity=len(keys))
    passes = cfg.batches * (cfg.rounds + 1)  # the warm-up's and each round's own batches
    tr = nt.zipf(len(keys), cfg.batch * passes, cfg.pooling, alpha=1.05, seed=cfg.seed)
    lookups = [tr.lookup(b * cfg.batch, (b + 1) * cfg.batch) for b in range(passes)]
    # the trace's rows are positions in the store (the keys' order there)
    positions = [np.asarray(r.indices) for r in lookups]
    offsets = [np.asarray(r.offsets) for r in lookups]
    ids = [keys_in[p] for p in positions]
    sorted_keys = torch.from_numpy(keys)  # np.unique sorted them
    bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(values), mode="sum")

    def torch_fn(b: int) -> Any:
        with torch.inference_mode():
            pos = torch.searchsorted(sorted_keys, torch.from_numpy(ids[b]))
            return bag(pos, torch.from_numpy(offsets[b]))

    def store_fn(store: Any, by_key: bool) -> Callable[[int], Any]:
        return lambda b: store.lookup("ids", ids[b] if by_key else positions[b], offsets[b])

    keyed_dram = nearrec.open(keyed_path, tier="dram")
    rows_dram = nearrec.open(rows_path, tier="dram")
    want = torch_fn(0).numpy()
    for fn in (store_fn(keyed_dram, True), store_fn(rows_dram, False),
               lambda b, t=table: t.lookup(ids[b], offsets[b])):
        np.testing.assert_allclose(fn(0), want, rtol=1e-5, atol=1e-5)
    index_bytes = int(keyed_dram.stats()["keyed_index_bytes"])
    log(f"{model}: index {index_bytes / 2**20:.1f} MiB, {index_bytes / len(keys):.2f} B a key")
    records = [
        _measure("store.keyed.dram", "dram", store_fn(keyed_dram, True), cfg, model, log,
                 extra={"index_bytes": index_bytes, "bytes_per_key": index_bytes / len(keys)}),
        _measure("store.rows.dram", "dram", store_fn(rows_dram, False), cfg, model, log),
        _measure("keyed", "dram", lambda b, t=table: t.lookup(ids[b], offsets[b]), cfg, model,
                 log),
        _measure("torch.searchsorted", "dram", torch_fn, cfg, model, log),
    ]
    keyed_dram.close()
    rows_dram.close()
    del table
    gc.collect()

    data_bytes = nearrec.info(rows_path).total_bytes
    files = [str(rows_path / t.file) for t in nearrec.info(rows_path).tables]
    have_rocks = cfg.rocks
    if have_rocks:
        try:
            import rocksdict  # noqa: F401
        except ImportError:
            have_rocks = False
            log("rocksdict is not installed: RocksDB is left out (pip install rocksdict)")
    for share in cfg.budgets:
        budget = int(share * data_bytes)
        group = f"ssd@{round(100 * share)}%"
        drop_page_cache()
        disk = _native.random_read(files, cfg.limit_reads, 128)["items_per_s"]
        log(f"  {group:<9} disk {disk:,.0f} random reads/s; budget {budget / 2**20:.1f} MiB")
        records.append(Record("keyed", model, 0, "-", "limit.random_read", 0.0, 0.0,
                              extra={"group": group, "reads_per_s": disk}))
        # the index inside the budget (the row caches get the rest), and beside it (the row
        # caches get what the rows' store gets: the index's own cost apart)
        for name, given in (("store.keyed.ssd", budget),
                            ("store.keyed.ssd+index", budget + index_bytes)):
            if given <= index_bytes:
                log(f"  {group:<9} the index ({index_bytes:,} B) does not fit the budget: "
                    f"{name} left out")
                continue
            s = nearrec.open(keyed_path, tier="ssd", dram_budget=given)
            np.testing.assert_allclose(store_fn(s, True)(0), want, rtol=1e-5, atol=1e-5)
            r = _measure(name, group, store_fn(s, True), cfg, model, log,
                         extra={"budget_bytes": given})
            r.extra.update(_reads(s))
            records.append(r)
            s.close()
        s = nearrec.open(rows_path, tier="ssd", dram_budget=budget)
        r = _measure("store.rows.ssd", group, store_fn(s, False), cfg, model, log)
        r.extra.update(_reads(s))
        records.append(r)
        s.close()
        if have_rocks:
            db = _rocks(cfg.scratch / f"keyed-rocks-{model}", keys_in, values_in, budget)
            fn = _rocks_fn(db, ids, offsets, cfg.dim)
            np.testing.assert_allclose(fn(0), want, rtol=1e-5, atol=1e-5)
            records.append(_measure("rocksdb.multiget", group, fn, cfg, model, log))
            db.close()
        gc.collect()
    records.extend(_inserts(cfg, have_rocks, log))
    if cfg.scale_keys:
        records.extend(_scale(cfg, log))
    return records


def _inserts(cfg: KeyedBenchConfig, rocks: bool, log: Callable[[str], None]) -> list[Record]:
    """Durable inserts of new keys a second (see the module docs), each system on the same
    calls: a warm-up round, then `cfg.rounds` rounds of `cfg.insert_calls` calls."""
    rng = np.random.default_rng(cfg.seed + 2)
    n0, per, calls = cfg.insert_base, cfg.insert_batch, cfg.insert_calls
    total = per * calls * (cfg.rounds + 1)
    keys = np.unique(rng.integers(-(2**63), 2**63 - 1, (n0 + total) * 2, dtype=np.int64))
    keys = rng.permutation(keys)[:n0 + total]
    values = rng.standard_normal((n0 + total, cfg.dim)).astype(np.float32)
    model = f"{n0}+{total}x{cfg.dim}"
    keyed_path = cfg.scratch / f"keyed-insert-{model}"
    rows_path = cfg.scratch / f"keyed-insert-rows-{model}"
    nearrec.from_numpy(keyed_path, {"ids": values[:n0]}, keys={"ids": keys[:n0]},
                       capacity={"ids": n0 + total}, overwrite=True)
    nearrec.from_numpy(rows_path, {"ids": np.zeros((n0 + total, cfg.dim), np.float32)},
                       overwrite=True)

    def call(r: int, c: int) -> slice:
        first = n0 + (r * calls + c) * per
        return slice(first, first + per)

    def measure(name: str, insert: Callable[[slice], Any]) -> Record:
        rates = []
        for r in range(cfg.rounds + 1):
            start = time.perf_counter()
            for c in range(calls):
                insert(call(r, c))
            rates.append(per * calls / (time.perf_counter() - start))
        rounds = rates[1:]  # the first round warms
        med = statistics.median(rounds)
        log(f"  {'inserts':<9} {name:<20} {med / 1e3:8.1f} k keys/s durable  (rounds "
            + ", ".join(f"{x / 1e3:.1f}" for x in rounds) + ")")
        return Record("keyed", model, per, "-", name, samples_per_s=med, lookups_per_s=med,
                      extra={"rounds_lookups_per_s": rounds, "group": "inserts",
                             "keys_per_call": per})

    records = []
    store = nearrec.open(keyed_path, tier="ssd", writable=True, durability="sync")
    records.append(measure("store.keyed.insert",
                           lambda s: store.write("ids", keys[s], values[s])))
    got = store.read_rows("ids", keys[n0 + total - per:])
    np.testing.assert_array_equal(got, values[n0 + total - per:])  # every key written landed
    records[-1].extra["keys_held"] = store.tables["ids"].keys
    store.close()
    store = nearrec.open(rows_path, tier="ssd", writable=True, durability="sync")
    rows = np.arange(n0 + total)
    records.append(measure("store.rows.write",
                           lambda s: store.write("ids", rows[s], values[s])))
    store.close()
    if rocks:
        from rocksdict import Options, Rdict, WriteBatch, WriteOptions
        path = cfg.scratch / f"keyed-insert-rocks-{model}"
        shutil.rmtree(path, ignore_errors=True)
        db = Rdict(str(path), Options(raw_mode=True))
        sync = WriteOptions()
        sync.sync = True
        db.set_write_options(sync)
        kb = keys.astype("<i8").tobytes()
        vb = np.ascontiguousarray(values, "<f4").tobytes()
        rb = cfg.dim * 4

        def put(s: slice) -> None:
            wb = WriteBatch(raw_mode=True)
            for j in range(s.start, s.stop):
                wb.put(kb[8 * j:8 * j + 8], vb[rb * j:rb * (j + 1)])
            db.write(wb)

        records.append(measure("rocksdb.put", put))
        db.close()
        shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(keyed_path, ignore_errors=True)
    shutil.rmtree(rows_path, ignore_errors=True)
    return records


def _reads(store: Any) -> dict[str, float]:
    st = store.stats()
    return {"dram_hit_ratio": float(st.get("dram_hit_ratio", 0.0)),
            "device_reads": float(st.get("device_reads", 0.0))}


def _scale(cfg: KeyedBenchConfig, log: Callable[[str], None]) -> list[Record]:
    """A keyed table of `cfg.scale_keys` keys: build time, index bytes per key, and lookups a
    second on the SSD tier (its index and a row cache in DRAM) beside the disk's limit."""
    n, dim = cfg.scale_keys, cfg.scale_dim
    rng = np.random.default_rng(cfg.seed + 1)
    path = cfg.scratch / f"keyed-scale-{n}"
    src = cfg.scratch / f"keyed-scale-{n}.npy"
    # distinct by construction, in no order: SplitMix64's finaliser is a bijection of 64 bits
    z = np.arange(n, dtype=np.uint64) + np.uint64(cfg.seed) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    keys = (z ^ (z >> np.uint64(31))).view(np.int64)
    del z
    rows = np.lib.format.open_memmap(src, mode="w+", dtype=np.float16, shape=(n, dim))
    for i in range(0, n, 1 << 22):
        j = min(n, i + (1 << 22))
        rows[i:j] = rng.standard_normal((j - i, dim), dtype=np.float32)
    rows.flush()
    del rows
    start = time.perf_counter()
    nearrec.from_numpy(path, {"ids": src}, dtype="fp16", keys={"ids": keys}, overwrite=True)
    build_s = time.perf_counter() - start
    src.unlink()
    info = nearrec.info(path)
    files = [str(path / t.file) for t in info.tables]
    drop_page_cache()
    disk = _native.random_read(files, cfg.limit_reads, 128)["items_per_s"]
    start = time.perf_counter()
    budget = key_index_bytes(n) + info.total_bytes // 100
    store = nearrec.open(path, tier="ssd", dram_budget=budget)
    open_s = time.perf_counter() - start
    st = store.stats()
    index_bytes = int(st["keyed_index_bytes"])
    log(f"scale: {n:,} keys built in {build_s:.0f} s, opened in {open_s:.1f} s; index "
        f"{index_bytes / 2**30:.2f} GiB ({index_bytes / n:.2f} B a key); disk {disk:,.0f} reads/s")
    passes = cfg.batches * (cfg.rounds + 1)
    tr = nt.uniform(n, cfg.batch * passes, cfg.pooling, seed=cfg.seed)
    batches = [tr.lookup(b * cfg.batch, (b + 1) * cfg.batch) for b in range(passes)]
    ids = [keys[np.asarray(r.indices)] for r in batches]
    offsets = [np.asarray(r.offsets) for r in batches]
    model = f"{n}x{dim}fp16"
    r = _measure("store.keyed.ssd", "scale", lambda b: store.lookup("ids", ids[b], offsets[b]),
                 cfg, model, log,
                 extra={"index_bytes": index_bytes, "bytes_per_key": index_bytes / n,
                        "build_s": build_s, "open_s": open_s})
    r.extra.update(_reads(store))  # after the lookups
    r.dist = "uniform"
    limit = Record("keyed", model, 0, "-", "limit.random_read", 0.0, 0.0,
                   extra={"group": "scale", "reads_per_s": disk})
    store.close()
    shutil.rmtree(path, ignore_errors=True)
    return [r, limit]


def markdown(records: list[Record], command: str) -> str:
    from .report import SPREAD_LIMIT, _spread, environment, ratio_text

    env = environment()

    def rounds(r: Record) -> Record:  # the lookups' rounds where ratio_text reads them
        return Record(r.bench, r.model, r.batch, r.dist, r.system, r.lookups_per_s, 0.0,
                      extra={"rounds_samples_per_s": r.extra["rounds_lookups_per_s"]})

    def find(group: str, system: str) -> Record | None:
        return next((r for r in records if r.extra.get("group") == group
                     and r.system == system), None)

    def ratio(r: Record, peer: Record | None) -> str:
        return ratio_text(rounds(r), rounds(peer)) if peer else "—"

    lines = [f"# nearrec bench keyed — {env['time']}", "",
             f"Command: `{command}`; machine: {env['cpus']} CPUs, torch {env.get('torch')} "
             f"({env.get('torch_threads')} threads).", "",
             "Pooled lookups of random 64-bit ids (Zipf 1.05 over the table), median of rounds; "
             "spread = (max − min) / 2 of the rounds over the median; a ratio whose rounds spread "
             f"beyond ±{100 * SPREAD_LIMIT:.0f} % (either side) is marked unreliable.", "",
             "## From DRAM", "",
             "| table | batch | system | M lookups/s | spread | ÷ torch.searchsorted |",
             "|---|---|---|---|---|---|"]
    for r in (r for r in records if r.extra.get("group") == "dram"):
        lines.append(f"| {r.model} | {r.batch} | {r.system} | {r.lookups_per_s / 1e6:.2f} | "
                     f"{_spread(rounds(r))} | {ratio(r, find('dram', 'torch.searchsorted'))} |")
    keyed = find("dram", "store.keyed.dram")
    if keyed:
        lines += ["", f"The keyed table's index: {keyed.extra['index_bytes'] / 2**20:.1f} MiB, "
                  f"**{keyed.extra['bytes_per_key']:.2f} bytes a key**."]
    groups = sorted({r.extra["group"] for r in records
                     if str(r.extra.get("group", "")).startswith("ssd@")})
    if groups:
        lines += ["", "## From SSD, at a DRAM budget (share of the rows' bytes; the keyed "
                  "table's index inside it, or beside it for `+index`)", "",
                  "| budget | system | M lookups/s | spread | DRAM hits | device reads "
                  "| ÷ store.rows.ssd | ÷ rocksdb.multiget |", "|---|---|---|---|---|---|---|---|"]
        for g in groups:
            limit = find(g, "limit.random_read")
            for r in (r for r in records if r.extra.get("group") == g
                      and r.system != "limit.random_read"):
                hits = r.extra.get("dram_hit_ratio")
                got = r.extra.get("device_reads")
                reads = "—" if got is None else f"{got:,.0f}"
                lines.append(
                    f"| {g[4:]} | {r.system} | {r.lookups_per_s / 1e6:.2f} | "
                    f"{_spread(rounds(r))} | {'—' if hits is None else f'{100 * hits:.1f} %'} | "
                    f"{reads} | "
                    f"{ratio(r, find(g, 'store.rows.ssd'))} | "
                    f"{ratio(r, find(g, 'rocksdb.multiget'))} |")
            if limit:
                lines.append(f"| {g[4:]} | limit.random_read | "
                             f"{limit.extra['reads_per_s'] / 1e6:.3f} M reads/s | | | | | |")
    inserts = [r for r in records if r.extra.get("group") == "inserts"]
    if inserts:
        lines += ["", f"## Durable inserts of new keys ({inserts[0].model}: keys at the start "
                  f"+ keys inserted)", "",
                  f"Calls of {inserts[0].batch} new keys each, every call synced before it "
                  "returns; median of rounds.", "",
                  "| system | k keys/s | spread | ÷ store.rows.write | ÷ rocksdb.put |",
                  "|---|---|---|---|---|"]
        for r in inserts:
            lines.append(f"| {r.system} | {r.lookups_per_s / 1e3:.1f} | {_spread(rounds(r))} | "
                         f"{ratio(r, find('inserts', 'store.rows.write'))} | "
                         f"{ratio(r, find('inserts', 'rocksdb.put'))} |")
    scale = find("scale", "store.keyed.ssd")
    if scale:
        limit = find("scale", "limit.random_read")
        x = scale.extra
        lines += ["", f"## {scale.model}: a table of {scale.model.split('x')[0]} keys", "",
                  f"Built in {x['build_s']:.0f} s, opened in {x['open_s']:.1f} s (the index "
                  f"built from the keys file); index {x['index_bytes'] / 2**30:.2f} GiB, "
                  f"**{x['bytes_per_key']:.2f} bytes a key**. Uniform lookups on the SSD tier "
                  f"(DRAM: the index and a row cache of 1 % of the rows): "
                  f"**{scale.lookups_per_s / 1e6:.3f} M lookups/s** "
                  f"({_spread(rounds(scale))}), {x['device_reads']:,.0f} device reads; the disk "
                  f"beside it: {limit.extra['reads_per_s'] / 1e6 if limit else 0:.3f} M random "
                  "reads/s."]
    return "\n".join(lines) + "\n"


#: ``nearrec bench keyed``
HARNESSES = {"keyed": Harness(KeyedBenchConfig, KeyedBenchConfig.quick,
                              {"--rows": "rows", "--scratch": "scratch",
                               "--scale-keys": "scale_keys"}, run, markdown)}


__all__ = ["HARNESSES", "KeyedBenchConfig", "markdown", "run"]
