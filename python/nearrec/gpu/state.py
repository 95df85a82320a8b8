"""The tensors of one table's GPU cache, shared by the Triton kernels and the CPU reference."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .config import EMPTY_KEY, key_tag


@dataclass
class CacheState:
    """Slots of one table's cache, set-major: slot ``s * ways + w`` is way ``w`` of set ``s``.

    ``keys`` int64 [slots] (``EMPTY_KEY`` = free); ``tags`` uint8 [slots], an 8-bit digest of
    each key (:func:`nearrec.gpu.config.key_tag`) that probes compare first, at an eighth of
    the bytes of the keys; ``rows`` float32 [slots, dim];
    ``counters`` int32 [slots] (LFU: accesses since admission; LRU: tick of the last access);
    ``locks`` int32 [num_sets], a sequence number per set, odd while a replace holds the set;
    ``owner`` int32 [num_sets]: which table a set belongs to when several tables share one
    state; ``stats`` int64 [2 * tables]: per owner, rows inserted and occupied slots evicted,
    counted by the replace kernel.
    """

    keys: torch.Tensor
    tags: torch.Tensor
    rows: torch.Tensor
    counters: torch.Tensor
    locks: torch.Tensor
    owner: torch.Tensor
    stats: torch.Tensor
    num_sets: int
    ways: int
    dim: int
    frequency: bool

    @classmethod
    def allocate(cls, num_sets: int, ways: int, dim: int, frequency: bool,
                 device: torch.device, owners: int = 1) -> CacheState:
        slots = num_sets * ways
        return cls(
            keys=torch.full((slots,), EMPTY_KEY, dtype=torch.int64, device=device),
            tags=torch.full((slots,), key_tag(EMPTY_KEY), dtype=torch.uint8, device=device),
            rows=torch.zeros((slots, dim), dtype=torch.float32, device=device),
            counters=torch.zeros((slots,), dtype=torch.int32, device=device),
            locks=torch.zeros((num_sets,), dtype=torch.int32, device=device),
            owner=torch.zeros((num_sets,), dtype=torch.int32, device=device),
            stats=torch.zeros((2 * owners,), dtype=torch.int64, device=device),
            num_sets=num_sets, ways=ways, dim=dim, frequency=frequency,
        )

    def sets(self, base: int, count: int) -> CacheState:
        """A view of ``count`` sets from set ``base``: one table's cache inside a state shared
        by several tables (stats stay shared; ``owner`` says whose row of them is whose)."""
        w = self.ways
        return CacheState(self.keys[base * w:(base + count) * w],
                          self.tags[base * w:(base + count) * w],
                          self.rows[base * w:(base + count) * w],
                          self.counters[base * w:(base + count) * w],
                          self.locks[base:base + count], self.owner[base:base + count],
                          self.stats, count, w, self.dim, self.frequency)

    @property
    def slots(self) -> int:
        return self.num_sets * self.ways

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def clone(self) -> CacheState:
        return self._map(lambda t: t.clone())

    def to(self, device: torch.device | str) -> CacheState:
        return self._map(lambda t: t.to(device))

    def _map(self, f: Callable[[torch.Tensor], torch.Tensor]) -> CacheState:
        return CacheState(f(self.keys), f(self.tags), f(self.rows), f(self.counters),
                          f(self.locks), f(self.owner), f(self.stats), self.num_sets, self.ways,
                          self.dim, self.frequency)


@dataclass
class GroupItem:
    """One table's part of a grouped probe (several tables' caches in one state, one launch):
    its batch on the device, where its sets start in the shared state, its sets, rows, tick
    and its own views (for the reference path)."""

    indices: torch.Tensor
    offsets: torch.Tensor
    weights: torch.Tensor | None
    set_base: int
    num_sets: int
    table_rows: int
    tick: int
    state: CacheState
