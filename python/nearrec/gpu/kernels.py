# mypy: disable-error-code="no-untyped-def, untyped-decorator, attr-defined, no-any-return"
# (the kernels are Triton source: their parameters are typed by Triton at launch)
"""Triton kernels of the GPU cache (CUDA, or Triton's interpreter on CPU tensors when
``TRITON_INTERPRET=1`` was set before Triton was imported). Their plain-torch twins and the
semantics both follow are in :mod:`nearrec.gpu.reference`.

- ``_probe_pool_kernel``: one program per bag. Each step takes ``BLOCK_L`` lookups of the bag,
  loads the ``[BLOCK_L, ways]`` tile of their sets' 8-bit tags (a set's tags are contiguous, so
  each row of the tile is one coalesced load: the warp-wide compare of HS-Rec, on an eighth of
  the keys' bytes), loads the keys only where a tag matches, reduces the matches to a way per
  lookup, gathers the hit rows as a ``[BLOCK_L, dim]`` tile and adds its weighted
  column sums to the bag's accumulator: hit rows are never written out. Misses are flagged for
  the host; they add nothing here.
- ``_lookup_kernel``: the same probe for ``BLOCK_L`` independent keys, hit rows copied out.
- ``_pool_rows_kernel``: adds rows of a source buffer (HBM, or pinned host memory read over PCIe)
  into bags with atomic adds: the misses and the partial sums from the lower tiers.
- ``_replace_kernel``: keys arrive sorted by set; the program of the first key of each set's run
  does the run (the others return at once, so no host round trip counts the runs). It takes the
  set's lock (a sequence number made odd with compare-and-swap), then for each key in order:
  skips it if another replace already cached it, else picks the victim (free slot, else least
  counter; the lowest way on ties), copies the row, writes counter and key, and finally releases
  the lock (sequence number + 1, after a block barrier so every thread's stores precede it).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from . import config
from .state import CacheState, GroupItem

HASH_MULT: tl.constexpr = tl.constexpr(config.HASH_MULT)


@triton.jit
def _set_of(keys, num_sets):
    h = (keys * HASH_MULT) >> 32
    return (h & 0x7FFFFFFF) % num_sets


@triton.jit
def _tag_of(keys):
    # the key's eight bytes folded by XOR
    t = keys ^ (keys >> 32)
    t = t ^ (t >> 16)
    return ((t ^ (t >> 8)) & 0xFF).to(tl.int32)


@triton.jit
def _probe(keys_ptr, tags_ptr, key, valid, set_base, num_sets, WAYS: tl.constexpr,
           TAGS: tl.constexpr):
    ways = tl.arange(0, WAYS)
    k = tl.where(valid, key, 0)
    base = (set_base + _set_of(k, num_sets)) * WAYS
    at = base[:, None] + ways[None, :]
    if TAGS:
        # compare the set's 8-bit tags (an eighth of the bytes of its keys), then load the
        # full key only where a tag matches
        tags = tl.load(tags_ptr + at, mask=valid[:, None], other=0).to(tl.int32)
        maybe = (tags == _tag_of(k)[:, None]) & valid[:, None]
        cand = tl.load(keys_ptr + at, mask=maybe, other=-1)
        match = maybe & (cand == key[:, None])
    else:
        cand = tl.load(keys_ptr + at, mask=valid[:, None], other=-1)
        match = (cand == key[:, None]) & valid[:, None]
    way = tl.max(tl.where(match, ways[None, :], -1), axis=1)
    hit = way >= 0
    slot = base + tl.where(hit, way, 0)
    return hit, slot


@triton.jit
def _touch(counters_ptr, slot, hit, tick, FREQUENCY: tl.constexpr):
    # a hit's counter: LFU adds 1 (a relaxed atomic: the count needs no order with anything,
    # and an acq_rel one cost the hit path 15 % of its bandwidth), LRU stores the tick
    if FREQUENCY:
        tl.atomic_add(counters_ptr + slot, tl.full(slot.shape, 1, tl.int32), mask=hit,
                      sem="relaxed")
    else:
        tl.store(counters_ptr + slot, tl.full(slot.shape, 0, tl.int32) + tick, mask=hit)


@triton.jit
def _probe_pool_kernel(indices_ptr, offsets_ptr, weights_ptr, keys_ptr, tags_ptr, rows_ptr,
                       counters_ptr, out_ptr, flags_ptr, num_sets, table_rows, tick, dim,
                       HAS_WEIGHTS: tl.constexpr, FREQUENCY: tl.constexpr, WAYS: tl.constexpr,
                       TAGS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr):
    bag = tl.program_id(0)
    start = tl.load(offsets_ptr + bag)
    end = tl.load(offsets_ptr + bag + 1)
    cols = tl.arange(0, BLOCK_D)
    dmask = cols < dim
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    i = start
    while i < end:  # (a while loop: Triton 3.6's interpreter cannot range() over loaded values)
        pos = i + tl.arange(0, BLOCK_L)
        m = pos < end
        key = tl.load(indices_ptr + pos, mask=m, other=-1)
        valid = m & (key >= 0) & (key < table_rows)
        hit, slot = _probe(keys_ptr, tags_ptr, key, valid, 0, num_sets, WAYS, TAGS)
        r = tl.load(rows_ptr + slot[:, None] * dim + cols[None, :],
                    mask=hit[:, None] & dmask[None, :], other=0.0)
        if HAS_WEIGHTS:
            w = tl.load(weights_ptr + pos, mask=m, other=0.0)
            r = r * w[:, None]
        acc += tl.sum(r, axis=0)
        flag = tl.where(hit, 0, tl.where(valid, 1, 2))
        tl.store(flags_ptr + pos, flag.to(tl.int8), mask=m)
        _touch(counters_ptr, slot, hit, tick, FREQUENCY)
        i += BLOCK_L
    tl.store(out_ptr + bag * dim + cols, acc, mask=dmask)


@triton.jit
def _probe_pool_group_kernel(meta_ptr, keys_ptr, tags_ptr, rows_ptr, counters_ptr, out_ptr,
                             flags_ptr, out_stride, dim, HAS_WEIGHTS: tl.constexpr,
                             FREQUENCY: tl.constexpr, WAYS: tl.constexpr, TAGS: tl.constexpr,
                             BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr):
    # several tables' caches in one state (each its range of sets) and their batches in one
    # launch: program (bag, table); per table, meta holds the addresses of its indices,
    # offsets and weights and its flag base, set base, sets, rows and tick
    bag = tl.program_id(0)
    t = tl.program_id(1)
    meta = meta_ptr + t * 9
    idx_ptr = tl.load(meta).to(tl.pointer_type(tl.int64))
    off_ptr = tl.load(meta + 1).to(tl.pointer_type(tl.int64))
    w_ptr = tl.load(meta + 2).to(tl.pointer_type(tl.float32))
    has_w = tl.load(meta + 3)
    flag_base = tl.load(meta + 4)
    set_base = tl.load(meta + 5)
    num_sets = tl.load(meta + 6)
    table_rows = tl.load(meta + 7)
    tick = tl.load(meta + 8).to(tl.int32)
    start = tl.load(off_ptr + bag)
    end = tl.load(off_ptr + bag + 1)
    cols = tl.arange(0, BLOCK_D)
    dmask = cols < dim
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    i = start
    while i < end:
        pos = i + tl.arange(0, BLOCK_L)
        m = pos < end
        key = tl.load(idx_ptr + pos, mask=m, other=-1)
        valid = m & (key >= 0) & (key < table_rows)
        hit, slot = _probe(keys_ptr, tags_ptr, key, valid, set_base, num_sets, WAYS, TAGS)
        r = tl.load(rows_ptr + slot[:, None] * dim + cols[None, :],
                    mask=hit[:, None] & dmask[None, :], other=0.0)
        if HAS_WEIGHTS:
            w = tl.load(w_ptr + pos, mask=m & (has_w != 0), other=1.0)
            r = r * w[:, None]
        acc += tl.sum(r, axis=0)
        flag = tl.where(hit, 0, tl.where(valid, 1, 2))
        tl.store(flags_ptr + flag_base + pos, flag.to(tl.int8), mask=m)
        _touch(counters_ptr, slot, hit, tick, FREQUENCY)
        i += BLOCK_L
    tl.store(out_ptr + bag * out_stride + t * dim + cols, acc, mask=dmask)


@triton.jit
def _lookup_kernel(idx_ptr, keys_ptr, tags_ptr, rows_ptr, counters_ptr, out_ptr, flags_ptr, n,
                   num_sets, table_rows, tick, dim, FREQUENCY: tl.constexpr, WAYS: tl.constexpr,
                   TAGS: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr):
    pos = tl.program_id(0) * BLOCK_L + tl.arange(0, BLOCK_L)
    m = pos < n
    cols = tl.arange(0, BLOCK_D)
    dmask = cols < dim
    key = tl.load(idx_ptr + pos, mask=m, other=-1)
    valid = m & (key >= 0) & (key < table_rows)
    hit, slot = _probe(keys_ptr, tags_ptr, key, valid, 0, num_sets, WAYS, TAGS)
    r = tl.load(rows_ptr + slot[:, None] * dim + cols[None, :],
                mask=hit[:, None] & dmask[None, :], other=0.0)
    tl.store(out_ptr + pos[:, None] * dim + cols[None, :], r, mask=m[:, None] & dmask[None, :])
    flag = tl.where(hit, 0, tl.where(valid, 1, 2))
    tl.store(flags_ptr + pos, flag.to(tl.int8), mask=m)
    _touch(counters_ptr, slot, hit, tick, FREQUENCY)


@triton.jit
def _pool_rows_kernel(src_ptr, src_row_ptr, bag_ptr, weight_ptr, out_ptr, n, dim, out_stride,
                      HAS_WEIGHTS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    j = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = j < n
    cols = tl.arange(0, BLOCK_D)
    mask2 = m[:, None] & (cols < dim)[None, :]
    r = tl.load(src_row_ptr + j, mask=m, other=0)
    b = tl.load(bag_ptr + j, mask=m, other=0)
    v = tl.load(src_ptr + r[:, None] * dim + cols[None, :], mask=mask2, other=0.0)
    if HAS_WEIGHTS:
        v = v * tl.load(weight_ptr + j, mask=m, other=0.0)[:, None]
    tl.atomic_add(out_ptr + b[:, None] * out_stride + cols[None, :], v, mask=mask2)


@triton.jit
def _replace_kernel(in_keys_ptr, in_sets_ptr, src_ptr, src_row_ptr, n, keys_ptr, tags_ptr,
                    rows_ptr, counters_ptr, locks_ptr, owner_ptr, stats_ptr, num_sets, tick, dim,
                    FREQUENCY: tl.constexpr, WAYS: tl.constexpr, BLOCK_D: tl.constexpr):
    j = tl.program_id(0)
    s = tl.load(in_sets_ptr + j)
    prev = tl.load(in_sets_ptr + j - 1, mask=j > 0, other=-1)
    # only the first key of each set's run works; keys marked with set == num_sets are skipped
    if (s < num_sets) & (s != prev):
        lock = locks_ptr + s
        # acquire: move the set's sequence number from even v to odd v + 1
        acquired = 0
        seq = 0
        while acquired == 0:
            seq = tl.atomic_add(lock, 0)
            even = (seq % 2) == 0
            old = tl.atomic_cas(lock, tl.where(even, seq, -1), seq + 1)
            acquired = (even & (old == seq)).to(tl.int32)
        ways = tl.arange(0, WAYS)
        cols = tl.arange(0, BLOCK_D)
        dmask = cols < dim
        base = s * WAYS
        inserted = 0
        evicted = 0
        k = j
        sk = s
        while (k < n) & (sk == s):
            key = tl.load(in_keys_ptr + k)
            cand = tl.load(keys_ptr + base + ways)
            present = tl.max((cand == key).to(tl.int32), axis=0)
            if present == 0:
                cnt = tl.load(counters_ptr + base + ways)
                score = tl.where(cand == -1, -1, cnt)
                way = tl.argmin(score, axis=0)
                old_key = tl.sum(tl.where(ways == way, cand, 0), axis=0)
                evicted += (old_key != -1).to(tl.int32)
                inserted += 1
                slot = base + way
                r = tl.load(src_ptr + tl.load(src_row_ptr + k) * dim + cols, mask=dmask,
                            other=0.0)
                tl.store(rows_ptr + slot * dim + cols, r, mask=dmask)
                if FREQUENCY:
                    tl.store(counters_ptr + slot, 1)
                else:
                    tl.store(counters_ptr + slot, tick)
                tl.store(tags_ptr + slot, _tag_of(key).to(tl.uint8))
                tl.store(keys_ptr + slot, key)
            tl.debug_barrier()
            k += 1
            sk = tl.load(in_sets_ptr + k, mask=k < n, other=-1)
        st = stats_ptr + 2 * tl.load(owner_ptr + s)
        tl.atomic_add(st, inserted.to(tl.int64))
        tl.atomic_add(st + 1, evicted.to(tl.int64))
        tl.debug_barrier()
        tl.atomic_xchg(lock, seq + 2)


def block(n: int, at_least: int = 16) -> int:
    """The power of two ≥ ``n`` (and ≥ ``at_least``): Triton tiles are powers of two."""
    return max(at_least, triton.next_power_of_2(max(n, 1)))


def _shape(programs: int) -> tuple[int, int]:
    """BLOCK_L and warps of a pooling kernel of ``programs`` bags: one warp of 8 lookups a step
    once there are 2,048 (more programs resident: on an H200, 69 % of the copy bandwidth at
    65,536 bags against 57 % with (16, 2), ``bench gpu-hit``), wide steps while there are few
    (measured on an H100, ``bench gpu``)."""
    return (8, 1) if programs >= 2048 else (32, 4)


# ---- launchers: the same signatures as nearrec.gpu.reference ----

def probe_pool(state: CacheState, indices: torch.Tensor, offsets: torch.Tensor,
               weights: torch.Tensor | None, table_rows: int, tick: int, out: torch.Tensor,
               flags: torch.Tensor, block_l: int | None = None, num_warps: int | None = None,
               tags: bool = True) -> None:
    bags = offsets.numel() - 1
    if bags <= 0:
        return
    if block_l is None or num_warps is None:
        block_l, num_warps = _shape(bags)
    _probe_pool_kernel[(bags,)](
        indices, offsets, weights if weights is not None else indices, state.keys, state.tags,
        state.rows, state.counters, out, flags, state.num_sets, table_rows, tick, state.dim,
        HAS_WEIGHTS=weights is not None, FREQUENCY=state.frequency, WAYS=state.ways, TAGS=tags,
        BLOCK_L=block_l, BLOCK_D=block(state.dim), num_warps=num_warps)


def probe_pool_group(state: CacheState, items: list[GroupItem], out: torch.Tensor,
                     flags: torch.Tensor, tags: bool = True) -> None:
    """One launch for several tables whose caches are views of ``state`` (same dim, same
    bag count): ``out`` is ``[bags, tables * dim]``, ``flags`` every table's flags in order."""
    if not items:
        return
    bags = items[0].offsets.numel() - 1
    if bags <= 0:
        return
    rows = []
    flag_base = 0
    any_w = any(it.weights is not None for it in items)
    for it in items:
        w = it.weights if it.weights is not None else it.indices
        rows.append([it.indices.data_ptr(), it.offsets.data_ptr(), w.data_ptr(),
                     int(it.weights is not None), flag_base, it.set_base, it.num_sets,
                     it.table_rows, it.tick])
        flag_base += it.indices.numel()
    meta = torch.tensor(rows, dtype=torch.int64)
    if state.device.type == "cuda":
        meta = meta.pin_memory().to(state.device, non_blocking=True)
    block_l, num_warps = _shape(bags * len(items))
    _probe_pool_group_kernel[(bags, len(items))](
        meta, state.keys, state.tags, state.rows, state.counters, out, flags, out.stride(0),
        state.dim, HAS_WEIGHTS=any_w, FREQUENCY=state.frequency, WAYS=state.ways, TAGS=tags,
        BLOCK_L=block_l, BLOCK_D=block(state.dim), num_warps=num_warps)


def lookup(state: CacheState, keys: torch.Tensor, table_rows: int, tick: int,
           out: torch.Tensor, flags: torch.Tensor, block_l: int = 32) -> None:
    n = keys.numel()
    if n == 0:
        return
    _lookup_kernel[(triton.cdiv(n, block_l),)](
        keys, state.keys, state.tags, state.rows, state.counters, out, flags, n, state.num_sets,
        table_rows, tick, state.dim, FREQUENCY=state.frequency, WAYS=state.ways, TAGS=True,
        BLOCK_L=block_l,
        BLOCK_D=block(state.dim), num_warps=4)


def pool_rows(src: Any, src_row: torch.Tensor, bag: torch.Tensor, weight: torch.Tensor | None,
              out: torch.Tensor, block_n: int = 16) -> None:
    n = src_row.numel()
    if n == 0:
        return
    dim = out.shape[1]
    _pool_rows_kernel[(triton.cdiv(n, block_n),)](
        src, src_row, bag, weight if weight is not None else src_row, out, n, dim, out.stride(0),
        HAS_WEIGHTS=weight is not None, BLOCK_N=block_n, BLOCK_D=block(dim), num_warps=4)


def replace(state: CacheState, keys: torch.Tensor, sets: torch.Tensor, src: Any,
            src_row: torch.Tensor, tick: int) -> None:
    n = keys.numel()
    if n == 0:
        return
    _replace_kernel[(n,)](
        keys, sets, src, src_row, n, state.keys, state.tags, state.rows, state.counters,
        state.locks, state.owner, state.stats, state.num_sets, tick, state.dim,
        FREQUENCY=state.frequency, WAYS=state.ways, BLOCK_D=block(state.dim), num_warps=2)
