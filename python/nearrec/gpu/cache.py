"""One table's set-associative GPU embedding cache: probe, fused probe + pool, replace."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

from ..errors import InvalidRequest
from . import reference
from .config import EMPTY_KEY, CachePolicy, GpuCacheConfig, key_tag, set_index, slot_bytes
from .state import CacheState

Backend = Literal["auto", "triton", "reference"]


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve_backend(backend: Backend, device: torch.device) -> Literal["triton", "reference"]:
    """``auto``: the Triton kernels on CUDA (and on CPU under ``TRITON_INTERPRET=1``), else
    the plain-torch reference."""
    if backend == "auto":
        return "triton" if device.type == "cuda" or _interpreting() else "reference"
    if backend == "triton" and device.type != "cuda" and not _interpreting():
        raise InvalidRequest("the Triton kernels need a CUDA device, or TRITON_INTERPRET=1 set "
                             "before Triton is imported")
    if backend not in ("triton", "reference"):
        raise InvalidRequest(f"backend must be 'auto', 'triton' or 'reference', not {backend!r}")
    return backend


def _ops(backend: str) -> ModuleType:
    if backend == "triton":
        from . import kernels

        return kernels
    return reference


class HostRows:
    """Pinned host memory handed to a kernel as a device pointer (zero-copy: the GPU reads it
    over PCIe). Triton takes any object with ``data_ptr()`` and ``dtype``; under unified
    addressing a pinned buffer's host address is also its device address."""

    def __init__(self, tensor: torch.Tensor):
        self._tensor = tensor
        self.dtype = tensor.dtype
        self.shape = tensor.shape

    def numel(self) -> int:
        return int(self._tensor.numel())

    def data_ptr(self) -> int:
        return int(self._tensor.data_ptr())


@dataclass
class CacheStats:
    """Counters of one table's cache since it was made (lookups, not unique keys, for hits and
    misses)."""

    hits: int = 0
    misses: int = 0
    unique_misses: int = 0
    admissions: int = 0
    evictions: int = 0
    rows_fetched: int = 0
    partial_sums: int = 0
    bytes_to_gpu: int = 0
    batches: int = 0
    #: cached rows dropped because the store changed them (a live store's writes, or all of
    #: them when it cannot tell which: a swap, created or dropped tables)
    invalidated: int = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class Clock:
    """A batch counter; tables whose caches share one state share one clock too."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        with self._lock:
            self.value += 1
            return self.value


def plan_num_sets(table: str, table_rows: int, dim: int, config: GpuCacheConfig,
                  slots: int | None = None) -> int:
    """The sets a table's cache gets: ``slots`` (else ``config.slots``, else the budget's
    worth), at most 1.25 slots per row (enough that hashing leaves almost no row without a
    slot), whole sets."""
    ways = config.ways
    if slots is None:
        slots = config.slots
    if slots is None:
        slots = (config.budget_bytes or 0) // slot_bytes(dim)
    num_sets = min(int(slots) // ways, -(-table_rows * 5 // (4 * ways)))
    if num_sets < 1:
        raise InvalidRequest(
            f"table {table!r}: the HBM budget holds {slots} slots of {slot_bytes(dim)} B, "
            f"less than one set of {ways}", table=table)
    return num_sets


class GpuEmbeddingCache:
    """A set-associative cache of one table's rows in GPU memory (HS-Rec's GPU embedding table).

    ``num_sets`` sets of ``config.ways`` slots (``group_size`` × ``groups_per_set``, a warp-wide
    compare per group). Keys are row ids (or any non-negative int64 keys). The cache never
    fetches by itself: :meth:`pool` / :meth:`lookup` report misses, :meth:`insert` takes rows in.
    :class:`nearrec.gpu.GpuTier` wires it to a store.
    """

    def __init__(self, table: str, table_rows: int, dim: int, config: GpuCacheConfig,
                 device: torch.device | str = "cuda", backend: Backend = "auto",
                 slots: int | None = None, state: CacheState | None = None,
                 clock: Clock | None = None):
        config.validate()
        self.table = table
        self.table_rows = int(table_rows)
        self.dim = int(dim)
        self.config = config
        self.policy = config.cache_policy
        self.device = torch.device(device)
        self.backend = resolve_backend(backend, self.device)
        self._ops = _ops(self.backend)
        num_sets = plan_num_sets(table, self.table_rows, self.dim, config, slots)
        if state is not None and (state.num_sets != num_sets or state.dim != self.dim):
            raise InvalidRequest(f"table {table!r}: the given cache state has {state.num_sets} "
                                 f"sets of dim {state.dim}, not {num_sets} of {self.dim}",
                                 table=table)
        self.state = state if state is not None else CacheState.allocate(
            num_sets, config.ways, self.dim, self.policy.frequency, self.device)
        self.stats = CacheStats()
        self.clock = clock if clock is not None else Clock()
        self.lock = threading.Lock()

    @property
    def num_sets(self) -> int:
        return self.state.num_sets

    @property
    def slots(self) -> int:
        return self.state.slots

    @property
    def hbm_bytes(self) -> int:
        return self.slots * slot_bytes(self.dim) + 4 * self.num_sets

    @property
    def tick(self) -> int:
        """The batch clock's last value."""
        return self.clock.value

    def next_tick(self) -> int:
        """Advances the batch clock (LRU's timestamps, the admission hash's salt)."""
        return self.clock.next()

    def pool_hits(self, indices: torch.Tensor, offsets: torch.Tensor,
                  weights: torch.Tensor | None, tick: int, flags: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sums of the cached rows per bag (``[bags, dim]``) and the flag per lookup (0 hit,
        1 miss, 2 out of range). ``offsets`` has ``bags + 1`` entries; all on the cache's
        device."""
        out = torch.empty((offsets.numel() - 1, self.dim), dtype=torch.float32,
                          device=self.device)
        if flags is None:
            flags = torch.empty((indices.numel(),), dtype=torch.int8, device=self.device)
        if out.shape[0] and indices.numel() == 0:
            out.zero_()
        if self.backend == "triton":
            self._ops.probe_pool(self.state, indices, offsets, weights, self.table_rows, tick,
                                 out, flags, tags=self.config.probe_tags)
        else:
            self._ops.probe_pool(self.state, indices, offsets, weights, self.table_rows, tick,
                                 out, flags)
        return out, flags

    def lookup(self, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached row of each key (``[n, dim]``, zeros where missed) and the positions of
        the misses (keys out of range count as misses). Hits update the counters."""
        keys = keys.to(self.device, torch.int64).contiguous()
        out = torch.empty((keys.numel(), self.dim), dtype=torch.float32, device=self.device)
        flags = torch.empty((keys.numel(),), dtype=torch.int8, device=self.device)
        self._ops.lookup(self.state, keys, self.table_rows, self.next_tick(), out, flags)
        miss = torch.nonzero(flags).flatten()
        self.stats.hits += keys.numel() - miss.numel()
        self.stats.misses += miss.numel()
        return out, miss

    def plan_replace(self, keys: torch.Tensor, taken: torch.Tensor | None = None,
                     src_row: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The replace kernel's inputs for offering ``keys`` (distinct, on the cache's device)
        with rows ``src[src_row]`` (default ``src[i]`` for ``keys[i]``), of which only ``taken``
        are admitted: keys, sets and source rows sorted by set (stable), refused keys last with
        set ``num_sets``. No host round trip."""
        sets = set_index(keys, self.num_sets)
        if taken is not None:
            sets = torch.where(taken, sets, self.num_sets)
        sets, order = torch.sort(sets, stable=True)
        rows = order if src_row is None else src_row[order]
        return keys[order].contiguous(), sets.contiguous(), rows.contiguous()

    def replace(self, keys: torch.Tensor, sets: torch.Tensor, src: Any, src_row: torch.Tensor,
                tick: int) -> None:
        """Runs the replace kernel on a :meth:`plan_replace`; ``src`` is a ``[*, dim]`` float32
        tensor on the device or pinned host memory (:class:`HostRows`)."""
        self._ops.replace(self.state, keys, sets, src, src_row, tick)

    def pool_rows(self, src: Any, src_row: torch.Tensor, bag: torch.Tensor,
                  weight: torch.Tensor | None, out: torch.Tensor) -> None:
        """``out[bag[j]] += weight[j] * src[src_row[j]]``: rows fetched from lower tiers."""
        self._ops.pool_rows(src, src_row, bag, weight, out)

    def insert(self, keys: Any, rows: torch.Tensor) -> None:
        """Takes ``keys`` (distinct, non-negative) into the cache with their ``rows``
        (``[len(keys), dim]``), as a batch's admitted misses would be. Admission is the
        caller's decision; this applies only the victim choice."""
        k = torch.as_tensor(np.asarray(keys, dtype=np.int64) if not isinstance(keys, torch.Tensor)
                            else keys).to(self.device, torch.int64)
        if k.numel() == 0:
            return
        ks, sets, src_row = self.plan_replace(k)
        self.replace(ks, sets, rows.to(self.device, torch.float32).contiguous(), src_row,
                     self.next_tick())

    def invalidate(self, keys: torch.Tensor | None) -> int:
        """Drops the cached rows of ``keys`` (every row with ``None``): the store changed them.
        Returns how many slots it freed (counted in ``stats.invalidated``)."""
        state = self.state
        hit = state.keys >= 0 if keys is None else \
            torch.isin(state.keys, keys.to(self.device, torch.int64))
        n = int(hit.sum())
        if n:
            state.keys.masked_fill_(hit, EMPTY_KEY)
            state.tags.masked_fill_(hit, key_tag(EMPTY_KEY))
            state.counters.masked_fill_(hit, 0)
        self.stats.invalidated += n
        return n

    def device_stats(self) -> tuple[int, int]:
        """(rows inserted, occupied slots evicted), counted on the device."""
        o = int(self.state.owner[0]) if self.num_sets else 0
        inserted, evicted = (int(x) for x in self.state.stats[2 * o:2 * o + 2].tolist())
        return inserted, evicted

    def cached_keys(self) -> npt.NDArray[np.int64]:
        """The keys now cached (for tests and tools; copies from the device)."""
        k = self.state.keys.cpu().numpy()
        return k[k >= 0]

    def __repr__(self) -> str:
        return (f"GpuEmbeddingCache({self.table!r}, sets={self.num_sets}, ways="
                f"{self.state.ways}, dim={self.dim}, policy={self.policy.value}, "
                f"device={self.device}, backend={self.backend})")


__all__ = ["CachePolicy", "CacheStats", "GpuEmbeddingCache", "HostRows", "plan_num_sets",
           "resolve_backend"]
