"""``nearrec bench gpu-hit``: the GPU tier's hit path against the card's memory (on a lent GPU).

All-hit batches on one fully cached table (every lookup a cached row, uniform over them): the
bytes of rows pooled per second against the device-to-device copy (read + written) and a plain
read measured in the same run. Each way of running the hit path is one kernel or two, timed by
CUDA events (``triton.testing.do_bench``, L2 flushed before each call), the ways interleaved round
by round, medians over rounds:

- ``probe_pool[tags|keys,POLICY]``: the fused kernel the tier runs (one program per bag: the
  probe, then the rows of the hits pooled), comparing the set's 8-bit tags first (the default)
  or every way's key, a hit counted as LFU does (a relaxed atomic add) or LRU (a store);
- ``gather_pool[slots]``: the same pooling with the slots given, no probe — the bound any
  probe adds to;
- ``F.embedding_bag(slots)`` and ``index_select`` (read + written): PyTorch's gathers of the
  same rows.

Every way's answer is checked against ``F.embedding_bag`` over the table before it is timed."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import triton
import triton.language as tl

from .harness import Harness
from .report import Record


@dataclass
class GpuHitConfig:
    rows: int = 1_000_000
    dim: int = 128
    pooling: int = 80
    bags: tuple[int, ...] = (2048, 16384, 65536)
    rounds: int = 3
    #: each way's timed repetitions per round (``do_bench``'s ``rep``), milliseconds
    rep_ms: int = 100
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> GpuHitConfig:
        return cls(rows=5_000, dim=32, pooling=8, bags=(64,), rounds=1, rep_ms=10)


@dataclass(frozen=True)
class Way:
    """One way of running the hit path: ``fused`` (the tier's ``probe_pool``, its probe by
    ``tag`` — ``tags`` or ``keys`` — and a hit counted as ``policy`` does) or ``gather``
    (:func:`gather_pool` on given slots); ``block``: BLOCK_L and warps."""

    kind: str
    block: tuple[int, int]
    tag: str = "tags"
    policy: str = "lfu"


WAYS = (
    Way("fused", (16, 2), "keys"),
    *(Way("fused", b) for b in ((4, 1), (8, 1), (16, 2), (32, 4))),
    Way("fused", (8, 1), policy="lru"),
    Way("gather", (8, 1)), Way("gather", (16, 1)), Way("gather", (16, 2)),
)


@triton.jit  # type: ignore[untyped-decorator]
def _gather_pool_kernel(slots_ptr, offsets_ptr, rows_ptr, out_ptr, dim, BLOCK_L: tl.constexpr,
                        BLOCK_D: tl.constexpr):
    # probe_pool's loop with the slots given: each step's rows loaded as a [BLOCK_L, dim] tile
    # and summed into the bag
    bag = tl.program_id(0)
    start = tl.load(offsets_ptr + bag)
    end = tl.load(offsets_ptr + bag + 1)
    cols = tl.arange(0, BLOCK_D)
    dmask = cols < dim
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    i = start
    while i < end:
        pos = i + tl.arange(0, BLOCK_L)
        slot = tl.load(slots_ptr + pos, mask=pos < end, other=-1)
        r = tl.load(rows_ptr + slot[:, None] * dim + cols[None, :],
                    mask=(slot >= 0)[:, None] & dmask[None, :], other=0.0)
        acc += tl.sum(r, axis=0)
        i += BLOCK_L
    tl.store(out_ptr + bag * dim + cols, acc, mask=dmask)


def gather_pool(rows: Any, slots: Any, offsets: Any, out: Any, block_l: int,
                num_warps: int) -> None:
    """``out[b]`` = the sum of ``rows[slots[i]]`` over bag ``b``'s lookups."""
    from nearrec.gpu.kernels import block

    dim = rows.shape[1]
    _gather_pool_kernel[(offsets.numel() - 1,)](slots, offsets, rows, out, dim, BLOCK_L=block_l,
                                               BLOCK_D=block(dim), num_warps=num_warps)


def run(cfg: GpuHitConfig, log: Callable[[str], None] = print) -> list[Record]:
    import torch
    import torch.nn.functional as F
    import triton.testing  # noqa: F401 - do_bench

    from nearrec.gpu import kernels
    from nearrec.gpu.cache import GpuEmbeddingCache
    from nearrec.gpu.config import GpuCacheConfig, set_index

    cuda = torch.cuda.is_available()
    if not cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("nearrec bench gpu-hit times CUDA kernels: it needs a CUDA device "
                           "(or TRITON_INTERPRET=1 for a dry run on the CPU, times meaningless)")
    dev = torch.device("cuda" if cuda else "cpu")
    rng = np.random.default_rng(cfg.seed)
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)

    def bench(fn: Callable[[], Any]) -> float:
        """Seconds per call: the median of ``do_bench``'s CUDA-event timings (one timed call
        on the CPU)."""
        if not cuda:
            t = time.perf_counter()
            fn()
            return time.perf_counter() - t
        return float(triton.testing.do_bench(fn, warmup=25, rep=cfg.rep_ms,
                                             return_mode="median")) / 1e3

    # -- the card's memory, measured in this run --
    copy_bw, read_bw = _limits(bench, dev, gen)
    log(f"copy {copy_bw / 1e9:,.0f} GB/s (read + written), read {read_bw / 1e9:,.0f} GB/s")
    machine = {"device": torch.cuda.get_device_name() if cuda else "cpu (Triton's interpreter)",
               "torch": torch.__version__, "triton": triton.__version__}
    records = [Record("gpu-hit", "-", 0, "-", "limit.copy", 0, 0,
                      extra={"bytes_per_s": copy_bw, "counts": "read + written", **machine}),
               Record("gpu-hit", "-", 0, "-", "limit.read(sum)", 0, 0,
                      extra={"bytes_per_s": read_bw})]

    # -- one table, every row cached --
    table = torch.empty(cfg.rows, cfg.dim, device=dev).normal_(generator=gen)
    cache = GpuEmbeddingCache("t", cfg.rows, cfg.dim, GpuCacheConfig(slots=2 * cfg.rows),
                              device=dev)
    for lo in range(0, cfg.rows, 1 << 18):
        k = torch.arange(lo, min(cfg.rows, lo + (1 << 18)), device=dev)
        cache.insert(k, table[k])
    keys = cache.cached_keys()
    log(f"{keys.size:,} of {cfg.rows:,} rows cached in {cache.num_sets:,} sets of "
        f"{cache.state.ways}")
    rows_t = cache.state.rows
    tick = cache.tick

    def measure(bags: int) -> list[Record]:
        n = bags * cfg.pooling
        idx = torch.from_numpy(rng.choice(keys, n)).to(dev)
        off = torch.arange(0, n + 1, cfg.pooling, device=dev)
        want = F.embedding_bag(idx, table, off[:-1], mode="sum")
        out = torch.empty(bags, cfg.dim, device=dev)
        flags = torch.empty(n, dtype=torch.int8, device=dev)
        # the slot of each lookup (every one cached), for the gathers that are given them
        keys_at = cache.state.keys.view(cache.num_sets, cache.state.ways)
        sets = set_index(idx, cache.num_sets)
        slots64 = sets * cache.state.ways + (keys_at[sets] == idx[:, None]).int().argmax(1)
        gathered = torch.empty(n, cfg.dim, device=dev)
        ways: dict[str, tuple[Callable[[], Any], bool]] = {}
        for w in WAYS:
            bl, nw = w.block
            if w.kind == "fused":
                state = cache.state if w.policy == "lfu" else dataclasses.replace(
                    cache.state, frequency=False)
                ways[f"probe_pool[{w.tag},{w.policy},BLOCK_L={bl},warps={nw}]"] = (
                    lambda s=state, t=w.tag == "tags", bl=bl, nw=nw: kernels.probe_pool(
                        s, idx, off, None, cfg.rows, tick, out, flags, block_l=bl,
                        num_warps=nw, tags=t), True)
            else:
                ways[f"gather_pool[slots,BLOCK_L={bl},warps={nw}]"] = (
                    lambda bl=bl, nw=nw: gather_pool(rows_t, slots64, off, out, bl, nw), True)
        ways["F.embedding_bag(slots)"] = (
            lambda: out.copy_(F.embedding_bag(slots64, rows_t, off[:-1], mode="sum")), True)
        ways["index_select(slots, read + written)"] = (
            lambda: torch.index_select(rows_t, 0, slots64, out=gathered), False)
        # every way answers what F.embedding_bag over the table does, before it is timed
        for name, (fn, pools) in ways.items():
            out.zero_()
            fn()
            if cuda:
                torch.cuda.synchronize()
            if pools:
                err = float((out - want).abs().max() / want.abs().max())
                if err > 1e-5 or int(flags.count_nonzero()) != 0:
                    raise AssertionError(f"{name} answers differently at {bags} bags: {err}")
        times: dict[str, list[float]] = {name: [] for name in ways}
        for r in range(cfg.rounds):
            order = list(ways) if r % 2 == 0 else list(reversed(ways))
            for name in order:
                times[name].append(bench(ways[name][0]))
        row_bytes = n * cfg.dim * 4
        cells = []
        for name in ways:
            t = float(np.median(times[name]))
            moved = 2 * row_bytes if name.startswith("index_select") else row_bytes
            cells.append(Record(
                "gpu-hit", "-", bags, "uniform-hits", name, bags / t, n / t, t * 1e6, 0.0,
                {"row_bytes_per_s": moved / t, "share_of_copy": moved / t / copy_bw,
                 "share_of_read": moved / t / read_bw, "rounds_s": times[name],
                 "rows": cfg.rows, "dim": cfg.dim, "pooling": cfg.pooling,
                 "ways": cache.state.ways}))
            log(f"{bags} bags {name}: {t * 1e6:,.0f} µs, rows {moved / t / 1e9:,.0f} GB/s = "
                f"{100 * moved / t / copy_bw:.0f} % of copy")
        return cells

    for bags in cfg.bags:
        records += measure(bags)
    return records


def _limits(bench: Callable[[Callable[[], Any]], float], dev: Any, gen: Any
            ) -> tuple[float, float]:
    """The device-to-device copy (bytes read + written per second) and a plain read (``sum``
    over 4 GiB of fp32), each of 1 GiB or more: far past the L2."""
    import torch

    size = 1 << (30 if dev.type == "cuda" else 24)
    x = torch.empty(size, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    copy_bw = 2 * x.numel() / bench(lambda: y.copy_(x))
    z = torch.empty(size, dtype=torch.float32, device=dev).normal_(generator=gen)
    read_bw = 4 * z.numel() / bench(lambda: z.sum())
    return copy_bw, read_bw


def markdown(records: list[Record], command: str) -> str:
    limit = next(r for r in records if r.system == "limit.copy")
    copy = limit.extra["bytes_per_s"]
    read = next(r.extra["bytes_per_s"] for r in records if r.system == "limit.read(sum)")
    cells = [r for r in records if r.batch > 0]
    lines = [f"Command: `{command}`", "",
             f"Machine: {limit.extra.get('device')}, torch {limit.extra.get('torch')}, Triton "
             f"{limit.extra.get('triton')}.", "",
             f"Copy (device to device, read + written): {copy / 1e9:,.0f} GB/s; read "
             f"(`sum`): {read / 1e9:,.0f} GB/s.", ""]
    if cells:
        e = cells[0].extra
        lines += [f"One table of {e['rows']:,} rows × dim {e['dim']} fp32, every row cached "
                  f"({e['ways']}-way sets), {e['pooling']} lookups a bag uniform over the cached "
                  "rows; µs: median over rounds of each round's median (CUDA events); row GB/s: "
                  "bytes of rows pooled (read + written for `index_select`).", "",
                  "| bags | way | µs | row GB/s | % of copy | % of read | rounds' spread |",
                  "|---:|---|---:|---:|---:|---:|---:|"]
        for r in cells:
            rs = r.extra["rounds_s"]
            spread = (max(rs) - min(rs)) / 2 / float(np.median(rs))
            lines.append(f"| {r.batch:,} | {r.system} | {r.p50_us:,.0f} | "
                         f"{r.extra['row_bytes_per_s'] / 1e9:,.0f} | "
                         f"{100 * r.extra['share_of_copy']:.0f} % | "
                         f"{100 * r.extra['share_of_read']:.0f} % | ±{100 * spread:.0f} % |")
    return "\n".join(lines) + "\n"


HARNESSES = {"gpu-hit": Harness(GpuHitConfig, GpuHitConfig.quick,
                                {"--rows": "rows", "--scratch": "scratch"}, run, markdown)}
