"""The GPU HBM tier (HS-Rec): a set-associative embedding cache per table in GPU memory, with
LRU / LFU victims, probabilistic admission and misses served by the store's DRAM / SSD tiers.

Kernels are Triton (:mod:`nearrec.gpu.kernels`) with a plain-torch twin
(:mod:`nearrec.gpu.reference`) that also serves machines without a GPU. Needs ``torch`` (and
``triton`` for the kernels).
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
