"""Delta feeds from Python: files written by pyarrow — as a producer outside nearrec writes
them — applied by ``nearrec.feed`` and ``nearrec feed`` to an embedded store and to a node,
each once, with the cursor in ``Store.feed_status``; misfits refused naming file, row and
column."""

from __future__ import annotations

import json
import signal
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
import nearrec.feed
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
        metrics = node.metrics()
        labels = {"store": "s", "feed": "trainer"}
        assert (labels, 3.0) in metrics["nearrec_feed_applied_sequence"]
        [(_, lag)] = metrics["nearrec_feed_lag_seconds"]
        assert 0 <= lag < 60, lag
        [(_, at)] = metrics["nearrec_feed_applied_timestamp_seconds"]
        assert abs(at - time.time()) < 60, at
        version = remote.version
        # a second feeder (the first was killed after its last call) finds only the new file
        delta(deltas, 4, {"b": ([4], np.full((1, DIM), 4, np.float32))})
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        assert [a["sequence"] for a in json.loads(out.stdout)["applied"]] == [4]
        assert remote.version == version + 1
        np.testing.assert_array_equal(rows_of(remote, "b", [4]), np.full((1, DIM), 4, np.float32))
    finally:
        assert node.stop() == 0


def test_a_torchrec_training_loop_feeds_a_node_as_it_trains(tmp_path: Path) -> None:
    """The done-when of delta feeds: TorchRec's DLRM trained 300 steps with a Publisher on,
    a node fed by ``nearrec feed --watch`` at the same time (files applied while the loop
    runs); after the last file the node's tables are the trained tables and its inferences
    the trained model's, each file applied once, in order."""
    pytest.importorskip("torchrec")
    import torch
    from conftest import Node, sigint_default
    from dlrm_requests import (
        TORCHREC_INPUTS,
        TORCHREC_ROWS,
        body_for,
        torchrec_answer,
        torchrec_kjt,
        train_step,
    )
    from test_torchrec import dlrm

    import nearrec.models as nm
    from nearrec.torch import from_torchrec

    torch.manual_seed(7)
    model = dlrm()
    nm.save(nm.offload(from_torchrec(model.eval(), tmp_path / "dlrm")), tmp_path / "dlrm")
    model.train()
    deltas = tmp_path / "deltas"
    publisher = nearrec.feed.Publisher(deltas, model, every_steps=20, dense_every=3)
    node = Node(str(tmp_path / "dlrm"), "--writable")
    feeder = subprocess.Popen(
        [sys.executable, "-m", "nearrec.cli", "feed", str(deltas), "--remote", node.address,
         "--watch", "--poll", "0.05", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    try:
        remote = nearrec.connect(node.address)

        def caught_up(timeout: float = 60.0) -> None:
            want = publisher.next_sequence - 1
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                cursor = remote.feed_status().get("default")
                if cursor is not None and cursor.sequence == want:
                    return
                time.sleep(0.05)
            raise AssertionError(f"the node did not reach file {want}: {remote.feed_status()}")

        rng = np.random.default_rng(7)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(300):
            publisher.step(train_step(model, optimizer, rng))
            if step == 149:
                caught_up()  # applied while the loop runs, not only at its end
        assert publisher.flush() is not None
        caught_up()
        model.eval()
        ebc = model.sparse_arch.embedding_bag_collection
        for t in ("t0", "t1", "t2"):
            want = ebc.embedding_bags[t].weight.detach().numpy()
            np.testing.assert_array_equal(remote.read_rows(t, np.arange(len(want))), want)
        for batch in (1, 6, 64):
            body = body_for(rng, TORCHREC_INPUTS, TORCHREC_ROWS, 5, batch)
            np.testing.assert_allclose(
                remote.infer(torch.tensor(body["dense"]), torchrec_kjt(body)),
                torchrec_answer(model, body), rtol=1e-5, atol=1e-6)
    finally:
        feeder.send_signal(signal.SIGINT)
        out, err = feeder.communicate(timeout=30)
        assert node.stop() == 0
    assert feeder.returncode == 0, err
    applied = [json.loads(line) for line in out.splitlines()]
    files = publisher.next_sequence - 1
    assert [a["sequence"] for a in applied] == list(range(1, files + 1)), err
    assert all(a["applied"] for a in applied) and files == 16


def test_a_sharded_store_takes_each_file_on_every_shard(store_dir: Path) -> None:
    """``nearrec feed --sharded``: a 2 × 2 sharded store (its tables cut by rows) takes each
    file's rows where they live and the cursor on every shard in one transaction; a feeder
    started again applies nothing twice."""
    from test_distributed import Served, name_replicas

    from nearrec import distributed

    deltas = store_dir / "deltas"
    root = store_dir / "shards"
    plan = distributed.shard(store_dir / "store", root, 2, replicas=2, scheme="row")
    served = Served(root, plan)
    try:
        name_replicas(root, served.replicas(), "")
        rows = {s: np.full((3, DIM), s, np.float32) for s in (1, 2)}
        delta(deltas, 1, {"a": ([0, 25, 49], rows[1])})
        delta(deltas, 2, {"b": ([1, 48, 30], rows[2])}, {"a": [25]})
        cmd = [sys.executable, "-m", "nearrec.cli", "feed", str(deltas), "--sharded", str(root),
               "--json"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert [a["sequence"] for a in json.loads(out.stdout)["applied"]] == [1, 2]
        store = distributed.open_dir(root)
        assert store.feed_status()["default"].sequence == 2
        np.testing.assert_array_equal(rows_of(store, "a", [0, 25, 49]),
                                      [rows[1][0], np.zeros(DIM), rows[1][2]])
        np.testing.assert_array_equal(rows_of(store, "b", [1, 48, 30]), rows[2])
        # every replica of every shard holds the cursor
        for shard in served.nodes:
            for node in shard:
                assert nearrec.connect(node.address, "s").feed_status()["default"].sequence == 2
        out = subprocess.run(cmd, capture_output=True, text=True)
        assert out.returncode == 0 and json.loads(out.stdout)["applied"] == [], out.stderr
    finally:
        served.stop()
