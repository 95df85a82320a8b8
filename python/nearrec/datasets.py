"""Traces from real data that nearrec does not ship: loaders for local copies.

- :func:`criteo` — Criteo's Kaggle / Terabyte click logs (TSV: label, 13 integer features, 26
  hashed categorical features, one sample per line, plain or gzipped), streamed in chunks. Each
  categorical feature becomes a table of pooling factor 1; categories map to rows by the hashing
  trick (``int(hex, 16) % rows``, DLRM's ``--max-ind-range``) or by a dictionary in order of first
  appearance (DLRM's preprocessing). Missing categories map to row 0, as in DLRM.
- :func:`fbgemm_file` — a ``torch.save``'d ``(indices, offsets, lengths)`` triple in FBGEMM's
  table-batched layout, as Meta's ``dlrm_datasets`` publishes its production-like traces.
- :func:`movielens_100k` — MovieLens-100K ratings (GroupLens' ``u.data``, RecBole's atomic
  ``ml-100k.inter``, or the ``recbole`` wheel that ships it), in time order: per rating a user
  table, an item table and the user's previous items as a bag. Its licence forbids
  redistribution: point the loader at your copy, never commit it.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import pickle
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

import numpy as np
import numpy.typing as npt

from .errors import InvalidRequest, InvalidTrace, StoreIOError, StoreNotFound
from .request import count, path_arg, regular_file
from .trace import TableTrace, Trace, from_fbgemm

#: Distinct values of each categorical feature in Criteo Kaggle (traces.md), for look-alikes and
#: as hash sizes.
CRITEO_KAGGLE_ROWS = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
                      3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105,
                      142572)
CRITEO_DENSE = 13
CRITEO_SPARSE = 26


@dataclass
class ClickLog:
    """Samples of a click log: the sparse features as a trace, plus dense features and labels
    (row ``i`` of ``dense`` / ``labels`` is bag ``i`` of every table)."""

    trace: Trace
    #: ``[samples, 13]`` raw integer features (missing = 0; DLRM feeds ``log(1 + max(x, 0))``)
    dense: npt.NDArray[np.float32]
    labels: npt.NDArray[np.int8]


def _source(path: Any, what: str = "path", dir_ok: bool = False) -> Path:
    """``path`` checked: a path that exists (a file, or a directory where ``dir_ok``)."""
    p = Path(path_arg(path, what))
    if not p.exists():
        raise StoreNotFound(f"{what} {str(p)!r} does not exist")
    if p.is_dir():
        if dir_ok:
            return p
        raise StoreIOError(f"{what} {str(p)!r} is a directory, not a file")
    return Path(regular_file(p, what))  # (a FIFO would block the read forever)


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Turns what reading ``path`` can raise into nearrec errors naming it."""
    try:
        yield
    except (gzip.BadGzipFile, zlib.error) as e:
        raise InvalidTrace(f"{path}: not a readable gzip file: {e}") from None
    except EOFError as e:
        raise InvalidTrace(f"{path}: truncated or empty file: {e}") from None
    except UnicodeDecodeError as e:
        raise InvalidTrace(f"{path}: not a text file (byte {e.start}: {e.reason})") from None
    except FileNotFoundError as e:
        raise StoreNotFound(f"{path}: {e.strerror or e}") from None
    except OSError as e:
        if isinstance(e, StoreIOError):
            raise
        raise StoreIOError(f"{path}: cannot read: {e.strerror or e}") from None


def _open_text(path: Path) -> TextIO:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="ascii", errors="strict")
    return open(path, encoding="ascii", errors="strict")


def criteo(path: str | Path,
           rows: int | Sequence[int] | Literal["keys"] | None = CRITEO_KAGGLE_ROWS,
           samples: int | None = None, batch_size: int = 64,
           chunk: int = 1 << 16) -> ClickLog:
    """Reads up to ``samples`` lines of a Criteo TSV file (``.gz`` read as gzip). ``rows``: the
    hash size of every table (one int, or 26), ``None`` to number each table's categories in
    order of first appearance (row 0 is "missing"), or ``"keys"`` for keyed tables: each
    category's 32-bit value is its key, kept as it is, and a missing one is an empty bag (the
    trace's tables are keyed, their ``rows`` the distinct keys seen). Tables are named ``C1`` ...
    ``C26``. A line without 40 fields, or with a non-hex category or non-integer feature, is an
    :class:`InvalidTrace` that names the file and line."""
    path = _source(path)
    if samples is not None:
        samples = count(samples, "samples", minimum=0)
    batch_size = count(batch_size, "batch_size")
    chunk = count(chunk, "chunk")
    sizes: list[int] | None
    keyed = isinstance(rows, str) and rows == "keys"
    if rows is None or keyed:
        sizes = None
    elif isinstance(rows, int) and not isinstance(rows, bool):
        sizes = [rows] * CRITEO_SPARSE
    elif isinstance(rows, str | bytes) or not isinstance(rows, Sequence | np.ndarray):
        raise InvalidRequest(f"criteo rows must be one hash size, 26 of them or None, not "
                             f"{rows!r:.60}")
    else:
        sizes = [count(r, f"criteo rows[{i}]", minimum=-(1 << 62)) for i, r in enumerate(rows)]
    if sizes is not None and (len(sizes) != CRITEO_SPARSE or min(sizes) < 1):
        raise InvalidTrace(f"criteo needs 26 positive hash sizes, got {rows!r}")
    dicts: list[dict[str, int]] = [{"": 0} for _ in range(CRITEO_SPARSE)]
    ids_parts, dense_parts, label_parts = [], [], []
    seen = 0
    with _reading(path), _open_text(path) as f:
        while samples is None or seen < samples:
            want = chunk if samples is None else min(chunk, samples - seen)
            lines = [line for _, line in zip(range(want), f, strict=False)]
            if not lines:
                break
            labels = np.empty(len(lines), np.int8)
            dense = np.zeros((len(lines), CRITEO_DENSE), np.float32)
            ids = np.empty((len(lines), CRITEO_SPARSE), np.int64)
            for i, line in enumerate(lines):
                fields = line.rstrip("\r\n").split("\t")
                where = f"{path}, line {seen + i + 1}"
                if len(fields) != 1 + CRITEO_DENSE + CRITEO_SPARSE:
                    raise InvalidTrace(f"{where}: {len(fields)} fields, expected 40")
                try:
                    labels[i] = int(fields[0])
                    dense[i] = [int(x) if x else 0 for x in fields[1:14]]
                    cats = fields[14:]
                    if keyed:
                        ids[i] = [int(c, 16) if c else -1 for c in cats]
                    elif sizes is None:
                        ids[i] = [d.setdefault(c, len(d)) for d, c in zip(dicts, cats,
                                                                            strict=True)]
                    else:
                        ids[i] = [int(c, 16) % n if c else 0
                                  for c, n in zip(cats, sizes, strict=True)]
                except ValueError as e:
                    raise InvalidTrace(f"{where}: {e}") from None
            ids_parts.append(ids)
            dense_parts.append(dense)
            label_parts.append(labels)
            seen += len(lines)
    all_ids = np.concatenate(ids_parts) if ids_parts else np.empty((0, CRITEO_SPARSE), np.int64)
    if keyed:
        tables = {}
        for t in range(CRITEO_SPARSE):
            present = all_ids[:, t] >= 0  # a category's value is 32 bits: -1 is "missing"
            keys = np.ascontiguousarray(all_ids[present, t])
            offsets = np.concatenate([[0], np.cumsum(present, dtype=np.int64)])
            tables[f"C{t + 1}"] = TableTrace(f"C{t + 1}", len(np.unique(keys)), 1, offsets,
                                             keys, keys=True)
        trace = Trace(tables, batch_size)
    else:
        counts = sizes if sizes is not None else [len(d) for d in dicts]
        offsets = np.arange(len(all_ids) + 1, dtype=np.int64)
        trace = Trace({f"C{t + 1}": TableTrace(f"C{t + 1}", counts[t], 1, offsets,
                                               np.ascontiguousarray(all_ids[:, t]))
                       for t in range(CRITEO_SPARSE)}, batch_size)
    return ClickLog(trace,
                    np.concatenate(dense_parts) if dense_parts
                    else np.empty((0, CRITEO_DENSE), np.float32),
                    np.concatenate(label_parts) if label_parts else np.empty(0, np.int8))


def fbgemm_file(path: str | Path, rows: Sequence[int] | None = None,
                names: Sequence[str] | None = None, batch_size: int | None = None) -> Trace:
    """Loads a ``torch.save``'d ``(indices, offsets, lengths)`` triple (``dlrm_datasets``'
    ``embedding_bag/*.pt``): ``lengths`` is ``[tables, batch]``, ``offsets`` has
    ``tables * batch + 1`` entries, table-major. Tables are named ``t0``, ``t1``, ... unless
    ``names`` are given; their row counts are ``rows``, or each table's largest id + 1."""
    import torch

    path = _source(path)
    if batch_size is not None:
        batch_size = count(batch_size, "batch_size")
    if names is not None and (isinstance(names, str | bytes) or not isinstance(names, Sequence)
                              or not all(isinstance(n, str) for n in names)):
        raise InvalidRequest(f"names must be a sequence of table names, not {names!r:.60}")
    if rows is not None:
        if isinstance(rows, str | bytes) or not isinstance(rows, Sequence | np.ndarray):
            raise InvalidRequest(f"rows must be a sequence of row counts, not {rows!r:.60}")
        rows = [count(r, f"rows[{i}]") for i, r in enumerate(rows)]
    try:
        with _reading(path):
            loaded = torch.load(path, map_location="cpu", weights_only=True)
        indices, offsets, lengths = (np.asarray(x.numpy() if hasattr(x, "numpy") else x)
                                     for x in loaded)
    except (ValueError, TypeError, RuntimeError, pickle.UnpicklingError, AttributeError) as e:
        raise InvalidTrace(f"{path}: not an (indices, offsets, lengths) triple: {e}") from None
    if indices.ndim != 1 or offsets.ndim != 1 or indices.dtype.kind not in "iu" \
            or offsets.dtype.kind not in "iu" or lengths.dtype.kind not in "iu":
        raise InvalidTrace(f"{path}: indices and offsets must be 1-D integer arrays, lengths a "
                           f"2-D one; got {indices.shape} {indices.dtype}, {offsets.shape} "
                           f"{offsets.dtype}, {lengths.shape} {lengths.dtype}")
    if lengths.ndim != 2 or len(offsets) != lengths.size + 1:
        raise InvalidTrace(f"{path}: lengths {lengths.shape} and {len(offsets)} offsets do not "
                           "describe tables x batch bags")
    t_count, batch = lengths.shape
    off = offsets.astype(np.int64)
    if not np.array_equal(np.diff(off), lengths.reshape(-1)):
        raise InvalidTrace(f"{path}: offsets and lengths disagree")
    names = list(names) if names is not None else [f"t{t}" for t in range(t_count)]
    if len(names) != t_count:
        raise InvalidTrace(f"{path}: {t_count} tables, {len(names)} names")
    idx = indices.astype(np.int64)
    if rows is None:
        rows = [int(idx[off[t * batch]:off[(t + 1) * batch]].max(initial=-1)) + 1
                for t in range(t_count)]
    if len(rows) != t_count:
        raise InvalidTrace(f"{path}: {t_count} tables, {len(rows)} row counts")
    return from_fbgemm(idx, off, dict(zip(names, (max(1, int(r)) for r in rows), strict=True)),
                       batch_size=batch_size or batch)


def _movielens_lines(source: Path) -> Iterator[str]:
    """Lines of ratings (``user item rating timestamp``) from a file, a directory holding
    ``u.data`` or ``ml-100k.inter``, or a recbole wheel."""
    if source.suffix == ".whl":
        name = "recbole/dataset_example/ml-100k/ml-100k.inter"
        try:
            with zipfile.ZipFile(source) as z:
                text = z.read(name).decode()
        except KeyError:
            raise InvalidTrace(f"{source} holds no {name}") from None
        except zipfile.BadZipFile as e:
            raise InvalidTrace(f"{source}: not a wheel (zip) file: {e}") from None
        yield from text.splitlines()[1:]
        return
    if source.is_dir():
        for name in ("u.data", "ml-100k.inter"):
            if (source / name).exists():
                source = source / name
                break
        else:
            raise InvalidTrace(f"{source} holds neither u.data nor ml-100k.inter")
    with open(source, encoding="utf-8", errors="strict") as f:
        lines = f.read().splitlines()
    yield from lines[1:] if lines and ":token" in lines[0] else lines


def movielens_100k(source: str | Path, history: int = 20, batch_size: int = 64) -> Trace:
    """MovieLens-100K as a trace, one sample per rating in time order (ties by file order):
    tables ``user`` and ``item`` (pooling 1, ids numbered in order of first appearance) and
    ``history`` (the user's up to ``history`` previous items, newest last; empty for a user's
    first rating). ``source``: ``u.data``, ``ml-100k.inter``, a directory holding either, or a
    ``recbole`` wheel (e.g. from ``pip download recbole==1.2.1 --no-deps``)."""
    src = _source(source, "source", dir_ok=True)
    history = count(history, "history", minimum=0)
    batch_size = count(batch_size, "batch_size")
    rows: list[tuple[int, str, str]] = []
    with _reading(src):
        lines = list(_movielens_lines(src))
    for n, line in enumerate(lines):
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 4:
            raise InvalidTrace(f"{source}: rating {n + 1} has {len(parts)} fields, expected 4")
        try:
            rows.append((int(float(parts[3])), parts[0], parts[1]))
        except ValueError as e:
            raise InvalidTrace(f"{source}: rating {n + 1}: {e}") from None
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])
    users: dict[str, int] = {}
    items: dict[str, int] = {}
    u_ids = np.empty(len(rows), np.int64)
    i_ids = np.empty(len(rows), np.int64)
    past: dict[int, list[int]] = {}
    hist: list[int] = []
    hist_off = np.zeros(len(rows) + 1, np.int64)
    for k, i in enumerate(order):
        _, u, it = rows[i]
        uid = users.setdefault(u, len(users))
        iid = items.setdefault(it, len(items))
        u_ids[k], i_ids[k] = uid, iid
        seen = past.setdefault(uid, [])
        hist.extend(seen[-history:] if history else [])
        hist_off[k + 1] = len(hist)
        seen.append(iid)
    one = np.arange(len(rows) + 1, dtype=np.int64)
    n_items = max(1, len(items))
    tables: dict[str, Any] = {
        "user": TableTrace("user", max(1, len(users)), 1, one, u_ids),
        "item": TableTrace("item", n_items, 1, one, i_ids),
        "history": TableTrace("history", n_items, history, hist_off,
                              np.asarray(hist, dtype=np.int64)),
    }
    return Trace(tables, batch_size)


__all__ = ["CRITEO_KAGGLE_ROWS", "ClickLog", "criteo", "fbgemm_file", "movielens_100k"]
