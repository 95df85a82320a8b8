"""Quantised rows (int8 / int4 / int2 row-wise, fp8): the bytes the builder writes are FBGEMM's,
a table of FBGEMM's bytes pools as FBGEMM's CPU int-n-bit TBE pools them, every tier and mode
agrees with ``nn.EmbeddingBag`` over the decoded rows, and bad input is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nearrec

torch = pytest.importorskip("torch")
fbgemm = pytest.importorskip("fbgemm_gpu")
from nearrec_bench.sls import fbgemm_rows, int_nbit_tbe  # noqa: E402

# FBGEMM's own quantisation (`fbgemm_rows`: its operators' bytes, in nearrec's layout) and its
# CPU inference TBE holding the same bytes (`int_nbit_tbe`) are the benchmark's, so that the
# tests hold nearrec to the very peer `bench sls-dtypes` times.


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


@pytest.mark.parametrize("dtype", ["int4", "int2"])
@pytest.mark.parametrize("dim", [8, 64, 96, 128])  # FBGEMM's operator wants whole fp16s of codes
def test_builder_writes_fbgemms_bytes(tmp_path, dtype, dim):
    rng = np.random.default_rng(dim)
    x = rng.standard_normal((300, dim)).astype(np.float32)
    x[7] = 0.5  # a constant row
    x[8] *= 1e-6  # a tiny range
    info = nearrec.from_numpy(tmp_path / "s", {"t": x}, dtype=dtype)
    np.testing.assert_array_equal(stored_rows(tmp_path / "s", "t"),
                                  fbgemm_rows(torch.from_numpy(x), dtype))
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
    tbe = int_nbit_tbe([q], [dim], dtype)
    want = tbe(torch.from_numpy(idx).int(), torch.from_numpy(offsets).int(),
               None if w is None else torch.from_numpy(w)).numpy()
    if weighted == "overflowing":
        assert not np.isfinite(want).all()  # the case is exercised
    np.testing.assert_array_equal(got, want)  # NaN where FBGEMM has NaN


# ---- TorchRec's quantised collections, taken as they are --------------------------------------

torchrec = pytest.importorskip("torchrec")


def quantized_dlrm(per_table: dict[str, Any] | None = None, dtype: Any = None) -> Any:
    """A TorchRec DLRM with its collection quantised by TorchRec: ``quantize_inference_model``
    (``per_table`` dtypes, int8 for the rest), or ``quantize_embeddings`` when ``dtype``."""
    import copy

    from test_torchrec import dlrm
    from torchrec.inference.modules import quantize_embeddings, quantize_inference_model

    torch.manual_seed(12)
    model = dlrm().eval()
    if dtype is not None:
        return quantize_embeddings(copy.deepcopy(model), dtype=dtype, inplace=False)
    return quantize_inference_model(copy.deepcopy(model), per_table_weight_dtype=per_table)


QUANTIZED = {
    "int4": dict(dtype=torch.quint4x2),
    "int8": dict(dtype=torch.qint8),
    "int2": dict(dtype=torch.quint2x4),
    "mixed": dict(per_table={"t0": torch.quint4x2, "t1": torch.qint8, "t2": torch.half}),
}


@pytest.mark.parametrize("tier", ["dram", "ssd"])
@pytest.mark.parametrize("kind", list(QUANTIZED))
def test_a_quantized_torchrec_dlrm_is_served_as_torchrec_serves_it(tmp_path, tier, kind):
    from test_torchrec import kjt
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as Quantized

    from nearrec.torch import from_torchrec

    model = quantized_dlrm(**QUANTIZED[kind])
    theirs = model.sparse_arch.embedding_bag_collection
    assert isinstance(theirs, Quantized)
    options = {"tier": tier} | ({"dram_budget": "8KiB"} if tier == "ssd" else {})
    served = from_torchrec(model, tmp_path / "s", dtype="fp32", **options)
    info = {t.name: t for t in nearrec.info(tmp_path / "s").tables}
    want = {c.name: c.data_type.name.lower().replace("fp16", "fp16")
            for c in theirs.embedding_bag_configs()}
    assert {n: t.dtype for n, t in info.items()} == want  # each keeps its dtype
    assert all(t.quant_error is None for t in info.values())  # bytes taken, not re-quantised
    for seed, batch in ((1, 1), (2, 9), (3, 40)):
        features, dense = kjt(theirs, batch, seed), torch.randn(batch, 5)
        with torch.inference_mode():
            ours, want_out = served(dense, features), model(dense, features)
            pooled = served.sparse_arch.embedding_bag_collection(features).values()
            their_pooled = theirs(features).values()
        if tier == "dram":  # the same bytes summed in the same order as FBGEMM sums them
            torch.testing.assert_close(pooled, their_pooled, rtol=0, atol=0)
            torch.testing.assert_close(ours, want_out, rtol=0, atol=0)
        else:  # rows added as their reads land
            torch.testing.assert_close(pooled, their_pooled, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(ours, want_out, rtol=1e-5, atol=1e-5)


def test_a_quantized_dlrm_compiles_and_exports_with_the_lookup_as_one_op(tmp_path):
    """The graph capture takes the quantised model's dense part and nearrec's lookup, one op."""
    from test_torchrec import export_served, kjt

    from nearrec.torch import from_torchrec

    model = quantized_dlrm(dtype=torch.quint4x2)
    theirs = model.sparse_arch.embedding_bag_collection
    served = from_torchrec(model, tmp_path / "s", tier="ssd", dram_budget="8KiB")
    compiled = torch.compile(served, fullgraph=True)  # a graph break would fail here
    with torch.inference_mode():
        for seed, batch in ((1, 6), (2, 6), (3, 11)):
            features, dense = kjt(theirs, batch, seed), torch.randn(batch, 5)
            torch.testing.assert_close(compiled(dense, features), model(dense, features),
                                       rtol=1e-5, atol=1e-5)
    program, ops = export_served(served, kjt(theirs, 6, 1), torch.randn(6, 5))
    assert torch.ops.nearrec.pooled_lookup.default in ops
    assert not any("fbgemm" in str(op) for op in ops)  # the quantised TBE is not in the graph
    for seed, n in ((4, 6), (5, 13)):
        features, dense = kjt(theirs, n, seed), torch.randn(n, 5)
        torch.testing.assert_close(
            program.module()(dense, features.values(), features.lengths()),
            model(dense, features), rtol=1e-5, atol=1e-5)


def test_quantized_collections_nearrec_cannot_take_are_refused_by_table(tmp_path):
    from torchrec.quant.embedding_modules import EmbeddingBagCollection as Quantized

    from nearrec.torch import from_torchrec
    from nearrec.torch.convert import _quantized_rows

    model = quantized_dlrm(dtype=torch.quint4x2)
    ebc = model.sparse_arch.embedding_bag_collection
    assert isinstance(ebc, Quantized)
    config = ebc.embedding_bag_configs()[1]
    weight = ebc.state_dict()[f"embedding_bags.{config.name}.weight"].view(torch.uint8)
    # scale / bias columns that do not match the rows: a row short, too few bytes a row
    with pytest.raises(nearrec.InvalidRequest, match="'t1'.*does not hold 150 rows") as e:
        _quantized_rows(weight[:-1], config, "t1")
    assert e.value.table == "t1"
    with pytest.raises(nearrec.InvalidRequest, match="'t1'.*does not hold"):
        _quantized_rows(weight[:, :5], config, "t1")
    bad = weight.clone()
    bad[7, :2] = torch.tensor([0x00, 0x7C], dtype=torch.uint8)  # fp16 +inf scale
    with pytest.raises(nearrec.InvalidRequest, match="row 7") as e:
        _quantized_rows(bad, config, "t1")
    assert e.value.position == 7
    # a data type nearrec does not serve, named by table
    import dataclasses

    from torchrec.modules.embedding_configs import DataType
    with pytest.raises(nearrec.InvalidRequest, match="'t1'.*BF16"):
        _quantized_rows(weight, dataclasses.replace(config, data_type=DataType.BF16), "t1")
    # pooled to fp16: refused rather than answered in another dtype
    ebc._output_dtype = torch.half
    with pytest.raises(nearrec.InvalidRequest, match="output_dtype"):
        from_torchrec(model, tmp_path / "s")
    assert not (tmp_path / "s").exists()


# ---- every tier, the live write path, bad input -----------------------------------------------

QDTYPES = ["int8", "int4", "int2", "fp8"]


@pytest.mark.parametrize("dtype", QDTYPES)
def test_a_live_store_requantises_written_rows_and_keeps_them_through_compaction(tmp_path,
                                                                                 dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((400, 32)).astype(np.float32)
    nearrec.from_numpy(tmp_path / "s", {"t": x}, dtype=dtype)
    w = nearrec.open(tmp_path / "s", writable=True, tier="ssd", dram_budget="16KiB")
    new = (rng.standard_normal((5, 32)) * 3).astype(np.float32)
    ids = np.array([3, 77, 150, 151, 399])
    w.write("t", ids, new)
    # what the row is stored as: the new values through the dtype's encoding, as the builder
    # would have written them
    nearrec.from_numpy(tmp_path / "want", {"t": new, "m": new[:, :16]}, dtype=dtype)
    want = nearrec.open(tmp_path / "want").read_rows("t", np.arange(5))
    want_made = nearrec.open(tmp_path / "want").read_rows("m", [0])
    np.testing.assert_array_equal(w.read_rows("t", ids), want)
    bags = np.array([3, 77, 150, 151, 399, 5]), np.array([0, 2])
    before = w.lookup("t", *bags)
    w.compact()
    np.testing.assert_array_equal(w.read_rows("t", ids), want)
    np.testing.assert_allclose(w.lookup("t", *bags), before, rtol=1e-6, atol=1e-6)
    w.close()
    again = nearrec.open(tmp_path / "s", tier="dram")
    np.testing.assert_array_equal(again.read_rows("t", ids), want)
    # a created table of the dtype, and one whose width the dtype cannot take
    w = nearrec.open(tmp_path / "s", writable=True)
    w.create_table("made", 50, 16, dtype, init="zeros")
    w.write("made", [4], new[:1, :16])
    assert w.tables["made"].dtype == dtype
    np.testing.assert_array_equal(w.read_rows("made", [4]), want_made)
    if dtype in ("int4", "int2"):
        with pytest.raises(nearrec.InvalidRequest, match=".odd.*dim must be"):
            w.create_table("odd", 50, 6 if dtype == "int2" else 5, dtype)


@pytest.mark.parametrize("dtype", QDTYPES)
def test_tiers_agree_on_quantised_tables(tmp_path, dtype):
    """DRAM, SSD with DRAM tiers (hot rows and a row cache) and SSD without: the same bags."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3000, 64)).astype(np.float32)
    nearrec.from_numpy(tmp_path / "s", {"t": x}, dtype=dtype)
    idx = (rng.zipf(1.2, 4000) % 3000).astype(np.int64)
    off = np.arange(0, 4000, 20)
    w = rng.random(4000).astype(np.float32)
    dram = nearrec.open(tmp_path / "s")
    for options in ({"tier": "ssd", "dram_budget": "0"},
                    {"tier": "ssd", "dram_budget": "48KiB"}):
        ssd = nearrec.open(tmp_path / "s", **options)
        for mode, weights in (("sum", w), ("mean", None), ("max", None)):
            a = ssd.lookup("t", idx, off, per_sample_weights=weights, mode=mode)
            b = dram.lookup("t", idx, off, per_sample_weights=weights, mode=mode)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_bad_quantised_input_is_refused_naming_the_table(tmp_path):
    x = np.ones((10, 6), np.float32)
    with pytest.raises(nearrec.InvalidRequest, match=".t.*int2.*multiple of 4"):
        nearrec.from_numpy(tmp_path / "a", {"t": x}, dtype="int2")
    with pytest.raises(nearrec.InvalidRequest, match=".t.*int4.*even"):
        nearrec.from_numpy(tmp_path / "a", {"t": np.ones((10, 7), np.float32)}, dtype="int4")
    bad = np.ones((10, 8), np.float32)
    bad[6, 3] = np.nan
    for dtype in QDTYPES:
        with pytest.raises(nearrec.InvalidRequest, match=".t.*row 6 value 3 is NaN"):
            nearrec.from_numpy(tmp_path / "a", {"t": bad}, dtype=dtype)
    assert not (tmp_path / "a").exists()  # nothing half-built left
    with pytest.raises(nearrec.InvalidRequest, match="dtype must be one of.*fp8"):
        nearrec.from_numpy(tmp_path / "a", {"t": x}, dtype="int3")
    # encoded rows: of no whole width, not bytes, a scale that is not finite
    with pytest.raises(nearrec.InvalidRequest, match=".t.*7-byte rows are not int8"):
        nearrec.from_encoded(tmp_path / "a", {"t": np.zeros((3, 7), np.uint8)}, dtype="int8")
    with pytest.raises(nearrec.InvalidRequest, match=".t.*uint8"):
        nearrec.from_encoded(tmp_path / "a", {"t": np.zeros((3, 12), np.float32)}, dtype="int4")
    rows = fbgemm_rows(torch.randn(5, 16), "int4")
    rows[2, -4:-2] = [0x00, 0x7C]  # the fp16 scale: +inf
    with pytest.raises(nearrec.InvalidRequest, match=".t.*row 2: scale inf"):
        nearrec.from_encoded(tmp_path / "a", {"t": rows}, dtype="int4")
    assert not (tmp_path / "a").exists()


def test_cli_builds_quantised_tables_and_reports_the_error(tmp_path):
    import json
    import subprocess
    import sys

    x = np.random.default_rng(0).standard_normal((500, 16)).astype(np.float32)
    np.save(tmp_path / "t.npy", x)
    cli = [sys.executable, "-m", "nearrec.cli"]
    out = subprocess.run([*cli, "build", str(tmp_path / "s"), "--npy", f"t={tmp_path}/t.npy",
                          "--dtype", "int4", "--json"], capture_output=True, text=True, check=True)
    err = json.loads(out.stdout)["quant_error"]["t"]
    decoded = nearrec.open(tmp_path / "s").read_rows("t", np.arange(500))
    assert err["max_abs"] == pytest.approx(float(np.abs(decoded - x).max()), rel=1e-6)
    shown = subprocess.run([*cli, "info", str(tmp_path / "s")], capture_output=True, text=True,
                           check=True).stdout
    assert "format v6" in shown and "t (int4): max |error|" in shown


@pytest.mark.parametrize("dtype", ["int8", "int4", "int2", "fp8"])
def test_means_are_fbgemms_within_one_rounding(tmp_path, dtype):
    """FBGEMM's mean multiplies the sum by 1/n where nearrec divides by n, as EmbeddingBag does:
    the same sums, then one rounding apart at most."""
    rows, dim = 300, 32
    rng = np.random.default_rng(5)
    q = fbgemm_rows(torch.from_numpy(rng.standard_normal((rows, dim)).astype(np.float32)), dtype)
    nearrec.from_encoded(tmp_path / "s", {"t": q}, dtype=dtype)
    lengths = rng.integers(1, 30, 50)
    idx = rng.integers(0, rows, int(lengths.sum()))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    got = nearrec.open(tmp_path / "s").lookup("t", idx, offsets[:-1], mode="mean")
    tbe = int_nbit_tbe([q], [dim], dtype, "mean")
    want = tbe(torch.from_numpy(idx).int(), torch.from_numpy(offsets).int()).numpy()
    ulp = np.spacing(np.abs(want).astype(np.float32))
    assert (np.abs(got - want) <= ulp).all()


@pytest.mark.parametrize("dtype", ["int4", "fp8"])
def test_the_gpu_tier_serves_quantised_tables(tmp_path, dtype):
    """The GPU tier (its reference kernels, on the CPU) over a quantised store: it caches the
    rows as the store decodes them and pools as EmbeddingBag over those rows."""
    import gpu_checks

    rng = np.random.default_rng(3)
    arrays = {"a": rng.standard_normal((300, 16)).astype(np.float32),
              "b": rng.standard_normal((200, 8)).astype(np.float32)}
    nearrec.from_numpy(tmp_path / "s", arrays, dtype=dtype)
    store = nearrec.open(tmp_path / "s")
    decoded = {n: store.read_rows(n, np.arange(a.shape[0])) for n, a in arrays.items()}
    assert any((decoded[n] != arrays[n]).any() for n in arrays)  # the rows are lossy
    gpu_checks.check_tier_matches_embedding_bag(store, decoded, "cpu", "reference", "lfu",
                                                "async_copy", "off")
