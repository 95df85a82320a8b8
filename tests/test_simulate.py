"""The flash device model from Python: simulations of every design, sweeps, plots and the CLI;
a store opened on a simulated drive pools exactly what the disk-backed and DRAM tiers pool and
against ``torch.nn.EmbeddingBag``; bad configurations are typed errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import TABLES, make_store

import nearrec
from nearrec import simulate as sim


def quick(**kw):
    args = {"batch": 2, "batches": 3, "warmup": 3, "rows": 20_000}
    args.update(kw)
    return args


@pytest.mark.parametrize("model", sorted(nearrec.MODELS))
def test_every_design_runs_every_model(model):
    dev = sim.device("rm-ssd", host__dram_bytes=1 << 20)
    seen = {}
    for mode in sim.MODES + sim.EMB_SSD_VARIANTS:
        r = sim.run(model, dev, mode, **quick())
        assert r["samples"] == 6 and r["lookups"] > 0, mode
        assert r["latency_p99_ms"] >= r["latency_p50_ms"] > 0, mode
        assert r["throughput"] > 0 and r["link_bytes"] >= r["link_read_bytes"] > 0, mode
        seen[mode] = r
    # vector-grained reads move exactly the rows; page reads move whole pages
    assert seen["emb-vectorsum"]["read_amplification"] == pytest.approx(1.0)
    assert seen["emb-pagesum"]["read_amplification"] > 1.0
    # RM-SSD sends back one CTR per sample (at least one 64-byte MMIO word)
    assert seen["rm-ssd"]["link_read_bytes"] == 3 * max(64, 4 * 2)
    assert seen["rm-ssd"]["kernels"] and seen["ssd-s"]["kernels"] is None


def test_sweeps_vary_what_they_name_and_plot(tmp_path):
    reps = sim.sweep(["rmc1"], "cosmos-plus", ["emb-vectorsum", "recssd"],
                     over={"pooling": [10, 40], "k": [0.0, 2.0]}, **quick())
    assert len(reps) == 2 * 2 * 2
    for r in reps:
        assert r["lookups"] == r["pooling"] * r["samples"] * r["tables"]
    vs = {(r["pooling"], r["k"]): r for r in reps if r["mode"] == "emb-vectorsum"}
    assert vs[(40, 0.0)]["embed_ms"] > vs[(10, 0.0)]["embed_ms"], "more lookups take longer"
    rec = {r["k"]: r for r in reps if r["mode"] == "recssd" and r["pooling"] == 40}
    assert rec[2.0]["flash_reads"] > rec[0.0]["flash_reads"], "less locality, more reads"
    png = sim.plot(reps, "pooling", "throughput", tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    red = sim.sweep(["rmc2"], "rm-ssd", ["ssd-s", "emb-vectorsum", "rm-ssd"],
                    over={"batch": [1, 2]}, **{k: v for k, v in quick().items() if k != "batch"})
    by = {(r["mode"], r["batch"]): r for r in red}
    for b in (1, 2):
        assert by[("ssd-s", b)]["traffic_reduction"] == 1.0
        # RM-SSD returns a 64-byte word per batch where VectorSum returns 32 × 64 floats a sample
        assert by[("rm-ssd", b)]["traffic_reduction"] > 100 * by[("emb-vectorsum", b)][
            "traffic_reduction"] > 100
    dims = sim.sweep(["rmc1"], "rm-ssd", ["emb-vectorsum"], over={"dim": [16, 64],
                                                                   "tables": [2, 4]}, **quick())
    assert [(r["dim"], r["tables"]) for r in dims] == [(16, 2), (16, 4), (64, 2), (64, 4)]
    # a row's dtype sets its bytes: int8 rows (dim + 8 bytes) move a quarter-ish of fp32's
    # through vector-grained reads, and the report says which it ran
    by_dtype = {r["dtype"]: r for r in sim.sweep(
        ["rmc1"], "rm-ssd", ["emb-vectorsum"], over={"dtype": ["fp32", "int8"]}, **quick())}
    assert by_dtype["int8"]["useful_bytes"] * 128 == by_dtype["fp32"]["useful_bytes"] * 40
    assert by_dtype["int8"]["channel_bytes"] < by_dtype["fp32"]["channel_bytes"]


def test_bad_configurations_are_typed_errors(tmp_path):
    with pytest.raises(nearrec.InvalidRequest, match="no field"):
        sim.device("rm-ssd", host__dram=1)
    with pytest.raises(nearrec.InvalidRequest, match="takes a int"):
        sim.device("rm-ssd", host__dram_bytes="lots")
    with pytest.raises(nearrec.InvalidRequest, match="unknown mode"):
        sim.run("rmc1", "rm-ssd", "ssd-x", **quick())
    with pytest.raises(nearrec.InvalidRequest, match="page size"):
        sim.run("rmc1", sim.device("rm-ssd", flash__page_bytes=3000), "rm-ssd", **quick())
    with pytest.raises(nearrec.InvalidRequest, match='unknown dtype "fp4"; expected one of'):
        sim.run("rmc1", "rm-ssd", "rm-ssd", dtype="fp4", **quick())
    with pytest.raises(nearrec.InvalidRequest, match="cannot sweep"):
        sim.sweep(["rmc1"], over={"colour": [1]})
    with pytest.raises(nearrec.InvalidRequest, match="no device"):
        sim.device(tmp_path / "missing.json")
    # a parameter file round-trips
    f = tmp_path / "d.json"
    f.write_text(json.dumps(sim.device("cosmos-plus", flash__channels=2)))
    assert sim.device(f)["flash"]["channels"] == 2


def test_a_store_on_a_simulated_drive_pools_like_the_disk_and_embeddingbag(tmp_path):
    path, arrays = make_store(tmp_path)
    dram = nearrec.open(path, tier="dram")
    disk = nearrec.open(path, tier="ssd")
    drive = nearrec.open(path, tier="ssd", device="rm-ssd")
    assert disk.flash_stats() is None
    rng = np.random.default_rng(3)
    for name, rows, _dim, dtype in TABLES:
        idx = rng.integers(0, rows, 64)
        offsets = np.arange(0, 64, 4)
        want = dram.lookup(name, idx, offsets)
        got = drive.lookup(name, idx, offsets)
        np.testing.assert_allclose(got, disk.lookup(name, idx, offsets), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        if dtype == "fp32":
            bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(arrays[name]),
                                                        mode="sum")
            ref = bag(torch.from_numpy(idx), torch.from_numpy(offsets)).numpy()
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    st = drive.flash_stats()
    assert st is not None and st["batches"] == len(TABLES)
    assert st["flash_reads"] > 0 and st["busy_ns"] == sum(st["batch_ns"]) > 0
    with pytest.raises(nearrec.IndexOutOfRange):
        drive.lookup(TABLES[0][0], np.array([0, 10**6]), np.array([0]))


def test_calibration_fits_no_worse_than_the_preset(tmp_path):
    path, _ = make_store(tmp_path)
    files = sorted(str(p) for p in path.glob("table-*.nrt"))
    fitted, points = sim.calibrate(files, depths=(1, 8, 32), reads=2_000)
    assert fitted["name"] == "this-disk"

    def error(dev):  # what the fit minimises: squared log error of the rates
        return sum(math.log(sim.read_rate(dev, p["queue_depth"]) / p["reads_per_s"]) ** 2
                   for p in points)

    assert error(fitted) <= error("this-disk") + 1e-9
    assert all(p["predicted_reads_per_s"] > 0 for p in points)


def test_the_simulate_command(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    cmd = [sys.executable, "-m", "nearrec.cli", "simulate", "--model", "rmc3",
           "--mode", "emb-vectorsum,rm-ssd", "--batch", "1,4", "--rows", "20000",
           "--batches", "2", "--warmup", "2", "--set", "host.dram_bytes=1MiB",
           "--out-json", str(out), "--png", str(png), "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    printed = json.loads(res.stdout)
    assert [(r["mode"], r["batch"]) for r in printed] == [
        ("emb-vectorsum", 1), ("emb-vectorsum", 4), ("rm-ssd", 1), ("rm-ssd", 4)]
    saved = json.loads(out.read_text())
    assert saved["device"]["host"]["dram_bytes"] == 1 << 20
    assert png.exists()
    bad = subprocess.run(cmd[:4] + ["--device", "optane"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no device" in bad.stderr


def test_plots_draw_a_line_per_design_and_swept_value_and_say_what_has_no_effect():
    """A sweep over batch and K: a design that K changes gets a line per K (no zig-zag through
    both); a design K does not change gets one line that says so."""
    from nearrec.simulate import plot_lines

    reports = []
    for k in (0, 1, 2):
        for batch in (1, 4, 16):
            reports.append({"model": "rmc1", "mode": "recssd", "batch": batch, "k": k,
                            "throughput": 100.0 * batch / (1 + k)})
            reports.append({"model": "rmc1", "mode": "rm-ssd", "batch": batch, "k": k,
                            "throughput": 300.0 * batch})
    lines = plot_lines(reports, "batch", "throughput")
    labels = [label for _, _, label, _ in lines]
    assert labels == ["recssd, k=0", "recssd, k=1", "recssd, k=2", "rm-ssd (k: no effect)"]
    for *_, pts in lines:
        assert [p[0] for p in pts] == [1, 4, 16]  # each line one K, in batch order
    assert [p[1] for p in lines[1][3]] == [50.0, 200.0, 800.0]
    # a design on top of another says so
    reports += [{**r, "mode": "emb-ssd", "throughput": r["throughput"] * 1.001}
                for r in reports if r["mode"] == "rm-ssd"]
    labels = [label for _, _, label, _ in plot_lines(reports, "batch", "throughput")]
    assert labels[-1] == "emb-ssd (k: no effect) (≈ rm-ssd (k: no effect))"
