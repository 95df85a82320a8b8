"""The GPU tier over a store: cached rows pool on the GPU, misses come from the engine.

Per table and batch (:meth:`CachedTable.pool`):

1. one fused probe + pool kernel sums the cached rows of every bag and flags the misses;
2. the misses are de-duplicated on the GPU (``torch.unique``) and the admission decision is
   made for each distinct key *before* anything is fetched; only the distinct keys cross to
   the host;
3. one gather fetches their rows from the store (a multi-threaded ``index_select`` straight into
   the pinned buffer when the table is resident in DRAM, one ``store.read_rows`` call otherwise);
   with near-data pooling, only the rows the cache will admit are fetched and one
   ``store.lookup`` call pools the other misses of each bag in the engine, so one partial sum
   per bag crosses PCIe instead of their rows;
4. the kernels read the pinned buffer in place over PCIe (``zero_copy``, the default) or it is
   copied on a side stream first (``async_copy``); on an H100 the two were within 7 % of each
   other, the winner changing between runs (``bench/results/gpu.md``);
5. a pool kernel adds the fetched rows and partial sums to their bags, and the replace kernel
   takes the admitted rows into the cache.

:class:`GpuTier` keeps the caches of tables of one width in one state (each table its range of
sets), so one launch probes and pools every table of a batch and, without near-data pooling,
the misses of all tables are served in one round (one ``unique``, one host round trip, one
copy, one pool and one replace launch).

Results equal ``store.lookup`` (``torch.nn.EmbeddingBag``'s sum / mean) within fp32 rounding.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ..errors import IndexOutOfRange, UnknownTable
from ..store import Store
from .cache import Backend, CacheStats, Clock, plan_num_sets
from .config import HASH_MULT, GpuCacheConfig, admit, slot_bytes
from .staging import Staging
from .state import CacheState, GroupItem
from .table import CachedTable, Request


class GpuTier:
    """GPU caches for several tables of a store, sharing one HBM budget.

    The budget is split between tables in proportion to their bytes; no table gets more than
    1.25 slots per row (a budget that large caches the whole table, hashing imbalance
    included).
    """

    def __init__(self, store: Store, tables: Sequence[str] | None = None,
                 config: GpuCacheConfig | None = None, device: torch.device | str = "cuda",
                 backend: Backend = "auto"):
        config = (config or GpuCacheConfig(hbm_budget="8GiB")).validate()
        names = list(tables) if tables is not None else list(store.tables)
        infos = [store.table(t) for t in names]
        slots: dict[str, int | None] = {t: None for t in names}
        if config.slots is None:
            # proportional to table bytes; a budget above the total gives every table all rows
            budget = config.budget_bytes or 0
            want = {i.name: -(-i.rows * 5 // 4) * slot_bytes(i.dim) for i in infos}
            total = sum(want.values())
            for i in infos:
                share = min(want[i.name], budget * want[i.name] // max(total, 1))
                slots[i.name] = share // slot_bytes(i.dim)
        self.config = config
        self.device = torch.device(device)
        self._lock = threading.Lock()
        self._pinned = torch.empty(0, dtype=torch.int64)
        self._uploaded: torch.cuda.Event | None = None
        # tables of one width share one state (each its range of sets), so that one kernel
        # launch probes and pools every table of a batch
        sets = {i.name: plan_num_sets(i.name, i.rows, i.dim, config, slots[i.name])
                for i in infos}
        self._shared: CacheState | None = None
        self._set_base: dict[str, int] = {}
        self._clock = Clock()
        if len({i.dim for i in infos}) == 1 and len(infos) > 1:
            self._shared = CacheState.allocate(sum(sets.values()), config.ways, infos[0].dim,
                                               config.cache_policy.frequency, self.device,
                                               owners=len(infos))
            at = 0
            for k, i in enumerate(infos):
                self._set_base[i.name] = at
                self._shared.owner[at:at + sets[i.name]] = k
                at += sets[i.name]
            self._staging = Staging(self.device, config.transfer_mode)
        self.tables: dict[str, CachedTable] = {}
        for t in names:
            view = None if self._shared is None else \
                self._shared.sets(self._set_base[t], sets[t])
            self.tables[t] = CachedTable(store, t, config, self.device, backend,
                                         slots=slots[t], state=view, clock=self._clock)

    def pool(self, table: str, indices: Any, offsets: Any, per_sample_weights: Any = None,
             mode: str = "sum", include_last_offset: bool = False) -> torch.Tensor:
        """:meth:`CachedTable.pool` on one table."""
        return self._table(table).pool(indices, offsets, per_sample_weights, mode,
                                       include_last_offset)

    def _table(self, table: str) -> CachedTable:
        try:
            return self.tables[table]
        except KeyError:
            raise UnknownTable(f"table {table!r} has no GPU cache", table=table) from None

    def pool_many(self, requests: Sequence[tuple[str, Any, Any, Any, str]]) -> list[torch.Tensor]:
        """Pools several tables' bags: ``requests`` are ``(table, indices, offsets,
        per_sample_weights or None, mode)`` (``offsets``: each bag's start, as
        ``nn.EmbeddingBag``'s); returns one ``[bags, dim]`` tensor per request (views of one
        ``[bags, Σ dim]`` tensor when the tables share their width and bag count).

        Numpy inputs of every table go to the GPU in one copy (tensors as they are); tables of
        one width are probed and pooled by one kernel launch, others by one launch each; one
        device→host copy of the miss counts tells which tables have misses to serve."""
        return self._pool(requests)[0]

    def pool_concat(self, requests: Sequence[tuple[str, Any, Any, Any, str]]) -> torch.Tensor:
        """:meth:`pool_many` as one ``[bags, Σ dim]`` tensor (TorchRec's KeyedTensor values)."""
        outs, whole = self._pool(requests)
        return whole if whole is not None else torch.cat(outs, dim=1)

    def _pool(self, requests: Sequence[tuple[str, Any, Any, Any, str]]
              ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        tables = [self._table(r[0]) for r in requests]
        reqs = [ct.prepare(r[1], r[2], r[3], r[4], upload=False)
                for ct, r in zip(tables, requests, strict=True)]
        self._upload(reqs)
        with self._lock:
            for ct in tables:
                ct.sync()
            sizes = [int(q.off_h[-1]) for q in reqs]
            flags = torch.empty(sum(sizes), dtype=torch.int8, device=self.device)
            ends = np.cumsum(sizes)
            whole: torch.Tensor | None = None
            if self._shared is not None and len({q.off_h.size for q in reqs}) == 1:
                assert self._shared is not None
                dim = self._shared.dim
                whole = torch.empty((reqs[0].off_h.size - 1, dim * len(reqs)),
                                    dtype=torch.float32, device=self.device)
                tick = self._clock.next()  # one tick for the batch, all its tables
                items = [GroupItem(q.idx_d, q.off_d, q.w_d, self._set_base[ct.table],
                                   ct.cache.num_sets, ct.rows, tick, ct.cache.state)
                         for ct, q in zip(tables, reqs, strict=True)]
                ops = tables[0].cache._ops
                if tables[0].cache.backend == "triton":
                    ops.probe_pool_group(self._shared, items, whole, flags,
                                         tags=self.config.probe_tags)
                else:
                    ops.probe_pool_group(self._shared, items, whole, flags)
                outs = [whole[:, k * dim:(k + 1) * dim] for k in range(len(reqs))]
                ticks = [it.tick for it in items]
            else:
                probed = [ct.probe(q, flags[e - n:e])
                          for ct, q, n, e in zip(tables, reqs, sizes, ends, strict=True)]
                outs = [o for _, o, _ in probed]
                ticks = [tk for _, _, tk in probed]
            # one wait: the number of misses of every table
            bounds = torch.from_numpy(np.concatenate([[0], ends])).to(self.device)
            per = torch.cumsum((flags != 0).to(torch.int32), 0)
            per = torch.cat([per.new_zeros(1), per])[bounds]
            counts = torch.diff(per).cpu().numpy()
            near = self.config.near_data_pooling != "off" and \
                self.config.cache_policy.probabilistic
            if whole is not None and not near and counts.any():
                # every table's misses in one round: one unique, one fetch, one copy, one
                # pool launch, one replace launch
                missing = [(k, torch.nonzero(flags[e - n:e]).flatten())
                           for k, (c, n, e) in enumerate(zip(counts, sizes, ends, strict=True))
                           if c]
                self._serve_group(tables, reqs, missing, whole, ticks[0])
                served = {k for k, _ in missing}
            else:
                served = set()
            empty = torch.zeros(0, dtype=torch.int64, device=self.device)
            for k, (ct, q, out, tick, c, n, e) in enumerate(
                    zip(tables, reqs, outs, ticks, counts, sizes, ends, strict=True)):
                if k in served:
                    ct.finish(q, out, tick, empty, misses=int(c))
                else:
                    miss = torch.nonzero(flags[e - n:e]).flatten() if c else empty
                    ct.finish(q, out, tick, miss)
        return outs, whole

    def _serve_group(self, tables: list[CachedTable], reqs: list[Request],
                     missing: list[tuple[int, torch.Tensor]], whole: torch.Tensor,
                     tick: int) -> None:
        """The misses of several tables sharing one state, served together (near-data pooling
        off): one de-duplication, one host round trip, one copy, one pool and one replace
        launch for all of them."""
        assert self._shared is not None
        shared = self._shared
        dim, width = shared.dim, len(reqs)
        keys = [reqs[k].idx_d[m] for k, m in missing]
        bad = torch.stack([((x < 0) | (x >= tables[k].rows)).any()
                           for x, (k, _) in zip(keys, missing, strict=True)]).cpu().numpy()
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            k, m = missing[j]
            ct = tables[k]
            i = torch.nonzero((keys[j] < 0) | (keys[j] >= ct.rows)).flatten()[0]
            pos, key = int(m[i]), int(keys[j][i])
            raise IndexOutOfRange(f"table {ct.table!r}: index {key} at position {pos} is out "
                                  f"of range for {ct.rows} rows", table=ct.table, position=pos)
        # one key space: table k's keys shifted past the rows of the tables before it
        shift = np.cumsum([0] + [tables[k].rows for k, _ in missing])
        gkeys = torch.cat([x + int(shift[j]) for j, x in enumerate(keys)])
        uniq, inv = torch.unique(gkeys, sorted=True, return_inverse=True)
        uniq_h = uniq.cpu()
        bounds = np.searchsorted(uniq_h.numpy(), shift)
        host = self._staging.host_rows(int(uniq_h.numel()), dim)
        for j, (k, _) in enumerate(missing):
            lo, hi = int(bounds[j]), int(bounds[j + 1])
            tables[k]._gather(uniq_h[lo:hi] - int(shift[j]), host[lo:hi])
            st = tables[k].cache.stats
            st.unique_misses += hi - lo
            st.rows_fetched += hi - lo
            st.bytes_to_gpu += (hi - lo) * dim * 4
        src = self._staging.to_device(host)
        bags = []
        weights = []
        any_w = any(reqs[k].w_d is not None for k, _ in missing)
        for k, m in missing:
            q = reqs[k]
            bags.append((torch.searchsorted(q.off_d, m, right=True) - 1) * width + k)
            if any_w:
                weights.append(q.w_d[m] if q.w_d is not None else
                               torch.ones(m.numel(), dtype=torch.float32, device=self.device))
        cache = tables[0].cache
        cache.pool_rows(src, inv, torch.cat(bags), torch.cat(weights) if any_w else None,
                        whole.view(-1, dim))
        counts = torch.from_numpy(np.diff(bounds)).to(self.device)

        def per(v: list[int]) -> torch.Tensor:  # one value per table, repeated per key
            return torch.repeat_interleave(
                torch.tensor(v, dtype=torch.int64, device=self.device), counts)

        local = uniq - per([int(shift[j]) for j in range(len(missing))])
        taken = admit(local, self.config.cache_policy, self.config.admission_probability, tick,
                      self.config.seed)
        h = ((local * HASH_MULT) >> 32) & 0x7FFFFFFF
        sets = per([self._set_base[tables[k].table] for k, _ in missing]) + \
            h % per([tables[k].cache.num_sets for k, _ in missing])
        sets = torch.where(taken, sets, shared.num_sets)
        sets, order = torch.sort(sets, stable=True)
        cache._ops.replace(shared, local[order].contiguous(), sets.contiguous(), src,
                           order.contiguous(), tick)
        self._staging.release()

    def _upload(self, reqs: list[Request]) -> None:
        """One host→device copy for every request's numpy indices, offsets and weights."""
        parts: list[npt.NDArray[np.int64]] = []
        for q in reqs:
            parts.append(q.off_h)
            if q.idx_h is not None:
                parts.append(q.idx_h)
            if q.w_h is not None:
                parts.append(q.w_h.view(np.int32).astype(np.int64))
        total = sum(p.size for p in parts)
        if self.device.type == "cuda":
            if self._pinned.numel() < total:
                self._pinned = torch.empty(max(total, 2 * self._pinned.numel()),
                                           dtype=torch.int64, pin_memory=True)
            if self._uploaded is not None:
                self._uploaded.synchronize()
            host = self._pinned.numpy()
            at = 0
            for p in parts:
                host[at:at + p.size] = p
                at += p.size
            dev = self._pinned[:total].to(self.device, non_blocking=True)
            if self._uploaded is None:
                self._uploaded = torch.cuda.Event()  # type: ignore[no-untyped-call]
            self._uploaded.record()
        else:
            dev = torch.from_numpy(np.concatenate(parts)) if parts else \
                torch.zeros(0, dtype=torch.int64)
        at = 0
        for q in reqs:
            q.off_d = dev[at:at + q.off_h.size]
            at += q.off_h.size
            n = int(q.off_h[-1])
            if q.idx_h is not None:
                q.idx_d = dev[at:at + n]
                at += n
            if q.w_h is not None:
                q.w_d = dev[at:at + n].to(torch.int32).view(torch.float32)
                at += n

    def stats(self) -> Mapping[str, CacheStats]:
        """Counters per table."""
        return {t: ct.stats for t, ct in self.tables.items()}

    @property
    def hbm_bytes(self) -> int:
        return sum(ct.cache.hbm_bytes for ct in self.tables.values())


__all__ = ["CachedTable", "GpuTier"]
