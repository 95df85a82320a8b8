"""One store table behind its GPU cache: validation, the probe, and the miss path (fetch,
admission-aware near-data pooling, pool, replace). :mod:`nearrec.gpu.tier` has the whole
path of a batch."""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from ..errors import IndexOutOfRange, InvalidRequest
from ..store import Store
from .cache import Backend, CacheStats, Clock, GpuEmbeddingCache
from .config import GpuCacheConfig, admit
from .staging import Staging
from .state import CacheState


@dataclass
class Request:
    """One table's validated batch: offsets on the host (small), everything on the device."""

    off_h: npt.NDArray[np.int64]
    idx_d: torch.Tensor
    off_d: torch.Tensor
    w_d: torch.Tensor | None
    mode: str
    idx_h: npt.NDArray[np.int64] | None = None
    w_h: npt.NDArray[np.float32] | None = None


class CachedTable:
    """One store table behind its GPU cache; :meth:`pool` serves EmbeddingBag batches."""

    def __init__(self, store: Store, table: str, config: GpuCacheConfig,
                 device: torch.device | str = "cuda", backend: Backend = "auto",
                 slots: int | None = None, state: CacheState | None = None,
                 clock: Clock | None = None):
        info = store.table(table)
        self.store = store
        self.table = table
        self.rows = info.rows
        self.dim = info.dim
        self.config = config.validate()
        self.device = torch.device(device)
        self.cache = GpuEmbeddingCache(table, info.rows, info.dim, config, self.device, backend,
                                       slots=slots, state=state, clock=clock)
        self._staging = Staging(self.device, config.transfer_mode)
        self._lock = threading.Lock()
        self._dtype = info.dtype
        # where the cache stands against the store: its version, base and engine
        now = store.changes_since(0)
        self._version, self._base, self._engine = now.version, now.base, now.engine
        self._resident = self._resident_view()

    def _resident_view(self) -> torch.Tensor | None:
        """The table's rows in place, when the store keeps it whole in DRAM as fp32."""
        if self.store.tier != "dram" or self._dtype != "fp32":
            return None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # read-only view: only ever read
                return torch.from_numpy(np.asarray(self.store.table_array(self.table)))
        except Exception:  # noqa: BLE001 - any table the view does not cover: read_rows
            return None

    def sync(self) -> None:
        """Follows the store before a batch (the caller holds the cache): the rows a live
        store's writes changed since the last batch leave the cache (every row when the store
        cannot tell which — a swap, tables created or dropped, two compactions since), so that
        no row is served stale after a write returned. Counted in ``stats.invalidated``."""
        now = self.store.changes_since(self._version)
        if now.version == self._version and now.engine == self._engine and now.rows == {}:
            return
        if now.rows is None or now.engine != self._engine:
            self.cache.invalidate(None)
            self._resident = self._resident_view()
        elif self.table in now.rows:
            self.cache.invalidate(torch.from_numpy(now.rows[self.table]))
        self._version, self._base, self._engine = now.version, now.base, now.engine

    @property
    def stats(self) -> CacheStats:
        s = self.cache.stats
        s.admissions, s.evictions = self.cache.device_stats()
        return s

    def pool(self, indices: Any, offsets: Any, per_sample_weights: Any = None,
             mode: str = "sum", include_last_offset: bool = False) -> torch.Tensor:
        """Pools bags like ``torch.nn.EmbeddingBag``: 1-D ``indices``, ``offsets`` of the bags'
        starts (plus the end, with ``include_last_offset``); returns ``[bags, dim]`` float32
        on the cache's device.

        Inputs may be numpy arrays or tensors on any device. Only ``sum`` and ``mean`` pool on
        the GPU tier; ``per_sample_weights`` only with ``sum``.
        """
        req = self.prepare(indices, offsets, per_sample_weights, mode,
                           include_last_offset=include_last_offset)
        with self._lock:
            self.sync()
            flags, out, tick = self.probe(req)
            miss = torch.nonzero(flags).flatten()
            self.finish(req, out, tick, miss)
        return out

    def prepare(self, indices: Any, offsets: Any, per_sample_weights: Any = None,
                mode: str = "sum", upload: bool = True,
                include_last_offset: bool = False) -> Request:
        """Validates one batch. Tensors go to the device at once; numpy ``indices`` /
        ``per_sample_weights`` stay on the host when ``upload`` is False (:class:`GpuTier`
        sends many tables in one copy)."""
        t = self.table
        if mode not in ("sum", "mean"):
            raise InvalidRequest(f"table {t!r}: the GPU tier pools with 'sum' or 'mean', not "
                                 f"{mode!r}", table=t)
        idx_h, idx_d = _to_device(indices, self.device, t, "indices", torch.int64, upload)
        off_h = _host(offsets, t, "offsets", np.int64)
        n = int(idx_d.numel()) if idx_h is None else idx_h.size
        if (idx_d.dim() if idx_h is None else idx_h.ndim) != 1 or off_h.ndim != 1:
            raise InvalidRequest(f"table {t!r}: indices and offsets must be 1-D", table=t)
        if not include_last_offset:
            off_h = np.append(off_h, n)
        elif off_h.size == 0 or off_h[-1] != n:
            raise InvalidRequest(f"table {t!r}: with include_last_offset the last offset must "
                                 f"be the number of indices ({n})", table=t)
        steps = np.diff(off_h)
        if off_h[0] != 0 or np.any(steps < 0) or off_h[-1] != n:
            bad = int(np.flatnonzero(steps < 0)[0]) if np.any(steps < 0) else 0
            raise InvalidRequest(f"table {t!r}: offsets must start at 0, not decrease and not "
                                 f"pass {n} lookups", table=t, position=bad)
        w_h = w_d = None
        if per_sample_weights is not None:
            if mode != "sum":
                raise InvalidRequest(f"table {t!r}: per_sample_weights needs mode='sum'",
                                     table=t)
            w_h, w_d = _to_device(per_sample_weights, self.device, t, "per_sample_weights",
                                  torch.float32, upload)
            if tuple(w_d.shape if w_h is None else w_h.shape) != (n,):
                raise InvalidRequest(f"table {t!r}: per_sample_weights must have one weight "
                                     f"per index ({n})", table=t)
        off_d = torch.from_numpy(off_h).to(self.device, non_blocking=True) if upload else \
            torch.from_numpy(off_h)
        return Request(off_h, idx_d, off_d, w_d, mode, idx_h, w_h)

    def probe(self, req: Request, flags: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Launches the fused probe + pool kernel: (flags, hit sums, tick)."""
        tick = self.cache.next_tick()
        out, flags = self.cache.pool_hits(req.idx_d, req.off_d, req.w_d, tick, flags)
        return flags, out, tick

    def finish(self, req: Request, out: torch.Tensor, tick: int, miss: torch.Tensor,
               misses: int | None = None) -> None:
        """Serves the misses at positions ``miss`` (device tensor) and finalises ``mean``;
        ``misses`` counts misses already served elsewhere (:class:`GpuTier`'s grouped path)."""
        stats = self.cache.stats
        stats.batches += 1
        n = int(req.off_h[-1])
        if miss.numel():
            self._serve_misses(miss, req, out, tick)
        k = int(miss.numel()) if misses is None else misses
        stats.hits += n - k
        stats.misses += k
        if req.mode == "mean":
            lengths = (req.off_d[1:] - req.off_d[:-1]).clamp(min=1).to(torch.float32)
            out /= lengths[:, None]

    def _gather(self, keys: torch.Tensor, dst: torch.Tensor) -> None:
        """The rows of ``keys`` (host int64, in range) into ``dst`` (pinned host)."""
        if self._resident is not None and self._version == self._base:
            # no row of the store is newer than its table in DRAM
            torch.index_select(self._resident, 0, keys, out=dst)
        else:
            dst.copy_(torch.from_numpy(self.store.read_rows(self.table, keys.numpy())))

    def _serve_misses(self, miss: torch.Tensor, req: Request, out: torch.Tensor,
                      tick: int) -> None:
        t = self.table
        keys = req.idx_d[miss]
        uniq, inv = torch.unique(keys, sorted=True, return_inverse=True)
        uniq_h = uniq.cpu()
        if int(uniq_h[0]) < 0 or int(uniq_h[-1]) >= self.rows:
            bad = torch.nonzero((keys < 0) | (keys >= self.rows)).flatten()[0]
            pos, key = int(miss[bad]), int(keys[bad])
            raise IndexOutOfRange(f"table {t!r}: index {key} at position {pos} is out of range "
                                  f"for {self.rows} rows", table=t, position=pos)
        stats = self.cache.stats
        stats.unique_misses += int(uniq_h.numel())
        bag = torch.searchsorted(req.off_d, miss, right=True) - 1
        weight = None if req.w_d is None else req.w_d[miss]
        taken = admit(uniq, self.cache.policy, self.config.admission_probability, tick,
                      self.config.seed)
        near = self.config.near_data_pooling != "off" and self.cache.policy.probabilistic
        if near:
            self._serve_near(uniq, uniq_h, inv, taken, keys, bag, weight, out, tick)
            return
        host = self._staging.host_rows(int(uniq_h.numel()), self.dim)
        self._gather(uniq_h, host)
        stats.rows_fetched += int(uniq_h.numel())
        stats.bytes_to_gpu += host.numel() * 4
        src = self._staging.to_device(host)
        self.cache.pool_rows(src, inv, bag, weight, out)
        ks, sets, rows = self.cache.plan_replace(uniq, taken)
        self.cache.replace(ks, sets, src, rows, tick)
        self._staging.release()

    def _serve_near(self, uniq: torch.Tensor, uniq_h: torch.Tensor, inv: torch.Tensor,
                    taken: torch.Tensor, keys: torch.Tensor, bag: torch.Tensor,
                    weight: torch.Tensor | None, out: torch.Tensor, tick: int) -> None:
        """Admission-aware near-data pooling: raw rows only for the keys the cache admits; the
        engine pools the rest per bag and sends one partial sum per bag."""
        stats = self.cache.stats
        raw = taken[inv]
        rest_h = (~raw).cpu().numpy()
        keys_h = keys.cpu().numpy()
        bag_h = bag.cpu().numpy()
        rest_bags, first = np.unique(bag_h[rest_h], return_index=True)
        if self.config.near_data_pooling == "auto" and \
                rest_bags.size >= np.unique(keys_h[rest_h]).size:
            raw = torch.ones_like(raw)  # partial sums would not save bytes: fetch every row
            rest_h[:] = False
            rest_bags = rest_bags[:0]
            take_rows = torch.ones_like(taken)
        else:
            take_rows = taken
        fetch_h = uniq_h[take_rows.cpu()]
        n_rows, n_part = int(fetch_h.numel()), int(rest_bags.size)
        host = self._staging.host_rows(n_rows + n_part, self.dim)
        self._gather(fetch_h, host[:n_rows])
        if n_part:
            w_rest = None if weight is None else weight.cpu().numpy()[rest_h]
            partial = self.store.lookup(self.table, keys_h[rest_h], offsets=first,
                                        per_sample_weights=w_rest, mode="sum")
            host[n_rows:].copy_(torch.from_numpy(partial))
        stats.rows_fetched += n_rows
        stats.partial_sums += n_part
        stats.bytes_to_gpu += host.numel() * 4
        src = self._staging.to_device(host)
        # fetched row of each distinct key (-1: pooled in the engine)
        row_of = torch.cumsum(take_rows.to(torch.int64), 0) - 1
        sel = torch.nonzero(raw).flatten()
        src_row = row_of[inv[sel]]
        pbag = bag[sel]
        pw = None if weight is None else weight[sel]
        if n_part:
            dev = self.device
            src_row = torch.cat([src_row, n_rows + torch.arange(n_part, device=dev)])
            pbag = torch.cat([pbag, torch.from_numpy(rest_bags).to(dev)])
            if pw is not None:
                pw = torch.cat([pw, torch.ones(n_part, dtype=torch.float32, device=dev)])
        self.cache.pool_rows(src, src_row, pbag, pw, out)
        ks, sets, rows = self.cache.plan_replace(uniq, taken, row_of)
        self.cache.replace(ks, sets, src, rows, tick)
        self._staging.release()


def _host(x: Any, table: str, what: str, dtype: type) -> npt.NDArray[Any]:
    a = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if a.size == 0 and a.dtype == np.float64 and dtype is np.int64:
        a = a.astype(np.int64)
    if (a.dtype.kind == "f") != (dtype is np.float32) or a.dtype.kind not in "iuf":
        raise InvalidRequest(f"table {table!r}: {what} has dtype {a.dtype}", table=table)
    return np.ascontiguousarray(a, dtype=dtype)


def _to_device(x: Any, device: torch.device, table: str, what: str, dtype: torch.dtype,
               upload: bool) -> tuple[Any, torch.Tensor]:
    """A tensor on ``device`` (``dtype``); for numpy input with ``upload`` False, the host
    array and a CPU view instead (the caller uploads)."""
    if isinstance(x, torch.Tensor):
        if x.dtype.is_floating_point != dtype.is_floating_point or x.dtype == torch.bool:
            raise InvalidRequest(f"table {table!r}: {what} has dtype {x.dtype}", table=table)
        return None, x.detach().to(device=device, dtype=dtype, non_blocking=True).contiguous()
    h = _host(x, table, what, np.float32 if dtype.is_floating_point else np.int64)
    d = torch.from_numpy(h)
    if upload:
        return None, d.to(device)
    return h, d


__all__ = ["CachedTable", "Request"]
