"""The DRAM tiers in front of the SSD tier, from Python: every policy and plan pools what the DRAM
tier pools, concurrent batches included; the counters say which tier served what; bad plans and
settings are typed errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nearrec
import nearrec.trace as nt
from nearrec_bench._native import MappedStore

POLICIES = ["lru", "lfu", "lru_pa", "lfu_pa"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(3)
    path = tmp_path_factory.mktemp("tiers") / "s"
    weights = {"big": rng.standard_normal((20_000, 16), np.float32),
               "mid": rng.standard_normal((8_000, 8), np.float32),
               "small": rng.standard_normal((300, 4), np.float32)}
    nearrec.from_numpy(path, weights)
    return path, weights


def trace(bags=512):
    return nt.generate({"big": 20_000, "mid": 8_000, "small": 300}, bags, 10,
                       nt.Generator.zipf(1.05), seed=7)


def torch_pool(w, indices, offsets):
    bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(w), mode="sum")
    return bag(torch.from_numpy(np.asarray(indices)), torch.from_numpy(np.asarray(offsets)))


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_pools_like_embedding_bag(store, policy):
    path, weights = store
    s = nearrec.open(path, tier="ssd", dram_budget="400KiB", cache_policy=policy, cache_ways=8)
    tr = trace()
    for batch in tr.batches(64):
        got = s.lookup_many(batch)
        for req in batch:
            want = torch_pool(weights[req.table], req.indices, req.offsets).numpy()
            np.testing.assert_allclose(got[req.table], want, rtol=1e-5, atol=1e-5)
    stats = s.stats()
    assert stats["dram_tier_bytes"] <= 400 * 1024
    assert stats["lookups_cache"] > 0 and stats["cache_admissions"] > 0
    assert 0 < stats["dram_hit_ratio"] < 1
    report = {r["table"]: r for r in s.tier_report()}
    assert report["small"]["resident"] and report["small"]["lookups_ssd"] == 0
    for r in report.values():
        served = sum(r[k] for k in ("lookups_resident", "lookups_hot", "lookups_cache",
                                    "lookups_ssd"))
        assert served == tr.bags * 10
    assert report["big"]["cache_rows"] > report["mid"]["cache_rows"] > 0


def test_a_plan_pins_hot_rows_and_matches(store):
    path, weights = store
    tr = trace()
    # RecSSD's static partition: the most frequent rows of a profiling run
    rows, counts = np.unique(tr["big"].indices, return_counts=True)
    hot = rows[np.argsort(-counts)][:500]
    plan = {"big": {"hot_rows": hot, "cache_bytes": "64KiB"}, "small": {"resident": True}}
    s = nearrec.open(path, tier="ssd", plan=plan)
    dram = nearrec.open(path, tier="dram")
    outs = [s.submit(b) for b in tr.batches(32)]  # concurrent batches share the tiers
    for pending, batch in zip(outs, tr.batches(32), strict=True):
        np.testing.assert_allclose(pending.result().values, dram.lookup_many(batch).values,
                                   rtol=1e-5, atol=1e-5)
    report = {r["table"]: r for r in s.tier_report()}
    assert report["big"]["hot_rows"] == 500 and report["big"]["lookups_hot"] > 0
    assert report["mid"]["bytes"] == 0 and report["mid"]["lookups_ssd"] == tr.bags * 10
    # a hot row is never in the cache as well: hits there are counted once
    big = report["big"]
    assert big["lookups_hot"] + big["lookups_cache"] + big["lookups_ssd"] == tr.bags * 10


def test_no_budget_means_no_dram_tiers_and_auto_uses_the_budget(store):
    path, _ = store
    plain = nearrec.open(path, tier="ssd")
    plain.lookup("big", [1, 2, 3], [0])
    assert plain.stats()["dram_tier_bytes"] == 0 and plain.stats()["lookups_ssd"] == 3
    total = nearrec.info(path).total_bytes
    auto = nearrec.open(path, dram_budget=total // 4)
    assert auto.tier == "ssd" and 0 < auto.stats()["dram_tier_bytes"] <= total // 4


def test_bad_plans_and_settings_are_typed_errors(store):
    path, _ = store
    with pytest.raises(nearrec.InvalidRequest, match="cache_policy"):
        nearrec.open(path, tier="ssd", cache_policy="fifo")  # type: ignore[arg-type]
    with pytest.raises(nearrec.InvalidRequest, match="admission_probability"):
        nearrec.open(path, tier="ssd", admission_probability=1.5)
    with pytest.raises(nearrec.UnknownTable) as e:
        nearrec.open(path, tier="ssd", plan={"nope": {"cache_bytes": 10}})
    assert e.value.table == "nope"
    with pytest.raises(nearrec.IndexOutOfRange) as e:
        nearrec.open(path, tier="ssd", plan={"mid": {"hot_rows": [0, 1, 8_000]}})
    assert (e.value.table, e.value.position) == ("mid", 2)
    with pytest.raises(nearrec.IndexOutOfRange) as e:
        nearrec.open(path, tier="ssd", plan={"mid": {"hot_rows": [3, -1]}})
    assert (e.value.table, e.value.position) == ("mid", 1)
    with pytest.raises(nearrec.InvalidRequest, match="more than once"):
        nearrec.open(path, tier="ssd", plan={"mid": {"hot_rows": [3, 3]}})
    with pytest.raises(nearrec.InvalidRequest, match="unknown keys"):
        nearrec.open(path, tier="ssd", plan={"mid": {"hot": [3]}})
    with pytest.raises(nearrec.InvalidRequest, match="more than dram_budget"):
        nearrec.open(path, tier="ssd", dram_budget="1KiB", plan={"big": {"resident": True}})


def test_cache_study_matches_exact_lru_and_the_ssds_baseline_pools_right(store):
    t = nt.zipf(2_000, 300, 10, alpha=1.0, seed=5)
    for cap in (8, 64):
        # one set as wide as the cache: exactly an LRU cache of `cap` rows
        hits, misses, *_ = nearrec._native.cache_simulate(np.asarray(t.indices), cap, "lru",
                                                           ways=cap)
        assert hits + misses == len(t.indices)
        assert hits / len(t.indices) == pytest.approx(t.profile().lru_hit_ratio(cap))
    path, weights = store
    mapped = MappedStore(str(path), True)
    ids = {n: i for i, n in enumerate(weights)}
    tr = trace(40)
    got = mapped.pool([(ids[r.table], np.asarray(r.indices), np.append(r.offsets, len(r.indices)))
                       for r in tr.batch(0, 40)])
    want = nearrec.open(path, tier="dram").lookup_many(tr.batch(0, 40)).values
    np.testing.assert_allclose(got, want, rtol=1e-6)
