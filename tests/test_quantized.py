"""Quantised rows (int8 / int4 / int2 row-wise, fp8): the bytes the builder writes are FBGEMM's,
a table of FBGEMM's bytes pools as FBGEMM's CPU int-n-bit TBE pools them, every tier and mode
agrees with ``nn.EmbeddingBag`` over the decoded rows, and bad input is refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import nearrec

torch = pytest.importorskip("torch")
fbgemm = pytest.importorskip("fbgemm_gpu")
from fbgemm_gpu.split_embedding_configs import SparseType  # noqa: E402
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (  # noqa: E402
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import (  # noqa: E402
    IntNBitTableBatchedEmbeddingBagsCodegen,
)

BITS = {"int8": 8, "int4": 4, "int2": 2}
SPARSE = {"int8": SparseType.INT8, "int4": SparseType.INT4, "int2": SparseType.INT2,
          "fp8": SparseType.FP8}


def stored_rows(store_path: Path, table: str) -> np.ndarray:
    """A table's encoded rows as the file holds them (``docs/format.md`` §3, §5): the test's own
    reading of the format, not the store's."""
    info = nearrec.info(store_path)
    t = next(t for t in info.tables if t.name == table)
    r, b = t.row_bytes, t.block_bytes
    span = b if r <= b else -(-r // b) * b
    per = max(1, span // r)
    data = np.fromfile(store_path / t.file, np.uint8)[4096:4096 + t.data_bytes]
    return np.stack([data[(i // per) * span + (i % per) * r:][:r] for i in range(t.rows)])


def fbgemm_quantize(x: torch.Tensor, dtype: str) -> np.ndarray:
    """FBGEMM's own quantisation of ``x``, in its operator's layout (codes, then scale, bias)."""
    if dtype == "int8":
        return torch.ops.fbgemm.FloatToFused8BitRowwiseQuantized(x).numpy()
    return torch.ops.fbgemm.FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf(x, BITS[dtype]).numpy()


@pytest.mark.parametrize("dtype", ["int4", "int2"])
@pytest.mark.parametrize("dim", [8, 64, 96, 128])  # FBGEMM's operator wants whole fp16s of codes
def test_builder_writes_fbgemms_bytes(tmp_path, dtype, dim):
    rng = np.random.default_rng(dim)
    x = rng.standard_normal((300, dim)).astype(np.float32)
    x[7] = 0.5  # a constant row
    x[8] *= 1e-6  # a tiny range
    info = nearrec.from_numpy(tmp_path / "s", {"t": x}, dtype=dtype)
    np.testing.assert_array_equal(stored_rows(tmp_path / "s", "t"),
                                  fbgemm_quantize(torch.from_numpy(x), dtype))
    err = info.tables[0].quant_error
    decoded = nearrec.open(tmp_path / "s").read_rows("t", np.arange(300))
    assert err.values == x.size
    assert err.max_abs == pytest.approx(np.abs(decoded - x).max(), rel=1e-6)
    assert err.mean_abs == pytest.approx(np.abs(decoded - x).mean(), rel=1e-4)


def test_fp8_bytes_are_float8_e4m3fn_bits(tmp_path):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((200, 32)) * np.exp(rng.uniform(-9, 5, (200, 1)))).astype(np.float32)
    x[0, :4] = [448.0, -448.0, 1e9, -1e9]  # saturate at the largest value both read
    nearrec.from_numpy(tmp_path / "s", {"t": x}, dtype="fp8")
    want = torch.from_numpy(np.clip(x, -448, 448)).to(torch.float8_e4m3fn).view(torch.uint8)
    np.testing.assert_array_equal(stored_rows(tmp_path / "s", "t"), want.numpy())


def tbe_for(dtype: str, rows: int, dim: int, mode: PoolingMode):
    return IntNBitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[("t", rows, dim, SPARSE[dtype], EmbeddingLocation.HOST)],
        device="cpu", pooling_mode=mode, output_dtype=SparseType.FP32, row_alignment=16)


def tbe_weights(tbe, q: np.ndarray, dtype: str) -> None:
    """Puts FBGEMM's operator layout ``q`` into the TBE's rows (scale and bias first)."""
    tbe.initialize_weights()
    w = tbe.split_embedding_weights(split_scale_shifts=False)[0][0]
    w.zero_()
    if dtype == "fp8":
        w[:, :q.shape[1]] = torch.from_numpy(q)
    elif dtype == "int8":
        # the TBE keeps an int8 row's scale and bias as fp16
        sb = torch.from_numpy(q[:, -8:].copy()).view(torch.float32).half().view(torch.uint8)
        w[:, :4] = sb
        w[:, 4:4 + q.shape[1] - 8] = torch.from_numpy(q[:, :-8])
    else:
        w[:, :4] = torch.from_numpy(q[:, -4:])
        w[:, 4:4 + q.shape[1] - 4] = torch.from_numpy(q[:, :-4])


def fbgemm_rows(x: torch.Tensor, dtype: str) -> np.ndarray:
    """``x`` quantised by FBGEMM in nearrec's layout for ``dtype`` (int8's scale and bias held to
    fp16, as the TBE holds them)."""
    if dtype == "fp8":
        return x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    q = fbgemm_quantize(x, dtype)
    if dtype == "int8":
        sb = q[:, -8:].copy().view(np.float32).astype(np.float16).astype(np.float32)
        q = np.concatenate([q[:, :-8], sb.view(np.uint8)], axis=1)
    return q


@pytest.mark.parametrize("dtype", ["int8", "int4", "int2", "fp8"])
@pytest.mark.parametrize("dim", [16, 64, 128, 40])
@pytest.mark.parametrize("weighted", [False, True, "overflowing"])
def test_pools_as_fbgemm_int_nbit_tbe(tmp_path, dtype, dim, weighted):
    """The same bytes in nearrec and in FBGEMM's TBE: sums equal bit for bit on the DRAM tier,
    weighted sums too, and weights that overflow fp32 give FBGEMM's infinities and NaNs."""
    rows = 500
    rng = np.random.default_rng(dim)
    x = torch.from_numpy((rng.standard_normal((rows, dim)) * 3).astype(np.float32))
    q = fbgemm_rows(x, dtype)
    nearrec.from_encoded(tmp_path / "s", {"t": q}, dtype=dtype)
    store = nearrec.open(tmp_path / "s")
    lengths = rng.integers(0, 30, 64)
    lengths[:3] = 0
    idx = rng.integers(0, rows, int(lengths.sum()))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    w = rng.uniform(-2, 2, len(idx)).astype(np.float32) if weighted else None
    if weighted == "overflowing":
        w = (np.sign(w) * 10.0 ** rng.uniform(36, 38.5, len(idx))).astype(np.float32)
    got = store.lookup("t", idx, offsets[:-1], per_sample_weights=w)
    tbe = tbe_for(dtype, rows, dim, PoolingMode.SUM)
    tbe_weights(tbe, q, dtype)
    want = tbe(torch.from_numpy(idx).int(), torch.from_numpy(offsets).int(),
               None if w is None else torch.from_numpy(w)).numpy()
    if weighted == "overflowing":
        assert not np.isfinite(want).all()  # the case is exercised
    np.testing.assert_array_equal(got, want)  # NaN where FBGEMM has NaN
