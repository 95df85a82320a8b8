"""The GPU HBM tier (HS-Rec): a set-associative embedding cache per table in GPU memory, with
LRU / LFU victims, probabilistic admission and misses served by the store's DRAM / SSD tiers.

Kernels are Triton (:mod:`nearrec.gpu.kernels`) with a plain-torch twin
(:mod:`nearrec.gpu.reference`) that also serves machines without a GPU. Needs ``torch`` (and
``triton`` for the kernels).

``nearrec.torch.EmbeddingBagCollection(..., device="cuda", hbm_budget=...)`` turns it on; the
design and its measurements are in ``docs/gpu.md``.

- ``config``: :class:`GpuCacheConfig` (HBM budget or slots, ways, policy, admission
  probability, transfer mode, near-data pooling), the set, tag and admission hashes the kernels
  and the reference share; the policy is the store config's ``CachePolicy``, re-exported.
- ``state``: the slot tensors of one table's cache (keys, tags, rows, counters), shared by the
  kernels and the reference; ``GroupItem`` for grouped launches.
- ``kernels``: the Triton kernels — fused probe + pool (one table, or a group of tables in one
  launch), lookup, pool-rows, and the locked replace — and ``reference``, their plain-torch twins
  with the semantics both follow.
- ``cache``: :class:`GpuEmbeddingCache`, one table's cache: probe, fused probe + pool, replace;
  the backend chosen (``triton`` or ``reference``); :class:`CacheStats`.
- ``staging``: the pinned host buffer a batch's fetched rows cross PCIe in (zero-copy, or one
  copy on a side stream).
- ``table``: :class:`CachedTable`, one store table behind its cache, with its miss path
  (de-duplicated misses, admission decided before the fetch, near-data pooling of the rows it
  will not admit).
- ``tier``: :class:`GpuTier`, several tables under one HBM budget, one launch per batch.
"""

from __future__ import annotations

from .cache import CacheStats, GpuEmbeddingCache, HostRows, resolve_backend
from .config import CachePolicy, GpuCacheConfig, TransferMode, slot_bytes
from .tier import CachedTable, GpuTier

__all__ = [
    "CachePolicy",
    "CacheStats",
    "CachedTable",
    "GpuCacheConfig",
    "GpuEmbeddingCache",
    "GpuTier",
    "HostRows",
    "TransferMode",
    "resolve_backend",
    "slot_bytes",
]
