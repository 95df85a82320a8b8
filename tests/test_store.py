"""Building, opening and checking stores: atomicity, validation, corruption, sources."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_pools_as_frozen

import nearrec

FIXTURE = Path(__file__).parent / "fixtures" / "v1"


def small(tmp_path: Path, name: str = "s", **kw) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / name
    nearrec.from_numpy(path, {"a": rng.random((1000, 16), np.float32),
                              "b": rng.random((300, 5), np.float32)}, **kw)
    return path


def test_frozen_v1_fixture_still_opens_and_pools():
    store = nearrec.open(FIXTURE)
    assert store.info.format_version == 1
    assert [t.dtype for t in store.tables.values()] == ["fp32", "fp16", "bf16", "int8"]
    expected = np.load(FIXTURE.parent / "v1_expected.npz")
    for name, t in store.tables.items():
        got = store.lookup(name, expected["indices"], expected["offsets"])
        assert_pools_as_frozen(got, expected[name], t.dtype)
    assert all(c.ok for c in nearrec.verify(FIXTURE))


def test_frozen_v4_fixture_a_live_store_still_opens_and_pools(tmp_path):
    """A live store (format version 4): v1's tables compacted once at version 8, and eight
    more calls in its log."""
    v4 = FIXTURE.parent / "v4"
    expected = np.load(FIXTURE.parent / "v4_expected.npz")
    store = nearrec.open(v4)
    assert store.info.format_version == 4 and not store.writable
    assert store.version == int(expected["version"]) == 16
    assert store.live_stats()["base_version"] == 8
    for name, t in store.tables.items():
        got = store.lookup(name, expected["indices"], expected["offsets"])
        assert_pools_as_frozen(got, expected[name], t.dtype)
    assert all(c.ok for c in nearrec.verify(v4))
    # a writer takes over where the log ends (on a copy: the fixture stays frozen)
    copy = tmp_path / "v4"
    shutil.copytree(v4, copy)
    w = nearrec.open(copy, writable=True, tier="ssd")
    assert w.write("fp32", [0], np.ones((1, store.tables["fp32"].dim))) == 17


def test_frozen_v5_fixture_a_keyed_table_still_opens_and_pools():
    """Format version 5: a keyed fp16 table beside a dense one (`docs/format.md` §16), looked
    up by key — some keys unknown, answered with the zero row."""
    v5 = FIXTURE.parent / "v5"
    expected = np.load(FIXTURE.parent / "v5_expected.npz")
    for tier in ("dram", "ssd"):
        store = nearrec.open(v5, tier=tier, unknown_keys="zero")
        assert store.info.format_version == 5
        assert store.tables["ids"].keys == 300 and not store.tables["dense"].keyed
        for mode in ("sum", "mean", "max"):
            got = store.lookup("ids", expected["keys"], expected["offsets"], mode=mode)
            np.testing.assert_array_equal(got, expected[f"ids_{mode}"])
        got = store.lookup("dense", expected["dense_ids"], np.arange(32))
        np.testing.assert_array_equal(got, expected["dense"])
        with pytest.raises(nearrec.UnknownKey):
            nearrec.open(v5, tier=tier).lookup("ids", expected["keys"], expected["offsets"])
    assert all(c.ok for c in nearrec.verify(v5))


def test_frozen_v6_fixture_quantised_tables_still_open_and_pool():
    """Format version 6: int4 (a specialised and a run-time width), int2 and fp8 tables
    (`docs/format.md` §4), pooled in every mode, weighted too, on both tiers."""
    v6 = FIXTURE.parent / "v6"
    expected = np.load(FIXTURE.parent / "v6_expected.npz")
    offsets = expected["offsets"]
    for tier, tol in (("dram", 0.0), ("ssd", 1e-5)):  # the SSD tier adds rows as they land
        store = nearrec.open(v6, tier=tier)
        assert store.info.format_version == 6
        assert [t.dtype for t in store.tables.values()] == ["int4", "int4", "int2", "fp8"]
        for name in store.tables:
            idx, w = expected[f"{name}_indices"], expected[f"{name}_weights"]
            for mode in ("sum", "mean", "max"):
                got = store.lookup(name, idx, offsets, mode=mode)
                want = expected[f"{name}_{mode}"]
                np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
            got = store.lookup(name, idx, offsets, per_sample_weights=w)
            np.testing.assert_allclose(got, expected[f"{name}_weighted"], rtol=tol, atol=tol)
    assert all(c.ok for c in nearrec.verify(v6))
    assert all(t.quant_error is not None and t.quant_error.values == t.rows * t.dim
               for t in nearrec.info(v6).tables)



def test_frozen_v7_fixture_a_fed_store_still_opens_with_its_cursor(tmp_path):
    """A store fed by a delta feed (format version 7): v1's tables, three delta files applied
    and compacted (their cursor in the manifest), two more in the log (cursor records)."""
    v7 = FIXTURE.parent / "v7"
    expected = np.load(FIXTURE.parent / "v7_expected.npz")
    store = nearrec.open(v7)
    assert store.info.format_version == 7 and not store.writable
    assert store.version == int(expected["version"]) == 5
    assert store.live_stats()["base_version"] == 3
    cursor = store.feed_status()["trainer"]
    assert (cursor.sequence, cursor.step, cursor.wall_time_ms, cursor.rows) == \
        (5, 500, 1_764_000_000_005, 12)
    for name, t in store.tables.items():
        got = store.lookup(name, expected["indices"], expected["offsets"])
        assert_pools_as_frozen(got, expected[name], t.dtype)
    assert all(c.ok for c in nearrec.verify(v7))
    # a writer goes on from the log's cursor (on a copy: the fixture stays frozen)
    copy = tmp_path / "v7"
    shutil.copytree(v7, copy)
    w = nearrec.open(copy, writable=True)
    assert w.feed_status()["trainer"].sequence == 5
    w.compact()
    assert w.feed_status()["trainer"].sequence == 5


def test_frozen_v8_fixture_evictions_and_expiries_replay_and_keep_their_log(tmp_path):
    """Format version 8: a keyed table (30 keys, cap 30, LRU, TTL 10 s on writes, a manual
    clock) given 10 new keys (10 evictions, kind 8), 2 keys removed (kind 6), the clock moved
    past the TTL (every key expired in a background record, kind 9), then 3 keys written; not
    compacted, so a reader replays all of it. Its evicted keys' log holds the 39 keys let go
    of by the table itself, each with its row: all 40 but the one removed while it was held
    (the other of the two removed had been evicted before)."""
    import pyarrow as pa

    v8 = FIXTURE.parent / "v8"
    e = np.load(FIXTURE.parent / "v8_expected.npz")
    keys, rows = e["keys"], e["rows"]
    store = nearrec.open(v8, unknown_keys="zero")
    assert store.info.format_version == 8 and store.version == int(e["version"]) == 4
    assert store.live_stats()["base_version"] == 0
    got = store.read_rows("ids", keys)
    np.testing.assert_array_equal(got[40:43], rows[40:43])
    assert not got[:40].any() and store.stats()["keyed_keys"] == 3
    assert all(c.ok for c in nearrec.verify(v8))

    def kept(path):
        out = {}
        for f in sorted((path / "evicted").glob("*.arrow")):
            t = pa.ipc.open_stream(f.read_bytes()).read_all()
            out.update(zip(t.column("id").to_pylist(), t.column("values").to_pylist(),
                           strict=True))
        return out

    log = kept(v8)
    assert len(log) == 39 and set(keys[2:40].tolist()) < set(log) < set(keys[:40].tolist())
    position = {int(k): i for i, k in enumerate(keys)}
    for key, values in log.items():
        np.testing.assert_array_equal(np.array(values, np.float32), rows[position[key]])
    # a writer replays the log onto its evicted keys' log, adding none twice (on a copy)
    copy = tmp_path / "v8"
    shutil.copytree(v8, copy)
    w = nearrec.open(copy, writable=True, evicted_log="1MiB", unknown_keys="zero")
    w.compact()
    w.close()
    assert kept(copy) == log and len(list((copy / "evicted").glob("*.arrow"))) == 1

def test_a_writable_open_makes_a_store_version_4(tmp_path):
    path = small(tmp_path)
    assert nearrec.info(path).format_version == 3
    nearrec.open(path, writable=True)
    # a reader that ignores the log must not open it any more
    assert nearrec.info(path).format_version == 4


def test_info_and_layout(tmp_path):
    info = nearrec.info(small(tmp_path))
    a, b = info.tables
    assert (a.name, a.rows, a.dim, a.row_bytes) == ("a", 1000, 16, 64)
    assert a.data_bytes == 16 * 4096  # 64 rows per block, 1000 rows -> 16 blocks
    assert a.padding_ratio == 0.0
    assert b.row_bytes == 20 and b.padding_ratio == pytest.approx(16 / 4096)
    assert info.params["source"] == "numpy"


def test_existing_store_needs_overwrite(tmp_path):
    path = small(tmp_path)
    with pytest.raises(nearrec.StoreExists):
        small(tmp_path)
    rng = np.random.default_rng(1)
    nearrec.from_numpy(path, {"c": rng.random((10, 4), np.float32)}, overwrite=True)
    assert list(nearrec.open(path).tables) == ["c"]


def test_overwrite_refuses_a_directory_that_is_not_a_store(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("precious")
    with pytest.raises(nearrec.InvalidRequest, match="not a nearrec store"):
        nearrec.from_numpy(tmp_path / "mine", {"a": np.zeros((2, 2), np.float32)},
                           overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "precious"


def test_missing_store(tmp_path):
    with pytest.raises(nearrec.StoreNotFound):
        nearrec.open(tmp_path / "nothing")


def test_corrupt_data_byte(tmp_path):
    path = small(tmp_path)
    f = path / "table-0000.nrt"
    data = bytearray(f.read_bytes())
    data[4096 + 777] ^= 0x40
    f.write_bytes(bytes(data))
    with pytest.raises(nearrec.StoreCorrupted, match="checksum"):
        nearrec.open(path)
    checks = nearrec.verify(path)
    assert [c.ok for c in checks] == [False, True]
    # Without load-time checks it opens; verify is how to find out.
    nearrec.open(path, verify_checksums=False)


@pytest.mark.parametrize("where", [0, 9, 30, 60])
def test_corrupt_header(tmp_path, where):
    path = small(tmp_path)
    f = path / "table-0001.nrt"
    data = bytearray(f.read_bytes())
    data[where] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(nearrec.StoreCorrupted):
        nearrec.open(path)


def test_truncated_table(tmp_path):
    path = small(tmp_path)
    f = path / "table-0000.nrt"
    os.truncate(f, f.stat().st_size - 4096)
    with pytest.raises(nearrec.StoreCorrupted, match="truncated"):
        nearrec.open(path)


def test_missing_table_file(tmp_path):
    path = small(tmp_path)
    (path / "table-0001.nrt").unlink()
    with pytest.raises(nearrec.StoreCorrupted, match="missing"):
        nearrec.open(path)


def test_corrupt_manifest_and_unknown_version(tmp_path):
    path = small(tmp_path)
    m = path / "MANIFEST"
    good = m.read_bytes()
    bad = bytearray(good)
    bad[-5] ^= 0x01
    m.write_bytes(bytes(bad))
    with pytest.raises(nearrec.StoreCorrupted, match="checksum"):
        nearrec.open(path)
    future = bytearray(good)
    future[8:12] = (nearrec._native.FORMAT_VERSION + 1).to_bytes(4, "little")
    m.write_bytes(bytes(future))
    with pytest.raises(nearrec.UnsupportedVersion):
        nearrec.open(path)
    m.write_bytes(b"garbage")
    with pytest.raises(nearrec.StoreCorrupted):
        nearrec.open(path)


KILL_SCRIPT = """
import sys, nearrec
nearrec.build(sys.argv[1], "rmc1", rows=2_000_000, seed=int(sys.argv[2]), overwrite=True,
              progress=False)
"""


@pytest.mark.slow
def test_killed_build_leaves_old_store_or_none(tmp_path):
    path = tmp_path / "s"
    # 1) no store before: a killed build leaves none.
    # 2) a store before: a killed rebuild leaves the old one, intact.
    for attempt in range(2):
        proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(path), str(attempt + 1)])
        deadline = time.time() + 60
        # Kill once the build is well under way (temp files growing).
        while time.time() < deadline:
            temps = [p for p in tmp_path.iterdir() if ".nrtmp-" in p.name]
            if temps and sum(f.stat().st_size for f in temps[0].iterdir()) > 64 << 20:
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if attempt == 0:
            assert not path.exists()
            nearrec.build(path, "rmc1", rows=1000, seed=0)
        else:
            store = nearrec.open(path)
            assert store.info.params["seed"] == 0 and store.table("t0").rows == 1000
            assert all(c.ok for c in nearrec.verify(path))
    # The next build removes the dead builds' temporary directories.
    nearrec.build(path, "rmc1", rows=10, overwrite=True)
    assert not [p for p in tmp_path.iterdir() if ".nrtmp-" in p.name]


def test_build_model_spec_and_knobs(tmp_path):
    info = nearrec.build(tmp_path / "r", "rmc2", rows=1000, seed=3)
    assert len(info.tables) == 32 and {t.dim for t in info.tables} == {64}
    assert {t.rows for t in info.tables} == {1000}
    info = nearrec.build(tmp_path / "m", "mtwnd", table_bytes=8 << 20)
    rows = [t.rows for t in info.tables]
    assert len(rows) == 43 and abs(rows[-1] - 10 * rows[0]) <= 10  # proportions kept
    assert abs(info.total_bytes - (8 << 20)) / (8 << 20) < 0.1
    with pytest.raises(nearrec.InvalidRequest, match="unknown model"):
        nearrec.build(tmp_path / "x", "rmc9", rows=10)


def test_random_init_is_seeded_and_bounded(tmp_path):
    a = nearrec.open(nearrec.build(tmp_path / "a", "rmc3", rows=5000, seed=1).path)
    b = nearrec.open(nearrec.build(tmp_path / "b", "rmc3", rows=5000, seed=1).path)
    c = nearrec.open(nearrec.build(tmp_path / "c", "rmc3", rows=5000, seed=2).path)
    ta, tb, tc = (s.table_array("t4") for s in (a, b, c))
    np.testing.assert_array_equal(ta, tb)
    assert not np.array_equal(ta, tc)
    bound = np.sqrt(1 / 5000)
    assert ta.min() >= -bound and ta.max() < bound
    assert abs(ta.mean()) < bound * 0.02
    assert not np.array_equal(a.table_array("t0"), a.table_array("t1"))


def test_from_npy_files_memory_mapped(tmp_path):
    rng = np.random.default_rng(0)
    arr = rng.random((5000, 24)).astype(np.float64)  # converted chunk by chunk
    np.save(tmp_path / "x.npy", arr)
    nearrec.from_numpy(tmp_path / "s", {"x": tmp_path / "x.npy"}, dtype="fp16")
    got = nearrec.open(tmp_path / "s").read_rows("x", np.arange(5000))
    np.testing.assert_array_equal(got, arr.astype(np.float32).astype(np.float16).astype(np.float32))


def test_from_state_dict(tmp_path):
    torch = pytest.importorskip("torch")
    model = torch.nn.ModuleDict({"user": torch.nn.EmbeddingBag(50, 8),
                                 "item": torch.nn.EmbeddingBag(70, 4)})
    model.add_module("dense", torch.nn.Linear(3, 3))
    sd = model.state_dict()
    info = nearrec.from_state_dict(tmp_path / "s", sd)
    assert [t.name for t in info.tables] == ["user", "item"]
    store = nearrec.open(tmp_path / "s")
    np.testing.assert_array_equal(store.table_array("item"), sd["item.weight"].numpy())
    # TorchRec EmbeddingBagCollection keys, from a saved file.
    trec = {"embedding_bags.t0.weight": torch.randn(20, 4), "over.weight": torch.randn(2, 2, 2)}
    torch.save(trec, tmp_path / "m.pt")
    info = nearrec.from_state_dict(tmp_path / "t", tmp_path / "m.pt", dtype="bf16")
    assert [(t.name, t.dtype) for t in info.tables] == [("t0", "bf16")]
    with pytest.raises(nearrec.InvalidRequest, match="no embedding weights"):
        nearrec.from_state_dict(tmp_path / "u", sd, tables=["nope"])


def test_failed_build_leaves_nothing(tmp_path):
    with pytest.raises(nearrec.InvalidRequest):
        nearrec.from_numpy(tmp_path / "s", {"a": np.zeros((3, 2), np.float32),
                                            "b": np.zeros((3,), np.float32)})
    rng = np.random.default_rng(0)
    good = {"a": rng.random((3, 2), np.float32), "b": np.array([[1]], np.int64)}
    with pytest.raises(nearrec.InvalidRequest):
        nearrec.from_numpy(tmp_path / "s", good)
    assert list(tmp_path.iterdir()) == []


def test_lookup_works_in_forked_child(tmp_path):
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    store = nearrec.open(small(tmp_path))
    idx = np.random.default_rng(0).integers(0, 1000, 50_000)
    off = np.arange(0, 50_000, 10)
    want = store.lookup("a", idx, off)  # parent's worker threads are running
    pid = os.fork()
    if pid == 0:  # child: must not hang on the parent's (absent) threads
        ok = np.array_equal(store.lookup("a", idx, off), want)
        os._exit(0 if ok else 1)
    deadline = time.time() + 30
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    pytest.fail("lookup hung in a forked child")


def test_a_pooled_batch_is_an_array_as_the_quick_start_says(tmp_path):
    """Issue 62, item 18: `lookup_many` answers `[B, Σ dim]` as the README's quick start says;
    `np.asarray(batch)` gave a 0-d object array."""
    rng = np.random.default_rng(0)
    users = rng.standard_normal((100, 8), dtype=np.float32)
    nearrec.from_numpy(tmp_path / "s", {"users": users, "items": users[:, :4].copy()})
    store = nearrec.open(tmp_path / "s")
    batch = store.lookup_many({"users": (np.array([5, 6, 7]), np.array([0, 1])),
                               "items": (np.array([1]), np.array([0, 1]))})
    assert batch.shape == (2, 12) and batch.dtype == np.float32
    got = np.asarray(batch)
    assert got.shape == (2, 12) and got.dtype == np.float32
    np.testing.assert_array_equal(got, batch.values)
    np.testing.assert_allclose(got[0, :8], users[5], rtol=1e-6)
    assert np.asarray(batch, dtype=np.float64).dtype == np.float64
    assert np.array(batch, copy=True) is not batch.values
