"""Delta feeds: a trainer's changed rows applied to a served store as it trains.

A producer — :class:`Publisher` in a PyTorch / TorchRec training loop, or any program that
writes the format — writes delta files (``docs/format.md`` §17: Arrow IPC or Parquet rows of
``(table, id, op, values)``, named by a sequence number) into a directory; :func:`apply` applies
the files after the store's cursor, in order, each in one atomic call that also moves the feed's
cursor (``docs/live.md``, "Delta feeds"), so a feeder killed at any moment and started again
applies each file exactly once (a file larger than ``part_bytes`` takes several calls, the
cursor moved by the last: it is applied again from its start after a kill between them, its
rows set to the same values). :func:`watch` keeps doing so as files come. The store may be
embedded (``nearrec.open(..., writable=True)``) or on a node (``nearrec.connect``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import _native
from .build import _check_dtype, _managed_slots, _split_state_dict
from .errors import InvalidRequest
from .request import count
from .store import Store

__all__ = ["Applied", "Publisher", "apply", "from_dynamicemb", "watch"]


@dataclass(frozen=True)
class Applied:
    """One delta file applied: its ``sequence``, ``rows`` and ``calls`` (more than one for a
    file larger than ``part_bytes``), the store's ``version`` that holds it, ``applied``
    (``False``: the store had it already) and ``lag_seconds`` from the producer's wall time to
    the store logging it (``None``: the file gave none)."""

    sequence: int
    rows: int
    calls: int
    version: int
    applied: bool
    lag_seconds: float | None


def apply(
    directory: str | os.PathLike[str],
    store: Store,
    *,
    name: str = "default",
    start: int | None = None,
    allow_nonfinite: bool = False,
    part_bytes: int | None = None,
    format: str = "nearrec",
    prefix: str | None = None,
    tables: Mapping[str, str] | None = None,
) -> list[Applied]:
    """Applies the delta files of ``directory`` after ``store``'s cursor of feed ``name``, in
    sequence order, each once; ``start``: the first sequence when the store has never seen
    the feed. A gap in the sequence, or a file that does not fit the store (unknown table,
    wrong dim or dtype, a row out of range), raises :class:`InvalidRequest` naming the file,
    row and column, after the files before it; nothing of that file is applied.

    A file of more than ``part_bytes`` bytes of ids and rows (default 32 MiB: inside a node's
    default message limit and a store's default delta budget) is applied in calls of at most
    that, in order, the cursor moved by the last: a reader may see its first calls' rows first.

    ``format="tzrec"``: ``directory`` holds TorchEasyRec's delta embedding dumps (its
    ``delta_embedding_dump_config``'s ``output_dir``; ``prefix`` its ``file_prefix``, default
    ``delta_embedding``), each whole step one delta whose sequence is its global step (steps
    come every N apart: none is a gap); an ``embedding_name``'s rows go to the table of that
    name, or the one ``tables`` maps it to (``docs/live.md``, "TorchEasyRec's dumps")."""
    parts = None if part_bytes is None else count(part_bytes, "part_bytes", minimum=1)
    done = store._native.feed_dir(os.fspath(directory), name, start, allow_nonfinite, parts,
                                  format, prefix, dict(tables) if tables else None)
    if any(a[4] for a in done):
        store._read_info()  # a keyed table's keys held may have changed, as a write's would
    return [Applied(*a) for a in done]


def watch(
    directory: str | os.PathLike[str],
    store: Store,
    *,
    name: str = "default",
    start: int | None = None,
    poll: float = 0.2,
    part_bytes: int | None = None,
    stop: threading.Event | None = None,
    on_applied: Callable[[Applied], None] | None = None,
    on_refused: Callable[[InvalidRequest], None] | None = None,
    format: str = "nearrec",
    prefix: str | None = None,
    tables: Mapping[str, str] | None = None,
) -> int:
    """Applies ``directory``'s delta files as they come, every ``poll`` seconds, until
    ``stop`` is set (or forever); returns the files applied. A file that is refused (a gap, a
    file not whole yet, one that does not fit) is reported to ``on_refused`` and tried again
    at the next poll — a producer may still be writing it or the one before it; an error of
    the store itself ends the watch. ``format``, ``prefix``, ``tables``: as :func:`apply`'s."""
    stop = stop or threading.Event()
    count = 0
    while not stop.is_set():
        started = time.monotonic()
        try:
            for a in apply(directory, store, name=name, start=start, part_bytes=part_bytes,
                           format=format, prefix=prefix, tables=tables):
                count += 1
                if on_applied is not None:
                    on_applied(a)
        except InvalidRequest as e:
            if on_refused is not None:
                on_refused(e)
        stop.wait(max(0.0, poll - (time.monotonic() - started)))
    return count


def from_dynamicemb(results: Mapping[str, Any] | Iterable[Mapping[str, Any]],
                    directory: str | os.PathLike[str], *, step: int | None = None,
                    sequence: int | None = None, tables: Mapping[str, str] | None = None,
                    evictions: bool = True) -> Path | None:
    """Writes NVIDIA dynamicemb's incremental dump as one delta file in ``directory`` (for
    :func:`apply` / ``nearrec feed``); its path, or ``None`` when the dump holds nothing.

    ``results`` is what ``dynamicemb.incremental_dump(model, score_threshold, pg)`` returns —
    ``{collection_path: DeltaDumpResult}`` — or a list of them, one a rank, for dumps made
    without a process group (each rank's keys its own). Per table ``table_names[i]`` (the
    store's keyed table of that name, or the one ``tables`` maps ``name`` or
    ``"collection_path.name"`` to): ``keys[i]`` with their embeddings ``values[i]`` are
    upserts; ``erased_keys[i]`` (explicit erases) are deletes, and so are ``evicted_keys[i]``
    (tables made with ``evicted_item_mode=RETAIN_KEY``) unless ``evictions=False`` — a nearrec
    keyed table does not evict as the trainer's hash table does, so a key it let go of is sent.
    Optimizer states and scores stay with the trainer. ``step`` is the trainer's; ``sequence``
    defaults to the one after the directory's last."""
    per_rank = [results] if isinstance(results, Mapping) else list(results)
    names = dict(tables or {})
    ups: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    gone: dict[str, list[np.ndarray]] = {}
    for rank in per_rank:
        for path, dump in rank.items():
            for i, name in enumerate(dump.table_names):
                table = names.get(f"{path}.{name}", names.get(name, name))
                keys = _keys(dump.keys[i])
                values = np.ascontiguousarray(_host(dump.values[i]), np.float32)
                if values.ndim != 2 or len(values) != len(keys):
                    raise InvalidRequest(f"dynamicemb table {name!r} of {path!r}: "
                                         f"{len(keys)} keys and values of shape {values.shape}",
                                         table=table)
                ups.setdefault(table, []).append((keys, values))
                removed = [dump.erased_keys[i]] + ([dump.evicted_keys[i]] if evictions else [])
                gone.setdefault(table, []).extend(_keys(k) for k in removed if k is not None)
    upserts, deletes = [], []
    for table, parts in ups.items():
        keys = np.concatenate([k for k, _ in parts])
        values = np.concatenate([v for _, v in parts])
        unique, first = np.unique(keys, return_index=True)
        if len(unique) != len(keys):
            again = np.setdiff1d(np.arange(len(keys)), first)[0]
            raise InvalidRequest(f"dynamicemb dump: key {keys[again]} of table {table!r} twice "
                                 "(two ranks' dumps of one key)", table=table,
                                 position=int(again))
        if len(keys):
            upserts.append((table, keys, values))
    for table, lost in gone.items():
        # a key evicted or erased and then admitted again is the table's: its upsert stands
        dropped = np.setdiff1d(np.concatenate(lost or [np.empty(0, np.int64)]),
                               np.concatenate([k for k, _ in ups[table]]))
        if len(dropped):
            deletes.append((table, dropped))
    if not upserts and not deletes:
        return None
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if sequence is None:
        sequence = _next_sequence(directory)
    path = directory / f"{count(sequence, 'sequence', minimum=0):020d}.arrow"
    _native.delta_write(path, sequence, step, int(time.time() * 1000), upserts, deletes)
    return path


def _host(x: Any) -> np.ndarray:
    """A torch tensor (on any device) or an array, as numpy."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _keys(x: Any) -> np.ndarray:
    """Keys as a delta file's ids: int64, a uint64 key its bits."""
    keys = _host(x).reshape(-1)
    if keys.dtype == np.uint64:
        return keys.view(np.int64)
    return keys.astype(np.int64, copy=False)


def _next_sequence(directory: Path) -> int:
    """The sequence after the largest of the delta files in ``directory`` (1 when none)."""
    taken = _native.delta_sequences(directory)
    return taken[-1] + 1 if taken else 1


class _Managed:
    """A managed-collision table of a :class:`Publisher`: its module, its ids' hash, and the
    ids and slots the last file published."""

    def __init__(self, module: Any, hash_: Any, ids: Any, slots: Any) -> None:
        self.module, self.hash = module, hash_
        self.ids, self.slots = ids, slots

    def changes(self, table: str, touched: Any) -> tuple[Any, Any, Any, tuple[Any, Any]]:
        """Since the last file: the ids to upsert and the slots holding their rows — the
        touched ones (raw ids, hashed here) that hold a slot, and those admitted or moved — the
        ids evicted, and the (ids, slots) held now."""
        import torch

        ids, slots, _, _ = _managed_slots(self.module, table, table)
        if self.hash is not None and len(touched):
            touched = self.hash(touched)
        order = np.argsort(ids, kind="stable")
        ids, slots = ids[order], slots[order]
        before = np.argsort(self.ids, kind="stable")
        was_ids, was_slots = self.ids[before], self.slots[before]
        same = np.zeros(len(ids), bool)
        if len(was_ids):
            at = np.minimum(np.searchsorted(was_ids, ids), len(was_ids) - 1)
            same = (was_ids[at] == ids) & (was_slots[at] == slots)
        # the empty mark, held while a slot is empty, reads an empty slot that misses train:
        # its row goes in every file
        mark = ids[ids == np.iinfo(np.int64).max]
        want = np.union1d(np.union1d(ids[~same], mark), np.intersect1d(touched.numpy(), ids))
        rows = slots[np.searchsorted(ids, want)]
        gone = np.setdiff1d(was_ids, ids)
        return (torch.from_numpy(want.astype(np.int64)), torch.from_numpy(rows.astype(np.int64)),
                gone.astype(np.int64), (ids, slots))


class Publisher:
    """The training loop's side of a delta feed: call :meth:`step` after each optimizer step
    with the step's ``KeyedJaggedTensor`` (or a list of them); every ``every_steps`` steps it
    writes one delta file into ``directory`` holding the rows of each ``EmbeddingBagCollection``
    table of ``model`` that the steps since the last file touched — found by the KJTs' ids,
    not by diffing whole tables — as the tables hold them after the step, with the model's
    dense weights beside it every ``dense_every`` files (0: never but at :meth:`flush`).

    A TorchRec ``ManagedCollisionEmbeddingBagCollection`` (ZCH, ``MCHManagedCollisionModule``)
    is published by key, as :func:`nearrec.torch.from_torchrec` serves it (a keyed table per
    table): the raw ids (hashed by the module's ``input_hash_func``) the steps touched that hold
    a slot, with their slots' rows; the ids the module admitted or moved to another slot since
    the last file; and deletes for the ids it evicted — from its slot table, a sort of the ids
    it holds, not a diff of rows. Its default slot (what TorchRec pools for an id it holds no
    slot for) is not carried: the served table answers unknown ids with the default row it was
    built with.

    ``dtype``: the rows' encoding in the files — ``"fp32"``, or the store's own (``"fp16"``,
    ``"int8"``, ``"int4"``, ...), encoded here as a store's writer encodes them (int8 / int4 /
    int2 row-wise with their scale and bias, as FBGEMM lays them) and applied as they are, so
    that a quantised store takes a trainer's rows without quantising them again; a store whose
    tables are of another dtype refuses such a file, naming the table.

    Rows an optimizer changes without their ids in the step's features (weight decay or
    momentum on untouched rows) are not seen: such a trainer publishes whole tables with
    :func:`nearrec.update` instead. Files are numbered on from the largest sequence in the
    directory (or from ``start``), each written whole under its name (a feeder never reads
    half of one); the dense weights first, so a feeder that reads a file finds them."""

    def __init__(self, directory: str | os.PathLike[str], model: Any, *,
                 every_steps: int = 1000, dense_every: int = 0,
                 start: int | None = None, dtype: str = "fp32") -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.every_steps = count(every_steps, "every_steps", minimum=1)
        self.dense_every = count(dense_every, "dense_every", minimum=0)
        self.dtype = _check_dtype(dtype)
        self._model = model
        self._weights: dict[str, Any] = {}
        self._features: dict[str, list[str]] = {}
        #: managed-collision tables: their module, hash, and the (ids, slots) last published
        self._managed: dict[str, _Managed] = {}
        managed = [m for m in model.modules() if hasattr(m, "_managed_collision_collection")
                   and hasattr(m, "_embedding_module")]
        inner = {id(m._embedding_module) for m in managed}
        for m in model.modules():
            configs = getattr(m, "embedding_bag_configs", None)
            if id(m) in inner or not callable(configs) or not hasattr(m, "embedding_bags"):
                continue
            for c in configs():
                self._add(c, m.embedding_bags[c.name].weight)
        for m in managed:
            ebc = m._embedding_module
            for c in ebc.embedding_bag_configs():
                self._add(c, ebc.embedding_bags[c.name].weight)
                ids, slots, _, hash_ = _managed_slots(m, c.name, c.name)
                self._managed[c.name] = _Managed(m, hash_, ids, slots)
        if not self._weights:
            raise InvalidRequest(f"{type(model).__name__} holds no EmbeddingBagCollection whose "
                                 "rows a delta could carry")
        self.next_sequence = count(start, "start", minimum=0) if start is not None \
            else _next_sequence(self.directory)
        self._touched: dict[str, list[Any]] = {}
        self.steps = 0
        self.files = 0

    def _add(self, config: Any, weight: Any) -> None:
        if config.name in self._weights:
            raise InvalidRequest(f"two collections of the model have a table {config.name!r}: "
                                 "a delta names tables by name", table=config.name)
        self._weights[config.name] = weight
        for f in config.feature_names:
            self._features.setdefault(f, []).append(config.name)

    def step(self, features: Any | Iterable[Any]) -> Path | None:
        """Records the ids a training step's ``KeyedJaggedTensor`` (or several) touched; every
        ``every_steps`` steps, writes a delta file (:meth:`publish`) and returns its path."""
        batches: list[Any] = list(features) if isinstance(features, list | tuple) \
            else [features]
        for kjt in batches:
            for key in kjt.keys():
                for table in self._features.get(key, ()):
                    self._touched.setdefault(table, []).append(kjt[key].values().detach())
        self.steps += 1
        if self.steps % self.every_steps == 0:
            return self.publish()
        return None

    def publish(self, *, dense: bool | None = None) -> Path | None:
        """Writes a delta file of the rows touched since the last one (and a managed table's
        admitted, moved and evicted ids), with the dense weights when ``dense`` (default: every
        ``dense_every`` files); its path, or ``None`` when there was nothing to write."""
        import torch

        if dense is None:
            dense = self.dense_every > 0 and (self.files + 1) % self.dense_every == 0
        upserts, deletes = [], []
        held: dict[str, tuple[Any, Any]] = {}
        with torch.no_grad():
            for table in sorted(set(self._touched) | set(self._managed)):
                parts = self._touched.get(table, [])
                touched = torch.unique(torch.cat(parts).to("cpu", torch.int64)) if parts \
                    else torch.zeros(0, dtype=torch.int64)
                w = self._weights[table]
                managed = self._managed.get(table)
                if managed is None:
                    ids, rows = touched, touched
                else:
                    ids, rows, gone, held[table] = managed.changes(table, touched)
                    if len(gone):
                        deletes.append((table, gone))
                if len(ids):
                    values = w[rows.to(w.device)].to("cpu", torch.float32).numpy()
                    upserts.append((table, np.ascontiguousarray(ids.numpy()), values))
        if not upserts and not deletes and not dense:
            return None
        sequence = self.next_sequence
        if dense:
            self._write_dense(sequence)
        path = self.directory / f"{sequence:020d}.arrow"
        _native.delta_write(path, sequence, self.steps, int(time.time() * 1000), upserts,
                            deletes, self.dtype)
        for table, (ids, slots) in held.items():
            self._managed[table].ids, self._managed[table].slots = ids, slots
        self._touched.clear()
        self.next_sequence += 1
        self.files += 1
        return path

    def flush(self) -> Path | None:
        """Writes what is touched and not yet published, with the dense weights (a training
        run's end)."""
        return self.publish(dense=True)

    def _write_dense(self, sequence: int) -> None:
        state = self._model.state_dict()
        _, names = _split_state_dict(state, None)
        arrays = {n: state[n].detach().to("cpu").float().numpy() for n in names}
        final = self.directory / f"{sequence:020d}.dense.npz"
        tmp = self.directory / f".{final.name}.tmp"
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        tmp.rename(final)
