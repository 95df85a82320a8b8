"""Whole-model offload (RM-SSD): the engine runs each supported model's dense layers next to the
embeddings and its outputs equal the PyTorch model's, on the DRAM tier and the SSD tier; the
pipeline and the stored model work through it; what it cannot run is a typed error."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import nearrec
from nearrec.models import OFFLOADABLE, build, infer, offload, save
from nearrec.torch import KeyedJaggedTensor

ROWS = 300


def batch_of(store: nearrec.Store, name: str, batch: int, seed: int) -> tuple[torch.Tensor | None,
                                                                             KeyedJaggedTensor]:
    spec = nearrec.model_spec(name)
    rng = np.random.default_rng(seed)
    tables = list(store.tables)
    lengths = rng.integers(0, spec.lookups + 2, batch * len(tables))
    lengths[0] = 0  # an empty bag
    values = rng.integers(0, ROWS, int(lengths.sum()))
    kjt = KeyedJaggedTensor(tables, torch.from_numpy(values), torch.from_numpy(lengths))
    dense = torch.from_numpy(rng.standard_normal((batch, spec.dense_features), dtype=np.float32)) \
        if spec.dense_features else None
    return dense, kjt


# every offloadable model, plus DLRM's dot interaction and MTWND with several heads
CASES = [(n, {}) for n in OFFLOADABLE] + [
    ("rmc1", {"interaction": "dot"}), ("rmc2", {"interaction": "dot"}),
    ("rmc3", {"interaction": "dot"}), ("mtwnd", {"tasks": 3})]


@pytest.mark.parametrize(("name", "options"), CASES,
                         ids=[f"{n}-{'-'.join(map(str, o.values())) or 'default'}"
                              for n, o in CASES])
@pytest.mark.parametrize("tier", ["dram", "ssd"])
def test_offload_equals_the_pytorch_model(tmp_path, name, options, tier):
    path = tmp_path / name
    nearrec.build(path, name, rows=ROWS, seed=1, progress=False)
    # on SSD with a budget for some tables: tables finish on both paths
    store = nearrec.open(path, tier=tier, dram_budget="256KiB" if tier == "ssd" else None)
    model = build(name, store, seed=3, **options)
    off = offload(model)
    for batch, seed in ((1, 0), (5, 1), (64, 2)):
        dense, kjt = batch_of(store, name, batch, seed)
        with torch.inference_mode():
            want = model(dense, kjt)
        got = off(dense, kjt)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-6)
        # the KeyedJaggedTensor is read in one native call; the same batch given as the
        # collection's TableLookups (in any order) takes the other path to the same outputs
        # (on SSD, the first layer sums the tables' shares as their rows land: not bit-equal)
        lookups = model.sparse.lookups(kjt)
        torch.testing.assert_close(off(dense, lookups[::-1]), got, rtol=1e-5, atol=1e-7)
        times = off.last_times
        assert set(times) == {"total", "embeddings", "dense", "blocks", "finish", "route",
                              "io_wait", "pool"}
        assert 0 < times["embeddings"] <= times["total"]
        assert 0 < times["route"] + times["io_wait"] + times["pool"] <= times["embeddings"]


def test_the_stored_model_runs_through_store_infer(tmp_path):
    path = tmp_path / "rmc1"
    nearrec.build(path, "rmc1", rows=ROWS, seed=1, progress=False)
    model = build("rmc1", nearrec.open(path), seed=9, interaction="dot")
    save(model, path)
    store = nearrec.open(path, tier="ssd")
    dense, kjt = batch_of(store, "rmc1", 7, 4)
    with torch.inference_mode():
        want = model(dense, kjt).numpy()
    np.testing.assert_allclose(store.infer(dense, kjt), want, rtol=1e-4, atol=2e-6)
    # the same from TableLookups, in the model's order
    lookups = model.sparse.lookups(kjt)
    np.testing.assert_allclose(store.infer(dense.numpy(), lookups), want, rtol=1e-4, atol=2e-6)
    # another model given explicitly
    other = build("rmc1", store, seed=10)
    with torch.inference_mode():
        np.testing.assert_allclose(store.infer(dense, kjt, model=other), other(dense, kjt).numpy(),
                                   rtol=1e-4, atol=2e-6)


@pytest.mark.parametrize("tier", ["dram", "ssd"])
def test_pipelined_offload_equals_forward(tmp_path, tier):
    path = tmp_path / "rmc3"
    nearrec.build(path, "rmc3", rows=ROWS, seed=2, progress=False)
    store = nearrec.open(path, tier=tier)
    model = build("rmc3", store, seed=1)
    off = offload(model)
    batches = [batch_of(store, "rmc3", 16, s) for s in range(5)]
    with torch.inference_mode():
        want = [model(d, f) for d, f in batches]
    for depth, sub in ((0, None), (2, None), (2, 5)):
        res = infer(off, batches, depth=depth, sub_batch=sub)
        assert res.samples == 80 and len(res.outputs) == 5
        for got, w in zip(res.outputs, want, strict=True):
            torch.testing.assert_close(got, w, rtol=1e-4, atol=2e-6)
        assert {"embedding_wait", "engine.embeddings", "engine.dense", "engine.blocks",
                "engine.finish", "engine.route", "engine.io_wait",
                "engine.pool"} == set(res.breakdown)
        assert res.breakdown["engine.dense"] > 0
        parts = 5 if sub is None else 5 * 4  # 16 samples in parts of 5, 5, 5, 1
        assert len(res.latencies) == len(res.finished) == parts
        assert all(x > 0 for x in res.latencies) and res.finished == sorted(res.finished)


def test_what_offload_cannot_run_is_a_typed_error(tmp_path):
    path = tmp_path / "rmc1"
    nearrec.build(path, "rmc1", rows=ROWS, seed=1, progress=False)
    store = nearrec.open(path)
    off = offload(build("rmc1", store))
    dense, kjt = batch_of(store, "rmc1", 4, 0)
    with pytest.raises(nearrec.InvalidRequest, match="128 per sample"):
        off(dense[:, :100], kjt)
    with pytest.raises(nearrec.InvalidRequest, match="needs dense features"):
        off(None, kjt)
    for features in (42, {"t0": [1]}):
        with pytest.raises(nearrec.InvalidRequest):
            off(dense, features)
    bad = KeyedJaggedTensor(kjt.keys(), kjt.values().clone(), kjt.lengths())
    bad.values()[-1] = ROWS  # the last value belongs to the last table, t7
    with pytest.raises(nearrec.IndexOutOfRange) as err:
        off(dense, bad)
    assert err.value.table == "t7"
    for name in ("din", "dien"):
        p = tmp_path / name
        nearrec.build(p, name, rows=40, seed=1, progress=False)
        with pytest.raises(nearrec.InvalidRequest, match="DIN and DIEN"):
            offload(build(name, nearrec.open(p)))
    # the engine builds an offloaded model by the rules it reads a kept one by
    from_config, f32 = nearrec._native.NativeModel.from_config, np.float32
    ncf = json.dumps({"model": "ncf", "tables": ["t0", "t1", "t2", "t3"]})
    with pytest.raises(nearrec.InvalidRequest, match=r"ncf: mlp.0.bias has shape \[5\], not \[4\]"):
        from_config(ncf, [("mlp.0.weight", np.zeros((4, 16), f32)),
                          ("mlp.0.bias", np.zeros(5, f32)),
                          ("predict.0.weight", np.zeros((1, 12), f32))], [8] * 4)
    with pytest.raises(nearrec.InvalidRequest, match="no layers predict.N.weight"):
        from_config(ncf, [("mlp.0.weight", np.zeros((4, 16), f32))], [8] * 4)
    gelu = {"model": "graph", "tables": ["t0"], "graph": {
        "dense": 0, "ops": [{"op": "activation", "input": [[1, 0, 8]], "activation": "gelu"}],
        "output": [[2, 0, 8]]}}
    with pytest.raises(nearrec.InvalidRequest, match="unknown activation"):
        from_config(json.dumps(gelu), [], [8])


def test_infer_command_offloads(tmp_path, capsys):
    import json

    from nearrec.cli import main

    path, tp = tmp_path / "ncf", tmp_path / "t.nrtrace"
    nearrec.build(path, "ncf", rows=ROWS, seed=1, progress=False)
    assert main(["trace", "gen", str(tp), "--store", str(path), "--bags", "64",
                 "--pooling", "1"]) == 0
    capsys.readouterr()
    assert main(["infer", str(path), str(tp), "--model", "ncf", "--batch", "16", "--tier", "ssd",
                 "--offload", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["offload"] and out["batches"] == 4 and out["tier"] == "ssd"
    for run in out["runs"].values():
        assert run["samples_per_s"] > 0 and run["breakdown_s"]["engine.blocks"] > 0
