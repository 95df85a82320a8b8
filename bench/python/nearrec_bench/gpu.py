"""``nearrec bench gpu``: the GPU HBM tier against CPU and GPU peers (HS-Rec Tables 4 and 5,
Fig. 7), the HBM bandwidth its hits reach, and the transfer / near-data pooling choices.

Systems, all on the same inputs (indices arrive on the host, outputs end on the GPU except (a)):

- ``a.dram-cpu``: nearrec's DRAM tier on the CPU (every core) — the DeepRec-like baseline;
- ``b.cpu-rows-to-gpu``: the CPU gathers each batch's distinct rows (nearrec ``read_rows``),
  copies them to the GPU, which pools them (AIBox-like);
- ``c.cpu-index-gpu-rows``: every row held on the GPU, the CPU translates ids to slots (a dense
  map, the cheapest CPU probe) and ships the slots; the GPU pools (EVStore-like, its best case);
- ``d.torch-gpu``: ``F.embedding_bag`` over the whole table in HBM (the ceiling);
- ``e.nearrec-gpu``: the GPU tier with room for every row (all hits once warm), and
  ``e.nearrec-gpu@N%`` with room for N % of the rows (misses served by the DRAM tier).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import nearrec

from .harness import Harness
from .report import Record

SYSTEMS = ["a.dram-cpu", "b.cpu-rows-to-gpu", "c.cpu-index-gpu-rows", "d.torch-gpu",
           "e.nearrec-gpu"]


@dataclass
class GpuBenchConfig:
    model: str = "rmc1"
    dim: int = 128
    rows: int = 1_000_000
    batches: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096)
    alpha: float = 1.05
    rounds: int = 5
    seconds: float = 0.25
    small_cache: float = 0.2
    sim_rows: int = 200_000
    sim_accesses: int = 3_000_000
    sd_rows: int = 2_000_000
    sd_accesses: int = 1_500_000
    sim_batch: int = 2048
    sizes: tuple[int, ...] = (10, 20, 40, 60, 80, 100)
    probabilities: tuple[float, ...] = (0.0, 0.2, 0.4, 0.5, 0.6, 0.8, 1.0)
    scratch: Path = field(default_factory=lambda: Path("bench/scratch"))
    #: where to dump the records after each section (a run cut short keeps what it measured)
    checkpoint: Path | None = None

    @classmethod
    def quick(cls) -> GpuBenchConfig:
        return cls(rows=20_000, dim=32, batches=(64, 512), rounds=2, seconds=0.05,
                   sim_rows=20_000, sim_accesses=40_000, sd_rows=50_000, sd_accesses=20_000,
                   sizes=(10, 100), probabilities=(0.0, 0.5, 1.0))


def zipf_ranks(rng: np.random.Generator, rows: int, alpha: float, n: int) -> np.ndarray:
    """``n`` Zipf(alpha) ranks in ``[0, rows)`` (0 = the hottest)."""
    p = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    cdf = np.cumsum(p / p.sum())
    return np.minimum(np.searchsorted(cdf, rng.random(n)), rows - 1).astype(np.int64)


def zipf_trace(rng: np.random.Generator, rows: int, alpha: float, n: int,
               perm: np.ndarray | None = None) -> np.ndarray:
    """Zipf(alpha) over a random permutation of the rows (``perm``: keep the same hot rows
    across calls)."""
    if perm is None:
        perm = rng.permutation(rows).astype(np.int64)
    return np.asarray(perm[zipf_ranks(rng, rows, alpha, n)], dtype=np.int64)


def stack_distance_trace(rng: np.random.Generator, rows: int, n: int, k: float = 1.0,
                         scale: int = 80) -> tuple[np.ndarray, float]:
    """DLRM's stack-distance generator with RecSSD's locality knob K (shared/specs/traces.md,
    full-table variant: first references walk a random permutation of all rows; distances
    multiplied by ``scale``, the bag length). A numpy twin of nearrec-plan's generator, which
    has no Python binding yet. Returns the trace and its share of first references."""
    samples = rng.exponential(1.0, 1000)
    dens, _ = np.histogram(samples, bins=50, density=True)
    dens[0] += np.floor(dens.sum() * k)
    cdf = np.cumsum(dens) / dens.sum()
    sd = np.searchsorted(cdf, rng.random(n)) * scale
    perm = rng.permutation(rows).astype(np.int64)
    recent: list[int] = []
    limit = int(sd.max()) + 1
    out = np.empty(n, dtype=np.int64)
    nxt = 0
    for i, d in enumerate(sd.tolist()):
        if d == 0 or d > len(recent):
            x = int(perm[nxt % rows])
            nxt += 1
        else:
            x = recent.pop(-d)
        recent.append(x)
        if len(recent) > limit:
            del recent[0]
        out[i] = x
    return out, nxt / n


def _timed(fn: Callable[[int], Any], sync: Callable[[], None], seconds: float,
           n_inputs: int) -> list[float]:
    """Per-call latencies (s) of ``fn`` over at least ``seconds`` (at least 3 calls)."""
    lat = []
    t_end = time.perf_counter() + seconds
    i = 0
    while i < 3 or time.perf_counter() < t_end:
        t = time.perf_counter()
        fn(i % n_inputs)
        sync()
        lat.append(time.perf_counter() - t)
        i += 1
    return lat


def run(cfg: GpuBenchConfig, log: Callable[[str], None] = print) -> list[Record]:
    import torch
    import torch.nn.functional as F

    from nearrec.gpu import GpuCacheConfig, GpuTier
    from nearrec.specs import model_spec

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    spec = model_spec(cfg.model)
    n_tables, pool, dim = len(spec.rows), spec.lookups, cfg.dim
    rng = np.random.default_rng(0)
    records: list[Record] = []
    env: dict[str, Any] = {"device": torch.cuda.get_device_name() if cuda else "cpu"}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None

    # -- the store: spec's tables and pooling, HS-Rec's dim --
    path = cfg.scratch / f"gpu-{cfg.model}-{cfg.rows}x{dim}"
    names = [f"t{i}" for i in range(n_tables)]
    if not path.exists():
        log(f"building {path} ({n_tables} x {cfg.rows} x {dim} fp32)")
        nearrec.from_numpy(path, {n: (rng.standard_normal((cfg.rows, dim), dtype=np.float32))
                                  for n in names}, overwrite=True)
    store = nearrec.open(path, tier="dram")
    gpu_tables = [torch.from_numpy(np.asarray(store.table_array(n))).to(dev) for n in names]

    # -- measured limits: device copy bandwidth --
    if cuda:
        x = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
        y = torch.empty_like(x)
        lat = _timed(lambda i: y.copy_(x), sync, 1.0, 1)
        copy_bw = 2 * x.numel() / float(np.median(lat))
        del x, y
        x = torch.empty(256 << 20, dtype=torch.uint8).pin_memory()
        y = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        h2d = x.numel() / float(np.median(_timed(lambda i: y.copy_(x, non_blocking=True),
                                                 sync, 0.5, 1)))
        del x, y
        records.append(Record("gpu", cfg.model, 0, "-", "limit.hbm_copy", 0, 0,
                              extra={"bytes_per_s": copy_bw, "counts": "read + written"}))
        records.append(Record("gpu", cfg.model, 0, "-", "limit.h2d_pinned", 0, 0,
                              extra={"bytes_per_s": h2d}))
        log(f"HBM copy {copy_bw / 1e9:,.0f} GB/s (read + write); H2D pinned {h2d / 1e9:.1f} GB/s")

    tiers = {"e.nearrec-gpu": GpuTier(store, names, GpuCacheConfig(hbm_budget=1 << 40), dev)}
    # HS-Rec's Taobao case: every row fits in HBM; fill the cache so timed batches all hit
    for n, ct in tiers["e.nearrec-gpu"].tables.items():
        for lo in range(0, cfg.rows, 1 << 18):
            k = torch.arange(lo, min(cfg.rows, lo + (1 << 18)), device=dev)
            ct.cache.insert(k, gpu_tables[names.index(n)][k])
    pct = int(round(cfg.small_cache * 100))
    small = f"e.nearrec-gpu@{pct}%"
    tiers[small] = GpuTier(store, names, GpuCacheConfig(slots=int(cfg.rows * cfg.small_cache)),
                           dev)
    slot_maps = [np.arange(cfg.rows, dtype=np.int64) for _ in names]  # (c): identity slots
    mlp = _dlrm(spec, dim, n_tables)
    import copy

    mlp_dev = copy.deepcopy(mlp).to(dev)
    perm_traces = [rng.permutation(cfg.rows) for _ in names]

    def batch_inputs(batch: int, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for t in range(n_tables):
            keys = zipf_trace(rng, cfg.rows, cfg.alpha, batch * pool, perm_traces[t])
            out.append((keys, np.arange(0, batch * pool, pool)))
        return out

    for batch in cfg.batches:
        inputs = [batch_inputs(batch, k) for k in range(4)]
        dense = [torch.randn(batch, spec.dense_features or 1) for _ in inputs]
        dense_dev = [d.to(dev) for d in dense]
        pinned = [[(torch.from_numpy(i).pin_memory() if cuda else torch.from_numpy(i),
                    torch.from_numpy(o)) for i, o in inp] for inp in inputs]

        def a(i: int, inp=inputs) -> Any:
            return store.lookup_many([nearrec.TableLookup(n, idx, off)
                                      for n, (idx, off) in zip(names, inp[i], strict=True)]).values

        def b(i: int, inp=inputs) -> Any:
            outs = []
            for n, (idx, off) in zip(names, inp[i], strict=True):
                uniq, inv = np.unique(idx, return_inverse=True)
                rows = torch.from_numpy(store.read_rows(n, uniq)).to(dev, non_blocking=True)
                inv_d = torch.from_numpy(inv.astype(np.int64)).to(dev, non_blocking=True)
                outs.append(F.embedding_bag(inv_d, rows, torch.from_numpy(off).to(dev),
                                            mode="sum"))
            return torch.cat(outs, dim=1)

        def c(i: int, inp=inputs) -> Any:
            outs = []
            for t, (idx, off) in enumerate(inp[i]):
                slots = torch.from_numpy(slot_maps[t][idx]).to(dev, non_blocking=True)
                outs.append(F.embedding_bag(slots, gpu_tables[t], torch.from_numpy(off).to(dev),
                                            mode="sum"))
            return torch.cat(outs, dim=1)

        def d(i: int, pin=pinned) -> Any:
            outs = []
            for t, (idx, off) in enumerate(pin[i]):
                outs.append(F.embedding_bag(idx.to(dev, non_blocking=True), gpu_tables[t],
                                            off.to(dev, non_blocking=True), mode="sum"))
            return torch.cat(outs, dim=1)

        def e(i: int, pin=pinned, tier=None) -> Any:
            reqs = [(n, idx, off, None, "sum") for n, (idx, off) in zip(names, pin[i],
                                                                        strict=True)]
            return tier.pool_concat(reqs)

        fns: dict[str, Callable[[int], Any]] = {"a.dram-cpu": a, "b.cpu-rows-to-gpu": b,
                                                "c.cpu-index-gpu-rows": c, "d.torch-gpu": d}
        for name, tier in tiers.items():
            fns[name] = lambda i, tier=tier: e(i, tier=tier)
        # correctness on this batch before timing: every system equals the DRAM tier
        want = a(0)
        for name, fn in fns.items():
            got = fn(0)
            got = got.cpu().numpy() if hasattr(got, "cpu") else got
            err = float(np.abs(got - want).max() / max(1e-6, np.abs(want).max()))
            if err > 1e-4:
                raise AssertionError(f"{name} differs from the DRAM tier at batch {batch}: {err}")
        for tier in tiers.values():  # warm the caches on these inputs
            for i in range(len(inputs)):
                e(i, tier=tier)
        before = {n: _hits(t) for n, t in tiers.items()}
        for mode in ("emb", "e2e"):
            lats: dict[str, list[float]] = {n: [] for n in fns}
            rounds: dict[str, list[float]] = {n: [] for n in fns}
            for _ in range(cfg.rounds):
                for name, fn in fns.items():
                    if mode == "e2e":
                        on_cpu = name == "a.dram-cpu"

                        def step(i: int, fn=fn, on_cpu=on_cpu, dense=dense,
                                 dense_dev=dense_dev) -> Any:
                            emb = fn(i)
                            if on_cpu:
                                return mlp(dense[i], torch.from_numpy(emb))
                            return mlp_dev(dense_dev[i], emb)
                        call = step
                    else:
                        call = fn
                    with torch.no_grad():
                        lat = _timed(call, sync, cfg.seconds, len(inputs))
                    lats[name] += lat
                    rounds[name].append(batch / float(np.median(lat)))
            for name in fns:
                lat = np.array(lats[name])
                extra: dict[str, Any] = {"rounds_samples_per_s": rounds[name]}
                if name in tiers:
                    h0, m0 = before[name]
                    h1, m1 = _hits(tiers[name])
                    extra["hit_rate"] = (h1 - h0) / max(1, h1 - h0 + m1 - m0)
                sps = float(np.median(rounds[name]))
                extra.update(rows=cfg.rows, dim=dim, tables=n_tables, pooling=pool)
                records.append(Record(f"gpu-{mode}", cfg.model, batch, f"zipf{cfg.alpha}", name,
                                      sps, sps * n_tables * pool,
                                      float(np.percentile(lat, 50) * 1e6),
                                      float(np.percentile(lat, 99) * 1e6), extra))
            log(f"batch {batch} {mode}: " + ", ".join(
                f"{r.system} {r.samples_per_s:,.0f}" for r in records[-len(fns):]))

        _checkpoint(cfg, records)
    if cuda:
        records += _bandwidth(cfg, tiers["e.nearrec-gpu"], names[0], copy_bw, pool, log)
        _checkpoint(cfg, records)
        del tiers
        records += _transfer(cfg, store, names, pool, dev, log)
        _checkpoint(cfg, records)
    records += _hit_rates(cfg, dev, log)
    for r in records:
        r.extra.setdefault("device", env["device"])
        r.extra.setdefault("triton", env["triton"])
    return records


def _checkpoint(cfg: GpuBenchConfig, records: list[Record]) -> None:
    if cfg.checkpoint is not None:
        import json
        from dataclasses import asdict

        cfg.checkpoint.write_text(json.dumps([asdict(r) for r in records], default=str))


def _hits(tier: Any) -> tuple[int, int]:
    s = tier.stats().values()
    return sum(x.hits for x in s), sum(x.misses for x in s)


def _dlrm(spec: Any, dim: int, n_tables: int) -> Any:
    """A DLRM-shaped model: the spec's bottom MLP (last layer ``dim``), dot interaction of
    the pooled tables with it, the spec's top MLP."""
    import torch
    from torch import nn

    def mlp(sizes: list[int], sigmoid: bool = False) -> Any:
        layers: list[Any] = []
        for i in range(len(sizes) - 1):
            layers += [nn.Linear(sizes[i], sizes[i + 1]), nn.ReLU()]
        if sigmoid:
            layers[-1] = nn.Sigmoid()
        return nn.Sequential(*layers)

    class Dlrm(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            dense = spec.dense_features or 1
            self.bottom = mlp([dense, *spec.bottom_mlp[:-1], dim] if spec.bottom_mlp
                              else [dense, dim])
            f = n_tables + 1
            self.top = mlp([dim + f * (f - 1) // 2, *spec.top_mlp[1:]], sigmoid=True)
            self.iu = torch.triu_indices(f, f, 1)

        def forward(self, dense: Any, pooled: Any) -> Any:
            x = self.bottom(dense)
            feats = torch.cat([x[:, None, :], pooled.view(pooled.shape[0], -1, x.shape[1])], 1)
            inter = torch.bmm(feats, feats.transpose(1, 2))
            iu = self.iu.to(inter.device)
            return self.top(torch.cat([x, inter[:, iu[0], iu[1]]], 1))

    return Dlrm().eval()


def _bandwidth(cfg: GpuBenchConfig, tier: Any, table: str, copy_bw: float, pool: int,
               log: Callable[[str], None]) -> list[Record]:
    """All-hit batches on one fully cached table: row bytes served per second vs the copy."""
    import torch

    from nearrec.gpu import kernels

    ct = tier.tables[table]
    cache = ct.cache
    dev = cache.device
    rng = np.random.default_rng(1)
    recs = []
    cached = np.sort(cache.cached_keys())
    # fill every row in (the timed batches only touched the Zipf-hot ones)
    left = np.setdiff1d(np.arange(cache.table_rows), cached)
    for lo in range(0, left.size, 1 << 18):
        k = left[lo:lo + (1 << 18)]
        cache.insert(k, torch.from_numpy(ct.store.read_rows(table, k)))
    keys = cache.cached_keys()
    rows_t = cache.state.rows
    for bags in (2048, 16384, 65536):
        idx = torch.from_numpy(rng.choice(keys, bags * pool)).to(dev)
        off = torch.arange(0, bags * pool + 1, pool, device=dev)
        out = torch.empty(bags, cache.dim, device=dev)
        flags = torch.empty(bags * pool, dtype=torch.int8, device=dev)
        for tags in (False, True):
            for bl, nw in ((16, 2), (32, 4)):
                def call(i: int, bl=bl, nw=nw, tags=tags, idx=idx, off=off, out=out,
                         flags=flags) -> None:
                    kernels.probe_pool(cache.state, idx, off, None, cache.table_rows,
                                       cache.tick, out, flags, block_l=bl, num_warps=nw,
                                       tags=tags)
                lat = _timed(call, torch.cuda.synchronize, 0.4, 1)
                t = float(np.median(lat))
                hits = int((flags == 0).sum())
                row_bytes = hits * cache.dim * 4
                probe_bytes = bags * pool * cache.state.ways * (1 if tags else 8)
                recs.append(Record(
                    "gpu-bandwidth", cfg.model, bags, "uniform-hits",
                    f"probe_pool[{'tags' if tags else 'keys'},BLOCK_L={bl},warps={nw}]", bags / t,
                    bags * pool / t, t * 1e6, float(np.percentile(lat, 99) * 1e6),
                    {"row_bytes_per_s": row_bytes / t, "row_share_of_copy": row_bytes / t / copy_bw,
                     "probe_and_row_bytes_per_s": (row_bytes + probe_bytes) / t,
                     "hit_rate": hits / (bags * pool), "dim": cache.dim}))
                log(f"bandwidth bags={bags} tags={tags} BLOCK_L={bl} warps={nw}: rows "
                    f"{row_bytes / t / 1e9:,.0f} GB/s = {100 * row_bytes / t / copy_bw:.0f} % "
                    "of copy")
        slots = torch.randint(0, rows_t.shape[0], (bags * pool,), device=dev)
        lat = _timed(lambda i, slots=slots, off=off: torch.nn.functional.embedding_bag(
            slots, rows_t, off[:-1], mode="sum"), torch.cuda.synchronize, 0.4, 1)
        t = float(np.median(lat))
        moved = bags * pool * cache.dim * 4
        recs.append(Record("gpu-bandwidth", cfg.model, bags, "uniform-hits",
                           "F.embedding_bag(slots)", bags / t, bags * pool / t, t * 1e6,
                           float(np.percentile(lat, 99) * 1e6),
                           {"row_bytes_per_s": moved / t,
                            "row_share_of_copy": moved / t / copy_bw}))
        gathered = torch.empty(bags * pool, cache.dim, device=dev)
        lat = _timed(lambda i, slots=slots, g=gathered: torch.index_select(
            rows_t, 0, slots, out=g), torch.cuda.synchronize, 0.4, 1)
        t = float(np.median(lat))
        recs.append(Record("gpu-bandwidth", cfg.model, bags, "uniform-hits",
                           "limit.random_row_gather(index_select, read+write)", bags / t,
                           bags * pool / t, t * 1e6, float(np.percentile(lat, 99) * 1e6),
                           {"row_bytes_per_s": 2 * moved / t,
                            "row_share_of_copy": 2 * moved / t / copy_bw}))
        log(f"bandwidth bags={bags}: random row gather (read+write) "
            f"{2 * moved / t / 1e9:,.0f} GB/s")
        del gathered
    return recs


def _transfer(cfg: GpuBenchConfig, store: Any, names: list[str], pool: int, dev: Any,
              log: Callable[[str], None]) -> list[Record]:
    """Zero-copy vs async copy, near-data pooling on vs off: a miss-heavy cache (10 %)."""
    import torch

    from nearrec.gpu import GpuCacheConfig, GpuTier

    rng = np.random.default_rng(2)
    batch = 2048
    recs = []
    perms = [rng.permutation(cfg.rows) for _ in names]
    inputs = [[(zipf_trace(rng, cfg.rows, cfg.alpha, batch * pool, perms[t]),
                np.arange(0, batch * pool, pool)) for t in range(len(names))] for _ in range(4)]
    variants: list[tuple[str, Any]] = [(t, ndp) for t in ("zero_copy", "async_copy")
                                       for ndp in ("off", "on")]
    tiers = {v: GpuTier(store, names, GpuCacheConfig(slots=cfg.rows // 10, transfer=v[0],
                                                     near_data_pooling=v[1]), dev)
             for v in variants}
    results: dict[Any, list[float]] = {v: [] for v in variants}
    lats: dict[Any, list[float]] = {v: [] for v in variants}
    for tier in tiers.values():
        for i in range(len(inputs)):
            tier.pool_many([(n, x, o, None, "sum") for n, (x, o) in zip(names, inputs[i],
                                                                        strict=True)])
    before = {v: _hits(t) for v, t in tiers.items()}
    b0 = {v: sum(s.bytes_to_gpu for s in t.stats().values()) for v, t in tiers.items()}
    for _ in range(cfg.rounds):
        for v, tier in tiers.items():
            def call(i: int, tier=tier) -> Any:
                return tier.pool_many([(n, x, o, None, "sum")
                                       for n, (x, o) in zip(names, inputs[i], strict=True)])
            lat = _timed(call, torch.cuda.synchronize, cfg.seconds, len(inputs))
            lats[v] += lat
            results[v].append(batch / float(np.median(lat)))
    for v, tier in tiers.items():
        h0, m0 = before[v]
        h1, m1 = _hits(tier)
        moved = sum(s.bytes_to_gpu for s in tier.stats().values()) - b0[v]
        calls = max(1, sum(s.batches for s in tier.stats().values()) // len(names) - 4)
        sps = float(np.median(results[v]))
        recs.append(Record("gpu-transfer", cfg.model, batch, f"zipf{cfg.alpha}",
                           f"{v[0]},near_data_pooling={v[1]}", sps, sps * len(names) * pool,
                           float(np.percentile(lats[v], 50) * 1e6),
                           float(np.percentile(lats[v], 99) * 1e6),
                           {"rounds_samples_per_s": results[v],
                            "hit_rate": (h1 - h0) / max(1, h1 - h0 + m1 - m0),
                            "bytes_to_gpu_per_batch": moved / calls}))
        log(f"transfer {v}: {sps:,.0f} samples/s, {moved / calls / 1e6:.2f} MB to GPU per batch")
    return recs


def _hit_rates(cfg: GpuBenchConfig, dev: Any, log: Callable[[str], None]) -> list[Record]:
    """HS-Rec Table 5 (policy × cache size) and Fig. 7 (admission probability) on a Zipf and a
    stack-distance trace; hit rates over the second half of each trace (the first warms)."""
    import torch

    from nearrec.gpu import GpuCacheConfig, GpuEmbeddingCache
    from nearrec.gpu.config import CachePolicy, admit

    rng = np.random.default_rng(3)
    zipf = zipf_trace(rng, cfg.sim_rows, cfg.alpha, cfg.sim_accesses)
    t0 = time.perf_counter()
    sd, first = stack_distance_trace(rng, cfg.sd_rows, cfg.sd_accesses)
    log(f"stack-distance trace: {sd.size:,} accesses in {time.perf_counter() - t0:.1f} s, "
        f"first references {100 * first:.1f} %")
    traces = {f"zipf{cfg.alpha}": (zipf, cfg.sim_rows), "stackdist-K1": (sd, cfg.sd_rows)}
    step = cfg.sim_batch

    def simulate(trace: np.ndarray, rows: int, slots: int, policy: str, p: float) -> float:
        cache = GpuEmbeddingCache("sim", rows, 1, GpuCacheConfig(
            slots=slots, policy=policy, admission_probability=p), device=dev)
        pol = CachePolicy(policy)
        hits = total = 0
        keys_d = torch.from_numpy(trace).to(dev)
        for lo in range(0, trace.size, step):
            k = keys_d[lo:lo + step]
            _, miss = cache.lookup(k)
            mk = torch.unique(k[miss])
            if lo >= trace.size // 2:
                total += k.numel()
                hits += k.numel() - miss.numel()
            take = mk[admit(mk, pol, p, cache.tick, 0)]
            cache.insert(take, torch.zeros((take.numel(), 1), device=dev))
        return hits / max(1, total)

    recs = []
    for tname, (trace, rows) in traces.items():
        for size in cfg.sizes:
            slots = max(64, rows * size // 100)
            rates = {}
            for policy in ("lru", "lfu", "lru_pa", "lfu_pa"):
                rates[policy] = simulate(trace, rows, slots, policy, 0.5)
            recs.append(Record("gpu-hitrate", "-", size, tname, "policies", 0, 0,
                               extra={"cache_pct": size, "hit_rates": rates,
                                      "first_ref_share": first if "stack" in tname else None}))
            log(f"hit rate {tname} cache {size}%: " + ", ".join(
                f"{k} {100 * v:.2f}" for k, v in rates.items()))
        for p in cfg.probabilities:
            rate = simulate(trace, rows, max(64, rows // 10), "lfu_pa", p)
            recs.append(Record("gpu-admission", "-", 10, tname, "lfu_pa", 0, 0,
                               extra={"probability": p, "hit_rate": rate}))
        log(f"admission sweep {tname}: " + ", ".join(
            f"{r.extra['probability']}: {100 * r.extra['hit_rate']:.2f}" for r in recs[-len(
                cfg.probabilities):]))
    return recs


def markdown(records: list[Record], command: str,
             environment: dict[str, Any] | None = None) -> str:
    from .report import _spread, ratio_text
    from .report import environment as current

    env = environment if environment is not None else current()
    dev = next((r.extra.get("device") for r in records), "?")
    triton_version = next((r.extra.get("triton") for r in records if r.extra.get("triton")),
                          env.get("triton", "?"))
    shape = next((r.extra for r in records if r.bench == "gpu-emb"), {})
    lines = [f"Command: `{command}`", "",
             f"Machine: {dev}; host {env.get('cpus')} cores ({env.get('machine')}), "
             f"Python {env.get('python')}, torch {env.get('torch')}, "
             f"triton {triton_version}; {env.get('time')}.", "",
             f"Workload: {shape.get('tables', '?')} tables × {shape.get('rows', 0):,} rows × "
             f"dim {shape.get('dim', '?')} fp32 (RMC1's table count and pooling factor; dim "
             f"128 is HS-Rec's), {shape.get('pooling', '?')} lookups per bag, Zipf(1.05) over "
             "a fixed random permutation of each table's rows; 4 input batches per size, "
             f"rotated; {len(shape.get('rounds_samples_per_s', [])) or '?'} interleaved rounds; "
             "samples/s is the median of the rounds' medians. Indices "
             "start on the host (pinned) for every system. Systems: a = nearrec's DRAM tier on "
             "the CPU (all cores); b = CPU gathers the batch's distinct rows, copies them, GPU "
             "pools (AIBox-like); c = every row in HBM, the CPU maps ids to slots and ships "
             "them, GPU pools (EVStore-like, its best case); d = `F.embedding_bag` on the whole "
             "table in HBM (the ceiling); e = the GPU tier holding every row (all hits: "
             "HS-Rec's Taobao case); e@20% = room for 20 % of the rows, LFU_PA, misses from "
             "the DRAM tier. End-to-end adds a DLRM (spec bottom MLP, dot interaction, top MLP) "
             "on the GPU (on the CPU for a).", ""]
    for mode, title in (("gpu-emb", "Embedding-only"), ("gpu-e2e", "End-to-end DLRM")):
        rs = [r for r in records if r.bench == mode]
        if not rs:
            continue
        systems = list(dict.fromkeys(r.system for r in rs))
        lines += [f"### {title} throughput (samples/s, median of rounds)", "",
                  "| batch | " + " | ".join(systems) + " | e ÷ a | e ÷ c | e ÷ d | e p50 / p99 µs"
                  " | e spread | hit rate e / " + systems[-1] + " |",
                  "|---:|" + "---:|" * (len(systems) + 6)]
        for batch in dict.fromkeys(r.batch for r in rs):
            c = {r.system: r for r in rs if r.batch == batch}
            e = c["e.nearrec-gpu"]
            ratio = [ratio_text(e, c[s]) if s in c else "—"
                     for s in ("a.dram-cpu", "c.cpu-index-gpu-rows", "d.torch-gpu")]
            lines.append(f"| {batch} | " + " | ".join(
                f"{c[s].samples_per_s:,.0f}" for s in systems) + " | " + " | ".join(ratio)
                + f" | {e.p50_us:,.0f} / {e.p99_us:,.0f} | {_spread(e)} | "
                + f"{100 * e.extra.get('hit_rate', 0):.2f} % / "
                + f"{100 * c[systems[-1]].extra.get('hit_rate', 0):.2f} % |")
        lines.append("")
    bw = [r for r in records if r.bench == "gpu-bandwidth"]
    if bw:
        copy = next(r.extra["bytes_per_s"] for r in records if r.system == "limit.hbm_copy")
        lines += [f"### HBM bandwidth of all-hit batches (copy: {copy / 1e9:,.0f} GB/s read + "
                  "written)", "", "| bags × 80 | kernel | µs | row GB/s | % of copy | "
                  "probe + row GB/s |", "|---:|---|---:|---:|---:|---:|"]
        for r in bw:
            pr = r.extra.get("probe_and_row_bytes_per_s")
            lines.append(f"| {r.batch} | {r.system} | {r.p50_us:,.0f} | "
                         f"{r.extra['row_bytes_per_s'] / 1e9:,.0f} | "
                         f"{100 * r.extra['row_share_of_copy']:.0f} % | "
                         + (f"{pr / 1e9:,.0f}" if pr else "—") + " |")
        lines.append("")
    tr = [r for r in records if r.bench == "gpu-transfer"]
    if tr:
        lines += ["### Misses: transfer mode and near-data pooling (cache 10 % of rows, batch "
                  "2048)", "", "| variant | samples/s | p50 / p99 µs | hit rate | MB to GPU per "
                  "batch |", "|---|---:|---:|---:|---:|"]
        for r in tr:
            lines.append(f"| {r.system} | {r.samples_per_s:,.0f} | {r.p50_us:,.0f} / "
                         f"{r.p99_us:,.0f} | {100 * r.extra['hit_rate']:.1f} % | "
                         f"{r.extra['bytes_to_gpu_per_batch'] / 1e6:.2f} |")
        lines.append("")
    hr = [r for r in records if r.bench == "gpu-hitrate"]
    for trace in dict.fromkeys(r.dist for r in hr):
        lines += [f"### Hit rate (%), {trace} trace (HS-Rec Table 5)", "",
                  "| cache % of rows | LRU | LFU | LRU_PA | LFU_PA |", "|---:|---:|---:|---:|---:|"]
        for r in (r for r in hr if r.dist == trace):
            h = r.extra["hit_rates"]
            lines.append(f"| {r.batch} | " + " | ".join(
                f"{100 * h[p]:.2f}" for p in ("lru", "lfu", "lru_pa", "lfu_pa")) + " |")
        lines.append("")
    ad = [r for r in records if r.bench == "gpu-admission"]
    for trace in dict.fromkeys(r.dist for r in ad):
        rs = [r for r in ad if r.dist == trace]
        lines += [f"### Admission probability, LFU_PA, cache 10 %, {trace} (HS-Rec Fig. 7)", "",
                  "| p | " + " | ".join(f"{r.extra['probability']:.1f}" for r in rs) + " |",
                  "|---|" + "---:|" * len(rs),
                  "| hit rate % | " + " | ".join(f"{100 * r.extra['hit_rate']:.2f}" for r in rs)
                  + " |", ""]
    return "\n".join(lines) + "\n"


#: ``nearrec bench gpu``
HARNESSES = {"gpu": Harness(GpuBenchConfig, GpuBenchConfig.quick,
                            {"--rows": "rows", "--scratch": "scratch"}, run, markdown)}
