"""The benchmark harnesses are a distribution of their own (`bench/`, `nearrec_bench`): the
product's extension does not carry their baselines, and `nearrec bench` without them says how to
get them instead of failing with a traceback."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

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


def test_a_harness_takes_only_its_own_flags(capsys):
    with pytest.raises(SystemExit) as e:
        nearrec.cli.main(["bench", "sls", "--budgets", "0.25", "--quick"])  # cache's flag
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--budgets" in err and "nearrec bench sls --help" in err, err
    with pytest.raises(SystemExit) as e:
        nearrec.cli.main(["bench", "sls", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: nearrec bench sls"), out
    for flag in ("--models", "--rows", "--quick", "--out", "--scratch", "--json", "--debug"):
        assert flag in out, flag
    assert "--budgets" not in out and "--table-bytes" not in out, out


def test_every_harness_declares_flags_its_config_has(tmp_path):
    from nearrec_bench.cli import FLAGS, MODULES, configure, harness, parse

    bench = next(a for a in nearrec.cli.parser()._subparsers._group_actions
                 if a.dest == "command").choices["bench"]
    assert set(next(a for a in bench._actions if a.dest == "what").choices) == set(MODULES)
    for what in MODULES:
        h = harness(what)
        for cfg in (h.config(), h.quick()):
            for flag, name in h.flags.items():
                assert flag in FLAGS and hasattr(cfg, name), (what, flag, name)
            assert not h.progress or hasattr(cfg, "progress_file"), what
        assert configure(h, parse(what, ["--quick", "--out", str(tmp_path)])) is not None


def test_the_flags_set_the_config(tmp_path):
    from nearrec_bench.cli import configure, harness, parse

    def cfg(what, *argv):
        return configure(harness(what), parse(what, [*argv, "--out", str(tmp_path / what)]))

    c = cfg("cache", "--quick", "--budgets", "0.25,0.06", "--traces", "k1", "--batches", "1,64",
            "--table-bytes", "64MiB", "--scratch", "s")
    assert (c.budgets, c.traces, c.batches, c.table_bytes) == ((0.25, 0.06), ("k1",), (1, 64),
                                                               64 << 20)
    assert c.scratch == Path("s") and c.progress_file == tmp_path / "cache" / "cache-progress.jsonl"
    assert cfg("colocate", "--budgets", "0,0.25").drams == (0.0, 0.25)
    e = cfg("e2e", "--no-recssd", "--places", "dram", "--models", "rmc1")
    assert (e.recssd, e.places, e.models) == (False, ("dram",), ("rmc1",))
    assert cfg("e2e").recssd is True
    assert cfg("ssd-cost").table_bytes == 1 << 30 and cfg("ssd").table_bytes == 16 << 30
    assert (cfg("ssd-cost", "--quick").rounds, cfg("ssd-cost", "--table-bytes", "2GiB").table_bytes
            ) == (2, 2 << 30)
    assert cfg("build", "--quick").table_bytes == 1 << 30 and cfg("build").table_bytes == 4 << 30
    assert cfg("flash-repro", "--quick").out == tmp_path / "flash-repro"
    assert parse("sls", ["--quick"]).out == "bench/scratch/quick"


def test_every_harness_runs_the_same_path(monkeypatch, tmp_path):
    """Parse, configure (--quick's config, the flags on top, the progress file), run, name,
    figure, and the records written as JSON + Markdown with the command line."""
    import nearrec_bench.cli
    from nearrec_bench.harness import Harness
    from nearrec_bench.report import Record

    @dataclass
    class Config:
        rows: int = 10
        scratch: Path = Path("unset")
        progress_file: Path | None = None

        @classmethod
        def quick(cls) -> Config:
            return cls(rows=1)

    seen = {}

    def run(cfg, log):
        seen["cfg"] = cfg
        return [Record("fake", "rmc1", 1, "-", "nearrec", 1.0, 1.0)]

    def figure(records, path):
        path.write_bytes(b"png")
        return path

    fake = Harness(Config, Config.quick, {"--rows": "rows", "--scratch": "scratch"}, run,
                   lambda records, command: f"Command: `{command}`\n", progress=True,
                   figure=figure)
    monkeypatch.setattr(nearrec_bench.cli, "harness", lambda what: fake)
    args = nearrec_bench.cli.parse("serve", ["--quick", "--rows", "5", "--out", str(tmp_path)])
    js, md, text = nearrec_bench.cli.run(args, "nearrec bench serve --quick --rows 5")
    cfg = seen["cfg"]
    assert (cfg.rows, cfg.scratch) == (5, Path("bench/scratch"))
    assert cfg.progress_file == tmp_path / "serve-progress.jsonl"
    assert (js, md) == (tmp_path / "serve-quick.json", tmp_path / "serve-quick.md")
    assert "![the figures](./serve-quick.png)" in text and (tmp_path / "serve-quick.png").exists()
    assert json.loads(js.read_text())["command"] == "nearrec bench serve --quick --rows 5"
    assert md.read_text().startswith("<!-- produced by: nearrec bench serve --quick --rows 5 -->")


def test_serve_pinned_without_two_cpus_says_so_before_building_anything(tmp_path):
    from nearrec_bench import serve

    cfg = serve.pinned_quick()
    cfg.scratch = tmp_path
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mine)})
    try:
        with pytest.raises(OSError, match="CPU 0 and the system under test on CPU 1"):
            serve.run_pinned(cfg, log=lambda _: None)
    finally:
        os.sched_setaffinity(0, mine)
    assert not any(tmp_path.iterdir())
