"""The GPU HBM tier (nearrec.gpu): EmbeddingBag parity, victims, admission, counters, errors,
the Triton kernels against their reference (interpreted in a subprocess; on CUDA when there is
one) and nearrec.torch's switch. CUDA tests are marked ``gpu`` and skipped without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import gpu_checks  # noqa: E402

from nearrec.errors import IndexOutOfRange, InvalidRequest, UnknownTable  # noqa: E402
from nearrec.gpu import CachePolicy, GpuCacheConfig, GpuEmbeddingCache, GpuTier  # noqa: E402
from nearrec.gpu.config import admission_uniform, admit, key_tag, key_tags  # noqa: E402

HERE = Path(__file__).parent
CUDA = torch.cuda.is_available()
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return gpu_checks.make_store(tmp_path_factory.mktemp("gpu"))


@pytest.mark.parametrize("seed,policy", list(enumerate(["lru", "lfu", "lru_pa", "lfu_pa"])))
@pytest.mark.parametrize("near", ["off", "on", "auto"])
def test_reference_tier_matches_embedding_bag(store, seed, policy, near):
    s, arrays = store
    gpu_checks.check_tier_matches_embedding_bag(s, arrays, "cpu", "reference", policy,
                                                "async_copy", near, seed=seed)


def test_include_last_offset(store):
    s, _ = store
    tier = GpuTier(s, ["a"], GpuCacheConfig(slots=64), device="cpu")
    idx = np.array([3, 4, 5])
    got = tier.pool("a", idx, np.array([0, 1, 3]), include_last_offset=True)
    assert got.shape == (2, 16)
    np.testing.assert_allclose(got.numpy(), s.lookup("a", idx, np.array([0, 1, 3]),
                                                     include_last_offset=True), rtol=1e-6)
    assert tier.pool("a", idx, np.array([0, 3])).shape == (2, 16)  # last bag empty
    with pytest.raises(InvalidRequest, match="last offset"):
        tier.pool("a", idx, np.array([0, 1]), include_last_offset=True)


@pytest.fixture(scope="module")
def same_width_store(tmp_path_factory):
    return gpu_checks.make_store(tmp_path_factory.mktemp("gpu-same"), 1, gpu_checks.SAME_WIDTH)


@pytest.mark.parametrize("policy,near", [("lfu_pa", "off"), ("lru", "off"), ("lru_pa", "on")])
def test_reference_grouped_tables_match_embedding_bag(same_width_store, policy, near):
    s, arrays = same_width_store
    tier = gpu_checks.check_tier_matches_embedding_bag(s, arrays, "cpu", "reference", policy,
                                                       "async_copy", near, seed=11, batches=5)
    assert tier._shared is not None  # one state, one launch per batch
    whole = tier.pool_concat([(n, np.array([1, 2, 3]), np.array([0, 1]), None, "sum")
                              for n in arrays])
    want = np.concatenate([s.lookup(n, np.array([1, 2, 3]), np.array([0, 1])) for n in arrays],
                          axis=1)
    np.testing.assert_allclose(whole.numpy(), want, rtol=1e-5, atol=1e-5)


def _one_set_cache(policy: str) -> GpuEmbeddingCache:
    cfg = GpuCacheConfig(slots=4, group_size=4, groups_per_set=1, policy=policy)
    return GpuEmbeddingCache("t", 100, 2, cfg, device="cpu", backend="reference")


def _rows(keys):
    return torch.tensor([[float(k), -float(k)] for k in keys])


def test_lfu_evicts_the_least_frequently_used():
    c = _one_set_cache("lfu")
    c.insert(np.array([1, 2, 3, 4]), _rows([1, 2, 3, 4]))
    c.lookup(torch.tensor([1, 1, 1, 2, 2, 4, 4, 4, 4]))  # key 3: never hit since admission
    c.insert(np.array([50]), _rows([50]))
    assert sorted(c.cached_keys().tolist()) == [1, 2, 4, 50]
    c.lookup(torch.tensor([50, 50, 50, 50, 50]))  # 50 now the most used; 2 the least
    c.insert(np.array([60]), _rows([60]))
    assert sorted(c.cached_keys().tolist()) == [1, 4, 50, 60]
    rows, miss = c.lookup(torch.tensor([60, 2]))
    assert miss.tolist() == [1] and rows[0].tolist() == [60.0, -60.0]
    assert rows[1].tolist() == [0.0, 0.0]
    assert c.device_stats() == (6, 2)


def test_lru_evicts_the_least_recently_used():
    c = _one_set_cache("lru")
    c.insert(np.array([1, 2, 3, 4]), _rows([1, 2, 3, 4]))
    for k in (1, 1, 1, 3, 4, 2):  # 1 used most often but longest ago
        c.lookup(torch.tensor([k]))
    c.insert(np.array([9]), _rows([9]))
    assert sorted(c.cached_keys().tolist()) == [2, 3, 4, 9]


def test_a_cached_key_is_not_taken_twice():
    c = _one_set_cache("lfu")
    c.insert(np.array([7]), _rows([7]))
    c.insert(np.array([7, 8]), _rows([7, 8]))
    assert sorted(c.cached_keys().tolist()) == [7, 8]
    assert c.device_stats() == (2, 0)


def test_admission_is_a_seeded_hash_with_the_configured_probability():
    keys = torch.arange(20_000, dtype=torch.int64) * 7919
    for p in (0.1, 0.5, 0.9):
        share = float(admit(keys, CachePolicy.LFU_PA, p, tick=3, seed=1).double().mean())
        assert abs(share - p) < 0.02, (p, share)
    a = admit(keys, CachePolicy.LRU_PA, 0.5, tick=3, seed=1)
    assert torch.equal(a, admit(keys, CachePolicy.LRU_PA, 0.5, tick=3, seed=1))
    assert not torch.equal(a, admit(keys, CachePolicy.LRU_PA, 0.5, tick=4, seed=1))
    assert not torch.equal(a, admit(keys, CachePolicy.LRU_PA, 0.5, tick=3, seed=2))
    assert not admit(keys, CachePolicy.LFU_PA, 0.0, 1, 0).any()
    assert admit(keys, CachePolicy.LFU, 0.0, 1, 0).all()  # lru / lfu admit every miss
    u = admission_uniform(keys, 5, 0)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0


def test_admission_probability_zero_caches_nothing(store):
    s, arrays = store
    tier = GpuTier(s, ["a"], GpuCacheConfig(slots=64, policy="lfu_pa", admission_probability=0),
                   device="cpu")
    for _ in range(3):
        out = tier.pool("a", np.arange(10), np.array([0, 5]))
        np.testing.assert_allclose(out.numpy(), s.lookup("a", np.arange(10), np.array([0, 5])),
                                   rtol=1e-6)
    st = tier.stats()["a"]
    assert st.admissions == 0 and st.hits == 0 and st.misses == 30
    assert tier.tables["a"].cache.cached_keys().size == 0


def test_counters_add_up(store):
    s, _ = store
    tier = GpuTier(s, ["a"], GpuCacheConfig(slots=10_000, policy="lfu"), device="cpu")
    tier.pool("a", np.array([1, 2, 2, 3]), np.array([0, 2]))
    tier.pool("a", np.array([1, 2, 9]), np.array([0]))
    st = tier.stats()["a"]
    assert (st.hits, st.misses, st.unique_misses, st.admissions) == (2, 5, 4, 4)
    assert st.rows_fetched == 4 and st.batches == 2 and st.hit_rate == pytest.approx(2 / 7)


def test_near_data_pooling_sends_partial_sums(store):
    s, arrays = store
    idx = np.repeat(np.arange(40), 3)
    off = np.arange(0, 120, 12)
    outs = {}
    for near in ("off", "on"):
        tier = GpuTier(s, ["a"], GpuCacheConfig(slots=64, policy="lfu_pa", near_data_pooling=near,
                                                admission_probability=0.3), device="cpu")
        outs[near] = tier.pool("a", idx, off)
        st = tier.stats()["a"]
        if near == "on":
            assert st.partial_sums > 0 and st.rows_fetched < 40
        else:
            assert st.partial_sums == 0 and st.rows_fetched == 40
    torch.testing.assert_close(outs["on"], outs["off"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs["on"].numpy(), s.lookup("a", idx, off), rtol=1e-5, atol=1e-5)


def test_bad_input_gets_typed_errors(store):
    s, _ = store
    tier = GpuTier(s, ["a"], GpuCacheConfig(slots=64), device="cpu")
    with pytest.raises(IndexOutOfRange) as e:
        tier.pool("a", np.array([1, 2, 300, 4]), np.array([0, 2]))
    assert e.value.table == "a" and e.value.position == 2
    with pytest.raises(IndexOutOfRange) as e:
        tier.pool("a", np.array([-1]), np.array([0]))
    assert e.value.position == 0
    with pytest.raises(InvalidRequest, match="'sum' or 'mean'"):
        tier.pool("a", np.array([1]), np.array([0]), mode="max")
    with pytest.raises(InvalidRequest, match="mode='sum'"):
        tier.pool("a", np.array([1]), np.array([0]), np.ones(1, np.float32), mode="mean")
    with pytest.raises(InvalidRequest, match="one weight per index"):
        tier.pool("a", np.array([1, 2]), np.array([0]), np.ones(3, np.float32))
    with pytest.raises(InvalidRequest, match="offsets"):
        tier.pool("a", np.array([1, 2]), np.array([0, 2, 1]))
    with pytest.raises(InvalidRequest, match="dtype"):
        tier.pool("a", np.array([1.0, 2.0]), np.array([0]))
    with pytest.raises(UnknownTable):
        tier.pool("zz", np.array([1]), np.array([0]))
    with pytest.raises(InvalidRequest, match="cache_policy"):
        GpuCacheConfig(slots=64, policy="fifo").validate()
    with pytest.raises(InvalidRequest, match="power of two"):
        GpuCacheConfig(slots=64, group_size=24).validate()
    with pytest.raises(InvalidRequest, match="admission_probability"):
        GpuCacheConfig(slots=64, admission_probability=1.5).validate()
    with pytest.raises(InvalidRequest, match="less than one set"):
        GpuTier(s, ["a"], GpuCacheConfig(hbm_budget="1KiB"), device="cpu")
    with pytest.raises(InvalidRequest, match="not a size"):
        GpuTier(s, ["a"], GpuCacheConfig(hbm_budget="lots"), device="cpu")


def test_budget_is_split_by_table_bytes(store):
    s, _ = store
    big = GpuTier(s, None, GpuCacheConfig(hbm_budget="1GiB", group_size=8, groups_per_set=1),
                  device="cpu")
    for name, rows, _ in gpu_checks.TABLES:  # room for everything: at most 1.25 slots per row
        assert rows <= big.tables[name].cache.slots <= rows * 1.25 + 8
    small = GpuTier(s, None, GpuCacheConfig(hbm_budget=40_000, group_size=8, groups_per_set=1),
                    device="cpu")
    assert small.hbm_bytes <= 40_000
    share = {n: small.tables[n].cache.hbm_bytes for n, _, _ in gpu_checks.TABLES}
    want = {n: r * (12 + 4 * d) for n, r, d in gpu_checks.TABLES}
    for n in share:  # proportional to table bytes, within a set's rounding
        assert abs(share[n] / 40_000 - want[n] / sum(want.values())) < 0.08, (n, share)


def test_tags_digest_keys():
    keys = torch.tensor([0, 1, 2**31 - 1, 2**31, 2**40 + 5, -1, -(2**40), 2**62 + 3],
                        dtype=torch.int64)
    assert key_tags(keys).tolist() == [key_tag(int(k)) for k in keys]
    assert key_tags(keys).dtype == torch.uint8
    assert all(0 <= key_tag(int(k)) < 256 for k in keys)
    # a digest, not the key's low byte: keys alike in their low bits (multiples of 256, as a
    # keyed table's ids may be) and consecutive ones both spread over the 256 tags
    for keys in (torch.arange(0, 2**16, dtype=torch.int64) * 256,
                 torch.arange(2**40, 2**40 + 2**16, dtype=torch.int64)):
        counts = torch.bincount(key_tags(keys).long(), minlength=256)
        assert counts.min() > 128 and counts.max() < 384, counts


def test_concurrent_callers_get_their_own_results(store):
    s, arrays = store
    tier = GpuTier(s, ["a", "b"], GpuCacheConfig(slots=64, group_size=8), device="cpu")
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(5):
                idx, off = gpu_checks.random_bags(rng, 257, 6)
                got = tier.pool_many([("b", idx, off, None, "sum")])[0]
                np.testing.assert_allclose(got.numpy(), s.lookup("b", idx, offsets=off),
                                           rtol=1e-5, atol=1e-5)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_collection_turns_the_tier_on(store):
    from nearrec.torch import EmbeddingBagCollection, KeyedJaggedTensor

    s, arrays = store
    rng = np.random.default_rng(5)
    plain = EmbeddingBagCollection(s)
    assert plain.gpu_tier is None
    tiered = EmbeddingBagCollection(s, device="cpu", hbm_budget="64KiB", cache_policy="lru_pa",
                                    admission_probability=0.7)
    assert tiered.gpu_tier is not None
    for step in range(4):
        if step % 2 == 0:  # each batch twice: the second finds what the first admitted
            lengths = torch.from_numpy(rng.integers(0, 5, 3 * 4))
            values = torch.from_numpy(np.concatenate([
                rng.integers(0, rows, int(lengths[k * 4:(k + 1) * 4].sum()))
                for k, (_, rows, _) in enumerate(gpu_checks.TABLES)]))
            kjt = KeyedJaggedTensor(["a", "b", "c"], values, lengths=lengths)
        torch.testing.assert_close(tiered(kjt).values(), plain(kjt).values(), rtol=1e-5,
                                   atol=1e-5)
    assert sum(st.hits for st in tiered.gpu_tier.stats().values()) > 0
    with pytest.raises(InvalidRequest, match="'sum' or 'mean'"):
        EmbeddingBagCollection(s, pooling="max", device="cpu", hbm_budget="1MiB")
    with pytest.raises(InvalidRequest, match="cache_policy"):
        EmbeddingBagCollection(s, device="cpu", hbm_budget="1MiB", cache_policy="mru")


def test_traces_for_the_benchmark():
    from nearrec_bench.gpu import stack_distance_trace, zipf_trace

    rng = np.random.default_rng(0)
    z = zipf_trace(rng, 1000, 1.05, 20_000)
    assert z.min() >= 0 and z.max() < 1000
    counts = np.bincount(z, minlength=1000)
    assert counts.max() > 20 * np.median(counts)  # skewed
    t, first = stack_distance_trace(np.random.default_rng(1), 50_000, 20_000, k=1.0, scale=1)
    assert 0.45 < first < 0.65  # the spec: K=1 gives about 55 % first references
    assert np.unique(t).size == round(first * t.size)
    t2, _ = stack_distance_trace(np.random.default_rng(1), 50_000, 20_000, k=1.0, scale=1)
    assert np.array_equal(t, t2)


def test_kernels_under_the_triton_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(HERE / "gpu_interp_cases.py")],
        env=env, capture_output=True, text=True, timeout=600, cwd=HERE.parent)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


@gpu
@needs_cuda
@pytest.mark.parametrize("policy", ["lfu", "lru", "lfu_pa"])
@pytest.mark.parametrize("tags", [True, False])
def test_cuda_kernels_match_reference(policy, tags):
    gpu_checks.check_kernels_match_reference("cuda", policy, seed=3, tags=tags)


@gpu
@needs_cuda
@pytest.mark.parametrize("transfer", ["zero_copy", "async_copy"])
@pytest.mark.parametrize("near", ["off", "on"])
def test_cuda_tier_matches_embedding_bag(store, transfer, near):
    s, arrays = store
    gpu_checks.check_tier_matches_embedding_bag(s, arrays, "cuda", "auto", "lfu_pa", transfer,
                                                near, seed=7, batches=6)


@gpu
@needs_cuda
@pytest.mark.parametrize("policy,near", [("lfu_pa", "off"), ("lru", "off"), ("lfu_pa", "on")])
def test_cuda_grouped_tables_match_embedding_bag(same_width_store, policy, near):
    s, arrays = same_width_store
    tier = gpu_checks.check_tier_matches_embedding_bag(s, arrays, "cuda", "auto", policy,
                                                       "async_copy", near, seed=5, batches=6)
    assert tier._shared is not None


@gpu
@needs_cuda
def test_cuda_replace_from_two_streams_is_safe():
    """Two replace kernels on two streams offer overlapping keys to the same sets: the set
    locks keep every set free of duplicates and every slot's row its key's."""
    rows, dim = 5000, 8
    cfg = GpuCacheConfig(slots=256, group_size=32, groups_per_set=2, policy="lfu")
    cache = GpuEmbeddingCache("t", rows, dim, cfg, device="cuda")
    table = torch.arange(rows * dim, dtype=torch.float32, device="cuda").view(rows, dim)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    rng = np.random.default_rng(0)
    for _ in range(20):
        plans = []
        for _s in streams:
            keys = torch.from_numpy(np.unique(rng.integers(0, 600, 300))).cuda()
            plans.append((keys, cache.plan_replace(keys)))
        torch.cuda.synchronize()
        for stream, (keys, (ks, sets, src_row)) in zip(streams, plans, strict=True):
            with torch.cuda.stream(stream):
                cache.replace(ks, sets, table[keys], src_row, cache.next_tick())
        torch.cuda.synchronize()
    k = cache.state.keys.view(cache.num_sets, -1).cpu().numpy()
    for s in range(cache.num_sets):
        present = k[s][k[s] >= 0]
        assert len(set(present.tolist())) == present.size, f"set {s} holds a key twice"
    slots = np.flatnonzero(cache.state.keys.cpu().numpy() >= 0)
    got = cache.state.rows.cpu().numpy()[slots]
    want = table.cpu().numpy()[cache.state.keys.cpu().numpy()[slots]]
    np.testing.assert_array_equal(got, want)
    assert int(cache.state.locks.remainder(2).sum()) == 0


@gpu
@needs_cuda
def test_cuda_collection(store):
    from nearrec.torch import EmbeddingBagCollection, KeyedJaggedTensor

    s, _ = store
    ebc = EmbeddingBagCollection(s, device="cuda", hbm_budget="1MiB")
    lengths = torch.tensor([2, 0, 3, 1, 1, 1])
    values = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8])
    kjt = KeyedJaggedTensor(["a", "b", "c"], values, lengths=lengths)
    got = ebc(kjt).values()
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.cpu(), EmbeddingBagCollection(s)(kjt).values(), rtol=1e-5,
                               atol=1e-5)
