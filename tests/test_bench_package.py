"""The benchmark harnesses are a distribution of their own (`bench/`, `nearrec_bench`): the
product's extension does not carry their baselines, and `nearrec bench` without them says how to
get them instead of failing with a traceback."""

from __future__ import annotations

import sys

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
