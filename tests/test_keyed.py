"""Keyed tables from Python: pooling equals nn.EmbeddingBag over the same rows, unknown keys follow
their policy (counted), many threads insert and read at once, tables save and load, and they work
end to end from nearrec.torch, on the CPU and behind the GPU tier (its reference path here)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import nearrec
from nearrec.keyed import KeyedTable
from nearrec.torch import EmbeddingBagCollection, KeyedEmbeddingBag, KeyedJaggedTensor

rng = np.random.default_rng(4)
# ids as a feature hasher gives them: all over the 64-bit range, negative ones included
KEYS = np.unique(rng.integers(-(2**63), 2**63 - 1, 3000, dtype=np.int64))
VALUES = rng.standard_normal((len(KEYS), 8)).astype(np.float32)


def reference(keys, offsets, mode="sum", weights=None, table=None):
    """nn.EmbeddingBag over the rows of `keys`, looked up by position in KEYS."""
    pos = np.searchsorted(KEYS, keys)
    bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(VALUES), mode=mode)
    w = None if weights is None else torch.from_numpy(weights)
    return bag(torch.from_numpy(pos), torch.from_numpy(offsets), per_sample_weights=w).numpy()


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_pools_like_embedding_bag(mode):
    t = KeyedTable.from_arrays("ids", KEYS, VALUES)
    assert len(t) == len(KEYS) and t.capacity == 2 * len(KEYS)
    keys = rng.choice(KEYS, 500)
    offsets = np.sort(rng.choice(500, 40, replace=False))
    offsets[0] = 0
    np.testing.assert_allclose(t.lookup(keys, offsets, mode=mode),
                               reference(keys, offsets, mode), rtol=1e-6, atol=1e-6)
    if mode == "sum":
        w = rng.random(500).astype(np.float32)
        np.testing.assert_allclose(t.lookup(keys, offsets, per_sample_weights=w),
                                   reference(keys, offsets, weights=w), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(t.read(keys[:10]), VALUES[np.searchsorted(KEYS, keys[:10])])
    assert t.stats()["hits"] > 0 and t.stats()["unknown_errors"] == 0
    # unsigned 64-bit ids keep their bits
    big = np.array([2**64 - 5], dtype=np.uint64)
    t.assign(big, np.ones((1, 8), np.float32))
    assert t.contains(np.array([-5])).tolist() == [True]


def test_unknown_key_policies():
    known, unknown = KEYS[:100], np.array([7, 8, 7], dtype=np.int64)
    mixed = np.concatenate([known[:3], unknown])
    strict = KeyedTable.from_arrays("strict", known, VALUES[:100])
    with pytest.raises(nearrec.UnknownKey, match="key 7 at position 3") as e:
        strict.lookup(mixed, np.array([0, 3]))
    assert (e.value.table, e.value.position) == ("strict", 3)
    assert isinstance(e.value, KeyError) and len(strict) == 100
    assert strict.stats()["unknown_errors"] == 1

    zero = KeyedTable.from_arrays("zero", known, VALUES[:100], unknown="zero")
    out = zero.lookup(mixed, np.array([0, 3]), mode="mean")
    np.testing.assert_allclose(out[1], np.zeros(8))  # zeros, counted towards the mean
    np.testing.assert_allclose(out[0], VALUES[:3].mean(0), rtol=1e-6)
    assert zero.stats()["unknown_zero"] == 3 and len(zero) == 100

    init = KeyedTable.from_arrays("init", known, VALUES[:100], unknown="init", init_scale=0.1,
                                  seed=5, capacity=101)
    a = init.read(np.array([7]))
    assert np.all(np.abs(a) <= 0.1) and np.any(a != 0)
    assert len(init) == 101 and init.stats()["initialised"] == 1
    other = KeyedTable("other", 8, 10, unknown="init", init_scale=0.1, seed=5)
    np.testing.assert_array_equal(other.read(np.array([7])), a)  # (seed, key) alone
    with pytest.raises(nearrec.TableFull, match="holds 101 keys"):
        init.read(np.array([8]))
    with pytest.raises(nearrec.InvalidRequest, match="unknown="):
        KeyedTable("x", 4, 10, unknown="guess")


def test_many_threads_insert_and_read_at_once():
    t = KeyedTable("shared", 4, 20_000, unknown="init", init_scale=1.0, seed=1)
    keys = rng.integers(0, 2**40, 8000, dtype=np.int64)
    results: list[np.ndarray] = [None] * 4  # type: ignore[list-item]

    def work(i: int) -> None:
        order = np.roll(keys, 2000 * i)
        out = np.concatenate([t.read(order[s:s + 500]) for s in range(0, len(order), 500)])
        results[i] = out[np.argsort(np.roll(np.arange(len(keys)), 2000 * i))]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    distinct = len(np.unique(keys))
    assert len(t) == distinct and t.stats()["initialised"] == distinct
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_save_load_and_export(tmp_path):
    t = KeyedTable.from_arrays("ids", KEYS[:500], VALUES[:500], unknown="zero")
    path = t.save(tmp_path / "ids.npz")
    u = KeyedTable.load(path)
    assert (u.name, u.capacity, u.unknown, len(u)) == ("ids", t.capacity, "zero", 500)
    keys, values = u.export()
    order = np.argsort(keys)
    np.testing.assert_array_equal(keys[order], KEYS[:500])
    np.testing.assert_array_equal(values[order], VALUES[:500])
    assert not list(tmp_path.glob(".*tmp*"))


def test_end_to_end_from_torch(tmp_path):
    # one store table and one keyed table in one collection
    store_rows = rng.standard_normal((300, 4)).astype(np.float32)
    nearrec.from_numpy(tmp_path / "s", {"small": store_rows})
    store = nearrec.open(tmp_path / "s")
    ids = KeyedTable.from_arrays("ids", KEYS, VALUES, unknown="zero")
    ebc = EmbeddingBagCollection(store, keyed=[ids], pooling={"small": "sum", "ids": "mean"})
    assert ebc.tables == ["small", "ids"] and ebc.dims == [4, 8]
    lengths = np.array([2, 0, 3, 1, 1, 2], dtype=np.int64)  # small: 3 bags, ids: 3 bags
    small_vals = np.array([1, 5, 7, 9, 299])
    id_vals = np.concatenate([rng.choice(KEYS, 3), [12345]])  # one unknown: a zero row
    kjt = KeyedJaggedTensor(["small", "ids"], torch.from_numpy(np.concatenate(
        [small_vals, id_vals])), torch.from_numpy(lengths))
    out = ebc(kjt)
    small_off = np.array([0, 2, 2])
    want_small = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(store_rows), mode="sum")(
        torch.from_numpy(small_vals), torch.from_numpy(small_off)).numpy()
    np.testing.assert_allclose(out["small"].numpy(), want_small, rtol=1e-6)
    want_ids = np.stack([VALUES[np.searchsorted(KEYS, id_vals[0])],
                         VALUES[np.searchsorted(KEYS, id_vals[1])],
                         (VALUES[np.searchsorted(KEYS, id_vals[2])] + 0) / 2])
    np.testing.assert_allclose(out["ids"].numpy(), want_ids, rtol=1e-6)
    # the GPU tier over the same tables (its reference path on a CPU device) agrees
    gpu = EmbeddingBagCollection(store, keyed=[ids], pooling={"small": "sum", "ids": "mean"},
                                 device="cpu", hbm_budget="64KiB")
    for _ in range(3):  # cold, then warm caches
        np.testing.assert_allclose(gpu(kjt).values().numpy(), out.values().numpy(), rtol=1e-5,
                                   atol=1e-6)
    # and a lone keyed table behaves like nn.EmbeddingBag over its rows
    bag = KeyedEmbeddingBag(ids, mode="sum")
    keys = torch.from_numpy(rng.choice(KEYS, (5, 3)))
    np.testing.assert_allclose(bag(keys).numpy(),
                               reference(keys.numpy().ravel(), np.arange(0, 15, 3)), rtol=1e-6)
    only = EmbeddingBagCollection(None, keyed=[ids])
    np.testing.assert_allclose(only(KeyedJaggedTensor(["ids"], torch.from_numpy(id_vals[:2]),
                                                      torch.tensor([1, 1]))).values().numpy(),
                               VALUES[np.searchsorted(KEYS, id_vals[:2])], rtol=1e-6)
    with pytest.raises(nearrec.InvalidRequest, match="unique"):
        EmbeddingBagCollection(store, keyed=[KeyedTable("small", 4, 10)])


def test_write_and_remove_match_a_dict_of_rows():
    """Writes (upserts, the last row of a repeated key winning) and removes against a dict,
    pooled like nn.EmbeddingBag over the rows the dict holds; removed keys are unknown (zeros
    here) until written again; a bad call changes nothing."""
    rng = np.random.default_rng(3)
    t = KeyedTable("w", 4, 64, unknown="zero")
    model: dict[int, np.ndarray] = {}
    for step in range(60):
        keys = rng.integers(-20, 20, rng.integers(1, 5))
        if step % 4 == 3:
            removed = t.remove(keys)
            assert removed == sum(1 for k in set(keys.tolist()) if model.pop(k, None) is not None)
        else:
            rows = rng.standard_normal((len(keys), 4)).astype(np.float32)
            t.write(keys, rows)
            for k, r in zip(keys.tolist(), rows, strict=True):
                model[k] = r
        look = rng.integers(-20, 20, 12)
        table = np.stack([model.get(k, np.zeros(4, np.float32)) for k in range(-20, 20)])
        bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(table), mode="sum")
        want = bag(torch.from_numpy(look + 20), torch.tensor([0, 4, 8])).numpy()
        np.testing.assert_allclose(t.lookup(look, offsets=[0, 4, 8]), want, rtol=1e-6, atol=1e-6)
        assert len(t) == len(model)
    with pytest.raises(nearrec.InvalidRequest, match="NaN"):
        t.write([1, 2], np.array([[0, 0, 0, 0], [0, np.nan, 0, 0]], np.float32))
    assert len(t) == len(model)
