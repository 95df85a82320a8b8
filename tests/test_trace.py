"""Traces: the generators' published locality, the file round trip, FBGEMM conversion, profiles
against a brute-force LRU, and the ``nearrec trace`` commands."""

from __future__ import annotations

import json
from collections import OrderedDict

import numpy as np
import pytest

import nearrec
import nearrec.trace as nt
from nearrec.cli import main


def brute_lru_hits(trace, capacity):
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for x in trace:
        x = int(x)
        if x in cache:
            hits += 1
            cache.move_to_end(x)
        else:
            cache[x] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits / len(trace)


@pytest.mark.parametrize("k, share, hit", [(0, 0.14, 0.84), (1, 0.55, 0.44), (2, 0.71, 0.29)])
def test_stack_distance_reproduces_published_locality(k, share, hit):
    t = nt.stack_distance(1_000_000, 3_000, 80, k=k, seed=5)
    assert t.indices.shape == (240_000,) and t.bags == 3_000
    assert abs(t.first_reference_share - share) < 0.015
    assert abs(t.profile().lru_hit_ratio(2_000) - hit) < 0.025


def test_profile_matches_brute_force_lru():
    t = nt.zipf(5_000, 400, 10, alpha=0.9, seed=3)
    p = t.profile()
    for cap in (1, 10, 100, 1_000):
        assert p.lru_hit_ratio(cap) == pytest.approx(brute_lru_hits(t.indices, cap))
    np.testing.assert_allclose(p.lru_hit_ratio([10, 100]),
                               [brute_lru_hits(t.indices, c) for c in (10, 100)])
    assert p.working_set == len(np.unique(t.indices))
    assert p.accesses == len(t.indices)
    # first-use order
    _, first = np.unique(t.indices, return_index=True)
    np.testing.assert_array_equal(p.unique, t.indices[np.sort(first)])


def test_generators_are_seeded_and_shaped():
    a = nt.uniform(100, 50, 4, seed=1)
    assert np.array_equal(a.indices, nt.uniform(100, 50, 4, seed=1).indices)
    assert not np.array_equal(a.indices, nt.uniform(100, 50, 4, seed=2).indices)
    assert a.indices.min() >= 0 and a.indices.max() < 100
    np.testing.assert_array_equal(a.offsets, np.arange(0, 201, 4))
    r = nt.stack_distance(1_000_000, 500, 20, k=1, ids="recssd", seed=0)
    assert np.all(r.indices % nt.RECSSD_STRIDE == 0)
    pb = nt.stack_distance(10_000, 200, 30, k=0, variant="per_bag", seed=0)
    lens = np.diff(pb.offsets)
    assert lens.max() <= 30 and lens.min() >= 1 and lens.mean() < 30
    for b in range(pb.bags):
        bag = pb.indices[pb.offsets[b]:pb.offsets[b + 1]]
        assert len(np.unique(bag)) == len(bag)
    with pytest.raises(nearrec.InvalidRequest, match="alpha"):
        nt.zipf(100, 10, 2, alpha=0)
    with pytest.raises(nearrec.InvalidRequest, match="ids"):
        nt.Generator.stack_distance(1, ids=0)


def test_file_round_trip_is_checked_and_atomic(tmp_path):
    tr = nt.generate({"a": 1000, "b": 50}, bags=120, pooling={"a": 7, "b": 2},
                     generator=nt.Generator.zipf(1.1), seed=4, batch_size=32,
                     path=tmp_path / "t.nrtrace")
    # read into memory (a mapped file truncated under us would kill the process), read-only
    assert not isinstance(tr["a"].indices, np.memmap) and not tr["a"].indices.flags.writeable
    assert tr.verified
    again = nt.load(tmp_path / "t.nrtrace")
    assert again.batch_size == 32 and again.seed == 4 and again.bags == 120
    fresh = nt.generate({"a": 1000, "b": 50}, 120, {"a": 7, "b": 2}, nt.Generator.zipf(1.1),
                        seed=4)
    for name in ("a", "b"):
        np.testing.assert_array_equal(again[name].indices, fresh[name].indices)
        np.testing.assert_array_equal(again[name].offsets, fresh[name].offsets)
        assert again[name].generator == nt.Generator.zipf(1.1)
    with pytest.raises(nearrec.StoreExists):
        fresh.save(tmp_path / "t.nrtrace")
    assert not list(tmp_path.glob("*.tmp"))
    data = (tmp_path / "t.nrtrace").read_bytes()
    (tmp_path / "cut.nrtrace").write_bytes(data[:-16])
    with pytest.raises(nearrec.errors.InvalidTrace):
        nt.load(tmp_path / "cut.nrtrace")
    (tmp_path / "junk.nrtrace").write_bytes(b"hello" * 10)
    with pytest.raises(nearrec.errors.InvalidTrace, match="magic"):
        nt.load(tmp_path / "junk.nrtrace")
    bad = nt.TableTrace("a", 10, 2, np.array([0, 2]), np.array([3, 10]))
    with pytest.raises(nearrec.InvalidRequest, match="position 1"):
        nt.Trace({"a": bad}).save(tmp_path / "bad.nrtrace")


def test_fbgemm_round_trip():
    tr = nt.generate({"a": 100, "b": 30}, 16, 3, nt.Generator.stack_distance(1, "per_bag"),
                     seed=2)
    indices, offsets, lengths = tr.to_fbgemm(4, 12)
    assert len(offsets) == 2 * 8 + 1 and offsets[-1] == len(indices)
    np.testing.assert_array_equal(np.diff(offsets), lengths)
    back = nt.from_fbgemm(indices, offsets, {"a": 100, "b": 30})
    for name in ("a", "b"):
        o = tr[name].offsets
        np.testing.assert_array_equal(back[name].indices, tr[name].indices[o[4]:o[12]])
        np.testing.assert_array_equal(back[name].offsets, o[4:13] - o[4])
    with pytest.raises(nearrec.InvalidRequest, match="split evenly"):
        nt.from_fbgemm(indices, offsets, {"a": 100, "b": 30, "c": 1})


def test_batches_feed_lookup_many(tmp_path):
    rng = np.random.default_rng(0)
    w = {"a": rng.random((300, 8), np.float32), "b": rng.random((40, 4), np.float32)}
    nearrec.from_numpy(tmp_path / "s", w)
    store = nearrec.open(tmp_path / "s")
    tr = nt.generate(store, bags=50, pooling=5, generator=nt.Generator.uniform(), seed=1)
    got = np.concatenate([store.lookup_many(b).values for b in tr.batches(16)])
    assert got.shape == (50, 12)
    o = tr["a"].offsets
    want = np.stack([w["a"][tr["a"].indices[o[i]:o[i + 1]]].sum(0) for i in range(50)])
    np.testing.assert_allclose(got[:, :8], want, rtol=1e-5)


def test_trace_commands(tmp_path, capsys):
    path = tmp_path / "c.nrtrace"
    assert main(["trace", "gen", str(path), "--model", "rmc1", "--rows", "20000", "--bags",
                 "100", "--k", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tables"] == 8
    assert main(["trace", "gen", str(path), "--bags", "10"]) == 1  # exists
    assert "already exists" in capsys.readouterr().err
    assert main(["trace", "profile", str(path), "--cache", "100", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    t0 = out["tables"][0]
    assert t0["lookups"] == 100 * 80 and set(t0["lru_hit_ratio"]) == {"100", "10000"}
    assert 0 < t0["lru_hit_ratio"]["100"] <= t0["lru_hit_ratio"]["10000"] <= 1
    assert main(["trace", "info", str(path)]) == 0
    assert "sd(k=0, continuous, full)" in capsys.readouterr().out
