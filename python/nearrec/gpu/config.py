"""Configuration of the GPU embedding cache (HS-Rec's HBM tier) and the hashing it shares
between the Triton kernels and the CPU reference.

The cache of one table is ``num_sets`` sets of ``ways = group_size * groups_per_set`` slots. A
slot holds a key (int64; ``EMPTY_KEY`` when free), one row (float32, ``dim`` wide) and a 32-bit
counter: the access count under LFU, the tick of the last access under LRU. A key lives only in
the set ``set_index(key)``, so a lookup compares the key with one set's ``ways`` keys at once.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import numpy.typing as npt
import torch

# one policy type for every cache, the store's and this tier's (re-exported here)
from ..config import CachePolicy as CachePolicy
from ..errors import InvalidRequest
from ..request import count, probability
from ..units import parse_size

#: the key of a free slot (row-indexed tables never use negative keys)
EMPTY_KEY = -1
#: odd 63-bit multiplier of the set hash (Fibonacci-like mixing; fits a signed int64)
HASH_MULT = 0x2545F4914F6CDD1D
#: multipliers of the admission hash
_ADMIT_MULT_TICK = 0x5851F42D4C957F2D
_ADMIT_MULT_SEED = 0x14057B7EF767814F
_ADMIT_MULT_MIX = 0x27BB2EE687B0B0FD


class TransferMode(str, enum.Enum):
    """How fetched miss rows reach the GPU: ``zero_copy`` (kernels read the pinned host buffer
    over PCIe) or ``async_copy`` (one copy of the buffer on a side stream, then kernels read
    HBM)."""

    ZERO_COPY = "zero_copy"
    ASYNC_COPY = "async_copy"


NearDataPooling = Literal["auto", "on", "off"]


@dataclass(frozen=True)
class GpuCacheConfig:
    """Builds a :class:`~nearrec.gpu.GpuEmbeddingCache` (one table) or a
    :class:`~nearrec.gpu.GpuTier` (several tables sharing ``hbm_budget``).

    ``hbm_budget`` is bytes (or a size such as ``"8GiB"``) for all slots (key 8 B + tag 1 B +
    counter 4 B + row ``4 * dim`` B each); ``slots`` overrides it with an exact slot count per table
    (rounded down to whole sets). ``admission_probability`` applies to the ``_pa`` policies;
    ``seed`` makes admission decisions reproducible (they are a hash of key, tick and seed, so
    the CPU reference and the kernels decide alike). ``near_data_pooling``: ``"on"`` asks the
    store for pooled partial sums of the misses the cache will not admit, ``"off"`` fetches
    every missed row, ``"auto"`` picks per batch whichever moves fewer bytes (it applies to
    the ``_pa`` policies, the ones that refuse misses). ``probe_tags``: probes compare each
    slot's 8-bit tag first and load full keys only where a tag matches (an eighth of the probe's
    bytes, one more dependent load; on an H200 the all-hit path pools rows at 1.4× the rate of
    comparing every key, ``bench/results/gpu-hit-h200.md``); ``False`` compares the keys.
    """

    hbm_budget: int | str | None = None
    slots: int | None = None
    policy: CachePolicy | str = CachePolicy.LFU_PA
    admission_probability: float = 0.5
    group_size: int = 32
    groups_per_set: int = 2
    seed: int = 0
    transfer: TransferMode | str = TransferMode.ZERO_COPY
    near_data_pooling: NearDataPooling = "off"
    probe_tags: bool = True

    @property
    def ways(self) -> int:
        return self.group_size * self.groups_per_set

    @property
    def cache_policy(self) -> CachePolicy:
        return CachePolicy(self.policy)

    @property
    def transfer_mode(self) -> TransferMode:
        return TransferMode(self.transfer)

    @property
    def budget_bytes(self) -> int | None:
        return None if self.hbm_budget is None else parse_size(self.hbm_budget)

    def with_slots(self, slots: int) -> GpuCacheConfig:
        return replace(self, slots=slots, hbm_budget=None)

    def with_policy(self, policy: CachePolicy | str) -> GpuCacheConfig:
        return replace(self, policy=policy)

    def validate(self) -> GpuCacheConfig:
        """Checks every field; returns ``self`` so calls chain."""
        try:
            CachePolicy(self.policy)
        except ValueError:
            raise InvalidRequest(
                f"cache_policy must be one of {[p.value for p in CachePolicy]}, "
                f"not {self.policy!r}") from None
        try:
            TransferMode(self.transfer)
        except ValueError:
            raise InvalidRequest(
                f"transfer must be one of {[t.value for t in TransferMode]}, "
                f"not {self.transfer!r}") from None
        if self.near_data_pooling not in ("auto", "on", "off"):
            raise InvalidRequest("near_data_pooling must be 'auto', 'on' or 'off', not "
                                 f"{self.near_data_pooling!r}")
        probability(self.admission_probability, "admission_probability")
        count(self.seed, "seed", 0, 2**64 - 1)
        if self.hbm_budget is not None:
            parse_size(self.hbm_budget)
        if self.slots is not None:
            count(self.slots, "slots", 1)
        for name in ("group_size", "groups_per_set"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise InvalidRequest(f"{name} must be a positive power of two, not {v!r}")
        if self.ways > 1024:
            raise InvalidRequest(f"a set of {self.ways} slots is too wide (at most 1024)")
        if self.hbm_budget is None and self.slots is None:
            raise InvalidRequest("give hbm_budget (bytes, e.g. '8GiB') or slots")
        if self.slots is not None and self.slots < self.ways:
            raise InvalidRequest(f"slots={self.slots} is less than one set of {self.ways}")
        return self


def slot_bytes(dim: int) -> int:
    """HBM bytes of one slot: key (8) + tag (1) + counter (4) + an fp32 row."""
    return 8 + 1 + 4 + 4 * dim


def key_tag(key: int) -> int:
    """The 8-bit tag of a key: its eight bytes folded by XOR (a few shifts, cheaper on the GPU
    than a second multiplicative hash), so that keys alike in their low byte differ in it."""
    t = key ^ (key >> 32)
    t ^= t >> 16
    return (t ^ (t >> 8)) & 0xFF


def key_tags(keys: torch.Tensor) -> torch.Tensor:
    """:func:`key_tag` of an int64 tensor, as uint8."""
    t = keys ^ (keys >> 32)
    t = t ^ (t >> 16)
    return ((t ^ (t >> 8)) & 0xFF).to(torch.uint8)


def set_index(keys: torch.Tensor, num_sets: int) -> torch.Tensor:
    """The set of each key (int64 tensor, any device); the kernels compute the same."""
    h = (keys * HASH_MULT) >> 32
    return (h & 0x7FFFFFFF) % num_sets


def set_index_np(keys: npt.NDArray[np.int64], num_sets: int) -> npt.NDArray[np.int64]:
    """:func:`set_index` on host arrays (int64 arithmetic wraps as in torch and Triton)."""
    with np.errstate(over="ignore"):
        h = (keys.astype(np.int64) * np.int64(HASH_MULT)) >> np.int64(32)
    return (h & np.int64(0x7FFFFFFF)) % np.int64(num_sets)


def _signed64(x: int) -> int:
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


def admission_uniform(keys: torch.Tensor, tick: int, seed: int) -> torch.Tensor:
    """A uniform number in [0, 1) per (key, tick, seed) as float64 (int64 tensor on any
    device): the admission draw. A hash rather than a random stream, so the decision does not
    depend on the order misses are visited in, and CPU and GPU decide alike."""
    salt = _signed64(tick * _ADMIT_MULT_TICK) ^ _signed64(seed * _ADMIT_MULT_SEED)
    x = keys ^ salt
    x = x * _ADMIT_MULT_MIX
    x = x ^ (x >> 29)
    x = x * HASH_MULT
    bits = (x >> 40) & ((1 << 24) - 1)
    return bits.to(torch.float64) / float(1 << 24)


def admit(keys: torch.Tensor, policy: CachePolicy, probability: float, tick: int,
          seed: int) -> torch.Tensor:
    """Which missed keys (int64 tensor) the cache takes in this batch (bool tensor)."""
    if not policy.probabilistic or probability >= 1.0:
        return torch.ones(keys.shape, dtype=torch.bool, device=keys.device)
    return admission_uniform(keys, tick, seed) < probability
