"""``nearrec bench sls``: pooled lookups with tables in DRAM, nearrec side by side with its peers
on the same indices, plus the machine's memory limits measured in the same run.

Peers: ``torch.nn.EmbeddingBag`` (one per table, sum, outputs concatenated — the strongest CPU
peer) twice: with its weights in torch's own memory, as a user loads them
(``torch.EmbeddingBag``), and as a zero-copy view of nearrec's resident tables
(``torch.EmbeddingBag[shared]``: the same bytes, the same huge pages, so that cell compares the
kernels and threading alone); FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` (CPU, under
``torch.no_grad()``) and TorchRec's inference ``IntNBitTableBatchedEmbeddingBagsCodegen`` (fp32)
when installed. Systems run round-robin, several rounds, so drift on a shared machine hits them
alike.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import nearrec

from . import _native
from .harness import Harness
from .report import Record, ratio_text, sls_dtype_markdown, sls_markdown, summarise

BATCHES = (1, 16, 64, 256, 1024)
DISTS = ("uniform", "zipf1.05")


@dataclass
class SlsConfig:
    models: tuple[str, ...] = ("rmc1", "rmc2", "rmc3")
    rows: int = 1_000_000
    batches: tuple[int, ...] = BATCHES
    dists: tuple[str, ...] = DISTS
    threads: int = 2
    rounds: int = 5
    #: seconds each system runs per round and cell
    seconds: float = 0.2
    distinct_batches: int = 8
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> SlsConfig:
        # five short rounds rather than three longer ones: a median that one slow round
        # cannot move
        return cls(rows=200_000, batches=(1, 64, 1024), rounds=5, seconds=0.05)


def zipf_rows(rng: np.random.Generator, rows: int, alpha: float, n: int,
              perm: np.ndarray) -> np.ndarray:
    """``n`` draws of Zipf(alpha) over ranks 1..rows, mapped through a random permutation."""
    cdf = np.cumsum(1.0 / np.arange(1, rows + 1, dtype=np.float64) ** alpha)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(n))
    return perm[np.minimum(ranks, rows - 1)]


def make_batches(cfg: SlsConfig, tables: list[int], pooling: int, batch: int, dist: str,
                 rng: np.random.Generator, perms: list[np.ndarray]) -> list[list[np.ndarray]]:
    """``distinct_batches`` batches; each a list of per-table int64 index arrays of B × L."""
    out = []
    for _ in range(cfg.distinct_batches):
        per_table = []
        for t, rows in enumerate(tables):
            n = batch * pooling
            if dist == "uniform":
                idx = rng.integers(0, rows, n)
            else:
                idx = zipf_rows(rng, rows, float(dist[4:]), n, perms[t])
            per_table.append(idx.astype(np.int64))
        out.append(per_table)
    return out


def _time_calls(fn: Callable[[int], Any], seconds: float, n_batches: int) -> list[float]:
    lat = []
    start = time.perf_counter()
    i = 0
    while True:
        t0 = time.perf_counter()
        fn(i % n_batches)
        t1 = time.perf_counter()
        lat.append(t1 - t0)
        i += 1
        if t1 - start >= seconds and i >= 3:
            return lat


def embedding_bags(weights: list[Any], copy: bool = True) -> list[Any]:
    """One summing ``nn.EmbeddingBag`` a table of `weights` (tensors), over its own copy of the
    rows (as users run it) or, with ``copy=False``, over the same memory."""
    import torch

    return [torch.nn.EmbeddingBag.from_pretrained(w.clone() if copy else w, mode="sum",
                                                  freeze=True) for w in weights]


def _peers(store: nearrec.Store, names: list[str], threads: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    peers: dict[str, Any] = {}
    weights = [torch.from_numpy(store.table_array(n)) for n in names]
    peers["torch.EmbeddingBag"] = embedding_bags(weights)
    peers["torch.EmbeddingBag[shared]"] = embedding_bags(weights, copy=False)
    try:
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            EmbeddingLocation,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        tbe = SplitTableBatchedEmbeddingBagsCodegen(
            [(w.shape[0], w.shape[1], EmbeddingLocation.HOST, ComputeDevice.CPU)
             for w in weights])
        with torch.no_grad():
            for k, w in enumerate(weights):
                tbe.split_embedding_weights()[k].copy_(w)
        peers["fbgemm.SplitTBE"] = tbe
    except Exception as e:  # not installed, or an incompatible build
        peers["fbgemm.SplitTBE"] = f"unavailable: {type(e).__name__}: {e}"[:200]
    try:
        from fbgemm_gpu.split_embedding_configs import SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            EmbeddingLocation as Loc,
        )
        from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
            IntNBitTableBatchedEmbeddingBagsCodegen,
        )

        inbit = IntNBitTableBatchedEmbeddingBagsCodegen(
            [(f"t{k}", w.shape[0], w.shape[1], SparseType.FP32, Loc.HOST)
             for k, w in enumerate(weights)], device="cpu")
        inbit.fill_random_weights()
        peers["torchrec.IntNBitTBE"] = inbit
    except Exception as e:
        peers["torchrec.IntNBitTBE"] = f"unavailable: {type(e).__name__}: {e}"[:200]
    return peers


def run(cfg: SlsConfig, log: Callable[[str], None] = print) -> list[Record]:
    import torch

    records: list[Record] = []
    rng = np.random.default_rng(cfg.seed)
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    for model in cfg.models:
        spec = nearrec.model_spec(model)
        # Never more rows than the model's DeepRecSys tables: RMC2 (32 x 500K x dim 64 = 4 GB)
        # is held three times here (nearrec, FBGEMM's copy, TorchRec's copy).
        n_rows = min(cfg.rows, max(spec.rows))
        path = cfg.scratch / f"sls-{model}-{n_rows}"
        log(f"[{model}] building {len(spec.rows)} tables x {n_rows} rows x dim {spec.dim}")
        nearrec.build(path, model, rows=n_rows, seed=cfg.seed, overwrite=True, progress=False)
        store = nearrec.open(path, threads=cfg.threads)
        names = list(store.tables)
        rows = [store.table(n).rows for n in names]
        manifest = {t.name: t for t in store.info.tables}
        row_bytes = manifest[names[0]].row_bytes
        table_bytes = sum(manifest[n].data_bytes for n in names)
        L = spec.lookups
        peers = _peers(store, names, cfg.threads)
        for name, p in peers.items():
            if isinstance(p, str):
                log(f"  {name}: {p}")
        # The machine's limits, measured now, beside the systems.
        # (over at most 1 GiB: far beyond the caches and the TLB's reach, and RMC2's tables are
        # already held four times here)
        gather = _native.gather_rows(min(table_bytes, 1 << 30), row_bytes, 4_000_000, 3,
                                             cfg.threads)
        stream = _native.stream_read(1 << 30, 3, cfg.threads)
        records.append(Record("sls", model, 0, "-", "limit.random_gather",
                              samples_per_s=0.0, lookups_per_s=gather["items_per_s"],
                              extra={"bytes_per_s": gather["bytes_per_s"],
                                     "row_bytes": row_bytes}))
        records.append(Record("sls", model, 0, "-", "limit.stream_read", samples_per_s=0.0,
                              lookups_per_s=0.0, extra={"bytes_per_s": stream["bytes_per_s"]}))
        perms = [rng.permutation(r) for r in rows]
        for dist in cfg.dists:
            for batch in cfg.batches:
                sets = make_batches(cfg, rows, L, batch, dist, rng, perms)
                offsets = np.arange(0, batch * L, L, dtype=np.int64)
                reqs = [[nearrec.TableLookup(n, idx, offsets) for n, idx in zip(names, s,
                                                                                 strict=True)]
                        for s in sets]
                t_idx = [[torch.from_numpy(i) for i in s] for s in sets]
                t_off = torch.from_numpy(offsets)
                cat_idx = [torch.cat(s) for s in t_idx]
                cat_off = [torch.arange(0, batch * L * len(names) + 1, L, dtype=torch.int64)
                           for _ in sets]
                systems: dict[str, Callable[[int], Any]] = {
                    "nearrec": lambda i, reqs=reqs, store=store: store.lookup_many(reqs[i]),
                }
                for pname in ("torch.EmbeddingBag", "torch.EmbeddingBag[shared]"):
                    def torch_eb(i: int, t_idx=t_idx, bags=peers[pname], t_off=t_off) -> Any:
                        with torch.no_grad():
                            return torch.cat([b(x, t_off) for b, x in zip(bags, t_idx[i],
                                                                           strict=True)], 1)

                    systems[pname] = torch_eb
                for pname in ("fbgemm.SplitTBE", "torchrec.IntNBitTBE"):
                    mod = peers[pname]
                    if isinstance(mod, str):
                        continue
                    if pname == "torchrec.IntNBitTBE" and batch * L * len(names) > 2_000_000:
                        continue  # a scalar kernel: minutes per cell at this size
                    if pname == "fbgemm.SplitTBE":
                        def run_tbe(i: int, mod=mod, cat_idx=cat_idx, cat_off=cat_off) -> Any:
                            with torch.no_grad():
                                return mod(cat_idx[i], cat_off[i])
                    else:
                        def run_tbe(i: int, mod=mod, cat_idx=cat_idx, cat_off=cat_off) -> Any:
                            with torch.no_grad():
                                return mod(cat_idx[i].int(), cat_off[i].int())
                    systems[pname] = run_tbe
                lat: dict[str, list[float]] = {s: [] for s in systems}
                for fn in systems.values():  # warm-up
                    _time_calls(fn, 0.02, len(sets))
                thr: dict[str, list[float]] = {s: [] for s in systems}
                order = list(systems)
                for rnd in range(cfg.rounds):  # interleaved, each round in a rotated order
                    for s in order[rnd % len(order):] + order[:rnd % len(order)]:
                        fn = systems[s]
                        ls = _time_calls(fn, cfg.seconds, len(sets))
                        lat[s].extend(ls)
                        thr[s].append(batch * len(ls) / sum(ls))
                for s in systems:
                    ls = np.array(lat[s]) * 1e6
                    sps = float(np.median(thr[s]))
                    records.append(Record(
                        "sls", model, batch, dist, s, samples_per_s=sps,
                        lookups_per_s=sps * L * len(names), p50_us=float(np.percentile(ls, 50)),
                        p99_us=float(np.percentile(ls, 99)),
                        extra={"rounds_samples_per_s": [round(x, 1) for x in thr[s]],
                               "useful_bytes_per_s": sps * L * len(names) * row_bytes}))
                cell = {r.system: r for r in records[-len(systems):]}
                log(f"  {dist:9} B={batch:5}: " + ", ".join(
                    f"{s} {r.samples_per_s:,.0f}/s" for s, r in cell.items())
                    + f"  (× torch: {ratio_text(cell['nearrec'], cell['torch.EmbeddingBag'])})")
        del store, peers
        gc.collect()
        nearrec.remove(path)
    summarise(records)
    return records




# ---- row dtypes: nearrec's quantised tables against FBGEMM's int-n-bit TBE on the same bytes ----

#: the row dtypes the dtype cells compare (``docs/format.md`` §4)
DTYPES = ("fp32", "int8", "int4", "int2", "fp8")


@dataclass
class SlsDtypeConfig(SlsConfig):
    #: rows of every table (capped by the model's own): the same tables in every dtype
    rows: int = 250_000
    dtypes: tuple[str, ...] = DTYPES
    batches: tuple[int, ...] = (16, 64, 256, 1024)

    @classmethod
    def quick(cls) -> SlsDtypeConfig:
        return cls(models=("rmc1",), rows=50_000, batches=(64, 1024), rounds=3, seconds=0.05)


def fbgemm_rows(x: Any, dtype: str) -> np.ndarray:
    """``x`` (a float32 tensor) quantised by FBGEMM's own operators, in nearrec's bytes for
    ``dtype`` (int8's scale and bias held to fp16, as the inference TBE holds them); fp32 and
    fp8 rows as their bits."""
    import fbgemm_gpu  # noqa: F401  (registers the operators)
    import torch

    out: np.ndarray
    if dtype == "fp32":
        out = x.numpy().view(np.uint8)
        return out
    if dtype == "fp8":
        out = x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
        return out
    if dtype == "int8":
        q = torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(x).numpy()
        sb = q[:, -8:].copy().view(np.float32).astype(np.float16).astype(np.float32)
        return np.concatenate([q[:, :-8], sb.view(np.uint8)], axis=1)
    bits = {"int4": 4, "int2": 2}[dtype]
    out = torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(x, bits).numpy()
    return out


def int_nbit_tbe(tables: list[np.ndarray], dims: list[int], dtype: str,
                 mode: str = "sum") -> Any:
    """FBGEMM's CPU inference TBE (``IntNBitTableBatchedEmbeddingBagsCodegen``, what TorchRec's
    quantised collections run) holding ``tables``, nearrec's bytes of ``dtype``, as its own rows
    (scale and bias moved first, rows padded to its alignment), pooling by ``mode`` (sum or
    mean)."""
    import torch
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
        EmbeddingLocation,
        PoolingMode,
    )
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (
        IntNBitTableBatchedEmbeddingBagsCodegen,
    )

    kind = {"fp32": SparseType.FP32, "int8": SparseType.INT8, "int4": SparseType.INT4,
            "int2": SparseType.INT2, "fp8": SparseType.FP8}[dtype]
    pooling = {"sum": PoolingMode.SUM, "mean": PoolingMode.MEAN}[mode]
    tbe = IntNBitTableBatchedEmbeddingBagsCodegen(
        [(f"t{k}", q.shape[0], d, kind, EmbeddingLocation.HOST)
         for k, (q, d) in enumerate(zip(tables, dims, strict=True))], device="cpu",
        pooling_mode=pooling, output_dtype=SparseType.FP32, row_alignment=16)
    tbe.initialize_weights()
    for k, q in enumerate(tables):
        w = tbe.split_embedding_weights(split_scale_shifts=False)[k][0]
        if dtype in ("fp32", "fp8"):
            w[:, :q.shape[1]] = torch.from_numpy(q)
            continue
        tail = 8 if dtype == "int8" else 4
        sb = q[:, -tail:].copy()
        if dtype == "int8":
            sb = sb.view(np.float32).astype(np.float16).view(np.uint8)
        w[:, :4] = torch.from_numpy(sb)
        w[:, 4:4 + q.shape[1] - tail] = torch.from_numpy(q[:, :-tail])
    return tbe


def run_dtypes(cfg: SlsDtypeConfig, log: Callable[[str], None] = print) -> list[Record]:
    """Each model's tables in each dtype, from the same float rows quantised by FBGEMM: nearrec's
    store of those bytes (DRAM tier) and FBGEMM's int-n-bit TBE holding the same bytes, all
    interleaved round by round in each cell."""
    import torch

    torch.set_num_threads(cfg.threads)
    records: list[Record] = []
    rng = np.random.default_rng(cfg.seed)
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    for model in cfg.models:
        spec = nearrec.model_spec(model)
        n_rows, dim, L = min(cfg.rows, max(spec.rows)), spec.dim, spec.lookups
        n_tables = len(spec.rows)
        log(f"[{model}] {n_tables} tables x {n_rows} rows x dim {dim}, in {', '.join(cfg.dtypes)}")
        floats = [torch.from_numpy(rng.standard_normal((n_rows, dim), dtype=np.float32) * 0.1)
                  for _ in range(n_tables)]
        stores: dict[str, nearrec.Store] = {}
        tbes: dict[str, Any] = {}
        row_bytes: dict[str, int] = {}
        for dtype in cfg.dtypes:
            encoded = [fbgemm_rows(x, dtype) for x in floats]
            path = cfg.scratch / f"sls-dtype-{model}-{dtype}"
            nearrec.from_encoded(path, {f"t{k}": q for k, q in enumerate(encoded)}, dtype,
                                 overwrite=True)
            stores[dtype] = nearrec.open(path, threads=cfg.threads)
            tbes[dtype] = int_nbit_tbe(encoded, [dim] * n_tables, dtype)
            row_bytes[dtype] = encoded[0].shape[1]
            del encoded
        del floats
        gc.collect()
        names = [f"t{k}" for k in range(n_tables)]
        perms = [rng.permutation(n_rows) for _ in names]
        for dist in cfg.dists:
            for batch in cfg.batches:
                sets = make_batches(cfg, [n_rows] * n_tables, L, batch, dist, rng, perms)
                offsets = np.arange(0, batch * L, L, dtype=np.int64)
                reqs = [[nearrec.TableLookup(n, idx, offsets) for n, idx in zip(names, s,
                                                                                 strict=True)]
                        for s in sets]
                cat_idx = [torch.from_numpy(np.concatenate(s)).int() for s in sets]
                cat_off = torch.arange(0, batch * L * n_tables + 1, L, dtype=torch.int32)
                systems: dict[str, Callable[[int], Any]] = {}
                for dtype in cfg.dtypes:
                    systems[f"nearrec[{dtype}]"] = (
                        lambda i, reqs=reqs, s=stores[dtype]: s.lookup_many(reqs[i]))
                    if batch * L * n_tables <= 2_000_000:  # a scalar kernel: bounded cells
                        def tbe(i: int, mod=tbes[dtype], cat_idx=cat_idx,
                                cat_off=cat_off) -> Any:
                            with torch.no_grad():
                                return mod(cat_idx[i], cat_off)
                        systems[f"fbgemm.IntNBitTBE[{dtype}]"] = tbe
                for fn in systems.values():  # warm-up
                    _time_calls(fn, 0.02, len(sets))
                lat: dict[str, list[float]] = {s: [] for s in systems}
                thr: dict[str, list[float]] = {s: [] for s in systems}
                order = list(systems)
                for rnd in range(cfg.rounds):  # interleaved, each round in a rotated order
                    for s in order[rnd % len(order):] + order[:rnd % len(order)]:
                        ls = _time_calls(systems[s], cfg.seconds, len(sets))
                        lat[s].extend(ls)
                        thr[s].append(batch * len(ls) / sum(ls))
                for s in systems:
                    dtype = s[s.index("[") + 1:-1]
                    ls = np.array(lat[s]) * 1e6
                    sps = float(np.median(thr[s]))
                    records.append(Record(
                        "sls.dtype", model, batch, dist, s, samples_per_s=sps,
                        lookups_per_s=sps * L * n_tables, p50_us=float(np.percentile(ls, 50)),
                        p99_us=float(np.percentile(ls, 99)),
                        extra={"dtype": dtype, "row_bytes": row_bytes[dtype], "dim": dim,
                               "rounds_samples_per_s": [round(x, 1) for x in thr[s]]}))
                cell = {r.system: r for r in records[-len(systems):]}
                log(f"  {dist:9} B={batch:5}: " + ", ".join(
                    f"{s} {r.samples_per_s:,.0f}/s" for s, r in cell.items()))
        del stores, tbes
        gc.collect()
        for dtype in cfg.dtypes:
            nearrec.remove(cfg.scratch / f"sls-dtype-{model}-{dtype}")
    summarise(records)
    return records


#: ``nearrec bench sls`` and ``nearrec bench sls-dtypes``
HARNESSES = {
    "sls": Harness(SlsConfig, SlsConfig.quick, {"--models": "models", "--rows": "rows",
                                                "--scratch": "scratch"}, run, sls_markdown),
    "sls-dtypes": Harness(SlsDtypeConfig, SlsDtypeConfig.quick,
                          {"--models": "models", "--rows": "rows", "--scratch": "scratch"},
                          run_dtypes, sls_dtype_markdown),
}
