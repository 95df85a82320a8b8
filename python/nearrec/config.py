"""How a store is opened and served: :class:`StoreConfig`, the Python mirror of the Rust
``nearrec::StoreConfig``. Its defaults are read from Rust (they live there and nowhere else);
its values are checked by Rust, which names the field at fault; ``to_toml`` / ``from_toml`` /
``from_file`` read and write the same TOML file as ``nearrec <verb> --config store.toml`` and
Rust callers.

Only what is Python's own is converted here: a :class:`nearrec.plan.Plan` or a placement mapping
holding numpy arrays, paths, numpy scalars.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ._native import StoreConfig as NativeStoreConfig
from .errors import IndexOutOfRange, InvalidRequest
from .request import index_vector, is_bool, path_arg

Tier = Literal["auto", "dram", "ssd"]
Durability = Literal["sync", "async"]
WalRecovery = Literal["tolerate_torn_tail", "absolute"]
UnknownKeys = Literal["error", "zero", "init", "default"]


# The names are Rust's (`Policy::name`); the extension does not list them, so they are written
# here once and tests/test_config.py holds them to the ones Rust accepts.
class CachePolicy(str, enum.Enum):
    """How a row cache picks its victims and admits misses, the policies of Rust's
    ``nearrec_cache::Policy`` by the names it gives them: ``lru`` / ``lfu`` admit every miss
    and evict the set's least-recently / least-frequently used slot; the ``_pa`` variants admit
    a miss only with the configured ``admission_probability`` (HS-Rec's probabilistic
    admission). One type for the store's DRAM row caches (``StoreConfig.cache_policy``) and the
    GPU tier's (``nearrec.gpu.GpuCacheConfig.policy``); wherever a policy is taken, its name as
    a plain string (``"lfu_pa"``) is taken too."""

    LRU = "lru"
    LFU = "lfu"
    LRU_PA = "lru_pa"
    LFU_PA = "lfu_pa"

    @property
    def frequency(self) -> bool:
        """True when the counter counts accesses (LFU), False when it holds a tick (LRU)."""
        return self in (CachePolicy.LFU, CachePolicy.LFU_PA)

    @property
    def probabilistic(self) -> bool:
        """True when a miss is admitted only with the admission probability (``_pa``)."""
        return self in (CachePolicy.LRU_PA, CachePolicy.LFU_PA)


#: The defaults, from Rust.
_DEFAULTS: dict[str, Any] = json.loads(NativeStoreConfig().to_json())


def _default(name: str) -> Any:
    return field(default=_DEFAULTS.get(name))


@dataclass(frozen=True, kw_only=True)
class StoreConfig:
    """How a store is opened and served (``nearrec.open(path, config=..., **overrides)``).

    ``tier``: ``"auto"`` (DRAM when the tables fit ``dram_budget``, else SSD with DRAM tiers in
    that budget), ``"dram"`` or ``"ssd"``. ``dram_budget``: bytes or a size such as ``"4GiB"``
    (``None``: half of memory for ``auto``, no DRAM tiers for an explicit ``ssd``). ``threads``:
    pooling threads (0: every core). ``verify_checksums``: check each table's CRC-32C as it
    loads into DRAM; ``verify_reads``: check every SSD read against the sector checksums.
    ``direct_io``, ``io_queue_depth``, ``io_rings``, ``pread_threads``, ``merge_gap_bytes``,
    ``dedup``, ``merge``: how the SSD tier reads. ``cache_policy``, ``admission_probability``,
    ``cache_ways``: the row caches. ``plan``: the DRAM placement — a plan file, a
    :class:`nearrec.plan.Plan`, or per table ``{"resident", "hot_rows", "cache_bytes"}``.
    ``device``: a simulated drive (a preset such as ``"rm-ssd"``, a JSON file, or a parameter
    mapping). ``writable``: open for ``write`` / ``remove`` (one writing process per store);
    ``durability``: ``"sync"`` (a write returns once on disk) or ``"async"`` (once in the
    kernel, on disk within ``durability_window_ms``); ``wal_recovery``: what a bad record at
    the end of the write-ahead log does to a writable open — ``"tolerate_torn_tail"`` (cut off
    and reported) or ``"absolute"`` (the open is refused with
    :class:`~nearrec.errors.StoreCorrupted` naming the record and the byte to cut at);
    ``delta_budget``: memory for rows written
    since the tables' files; ``auto_compact``: fold them into new table files in the background
    when the delta is half full; ``compaction_rate``: bytes per second a compaction writes, and
    a swap reads to load the new version, at most — each of a swap's row reads counted as at
    least 4 KiB — so that lookups keep the disk (64 MiB by default; 0: no bound);
    ``scrub_rate``: bytes per second a background scrub reads the table files at, checking
    every sector against its checksum, pass after pass (0: no scrub; :func:`nearrec.scrub` is
    one pass);
    ``write_wait_ms``: how long a write waits for room in a full delta. ``follow_ms``: a
    read-only store looks for what its writer (another process) logged every this many ms and
    serves it (``None``: only on
    :meth:`Store.refresh`; ``nearrec serve`` follows every 1000 ms unless told).
    ``keep_last``: a store opened from a repository of versions removes, after a swap, the
    versions beyond the newest this many (never the served one) once no call reads them
    (``None``: keeps them all). ``warm``: a recorded trace (``.nrtrace``) or a kept hot set
    whose rows fill the DRAM tiers' row caches at open, before the store serves;
    ``hot_set_dir``: where the store keeps its hot set (``NAME.hotset``), written when it
    closes and read at the next open. ``unknown_keys``: what a key a keyed table does not hold
    answers — ``"error"`` (:class:`~nearrec.errors.UnknownKey` naming its position),
    ``"zero"`` (a row of zeros) or ``"init"`` (a row drawn from ``(key_seed, key)``, uniform in
    ``±init_scale``); ``unknown_keys_by_table``: the same per table name. ``key_limits``:
    how a live keyed table's keys come and go, ``{table: {...}}`` with ``ttl_s`` (a key not
    touched that long — read or written, or only written with ``touch="write"`` — is let go of
    at the next compaction), ``admit_after`` / ``admit_window_s`` / ``admit_slots`` (a new key
    takes a row at its Nth sighting within the window, counted in a sketch of 4 × slots bytes;
    until then its writes are dropped, counted), ``cap`` (the most keys it holds) and ``evict``
    (``"off"``: a new key past the cap is :class:`~nearrec.errors.KeysFull`; ``"lfu"`` /
    ``"lru"``: a sampled key gives up its row). ``evicted_log``: keep the keys a writable
    store's keyed tables evict and let expire, with their rows as they were, in delta files in
    ``evicted/`` beside the store, at most this many bytes of them (``None``: no log; see
    ``docs/live.md``, "The evicted keys' log"). ``manual_clock``: TTLs and windows read a clock
    only :meth:`Store.advance_clock` moves. See :func:`nearrec.open` for what each does."""

    tier: Tier = _default("tier")
    dram_budget: int | str | None = _default("dram_budget")
    threads: int = _default("threads")
    verify_checksums: bool = _default("verify_checksums")
    verify_reads: bool = _default("verify_reads")
    direct_io: bool = _default("direct_io")
    io_queue_depth: int = _default("io_queue_depth")
    io_rings: int = _default("io_rings")
    pread_threads: int = _default("pread_threads")
    merge_gap_bytes: int | str = _default("merge_gap_bytes")
    dedup: bool = _default("dedup")
    merge: bool = _default("merge")
    cache_policy: CachePolicy | str = _default("cache_policy")
    admission_probability: float = _default("admission_probability")
    cache_ways: int = _default("cache_ways")
    plan: Any = None
    device: Any = None
    writable: bool = _default("writable")
    durability: Durability = _default("durability")
    durability_window_ms: int = _default("durability_window_ms")
    wal_recovery: WalRecovery = _default("wal_recovery")
    delta_budget: int | str = _default("delta_budget")
    auto_compact: bool = _default("auto_compact")
    compaction_rate: int | str = _default("compaction_rate")
    scrub_rate: int | str = _default("scrub_rate")
    write_wait_ms: int = _default("write_wait_ms")
    follow_ms: int | None = _default("follow_ms")
    keep_last: int | None = _default("keep_last")
    warm: str | Path | None = _default("warm")
    hot_set_dir: str | Path | None = _default("hot_set_dir")
    unknown_keys: UnknownKeys = _default("unknown_keys")
    unknown_keys_by_table: Mapping[str, UnknownKeys] | None = None
    init_scale: float = _default("init_scale")
    key_seed: int = _default("key_seed")
    key_limits: Mapping[str, Mapping[str, Any]] | None = None
    evicted_log: int | str | None = None
    manual_clock: bool = _default("manual_clock")

    def __post_init__(self) -> None:
        self.native()  # checked now: a bad value fails where it is given

    def replace(self, **changes: Any) -> StoreConfig:
        """A copy with ``changes`` (an unknown name is an :class:`InvalidRequest`)."""
        names = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise InvalidRequest(f"unknown setting {unknown[0]!r}; the settings are: "
                                 f"{', '.join(sorted(names))}")
        return dataclasses.replace(self, **changes)

    def native(self) -> Any:
        """The checked Rust config (what crosses into the engine)."""
        return NativeStoreConfig.from_json(json.dumps(self._json()))

    def to_toml(self) -> str:
        return str(self.native().to_toml())

    @classmethod
    def from_toml(cls, text: str) -> StoreConfig:
        if not isinstance(text, str):
            raise InvalidRequest(f"TOML text is a str, not {type(text).__name__}")
        return cls._from_native(NativeStoreConfig.from_toml(text))

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> StoreConfig:
        """Reads a TOML config file (``nearrec <verb> --config FILE`` reads the same)."""
        return cls._from_native(NativeStoreConfig.from_file(path_arg(path, "the config file")))

    @classmethod
    def _from_native(cls, native: Any) -> StoreConfig:
        fields_ = json.loads(native.to_json())
        plan = fields_.get("plan")
        if isinstance(plan, dict):  # Rust's placement: {"tables": {name: ...}}
            fields_["plan"] = plan["tables"]
        return cls(**fields_)

    def _json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.default is None:
                continue  # an optional setting left out
            if f.name == "plan":
                value = _plan(value)
            elif f.name == "device":
                value = _device(value)
            try:
                out[f.name] = json.loads(json.dumps(value, default=_plain, allow_nan=False))
            except (TypeError, ValueError) as e:
                raise InvalidRequest(f"config: {f.name}: {value!r:.60} is not a setting: "
                                     f"{e}") from None
        return out


def _plain(x: Any) -> Any:
    """numpy scalars and paths as JSON values (nothing else: a bool stays a bool)."""
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        value = float(x)
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a number")
        return value
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    raise TypeError(f"{type(x).__name__} is not a setting's type")


def _device(device: Any) -> Any:
    if isinstance(device, str):
        return device  # a preset, or a JSON file Rust reads
    if isinstance(device, os.PathLike):
        return os.fspath(device)
    if isinstance(device, Mapping):
        return dict(device)
    raise InvalidRequest(f"device is a preset name, a JSON file or a parameter mapping, not "
                         f"{type(device).__name__}")


def _plan(plan: Any) -> Any:
    """A plan as the config holds it: a plan file's path, or ``{"tables": {...}}``."""
    if isinstance(plan, str | os.PathLike):
        return path_arg(plan, "the plan file")
    placement = getattr(plan, "placement", None)
    if callable(placement):  # a nearrec.plan.Plan
        plan = placement()
    if not isinstance(plan, Mapping):
        raise InvalidRequest(f"a plan is a file, a Plan or a mapping from table name to its "
                             f"placement, not {type(plan).__name__}")
    return {"tables": {table: _placement(table, p) for table, p in plan.items()}}


def _placement(table: Any, p: Any) -> dict[str, Any]:
    """One table's placement: ``resident`` a real bool (a string such as ``"no"`` is refused,
    not read as true), ``hot_rows`` a 1-D array of non-negative integer row ids (floats are
    refused, not truncated; 2-D arrays refused, not flattened); ``cache_bytes`` a size (Rust
    reads it)."""
    if not isinstance(table, str):
        raise InvalidRequest(f"plan: table names are str, not {type(table).__name__} {table!r}")
    if not isinstance(p, Mapping):
        raise InvalidRequest(f"plan for table {table!r}: expected a mapping with resident / "
                             f"hot_rows / cache_bytes, not {type(p).__name__}", table=table)
    unknown = set(p) - {"resident", "hot_rows", "cache_bytes"}
    if unknown:
        raise InvalidRequest(f"plan for table {table!r}: unknown keys "
                             f"{sorted(unknown, key=str)}", table=table)
    resident = p.get("resident", False)
    if not is_bool(resident):
        raise InvalidRequest(f"plan for table {table!r}: resident must be true or false, not "
                             f"{resident!r}", table=table)
    hot = index_vector(p.get("hot_rows", ()), table, "hot_rows")
    if hot.size and hot.min() < 0:
        pos = int(np.argmax(hot < 0))
        raise IndexOutOfRange(f"plan for table {table!r}: hot row {hot[pos]} at position "
                              f"{pos} is negative", table=table, position=pos)
    out: dict[str, Any] = {"resident": bool(resident), "hot_rows": hot.tolist()}
    if "cache_bytes" in p:
        out["cache_bytes"] = p["cache_bytes"]
    return out


__all__ = ["CachePolicy", "StoreConfig", "Tier"]
