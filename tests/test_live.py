"""Live stores from Python: writes and removes are seen by the next lookup on every tier (held to
torch.nn.EmbeddingBag over the same rows), survive a killed writer once acknowledged, reach
read-only openers on refresh, and bad calls are typed errors that apply nothing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import nearrec

torch = pytest.importorskip("torch")

ROWS, DIM = 200, 8
TIERS = [dict(tier="dram"), dict(tier="ssd"),
         dict(tier="ssd", dram_budget="16KiB", cache_policy="lru")]


@pytest.fixture
def path(tmp_path):
    rng = np.random.default_rng(0)
    tables = {"a": rng.standard_normal((ROWS, DIM), dtype=np.float32),
              "b": rng.standard_normal((ROWS, 4), dtype=np.float32)}
    p = tmp_path / "s"
    nearrec.from_numpy(p, tables)
    return p, tables


def pooled_by_torch(table: np.ndarray, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(table), mode="sum")
    return bag(torch.from_numpy(ids), torch.from_numpy(offsets)).detach().numpy()


@pytest.mark.parametrize("tier", TIERS, ids=lambda t: "+".join(f"{k}={v}" for k, v in t.items()))
def test_writes_match_embedding_bag_over_the_written_rows(path, tier):
    p, tables = path
    model = {k: v.copy() for k, v in tables.items()}
    s = nearrec.open(p, writable=True, **tier)
    rng = np.random.default_rng(1)
    for step in range(40):
        t = "a" if step % 3 else "b"
        dim = model[t].shape[1]
        ids = rng.integers(0, ROWS, rng.integers(1, 6))
        if step % 4 == 3:
            s.remove(t, ids)
            model[t][ids] = 0.0
        else:
            rows = rng.standard_normal((len(ids), dim)).astype(np.float32)
            s.write(t, ids, rows)
            # a repeated id takes the last of its rows, as an upsert in order does
            for i, r in zip(ids, rows, strict=True):
                model[t][i] = r
        if step in (13, 27):
            # the written rows move into new table files; lookups must not notice
            done = s.compact()
            assert done.version == s.version == step + 1 and done.rows > 0 and done.tables >= 1
            assert s.live_stats()["delta_rows"] == 0
        look = rng.integers(0, ROWS, 30)
        look[:5] = ids[:5] if len(ids) >= 5 else np.resize(ids, 5)
        offsets = np.arange(0, 30, 3)
        for name in ("a", "b"):
            got = s.lookup(name, look, offsets=offsets)
            np.testing.assert_allclose(got, pooled_by_torch(model[name], look, offsets),
                                       rtol=1e-5, atol=1e-5)
    assert s.version == 40
    stats = s.live_stats()
    assert stats["log_records"] == 40 and stats["removed_served"] > 0
    assert stats["compactions"] == 2 and stats["base_version"] == 28


def test_collection_and_many_tables_at_once(path):
    p, tables = path
    s = nearrec.open(p, writable=True, tier="dram")
    from nearrec.torch import EmbeddingBagCollection, KeyedJaggedTensor
    ebc = EmbeddingBagCollection(s)
    kjt = KeyedJaggedTensor(["a", "b"], torch.tensor([3, 4]), lengths=torch.tensor([1, 1]))
    before = ebc(kjt).values().clone()
    v = s.write_many({"a": ([3], np.full((1, DIM), 2.0)), "b": ([4], np.full((1, 4), -1.0))})
    assert v == s.version == 1
    after = ebc(kjt).values()
    assert torch.equal(after, torch.tensor([[2.0] * DIM + [-1.0] * 4]))
    assert not torch.equal(before, after)
    # None rows remove, in the same atomic call as other tables' writes
    v = s.write_many({"a": ([3], None), "b": (np.array([4], np.int32), np.ones((1, 4)))})
    assert v == s.version == 2
    assert torch.equal(ebc(kjt).values(), torch.tensor([[0.0] * DIM + [1.0] * 4]))


def test_bad_calls_are_typed_and_apply_nothing(path):
    p, _ = path
    s = nearrec.open(p, writable=True, tier="dram")
    ok = np.zeros((1, DIM), np.float32)
    cases = [
        (lambda: s.write("a", [1, 2], ok), nearrec.InvalidRequest, "2 ids need 16 values"),
        (lambda: s.write("a", [ROWS], ok), nearrec.InvalidRequest, f"ids[0] = {ROWS}"),
        (lambda: s.write("a", [1], np.zeros((1, DIM), np.int64)), nearrec.InvalidRequest,
         "must be floats"),
        (lambda: s.write("a", [1], np.zeros(DIM, np.float32)), nearrec.InvalidRequest, "2-D"),
        (lambda: s.write("a", [1.5], ok), nearrec.InvalidRequest, "int32 or int64"),
        (lambda: s.write("a", [1], np.full((1, DIM), 1e39)), nearrec.InvalidRequest,
         "does not fit float32"),
        (lambda: s.write("a", [1], np.full((1, DIM), np.inf, np.float32)),
         nearrec.InvalidRequest, "is inf"),
        (lambda: s.write("zz", [1], ok), nearrec.UnknownTable, "zz"),
        (lambda: s.write_many({"a": ([1], ok), "b": ([1], np.full((1, 4), np.nan))}),
         nearrec.InvalidRequest, "NaN"),
        (lambda: s.remove("a", [-1]), nearrec.InvalidRequest, "ids[0] = -1"),
        (lambda: s.write_many([("a", [1], ok)]), nearrec.InvalidRequest,
         "writes is a mapping from table to (ids, rows), not list"),
        (lambda: s.write_many({"a": ([1],)}), nearrec.InvalidRequest, "an (ids, rows) pair"),
        (lambda: s.write_many({3: ([1], ok)}), nearrec.InvalidRequest, "a table name is a str"),
    ]
    for call, cls, says in cases:
        with pytest.raises(cls, match=re.escape(says)):
            call()
    assert s.version == 0 and s.live_stats()["log_records"] == 0
    with pytest.raises(nearrec.InvalidRequest) as e:
        s.write("b", [7, 8], np.array([[0, 0, 0, 0], [0, np.nan, 0, 0]], np.float32))
    assert (e.value.table, e.value.position) == ("b", 1)
    big = np.zeros((3, DIM))
    big[2, 5] = -1e39
    with pytest.raises(nearrec.InvalidRequest,
                       match=r"rows\[2\]\[5\] = -1e39 does not fit float32") as e:
        s.write("a", [1, 2, 3], big)
    assert (e.value.table, e.value.position) == ("a", 2)
    s.write("a", [1], np.full((1, DIM), np.nan, np.float32), allow_nonfinite=True)
    assert np.isnan(s.lookup("a", [1], offsets=[0])).all()


def test_one_writer_and_read_only_openers(path):
    p, _ = path
    w = nearrec.open(p, writable=True)
    with pytest.raises(nearrec.StoreLocked):
        nearrec.open(p, writable=True)
    r = nearrec.open(p, tier="ssd")
    with pytest.raises(nearrec.StoreReadOnly):
        r.remove("a", [1])
    w.write("a", [1], np.full((1, DIM), 5.0))
    assert r.version == 0 and not np.allclose(r.lookup("a", [1], offsets=[0]), 5.0)
    assert r.refresh() == 1
    np.testing.assert_array_equal(r.lookup("a", [1], offsets=[0]), np.full((1, DIM), 5.0))


@pytest.mark.parametrize("tier", TIERS, ids=lambda t: "+".join(f"{k}={v}" for k, v in t.items()))
def test_created_and_dropped_tables(path, tier):
    """A table created with zeros, written and pooled like any other (held to
    torch.nn.EmbeddingBag over a numpy twin), dropped; a reader follows on refresh."""
    p, tables = path
    s = nearrec.open(p, writable=True, **tier)
    reader = nearrec.open(p, **tier)
    v = s.create_table("c", 300, 5, init="zeros")
    assert v == s.version and list(s.tables) == ["a", "b", "c"]
    assert s.tables["c"].rows == 300 and s.tables["c"].dim == 5
    twin = np.zeros((300, 5), np.float32)
    rng = np.random.default_rng(2)
    ids = rng.choice(300, 40, replace=False)
    rows = rng.standard_normal((40, 5)).astype(np.float32)
    s.write("c", ids, rows)
    twin[ids] = rows
    look, offsets = rng.integers(0, 300, 60), np.arange(0, 60, 4)
    np.testing.assert_allclose(s.lookup("c", look, offsets=offsets),
                               pooled_by_torch(twin, look, offsets), rtol=1e-5, atol=1e-5)
    with pytest.raises(nearrec.InvalidRequest, match="already"):
        s.create_table("a", 10, 2)
    s.drop_table("a")
    assert list(s.tables) == ["b", "c"]
    with pytest.raises(nearrec.UnknownTable):
        s.lookup("a", [1], offsets=[0])
    # the reader keeps its tables until it refreshes
    assert list(reader.tables) == ["a", "b"]
    assert reader.refresh() == s.version
    assert list(reader.tables) == ["b", "c"]
    np.testing.assert_allclose(reader.lookup("c", look, offsets=offsets),
                               pooled_by_torch(twin, look, offsets), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(reader.lookup("b", [3], offsets=[0]), tables["b"][[3]])


@pytest.mark.parametrize("tier", TIERS, ids=lambda t: "+".join(f"{k}={v}" for k, v in t.items()))
def test_swap_serves_the_new_version_with_no_failed_lookup(path, tier, tmp_path):
    """Threads pool batches while the store swaps between two versions: every batch is one
    version's (held to torch.nn.EmbeddingBag over it), none fails."""
    import threading
    p, v1 = path
    v2 = {k: -a for k, a in v1.items()}
    nearrec.from_numpy(tmp_path / "v2", v2)
    s = nearrec.open(p, **tier)
    look, offsets = np.arange(0, ROWS, 3), np.arange(0, len(np.arange(0, ROWS, 3)), 5)
    want = [pooled_by_torch(v["a"], look, offsets) for v in (v1, v2)]
    stop, errors, seen = threading.Event(), [], [0, 0]

    def pool():
        try:
            while not stop.is_set():
                got = s.lookup("a", look, offsets=offsets)
                k = next(k for k in (0, 1) if np.allclose(got, want[k], rtol=1e-5, atol=1e-5))
                seen[k] += 1
        except Exception as e:  # noqa: BLE001  (any failure fails the test below)
            errors.append(e)

    threads = [threading.Thread(target=pool) for _ in range(2)]
    for t in threads:
        t.start()
    for k in range(10):
        s.swap(tmp_path / "v2" if k % 2 == 0 else p, warm=k % 3 == 0)
        time.sleep(0.005)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sum(seen) > 0
    assert s.path == p and s.swap(tmp_path / "v2") == 0 and s.path == tmp_path / "v2"
    np.testing.assert_allclose(s.lookup("a", look, offsets=offsets), want[1], rtol=1e-5)


def test_a_swap_to_a_store_that_would_fail_every_lookup_is_refused_unless_forced(path, tmp_path):
    """Other table names, other dims: every lookup would fail after such a swap, so it is
    refused naming the difference (and nothing changes), unless forced."""
    p, tables = path
    s = nearrec.open(p)
    other = {"a": tables["a"][:, :2].copy(), "b": tables["b"]}
    nearrec.from_numpy(tmp_path / "dims", other)
    nearrec.from_numpy(tmp_path / "names", {"z": tables["a"]})
    with pytest.raises(nearrec.InvalidRequest, match="dim") as e:
        s.swap(tmp_path / "dims")
    assert e.value.table == "a"
    with pytest.raises(nearrec.InvalidRequest, match="no table") as e:
        s.swap(tmp_path / "names")
    assert s.path == p
    np.testing.assert_array_equal(s.lookup("a", [3], offsets=[0]), tables["a"][[3]])
    s.swap(tmp_path / "names", force=True)
    assert list(s.tables) == ["z"]


def test_a_swap_keeps_the_served_model_answerable(tmp_path):
    """A store that keeps a model swaps only to one keeping a model of the same inputs: to the
    same tables without the model every `infer` would fail, so it is refused unless forced."""
    pytest.importorskip("torch")
    from nearrec import models
    for name in ("v1", "v2", "bare"):
        nearrec.build(tmp_path / name, "rmc1", rows=2_000, seed=1, progress=False)
    for name in ("v1", "v2"):
        models.save(models.build("rmc1", nearrec.open(tmp_path / name), seed=2), tmp_path / name)
    s = nearrec.open(tmp_path / "v1")
    with pytest.raises(nearrec.InvalidRequest, match="keeps a model"):
        s.swap(tmp_path / "bare")
    assert s.swap(tmp_path / "v2") >= 0
    s.swap(tmp_path / "bare", force=True)
    assert s.path == tmp_path / "bare"


@pytest.mark.parametrize("tier", TIERS, ids=lambda t: "+".join(f"{k}={v}" for k, v in t.items()))
def test_the_gpu_tier_serves_no_stale_row(path, tier, tmp_path):
    """The GPU tier (its reference path, on the CPU) over a live store: rows it cached are
    dropped when a write changes them, across a compaction, and all of them across a swap;
    what it pools always matches torch.nn.EmbeddingBag over the store's current rows."""
    from nearrec.gpu import GpuCacheConfig, GpuTier
    p, tables = path
    model = tables["a"].copy()
    s = nearrec.open(p, writable=True, **tier)
    gpu = GpuTier(s, ["a", "b"], GpuCacheConfig(slots=ROWS * 2, policy="lru"), device="cpu")
    look, offsets = np.arange(0, ROWS, 2), np.arange(0, ROWS // 2, 4)

    def check():
        got = gpu.pool_many([("a", look, offsets, None, "sum")])[0].numpy()
        np.testing.assert_allclose(got, pooled_by_torch(model, look, offsets), rtol=1e-5,
                                   atol=1e-5)

    check()
    check()  # now from the cache
    rng = np.random.default_rng(5)
    for step in range(6):
        ids = rng.choice(ROWS // 2, 5, replace=False) * 2  # rows the cache holds
        rows = rng.standard_normal((5, DIM)).astype(np.float32)
        s.write("a", ids, rows)
        model[ids] = rows
        check()
        if step == 2:
            s.compact()
    assert gpu.stats()["a"].invalidated >= 6 * 5
    # a swap drops every cached row
    v2 = {k: -a for k, a in tables.items()}
    nearrec.from_numpy(tmp_path / "v2", v2)
    s.swap(tmp_path / "v2")
    model = v2["a"]
    check()


WRITER = textwrap.dedent("""
    import sys, numpy as np, nearrec
    s = nearrec.open(sys.argv[1], writable=True, tier=sys.argv[3], durability=sys.argv[2])
    for k in range(100000):
        v = s.write("a", [k % 200], np.full((1, 8), float(k), np.float32))
        print(k, v, flush=True)
        if sys.argv[4] == "compact" and k % 7 == 6:
            s.compact()
""")


@pytest.mark.parametrize("durability,tier,compact", [
    ("sync", "dram", ""), ("async", "dram", ""), ("sync", "ssd", "compact"),
    ("async", "dram", "compact")])
def test_a_killed_writer_keeps_every_acknowledged_write(path, durability, tier, compact):
    """The writer prints each write once it returned (and compacts every seventh, in some
    runs); it is killed (SIGKILL) mid-stream, wherever it is. A reopen holds every
    acknowledged write, no partial one, and a new writer can take over."""
    p, _ = path
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(p), durability, tier, compact],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acked = []
    deadline = time.monotonic() + 60
    while len(acked) < 40 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        acked.append(tuple(int(x) for x in line.split()))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert len(acked) >= 40, "the writer did not get going"
    s = nearrec.open(p, writable=True, tier="dram")
    last_v = acked[-1][1]
    assert s.version >= last_v
    # each row holds the last value written to it by a write up to the store's version
    got = s.lookup("a", np.arange(ROWS), offsets=np.arange(ROWS))[:, 0]
    for k, _ in acked:
        # row k % ROWS holds k, or a later write's value
        assert got[k % ROWS] >= k
    # what reached the store is whole calls, the newest one's value in its row
    newest = s.version - 1
    assert got[newest % ROWS] == newest
    s.write("a", [0], np.zeros((1, DIM), np.float32))
    s.compact()
    assert all(c.ok for c in nearrec.verify(p))


def test_training_feeds(path, tmp_path):
    """nearrec.update from an .npz, a state dict (.pt) and a module; sync_from on the torch
    modules; the CLI's update: only the rows that differ are written, and every lookup after
    matches nn.EmbeddingBag over the trainer's rows."""
    p, tables = path
    s = nearrec.open(p, writable=True, tier="ssd")
    trained = {k: v.copy() for k, v in tables.items()}
    trained["a"][[3, 7]] += 1.0
    np.savez(tmp_path / "u.npz", a=trained["a"], **{"b.ids": np.array([2]),
                                                   "b.rows": np.full((1, 4), 9.0, np.float32)})
    trained["b"][2] = 9.0
    done = nearrec.update(s, tmp_path / "u.npz")
    assert (done["a"].compared, done["a"].written, done["b"].written) == (ROWS, 2, 1)
    look, offsets = np.arange(ROWS), np.arange(0, ROWS, 5)
    for t in ("a", "b"):
        np.testing.assert_allclose(s.lookup(t, look, offsets=offsets),
                                   pooled_by_torch(trained[t], look, offsets), rtol=1e-5)
    # a TorchRec-shaped state dict saved to .pt, with a dense layer beside the tables
    trained["a"][11] = 0.25
    sd = {"embedding_bags.a.weight": torch.from_numpy(trained["a"]),
          "over.weight": torch.zeros(2, 2), "over.bias": torch.zeros(2)}
    torch.save(sd, tmp_path / "u.pt")
    # its dense weights are never dropped without a word: refused before anything is written
    v = s.version
    with pytest.raises(nearrec.InvalidRequest,
                       match=r"2 dense weights .*over.weight, over.bias.*keeps no model"):
        nearrec.update(s, tmp_path / "u.pt")
    with pytest.raises(nearrec.InvalidRequest, match=r"2 dense weights .*dense='skip'"):
        nearrec.update(s, tmp_path / "u.pt", dense="error")
    assert s.version == v
    assert nearrec.update(s, tmp_path / "u.pt", tolerance=1e-6,
                          dense="skip")["a"].written == 1
    # a full model's checkpoint, as a trainer writes it: the tables at TorchRec's paths under
    # the model's own, and other layouts through a prefix map
    trained["a"][12] = -0.5
    full = {"sparse_arch.embedding_bag_collection.embedding_bags.a.weight":
            torch.from_numpy(trained["a"]),
            "dense_arch.model._mlp.0._linear.weight": torch.zeros(4, 3),
            "dense_arch.model._mlp.0._linear.bias": torch.zeros(4)}
    done = nearrec.update(s, full, dense="skip")
    assert list(done) == ["a"] and done["a"].written == 1
    trained["b"][5] = 2.0
    mine = {"model.tables.b.weight": torch.from_numpy(trained["b"]),
            "model.head": torch.ones(3, 3)}  # no table: a bias-less 2-D weight is dense here
    with pytest.raises(nearrec.InvalidRequest, match="1 dense weights .*model.head"):
        nearrec.update(s, mine, prefix={"model.tables.": ""})
    assert nearrec.update(s, mine, prefix={"model.tables.": ""},
                          dense="skip")["b"].written == 1
    with pytest.raises(nearrec.InvalidRequest, match="dense is 'update', 'skip' or 'error'"):
        nearrec.update(s, mine, dense="keep")
    # the torch modules' sync_from
    from nearrec.torch import EmbeddingBag, EmbeddingBagCollection
    bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(trained["b"].copy()))
    with torch.no_grad():
        bag.weight[0] = -3.0
    trained["b"][0] = -3.0
    assert EmbeddingBag(s, "b").sync_from(bag).written == 1
    trained["a"][0] = 4.0
    assert EmbeddingBagCollection(s).sync_from(
        {"embedding_bags.a.weight": torch.from_numpy(trained["a"])})["a"].written == 1
    for t in ("a", "b"):
        np.testing.assert_allclose(s.lookup(t, look, offsets=offsets),
                                   pooled_by_torch(trained[t], look, offsets), rtol=1e-5)
    del s
    # the command line, on the store no one holds now
    trained["a"][1] = 7.0
    np.savez(tmp_path / "v.npz", a=trained["a"])
    import contextlib
    import io
    import json

    from nearrec import cli
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(["update", str(p), "--from", str(tmp_path / "v.npz"),
                                 "--compact", "--json"]) == 0
    report = json.loads(printed.getvalue())
    assert report["tables"]["a"]["written"] == 1 and report["compaction"]["rows"] >= 1
    nearrec.open(p, writable=True).write("a", [2], np.full((1, DIM), 6.0, np.float32))
    trained["a"][2] = 6.0
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert cli.main(["compact", str(p), "--json"]) == 0
    assert json.loads(printed.getvalue())["compaction"]["rows"] == 1
    r = nearrec.open(p)
    np.testing.assert_allclose(r.lookup("a", look, offsets=offsets),
                               pooled_by_torch(trained["a"], look, offsets), rtol=1e-5)
    (tmp_path / "junk.npz").write_bytes(b"junk")
    with pytest.raises(nearrec.InvalidRequest, match="not a readable"):
        nearrec.update(nearrec.open(p, writable=True), tmp_path / "junk.npz")
