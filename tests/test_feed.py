"""Delta feeds from Python: files written by pyarrow — as a producer outside nearrec writes
them — applied by ``nearrec.feed`` and ``nearrec feed`` to an embedded store and to a node,
each once, with the cursor in ``Store.feed_status``; misfits refused naming file, row and
column."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import nearrec
from nearrec.errors import InvalidRequest

DIM = 8
ROWS = 50


def delta(directory: Path, sequence: int, rows: dict[str, tuple[list[int], np.ndarray]],
          deletes: dict[str, list[int]] | None = None, *, parquet: bool = False,
          wall_ms: int | None = None) -> Path:
    """Delta file ``sequence`` as pyarrow writes it: upserts of ``rows`` (table → ids,
    values), deletes of ``deletes``; written under a temporary name and renamed."""
    tables, ids, ops, values = [], [], [], []
    for table, (table_ids, vals) in rows.items():
        for i, v in zip(table_ids, vals, strict=True):
            tables.append(table)
            ids.append(i)
            ops.append(0)
            values.append([float(x) for x in v])
    for table, table_ids in (deletes or {}).items():
        for i in table_ids:
            tables.append(table)
            ids.append(i)
            ops.append(1)
            values.append(None)
    meta = {"nearrec.delta": "1", "nearrec.sequence": str(sequence),
            "nearrec.step": str(100 * sequence),
            "nearrec.wall_time_ms": str(wall_ms or int(time.time() * 1000))}
    schema = pa.schema([("table", pa.string()), ("id", pa.int64()), ("op", pa.int8()),
                        ("values", pa.list_(pa.float32(), DIM))], metadata=meta)
    batch = pa.table([pa.array(tables), pa.array(ids, pa.int64()), pa.array(ops, pa.int8()),
                      pa.array(values, pa.list_(pa.float32(), DIM))], schema=schema)
    ext = "parquet" if parquet else "arrow"
    path = directory / f"{sequence:020d}.{ext}"
    tmp = directory / f".{path.name}.tmp"
    if parquet:
        pq.write_table(batch, tmp)
    else:
        with pa.OSFile(str(tmp), "wb") as f, pa.ipc.new_stream(f, schema) as w:
            w.write_table(batch)
    tmp.rename(path)
    return path


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    tables = {t: rng.standard_normal((ROWS, DIM)).astype(np.float32) for t in ("a", "b")}
    nearrec.from_numpy(tmp_path / "store", tables)
    (tmp_path / "deltas").mkdir()
    return tmp_path


def rows_of(store: nearrec.Store, table: str, ids: list[int]) -> np.ndarray:
    return store.lookup(table, np.array(ids), offsets=np.arange(len(ids)))


def test_pyarrow_files_are_applied_in_order_once(store_dir: Path) -> None:
    deltas = store_dir / "deltas"
    store = nearrec.open(store_dir / "store", writable=True)
    v1 = np.full((2, DIM), 1.5, np.float32)
    v2 = np.arange(DIM, dtype=np.float32)[None, :]
    delta(deltas, 1, {"a": ([3, 7], v1)})
    delta(deltas, 2, {"b": ([0], v2)}, {"a": [7]}, parquet=True)
    done = nearrec.feed.apply(deltas, store)
    assert [(a.sequence, a.rows, a.applied) for a in done] == [(1, 2, True), (2, 2, True)]
    assert all(a.lag_seconds is not None and 0 <= a.lag_seconds < 60 for a in done)
    np.testing.assert_array_equal(rows_of(store, "a", [3, 7]), [v1[0], np.zeros(DIM)])
    np.testing.assert_array_equal(rows_of(store, "b", [0]), v2)
    cursor = store.feed_status()["default"]
    assert (cursor.sequence, cursor.step, cursor.rows) == (2, 200, 2)
    # again: nothing; the store's version stays
    version = store.version
    assert nearrec.feed.apply(deltas, store) == []
    assert store.version == version
    # reopened read-only, the cursor is there
    store.close()
    assert nearrec.open(store_dir / "store").feed_status()["default"].sequence == 2


def test_misfits_and_gaps_are_refused_naming_file_row_and_column(store_dir: Path) -> None:
    deltas = store_dir / "deltas"
    store = nearrec.open(store_dir / "store", writable=True)
    ok = np.ones((1, DIM), np.float32)
    delta(deltas, 1, {"a": ([1], ok)})
    path = delta(deltas, 2, {"a": ([2], ok), "nope": ([0], ok)})
    with pytest.raises(InvalidRequest, match=r"row 1, column \"table\"") as e:
        nearrec.feed.apply(deltas, store)
    assert str(path) in str(e.value)
    assert store.feed_status()["default"].sequence == 1, "file 1 before it stays applied"
    np.testing.assert_array_equal(rows_of(store, "a", [2])[0] == 1.0, np.zeros(DIM, bool))
    path.unlink()
    delta(deltas, 2, {"a": ([ROWS], ok)})
    with pytest.raises(InvalidRequest, match=r"row 0, column \"id\".*not a row"):
        nearrec.feed.apply(deltas, store)
    next(deltas.glob("*2.arrow")).unlink()
    delta(deltas, 3, {"a": ([4], ok)})
    with pytest.raises(InvalidRequest, match="needs sequence 2 next"):
        nearrec.feed.apply(deltas, store)


def test_watch_follows_the_directory(store_dir: Path) -> None:
    deltas = store_dir / "deltas"
    store = nearrec.open(store_dir / "store", writable=True)
    seen: list[int] = []
    refused: list[str] = []
    stop = threading.Event()
    watcher = threading.Thread(
        target=nearrec.feed.watch, args=(deltas, store),
        kwargs={"poll": 0.02, "stop": stop, "on_applied": lambda a: seen.append(a.sequence),
                "on_refused": lambda e: refused.append(str(e))})
    watcher.start()
    try:
        for s in (1, 2, 4):
            delta(deltas, s, {"a": ([s], np.full((1, DIM), s, np.float32))})
            time.sleep(0.1)
        assert seen == [1, 2] and any("needs sequence 3" in r for r in refused), refused
        delta(deltas, 3, {"a": ([3], np.full((1, DIM), 3, np.float32))})
        deadline = time.monotonic() + 10
        while seen != [1, 2, 3, 4] and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        stop.set()
        watcher.join()
    assert seen == [1, 2, 3, 4]
    np.testing.assert_array_equal(rows_of(store, "a", [4]), np.full((1, DIM), 4, np.float32))


def test_the_command_feeds_a_node_and_a_killed_feeder_applies_nothing_twice(
        store_dir: Path) -> None:
    from conftest import Node

    deltas = store_dir / "deltas"
    for s in range(1, 4):
        delta(deltas, s, {"b": ([s], np.full((1, DIM), s, np.float32))})
    node = Node(f"{store_dir / 'store'}=s", "--writable")
    try:
        cmd = [sys.executable, "-m", "nearrec.cli", "feed", str(deltas), "s", "--remote",
               node.address, "--name", "trainer", "--json"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        applied = json.loads(out.stdout)["applied"]
        assert [a["sequence"] for a in applied] == [1, 2, 3]
        remote = nearrec.connect(node.address, "s")
        assert remote.feed_status()["trainer"].sequence == 3
        version = remote.version
        # a second feeder (the first was killed after its last call) finds only the new file
        delta(deltas, 4, {"b": ([4], np.full((1, DIM), 4, np.float32))})
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        assert [a["sequence"] for a in json.loads(out.stdout)["applied"]] == [4]
        assert remote.version == version + 1
        np.testing.assert_array_equal(rows_of(remote, "b", [4]), np.full((1, DIM), 4, np.float32))
    finally:
        assert node.stop() == 0
