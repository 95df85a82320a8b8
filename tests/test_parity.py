"""Differential tests: every mode and flag of torch.nn.EmbeddingBag against nearrec, on every
dtype (torch runs on the decoded rows, so only the summation order may differ)."""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nearrec

torch = pytest.importorskip("torch")

from conftest import TABLES  # noqa: E402


def reference(store: nearrec.Store, table: str, indices, offsets=None, weights=None,
              mode="sum", include_last_offset=False, padding_idx=None):
    info = store.table(table)
    decoded = torch.from_numpy(store.read_rows(table, np.arange(info.rows)))
    bag = torch.nn.EmbeddingBag.from_pretrained(
        decoded, mode=mode, include_last_offset=include_last_offset, padding_idx=padding_idx)
    with torch.no_grad():
        return bag(torch.as_tensor(indices),
                   None if offsets is None else torch.as_tensor(offsets),
                   None if weights is None else torch.as_tensor(weights)).numpy()


def assert_close(got, want, mode):
    assert got.shape == want.shape
    assert got.dtype == np.float32
    if mode == "max":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def random_bags(rng, rows, batch, max_len, padding=None):
    lengths = rng.integers(0, max_len + 1, batch)
    lengths[rng.random(batch) < 0.2] = 0  # empty bags
    idx = rng.integers(0, rows, int(lengths.sum()))
    if padding is not None and idx.size:
        idx[rng.random(idx.size) < 0.3] = padding % rows
    offsets = (np.cumsum(lengths) - lengths).astype(np.int64)
    return idx.astype(np.int64), offsets, lengths


MODES = ["sum", "mean", "max"]


@pytest.mark.parametrize("table", [t[0] for t in TABLES])
@pytest.mark.parametrize("mode,include_last,padding,weighted,itype", [
    (m, ilo, p, w, it)
    for m, ilo, p, w, it in itertools.product(MODES, [False, True], [None, 3, -1], [False, True],
                                              [np.int64, np.int32])
    if not (w and m != "sum")
])
def test_matches_embedding_bag(mixed_store, table, mode, include_last, padding, weighted, itype):
    # a seed of the case's own (str hashes change from process to process)
    rng = np.random.default_rng(zlib.crc32(repr((table, mode, include_last, padding,
                                                 weighted)).encode()))
    rows = mixed_store.table(table).rows
    idx, offsets, _ = random_bags(rng, rows, 33, 9, padding)
    idx, offsets = idx.astype(itype), offsets.astype(itype)
    if include_last:
        offsets = np.append(offsets, len(idx)).astype(itype)
    weights = rng.random(len(idx)).astype(np.float32) if weighted else None
    got = mixed_store.lookup(table, idx, offsets, per_sample_weights=weights, mode=mode,
                             include_last_offset=include_last, padding_idx=padding)
    want = reference(mixed_store, table, idx, offsets, weights, mode, include_last, padding)
    assert_close(got, want, mode)


@pytest.mark.parametrize("mode", MODES)
def test_2d_input(mixed_store, mode):
    rng = np.random.default_rng(1)
    idx = rng.integers(0, 300, (17, 5))
    got = mixed_store.lookup("f32_d32", idx, mode=mode)
    assert_close(got, reference(mixed_store, "f32_d32", idx, mode=mode), mode)
    w = rng.random((17, 5)).astype(np.float32)
    got = mixed_store.lookup("f32_d32", idx, per_sample_weights=w)
    assert_close(got, reference(mixed_store, "f32_d32", idx, weights=w), "sum")


def test_2d_input_with_no_columns_is_empty_bags(mixed_store):
    got = mixed_store.lookup("f32_d32", np.zeros((4, 0), np.int64))
    np.testing.assert_array_equal(got, np.zeros((4, 32), np.float32))
    # beside a table with rows, in one batched call
    idx = np.array([[1, 2], [3, 4], [5, 6], [7, 8]])
    out = mixed_store.lookup_many([nearrec.TableLookup("f32_d32", np.zeros((4, 0), np.int64)),
                                   nearrec.TableLookup("f16_d16", idx)])
    np.testing.assert_array_equal(out["f32_d32"], np.zeros((4, 32), np.float32))
    assert_close(out["f16_d16"], reference(mixed_store, "f16_d16", idx), "sum")
    with pytest.raises(nearrec.InvalidRequest, match="bags"):
        mixed_store.lookup_many([nearrec.TableLookup("f32_d32", np.zeros((3, 0), np.int64)),
                                 nearrec.TableLookup("f16_d16", idx)])


def test_include_last_offset_ignores_trailing_indices_like_torch(mixed_store):
    idx = np.array([1, 2, 3, 4])
    off = np.array([0, 1, 2])
    got = mixed_store.lookup("f32_d32", idx, off, include_last_offset=True)
    assert got.shape == (2, 32)
    assert_close(got, reference(mixed_store, "f32_d32", idx, off, include_last_offset=True), "sum")


def test_empty_batch(mixed_store):
    got = mixed_store.lookup("f32_d32", np.array([], np.int64), np.array([], np.int64))
    assert got.shape == (0, 32)


def test_fp32_rows_are_stored_exactly(tmp_path):
    from conftest import make_store

    path, arrays = make_store(tmp_path)
    store = nearrec.open(path)
    np.testing.assert_array_equal(store.table_array("f32_d32"), arrays["f32_d32"])
    np.testing.assert_array_equal(store.read_rows("f32_d7", np.arange(257)), arrays["f32_d7"])
    f16 = store.read_rows("f16_d16", np.arange(200))
    np.testing.assert_array_equal(f16, arrays["f16_d16"].astype(np.float16).astype(np.float32))
    i8 = store.read_rows("i8_d32", np.arange(400))
    a = arrays["i8_d32"]
    step = (a.max(1) - a.min(1)) / 255
    assert np.all(np.abs(i8 - a) <= step[:, None] * 0.5 + 1e-6)


def test_multi_table_batch_matches_per_table(mixed_store):
    rng = np.random.default_rng(7)
    reqs = []
    for name, rows, _dim, _ in TABLES:
        idx, offsets, _ = random_bags(rng, rows, 12, 6)
        reqs.append(nearrec.TableLookup(name, idx, offsets, mode="mean"))
    batch = mixed_store.lookup_many(reqs)
    assert batch.values.shape == (12, sum(t[2] for t in TABLES))
    for r in reqs:
        want = reference(mixed_store, r.table, r.indices, r.offsets, mode="mean")
        assert_close(batch[r.table], want, "mean")


def test_large_batch_runs_on_worker_threads(mixed_store):
    # Above the inline threshold the request is split into (table, bag-run) tasks.
    rng = np.random.default_rng(3)
    idx, offsets, _ = random_bags(rng, 300, 4000, 20)
    got = mixed_store.lookup("f32_d32", idx, offsets)
    assert_close(got, reference(mixed_store, "f32_d32", idx, offsets), "sum")


@settings(max_examples=60, deadline=None)
@given(
    table=st.sampled_from([t[0] for t in TABLES]),
    mode=st.sampled_from(MODES),
    batch=st.integers(0, 40),
    max_len=st.integers(0, 12),
    seed=st.integers(0, 2**31),
    use_lengths=st.booleans(),
)
def test_random_shapes(mixed_store, table, mode, batch, max_len, seed, use_lengths):
    rng = np.random.default_rng(seed)
    rows = mixed_store.table(table).rows
    idx, offsets, lengths = random_bags(rng, rows, batch, max_len)
    if use_lengths:
        got = mixed_store.lookup(table, idx, lengths=lengths, mode=mode)
    else:
        got = mixed_store.lookup(table, idx, offsets, mode=mode)
    if batch == 0:
        assert got.shape == (0, mixed_store.table(table).dim)
        return
    assert_close(got, reference(mixed_store, table, idx, offsets, mode=mode), mode)
