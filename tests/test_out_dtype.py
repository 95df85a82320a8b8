"""Pooled answers in fp16, bf16 and int8 (``out_dtype``) against what PyTorch and FBGEMM make of
the same float32 answer: torch's ``.half()`` / ``.bfloat16()``, FBGEMM's
``FloatToFused8BitRowwiseQuantized`` then ``Fused8BitRowwiseQuantizedToFloat`` per bag and
table — bit for bit; the torch modules' outputs in the asked dtype; the ways of naming a dtype
and the refusals. Every store's answers (embedded, node, sharded, Ray) are held to one rounding
of their fp32 answer in ``test_contract.py``."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import nearrec
from nearrec import InvalidRequest, TableLookup

torch = pytest.importorskip("torch")

DIMS = {"a": 16, "b": 64, "c": 7}
ROWS = 500


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> nearrec.Store:
    rng = np.random.default_rng(7)
    path = Path(tmp_path_factory.mktemp("out")) / "s"
    tables = {t: (rng.standard_normal((ROWS, d)) * 3).astype(np.float32) for t, d in DIMS.items()}
    nearrec.from_numpy(path, tables)
    return nearrec.open(path, tier="dram")


def requests(seed: int, batch: int = 33) -> list[TableLookup]:
    rng = np.random.default_rng(seed)
    out = []
    for t in DIMS:
        lengths = rng.integers(0, 9, batch)
        out.append(TableLookup(t, rng.integers(0, ROWS, lengths.sum()), lengths=lengths,
                               per_sample_weights=rng.standard_normal(lengths.sum())
                               .astype(np.float32)))
    return out


def test_fp16_and_bf16_are_torchs_rounding_of_the_fp32_answer(store):
    for seed in range(4):
        reqs = requests(seed)
        fp32 = torch.from_numpy(store.lookup_many(reqs).values)
        half = store.lookup_many(reqs, out_dtype="fp16").values
        assert half.dtype == np.float16
        assert torch.equal(torch.from_numpy(half), fp32.half())
        bf16 = store.lookup_many(reqs, out_dtype="bf16").values
        assert bf16.dtype == ml_dtypes.bfloat16
        as_torch = torch.from_numpy(bf16.view(np.int16)).view(torch.bfloat16)
        assert torch.equal(as_torch, fp32.bfloat16())


def test_int8_is_fbgemms_fused_rowwise_quantisation_per_bag_and_table(store):
    pytest.importorskip("fbgemm_gpu")
    ops = torch.ops.fbgemm
    for seed in range(4):
        reqs = requests(seed, batch=40)
        fp32 = store.lookup_many(reqs).values
        got = store.lookup_many(reqs, out_dtype="int8").values
        assert got.dtype == np.float32
        at = 0
        for t, d in DIMS.items():
            block = torch.from_numpy(np.ascontiguousarray(fp32[:, at:at + d]))
            fused = ops.FloatToFused8BitRowwiseQuantized(block)
            assert fused.shape == (40, d + 8)  # codes, float32 scale and bias
            want = ops.Fused8BitRowwiseQuantizedToFloat(fused).numpy()
            assert np.array_equal(got[:, at:at + d], want), (seed, t)
            at += d
    # a bag with no rows: a zero vector (scale 0) comes back zeros
    empty = [TableLookup("a", np.zeros(0, np.int64), lengths=np.zeros(3, np.int64))]
    assert not store.lookup_many(empty, out_dtype="int8").values.any()


def test_dtypes_are_named_by_name_numpy_or_torch(store):
    reqs = requests(9)
    want = store.lookup_many(reqs, out_dtype="bf16").values
    for name in ("bfloat16", ml_dtypes.bfloat16, torch.bfloat16, np.dtype(ml_dtypes.bfloat16)):
        got = store.lookup_many(reqs, out_dtype=name).values
        assert got.dtype == want.dtype and np.array_equal(got.view(np.int16), want.view(np.int16))
    for name in ("float16", np.float16, torch.float16):
        assert store.lookup_many(reqs, out_dtype=name).values.dtype == np.float16
    for name in (None, "fp32", np.float32, torch.float32):
        assert store.lookup_many(reqs, out_dtype=name).values.dtype == np.float32
    # one table's lookup too
    one = store.lookup("a", np.array([1, 2, 3]), np.array([0, 2]), out_dtype="fp16")
    assert one.dtype == np.float16 and one.shape == (2, DIMS["a"])
    for bad, says in [("int4", '"int4" is not one of'), (np.float64, '"float64" is not one of'),
                      (torch.int8, "'int8'"), (3, "out_dtype is a dtype or its name")]:
        if bad is torch.int8:  # torch's int8 is the int8 answer's name too
            assert store.lookup_many(reqs, out_dtype=bad).values.dtype == np.float32
            continue
        with pytest.raises(InvalidRequest, match=says):
            store.lookup_many(reqs, out_dtype=bad)


def test_torch_modules_answer_in_the_asked_dtype(store):
    from nearrec.torch import EmbeddingBag, EmbeddingBagCollection, KeyedJaggedTensor

    ids = torch.tensor([1, 5, 7, 9, 11, 400], dtype=torch.int64)
    offsets = torch.tensor([0, 2, 2, 5])
    base = EmbeddingBag(store, "b")(ids, offsets)
    for dtype in (torch.float16, torch.bfloat16):
        got = EmbeddingBag(store, "b", out_dtype=dtype)(ids, offsets)
        assert got.dtype == dtype and torch.equal(got, base.to(dtype))
    lengths = torch.tensor([2, 0, 3, 1, 1, 1, 2, 2, 2])
    kjt = KeyedJaggedTensor(["a", "b", "c"], torch.arange(14) * 31 % ROWS, lengths)
    fp32 = EmbeddingBagCollection(store)(kjt).values()
    for dtype, torch_dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16),
                               ("int8", torch.float32)):
        got = EmbeddingBagCollection(store, out_dtype=dtype)(kjt).values()
        assert got.dtype == torch_dtype
        want = fp32.numpy().copy()
        nearrec._native.round_out(want, list(DIMS.values()), dtype)
        assert torch.equal(got.float(), torch.from_numpy(want)), dtype
    with pytest.raises(InvalidRequest, match='"fp64" is not one of'):
        EmbeddingBagCollection(store, out_dtype="fp64")


def test_keyed_tables_columns_are_rounded_as_the_stores(store, tmp_path):
    from nearrec.keyed import KeyedTable
    from nearrec.torch import EmbeddingBagCollection, KeyedJaggedTensor

    keyed = KeyedTable("k", dim=8, capacity=100)
    keys = np.arange(10, dtype=np.int64) * 1000003
    keyed.write(keys, np.random.default_rng(1).standard_normal((10, 8)).astype(np.float32))
    kjt = KeyedJaggedTensor(["a", "k"], torch.tensor([1, 2, 3, 1000003, 2000006, 0]),
                            torch.tensor([2, 1, 2, 1]))
    fp32 = EmbeddingBagCollection(store, ["a"], keyed=[keyed])(kjt).values()
    got = EmbeddingBagCollection(store, ["a"], keyed=[keyed], out_dtype="int8")(kjt).values()
    want = fp32.numpy().copy()
    nearrec._native.round_out(want, [DIMS["a"], 8], "int8")
    assert torch.equal(got, torch.from_numpy(want))
