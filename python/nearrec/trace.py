"""Traces: the requests a model sends, as seeded synthetic generators, a binary file, and
stack-distance profiles (``../shared/specs/traces.md``).

- Generators: uniform, Zipf(α) over a random permutation of the rows, and DLRM's stack-distance
  generator driven by RecSSD's locality knob ``k`` (higher ``k``, less locality) in RecSSD's
  continuous variant or DLRM's per-bag one, over the whole table or RecSSD's strided ids.
- The trace file (``.nrtrace``, checksummed): :func:`load` reads it into memory and checks it
  (``mmap=True`` maps it instead, for files nobody changes while they are in use).
  :meth:`Trace.to_fbgemm` / :func:`from_fbgemm` convert to and from FBGEMM's layout.
- :func:`profile` gives a trace's stack-distance profile and LRU hit-ratio curve.
- A keyed table's trace (``TableTrace(keys=True)``) holds its keys — any int64, a uint64's
  bits — not rows: warm-up and ``nearrec plan`` map them to the rows they hold through the
  store's key index (:meth:`nearrec.Store.key_rows`); a trace with one is file version 3.

Example::

    import nearrec.trace as nt
    t = nt.generate({"t0": 1_000_000}, bags=10_000, pooling=80,
                    generator=nt.Generator.stack_distance(k=1))
    t["t0"].first_reference_share   # about 0.55
    for requests in t.batches(64):  # dicts for Store.lookup_many
        ...
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ._native import trace_generate_table, trace_open, trace_profile, trace_write
from .errors import InvalidRequest
from .store import Store, TableLookup

VariantName = Literal["continuous", "per_bag"]
GeneratorKind = Literal["uniform", "zipf", "stack_distance"]
I64 = npt.NDArray[np.int64]

#: RecSSD's id spacing: profile id ``i`` is row ``128 i``.
RECSSD_STRIDE = 128


@dataclass(frozen=True)
class Generator:
    """How a table's row ids are drawn. Build with :meth:`uniform`, :meth:`zipf` or
    :meth:`stack_distance`."""

    kind: GeneratorKind
    alpha: float | None = None
    k: float | None = None
    variant: VariantName = "continuous"
    #: ``None``: the whole table (a seeded permutation of every row); an int: RecSSD's strided ids
    stride: int | None = None

    @classmethod
    def uniform(cls) -> Generator:
        return cls("uniform")

    @classmethod
    def zipf(cls, alpha: float) -> Generator:
        return cls("zipf", alpha=float(alpha))

    @classmethod
    def stack_distance(cls, k: float, variant: VariantName = "continuous",
                       ids: Literal["full", "recssd"] | int = "full") -> Generator:
        """DLRM's stack-distance generator with locality ``k`` (0: most locality). ``ids="full"``
        draws from every row; ``"recssd"`` uses rows ``0, 128, 256, …`` as RecSSD does; an int
        is another stride."""
        if variant not in ("continuous", "per_bag"):
            raise InvalidRequest(f"variant must be 'continuous' or 'per_bag', not {variant!r}")
        stride = None if ids == "full" else RECSSD_STRIDE if ids == "recssd" else ids
        if stride is not None and (not isinstance(stride, int) or stride < 1):
            raise InvalidRequest(f"ids must be 'full', 'recssd' or a stride ≥ 1, not {ids!r}")
        return cls("stack_distance", k=float(k), variant=variant, stride=stride)

    def to_json(self) -> dict[str, Any]:
        if self.kind == "uniform":
            return {"kind": "uniform"}
        if self.kind == "zipf":
            return {"kind": "zipf", "alpha": self.alpha}
        ids = {"kind": "full"} if self.stride is None else {"kind": "strided",
                                                            "stride": self.stride}
        return {"kind": "stack_distance", "k": self.k, "variant": self.variant, "ids": ids}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Generator:
        kind = d["kind"]
        if kind == "zipf":
            return cls.zipf(d["alpha"])
        if kind == "stack_distance":
            ids = d.get("ids", {"kind": "full"})
            return cls.stack_distance(d["k"], d.get("variant", "continuous"),
                                      "full" if ids["kind"] == "full" else int(ids["stride"]))
        return cls.uniform()

    def __str__(self) -> str:
        if self.kind == "zipf":
            return f"zipf({self.alpha:g})"
        if self.kind == "stack_distance":
            ids = "full" if self.stride is None else (
                "recssd" if self.stride == RECSSD_STRIDE else f"stride {self.stride}")
            return f"sd(k={self.k:g}, {self.variant}, {ids})"
        return "uniform"


@dataclass(frozen=True)
class Profile:
    """A trace's stack-distance profile: distinct ids in first-use order, the sorted distinct
    distances (0 = a first reference, 1 = the previous id again) and how often each occurred."""

    unique: npt.NDArray[np.uint64]
    distances: npt.NDArray[np.uint64]
    counts: npt.NDArray[np.uint64]

    @property
    def accesses(self) -> int:
        return int(self.counts.sum())

    @property
    def working_set(self) -> int:
        """Distinct rows touched."""
        return len(self.unique)

    @property
    def first_reference_share(self) -> float:
        first = int(self.counts[0]) if len(self.distances) and self.distances[0] == 0 else 0
        return first / max(1, self.accesses)

    def lru_hit_ratio(self, capacity: Any) -> Any:
        """Hit ratio of an LRU cache of ``capacity`` rows (an int, or an array of them) over the
        trace, from a cold start: the share of accesses at distances ``1..capacity``."""
        cap = np.asarray(capacity, dtype=np.uint64)
        hits = np.concatenate([[0], np.cumsum(np.where(self.distances > 0, self.counts, 0))])
        ratio = hits[np.searchsorted(self.distances, cap, side="right")] / max(1, self.accesses)
        return float(ratio) if np.ndim(ratio) == 0 else ratio


def profile(indices: Any, keys: bool = False) -> Profile:
    """The stack-distance profile of a sequence of row ids (O(n log n)); with ``keys``, of a
    keyed table's keys (any int64, their ``unique`` as uint64)."""
    ids = np.ascontiguousarray(np.asarray(indices), dtype=np.int64).ravel()
    if not keys:
        return Profile(*trace_profile(ids))
    distinct, codes = np.unique(ids, return_inverse=True)
    unique, distances, counts = trace_profile(codes.astype(np.int64))
    return Profile(distinct.view(np.uint64)[unique.astype(np.intp)], distances, counts)


@dataclass(frozen=True)
class TableTrace:
    """One table's bags (CSR: ``offsets`` has ``bags + 1`` entries into ``indices``). With
    ``keys``, a keyed table's: its ``indices`` are keys (a uint64's bits as int64), and ``rows``
    only describes the table (its row count, or the distinct keys recorded)."""

    name: str
    rows: int
    pooling: int
    offsets: I64
    indices: I64
    generator: Generator | None = None
    #: stack-distance traces: the share of draws that took a never-used id
    first_reference_share: float | None = None
    #: a keyed table's trace: ``indices`` are keys, not rows
    keys: bool = False

    @property
    def bags(self) -> int:
        return len(self.offsets) - 1

    def lookup(self, start: int, stop: int) -> TableLookup:
        """Bags ``start:stop`` as a :class:`~nearrec.TableLookup` (offsets rebased to 0)."""
        o = self.offsets[start:stop + 1]
        return TableLookup(self.name, self.indices[o[0]:o[-1]], o[:-1] - o[0])

    def profile(self) -> Profile:
        return profile(self.indices, self.keys)

    def _entry(self) -> str:
        return json.dumps({"name": self.name, "rows": self.rows, "pooling": self.pooling,
                           "generator": self.generator.to_json() if self.generator else None,
                           "first_reference_share": self.first_reference_share,
                           "keys": bool(self.keys)})


@dataclass(frozen=True)
class Trace:
    """A multi-table trace: every table has the same number of bags (one per sample)."""

    tables: dict[str, TableTrace]
    batch_size: int = 64
    seed: int = 0
    #: the file it was loaded from or saved to
    path: Path | None = field(default=None, compare=False)
    #: loaded from a file whose checksums matched (False for version-1 files, which have none)
    verified: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        counts = {t.bags for t in self.tables.values()}
        if len(counts) > 1:
            raise InvalidRequest(f"tables of a trace need the same number of bags, not {counts}")

    @property
    def bags(self) -> int:
        return next(iter(self.tables.values())).bags if self.tables else 0

    def __getitem__(self, name: str) -> TableTrace:
        return self.tables[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tables)

    def batch(self, start: int, stop: int) -> list[TableLookup]:
        """Samples ``start:stop`` of every table, ready for :meth:`Store.lookup_many`."""
        return [t.lookup(start, stop) for t in self.tables.values()]

    def batches(self, batch_size: int | None = None) -> Iterator[list[TableLookup]]:
        """The trace cut into batches of ``batch_size`` samples (the file's hint by default; the
        last batch may be short)."""
        size = self.batch_size if batch_size is None else batch_size
        if isinstance(size, bool) or not isinstance(size, int | np.integer) or size < 1:
            raise InvalidRequest(f"batch_size must be a positive integer, not {size!r}")
        for start in range(0, self.bags, size):
            yield self.batch(start, min(self.bags, start + size))

    def to_fbgemm(self, start: int = 0, stop: int | None = None) -> tuple[I64, I64, I64]:
        """Samples ``start:stop`` in FBGEMM's table-batched layout: ``(indices, offsets,
        lengths)``, table-major (bag ``t * B + b``), ``offsets`` of length ``T * B + 1``."""
        stop = self.bags if stop is None else stop
        parts, lengths = [], []
        for t in self.tables.values():
            o = t.offsets[start:stop + 1]
            parts.append(t.indices[o[0]:o[-1]])
            lengths.append(np.diff(o))
        length = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
        offsets = np.concatenate([[0], np.cumsum(length)]).astype(np.int64)
        indices = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return indices.astype(np.int64, copy=False), offsets, length.astype(np.int64)

    def save(self, path: str | Path, overwrite: bool = False) -> Trace:
        """Writes the trace file (atomically) and returns it as loaded from there."""
        trace_write(
            Path(path), self.batch_size, self.seed,
            [(t._entry(), np.ascontiguousarray(t.offsets, np.int64),
              np.ascontiguousarray(t.indices, np.int64)) for t in self.tables.values()],
            overwrite)
        return load(path)


def generate_table(name: str, rows: int, pooling: int, bags: int, generator: Generator,
                   seed: int = 0, table: int = 0) -> TableTrace:
    """``bags`` bags of ``pooling`` lookups into ``rows`` rows. ``table`` (the table's position
    in its trace) picks an independent stream of ``seed``."""
    if bags < 0 or pooling < 0:
        raise InvalidRequest("bags and pooling must be ≥ 0", table=name)
    spec = json.dumps({"name": name, "rows": int(rows), "pooling": int(pooling),
                       "generator": generator.to_json()})
    offsets, indices, share = trace_generate_table(spec, int(bags), int(seed), int(table))
    return TableTrace(name, int(rows), int(pooling), offsets, indices, generator, share)


def generate(tables: Mapping[str, int] | Store, bags: int, pooling: int | Mapping[str, int],
             generator: Generator, seed: int = 0, batch_size: int = 64,
             path: str | Path | None = None, overwrite: bool = False) -> Trace:
    """A trace over ``tables`` (name → rows, or a store's tables): ``bags`` samples, ``pooling``
    lookups per bag (one number or per table). With ``path``, also written there. A store's
    keyed table gets a keyed trace: the generator draws over the keys its keys file holds (in
    their row order), each id drawn becoming that key."""
    #: a store's keyed tables: the keys they hold, and their rows
    keys: dict[str, tuple[npt.NDArray[np.int64], int]] = {}
    if isinstance(tables, Store):
        from .keyed import keys_of

        keys = {n: (keys_of(tables.path, n), t.rows) for n, t in tables.tables.items()
                if t.keyed}
        rows = {n: len(keys[n][0]) if n in keys else t.rows for n, t in tables.tables.items()}
    else:
        rows = dict(tables)
    per = pooling if isinstance(pooling, Mapping) else dict.fromkeys(rows, pooling)
    out = {n: generate_table(n, r, per[n], bags, generator, seed, i)
           for i, (n, r) in enumerate(rows.items())}
    for n, (held, table_rows) in keys.items():
        out[n] = replace(out[n], rows=table_rows, indices=held[out[n].indices], keys=True)
    trace = Trace(out, batch_size, seed)
    return trace.save(path, overwrite) if path is not None else trace


def stack_distance(rows: int, bags: int, pooling: int, k: float = 1.0,
                   variant: VariantName = "continuous",
                   ids: Literal["full", "recssd"] | int = "full", seed: int = 0) -> TableTrace:
    """One table's stack-distance trace (see :meth:`Generator.stack_distance`)."""
    return generate_table("t0", rows, pooling, bags, Generator.stack_distance(k, variant, ids),
                          seed)


def zipf(rows: int, bags: int, pooling: int, alpha: float = 1.05, seed: int = 0) -> TableTrace:
    """One table's Zipf(α) trace over a random permutation of the rows."""
    return generate_table("t0", rows, pooling, bags, Generator.zipf(alpha), seed)


def uniform(rows: int, bags: int, pooling: int, seed: int = 0) -> TableTrace:
    return generate_table("t0", rows, pooling, bags, Generator.uniform(), seed)


def load(path: str | Path, mmap: bool = False) -> Trace:
    """Reads a trace file into memory and validates it (structure and checksums); its arrays
    are read-only views of the bytes read. ``Trace.verified`` says whether the file carried
    checksums (version-1 files have none; they load, unverified).

    ``mmap=True`` maps the file instead of reading it (numpy memmaps, nothing copied). Only for
    files nobody changes while they are in use: if another process truncates a mapped file, the
    next access to the lost pages kills this process with ``SIGBUS``.
    """
    p = Path(path)
    text, verified, data = trace_open(p, mmap)
    header = json.loads(text)
    bags = header["bags"]
    tables: dict[str, TableTrace] = {}

    def array(at: int, n: int) -> npt.NDArray[np.int64]:
        if n == 0:
            return np.zeros(0, np.int64)
        if data is None:
            return np.memmap(p, np.int64, "r", at, (n,))
        return np.frombuffer(data, np.int64, n, at)

    for t in header["tables"]:
        offsets = array(t["offsets_at"], bags + 1)
        indices = array(t["indices_at"], t["lookups"])
        gen = Generator.from_json(t["generator"]) if t.get("generator") else None
        tables[t["name"]] = TableTrace(t["name"], t["rows"], t["pooling"], offsets, indices,
                                       gen, t.get("first_reference_share"),
                                       bool(t.get("keys", False)))
    return Trace(tables, header["batch_size"], header["seed"], p, verified)


def from_fbgemm(indices: Any, offsets: Any, tables: Mapping[str, int], batch_size: int = 64,
                pooling: int | None = None, keyed: Collection[str] = ()) -> Trace:
    """A trace from FBGEMM's table-batched layout (``offsets`` of length ``T * B + 1``,
    table-major, tables in ``tables``' order with their row counts) — requests as a server
    recorded them. The tables named in ``keyed`` are keyed: their ids are keys (int64, or
    uint64 taken as their bits), kept as they are."""
    if isinstance(keyed, str) or not all(isinstance(n, str) for n in keyed):
        raise InvalidRequest(f"keyed is a collection of table names, not {keyed!r:.60}")
    if unknown := set(keyed) - set(tables):
        name = sorted(unknown)[0]
        raise InvalidRequest(f"keyed names table {name!r}, which tables lacks", table=name)
    raw = np.asarray(indices)
    idx = raw.view(np.int64) if raw.dtype == np.uint64 else raw.astype(np.int64, copy=False)
    off = np.asarray(offsets, dtype=np.int64)
    t_count = len(tables)
    if t_count == 0 or (len(off) - 1) % t_count:
        raise InvalidRequest(f"{len(off) - 1} bags do not split evenly over {t_count} tables")
    b = (len(off) - 1) // t_count
    out = {}
    for i, (name, rows) in enumerate(tables.items()):
        o = off[i * b:(i + 1) * b + 1]
        lens = np.diff(o)
        out[name] = TableTrace(name, int(rows), pooling or int(lens.max(initial=0)),
                               (o - o[0]).astype(np.int64), idx[o[0]:o[-1]].copy(),
                               keys=name in keyed)
    return Trace(out, batch_size)


__all__ = [
    "RECSSD_STRIDE",
    "Generator",
    "Profile",
    "TableTrace",
    "Trace",
    "from_fbgemm",
    "generate",
    "generate_table",
    "load",
    "profile",
    "stack_distance",
    "uniform",
    "zipf",
]
