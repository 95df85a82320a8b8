"""The benchmark harnesses are a distribution of their own (`bench/`, `nearrec_bench`): the
product's extension does not carry their baselines, and `nearrec bench` without them says how to
get them instead of failing with a traceback."""

from __future__ import annotations

import sys

import numpy as np
import pytest

import nearrec
import nearrec.cli

BASELINES = ["stream_read", "gather_rows", "sequential_write", "random_read", "naive_sls",
             "MappedStore"]


def test_the_baselines_live_in_the_bench_extension_only():
    import nearrec_bench._native as bench_native

    for name in BASELINES:
        assert hasattr(bench_native, name), name
        assert not hasattr(nearrec._native, name), name
    # the disk probe that calibration needs stayed in the product
    assert hasattr(nearrec._native, "disk_read_rate")


@pytest.mark.parametrize("missing", ["nearrec_bench", "nearrec_bench._native"])
def test_bench_without_the_bench_package_says_how_to_get_it(monkeypatch, capsys, missing):
    for name in list(sys.modules):
        if name == "nearrec_bench" or name.startswith("nearrec_bench."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, missing, None)  # an import of it fails
    assert nearrec.cli.main(["bench", "sls", "--quick", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "make develop" in err and "pip install ./bench" in err, err


def test_a_ratio_whose_rounds_spread_too_far_is_marked_not_given():
    """`bench sls --quick` once printed ×287 against torch because torch's rounds had one
    900-samples/s outlier: such a cell now says it is unreliable."""
    from nearrec_bench.report import SPREAD_LIMIT, Record, ratio_text, sls_markdown, summarise

    def rec(system: str, rounds: list[float]) -> Record:
        return Record("sls", "rmc1", 64, "uniform", system, float(np.median(rounds)), 0.0,
                      extra={"rounds_samples_per_s": rounds, "useful_bytes_per_s": 0.0})

    steady, noisy = [1000.0, 1010.0, 990.0, 1005.0, 995.0], [900.0, 260_000.0, 250_000.0]
    ours, torch_ = rec("nearrec", steady), rec("torch.EmbeddingBag", [800.0, 810.0, 790.0])
    assert ratio_text(ours, torch_) == "1.25"
    wild = rec("torch.EmbeddingBag", noisy)
    assert ratio_text(ours, wild).startswith("unreliable (±")
    records = [ours, wild]
    summarise(records)
    assert ours.extra["unreliable_vs_torch.EmbeddingBag"] is True
    md = sls_markdown(records, "nearrec bench sls --quick")
    assert "unreliable" in md and f"±{100 * SPREAD_LIMIT:.0f} %" in md


def test_quick_benchmarks_write_under_the_scratch_folder(monkeypatch, tmp_path):
    import nearrec_bench.cli

    seen = {}

    def fake_run(args, command):
        seen["out"] = args.out
        return tmp_path / "x.json", tmp_path / "x.md", ""

    monkeypatch.setattr(nearrec_bench.cli, "run", fake_run)
    nearrec.cli.main(["bench", "sls", "--quick"])
    assert seen["out"] == "bench/scratch/quick"
    nearrec.cli.main(["bench", "sls"])
    assert seen["out"] == "bench/results"
