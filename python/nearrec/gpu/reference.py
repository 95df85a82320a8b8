"""The CPU reference of the GPU cache's kernels: the same probe, pool and replace, in plain
torch, one step at a time. The kernels must agree with it (``tests/test_gpu_*``); it also runs
the tier on machines without a GPU.

Semantics every backend implements (see :mod:`nearrec.gpu.kernels` for the Triton twins):

- ``probe_pool``: for each bag ``b`` (lookups ``offsets[b]:offsets[b+1]``), ``out[b]`` = the sum
  of ``weight * row`` over the lookups whose key is cached; ``flags[i]`` = 0 hit, 1 miss, 2 key
  outside ``[0, table_rows)``. A hit adds 1 to the slot's counter (LFU) or sets it to ``tick``
  (LRU).
- ``lookup``: the same probe per key, rows copied out (zeros for misses).
- ``pool_rows``: ``out[bag[j]] += weight[j] * src[src_row[j]]``.
- ``replace``: keys with their ``sets`` (sorted by set; ``num_sets`` marks a key to skip); per
  set, in order, each key not already cached takes the slot of least score (free slots first,
  then the least counter; ties to the lowest way), its row copied from ``src[src_row[j]]``, its
  counter set to 1 (LFU) or ``tick`` (LRU).
"""

from __future__ import annotations

import torch

from .config import EMPTY_KEY, key_tag, set_index
from .state import CacheState, GroupItem


def _probe(state: CacheState, keys: torch.Tensor, table_rows: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    valid = (keys >= 0) & (keys < table_rows)
    sets = set_index(keys.clamp(min=0), state.num_sets)
    cand = state.keys.view(state.num_sets, state.ways)[sets]
    match = (cand == keys[:, None]) & valid[:, None]
    hit = match.any(dim=1)
    way = match.to(torch.int8).argmax(dim=1)
    slot = sets * state.ways + way
    return valid, hit, slot


def _touch(state: CacheState, slot: torch.Tensor, tick: int) -> None:
    if state.frequency:
        state.counters.index_add_(0, slot, torch.ones_like(slot, dtype=torch.int32))
    else:
        state.counters[slot] = tick


def probe_pool(state: CacheState, indices: torch.Tensor, offsets: torch.Tensor,
               weights: torch.Tensor | None, table_rows: int, tick: int, out: torch.Tensor,
               flags: torch.Tensor) -> None:
    valid, hit, slot = _probe(state, indices, table_rows)
    lengths = offsets[1:] - offsets[:-1]
    bag = torch.repeat_interleave(torch.arange(lengths.numel(), device=indices.device), lengths)
    contrib = state.rows[slot] * hit[:, None]
    if weights is not None:
        contrib = contrib * weights[:, None]
    out.zero_()
    out.index_add_(0, bag, contrib)  # (a view of a wider output works too)
    flags.copy_(torch.where(hit, 0, torch.where(valid, 1, 2)).to(torch.int8))
    _touch(state, slot[hit], tick)


def probe_pool_group(state: CacheState, items: list[GroupItem], out: torch.Tensor,
                     flags: torch.Tensor) -> None:
    dim = state.dim
    at = 0
    for t, it in enumerate(items):
        n = it.indices.numel()
        probe_pool(it.state, it.indices, it.offsets, it.weights, it.table_rows, it.tick,
                   out[:, t * dim:(t + 1) * dim], flags[at:at + n])
        at += n


def lookup(state: CacheState, keys: torch.Tensor, table_rows: int, tick: int,
           out: torch.Tensor, flags: torch.Tensor) -> None:
    valid, hit, slot = _probe(state, keys, table_rows)
    out.copy_(state.rows[slot] * hit[:, None])
    flags.copy_(torch.where(hit, 0, torch.where(valid, 1, 2)).to(torch.int8))
    _touch(state, slot[hit], tick)


def pool_rows(src: torch.Tensor, src_row: torch.Tensor, bag: torch.Tensor,
              weight: torch.Tensor | None, out: torch.Tensor) -> None:
    rows = src[src_row]
    if weight is not None:
        rows = rows * weight[:, None]
    out.index_add_(0, bag, rows)


def replace(state: CacheState, keys: torch.Tensor, sets: torch.Tensor, src: torch.Tensor,
            src_row: torch.Tensor, tick: int) -> None:
    ks = state.keys.view(state.num_sets, state.ways)
    cs = state.counters.view(state.num_sets, state.ways)
    set_list = sets.tolist()
    for j, s in enumerate(set_list):
        if s >= state.num_sets or (j > 0 and set_list[j - 1] == s):
            continue
        state.locks[s] += 1
        st = 2 * int(state.owner[s])
        k = j
        while k < len(set_list) and set_list[k] == s:
            key = int(keys[k])
            if not bool((ks[s] == key).any()):
                score = torch.where(ks[s] == EMPTY_KEY, torch.full_like(cs[s], -1), cs[s])
                way = int(torch.argmin(score))
                if int(ks[s, way]) != EMPTY_KEY:
                    state.stats[st + 1] += 1
                state.stats[st] += 1
                slot = s * state.ways + way
                state.rows[slot] = src[int(src_row[k])]
                cs[s, way] = 1 if state.frequency else tick
                ks[s, way] = key
                state.tags[slot] = key_tag(key)
            k += 1
        state.locks[s] += 1
