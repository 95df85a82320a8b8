"""The command line as a new user meets it: every failure one line and a status (2 for bad
input), ``--debug`` for the traceback, Ctrl-C, a missing extra named with its install; lookups
that draw a fresh batch per repeat and say so; plans that are not overwritten by accident;
bars forced onto a pipe; ``predict`` on real inputs (an ``.npz``, Criteo TSV rows) against the
PyTorch model."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import nearrec


def run(*args: str, check: int | None = 0, **kw: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "nearrec.cli", *args], capture_output=True,
                          text=True, **kw)
    if check is not None:
        assert done.returncode == check, (args, done.returncode, done.stdout, done.stderr)
    return done


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "s"
    nearrec.build(path, "rmc1", rows=5_000, seed=1, progress=False)
    return path


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("nearrec: error: "), done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def test_failures_are_one_line_with_a_status_and_debug_shows_the_traceback(store, tmp_path):
    assert "no file" in one_line(run("lookup", str(store), "--indices", "none.npy", check=1))
    assert "dram_budget" in one_line(run("lookup", str(store), "--dram-budget", "lots",
                                         check=2)).replace("-", "_")
    # Python's words become the command line's
    line = one_line(run("build", str(store), "--rows", "10", check=1))
    assert "--overwrite" in line and "overwrite=True" not in line
    usage = one_line(run("lookup", str(store), "--dram-budgt", "1MiB", check=2))
    assert "unrecognized arguments: --dram-budgt" in usage and "--help)" in usage
    assert "invalid choice: 'lokup'" in one_line(run("lokup", str(store), check=2))
    debug = run("--debug", "lookup", str(store), "--indices", "none.npy", check=None)
    assert debug.returncode != 0 and "Traceback" in debug.stderr
    after = run("lookup", str(store), "--indices", "none.npy", "--debug", check=None)
    assert "Traceback" in after.stderr


def test_a_missing_extra_is_named_with_its_install(store, tmp_path):
    # torch made unimportable, as in an install without the extra
    code = ("import sys; sys.modules['torch'] = None; from nearrec.cli import main; "
            f"sys.exit(main(['infer', {str(store)!r}, {str(tmp_path / 'x.nrtrace')!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert one_line(done) == ("nearrec: error: nearrec infer needs torch, which is not "
                              "installed: pip install 'nearrec[torch]'")


def test_ctrl_c_ends_in_one_line_and_status_130(store):
    from conftest import sigint_default

    proc = subprocess.Popen([sys.executable, "-m", "nearrec.cli", "lookup", str(store),
                             "--repeat", "100000000"], stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_default)
    try:
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # the interrupt did not end it: not left running
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and err.strip() == "nearrec: interrupted", err


def test_lookup_draws_a_fresh_batch_per_repeat_and_says_so(store, tmp_path):
    done = run("lookup", str(store), "--tier", "ssd", "--repeat", "10", "--batch", "8",
               "--pooling", "4", "--json")
    out = json.loads(done.stdout)
    assert out["fresh_batches"] and out["batches"] == 10
    # 10 batches x 8 bags x 4 ids x 8 tables of uniform ids over 5,000 rows: nearly all
    # distinct, not one batch's 256 read ten times
    assert out["stats"]["lookups"] == 10 * 8 * 4 * 8 and out["stats"]["unique_rows"] > 2000
    text = run("lookup", str(store), "--repeat", "3").stdout
    assert "3 batches of 16 bags x 8 tables, each drawn afresh" in text
    assert "µs" in text or "ms" in text
    np.save(tmp_path / "ids.npy", np.arange(40) % 5000)
    given = run("lookup", str(store), "--indices", str(tmp_path / "ids.npy"), "--repeat", "4",
                "--pooling", "4")
    assert "the given batch (10 bags x 8 tables) 4 times" in given.stdout


def test_plan_refuses_to_overwrite_and_says_how_to_apply_it(store, tmp_path):
    trace = tmp_path / "t.nrtrace"
    run("trace", "gen", str(trace), "--store", str(store), "--bags", "500")
    out = tmp_path / "p.toml"
    first = run("plan", str(store), str(trace), "--budget", "64KiB", "--out", str(out))
    assert f"nearrec lookup {store} --plan {out} --dram-budget 64KiB" in first.stdout
    before = out.read_bytes()
    line = one_line(run("plan", str(store), str(trace), "--budget", "1MiB", "--out", str(out),
                        check=2))
    assert "--overwrite" in line and out.read_bytes() == before
    run("plan", str(store), str(trace), "--budget", "1MiB", "--out", str(out), "--overwrite")
    assert out.read_bytes() != before
    applied = json.loads(run("lookup", str(store), "--plan", str(out), "--dram-budget",
                             "1MiB", "--tier", "ssd", "--repeat", "2", "--json").stdout)
    assert applied["stats"]["dram_tier_bytes"] > 0


def test_progress_forces_bars_onto_a_pipe(tmp_path):
    done = run("build", str(tmp_path / "b"), "--rows", "20000", "--progress")
    assert "[" in done.stderr and "/" in done.stderr, done.stderr  # a bar, drawn as lines
    quiet = run("build", str(tmp_path / "c"), "--rows", "20000")
    assert "[" not in quiet.stderr


def test_predict_runs_the_stored_model_on_an_npz(store, tmp_path):
    torch = pytest.importorskip("torch")
    from nearrec import models
    from nearrec.torch import KeyedJaggedTensor
    local = nearrec.open(store)
    model = models.build("rmc1", local, seed=2)
    models.save(model, store)
    rng = np.random.default_rng(3)
    n, tables = 50, model.table_names
    lengths = {t: rng.integers(0, 5, n) for t in tables}
    arrays: dict[str, Any] = {"dense": rng.standard_normal((n, 128)).astype(np.float32)}
    for t in tables:
        arrays[t] = rng.integers(0, 5_000, int(lengths[t].sum()))
        arrays[f"{t}.lengths"] = lengths[t]
    np.savez(tmp_path / "in.npz", **arrays)
    kjt = KeyedJaggedTensor(tables, torch.from_numpy(np.concatenate([arrays[t] for t in tables])),
                            torch.from_numpy(np.concatenate([lengths[t] for t in tables])))
    with torch.inference_mode():
        want = model(torch.from_numpy(arrays["dense"]), kjt).numpy()
    done = run("predict", str(store), "--inputs", str(tmp_path / "in.npz"), "--out",
               str(tmp_path / "p.npy"), "--batch", "16", "--tier", "ssd")
    assert "rmc1 on 50 samples" in done.stdout
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), want, rtol=1e-5, atol=1e-6)
    run("predict", str(store), "--inputs", str(tmp_path / "in.npz"), "--out",
        str(tmp_path / "p.csv"))
    np.testing.assert_allclose(np.loadtxt(tmp_path / "p.csv", delimiter=",").reshape(-1, 1),
                               want, rtol=1e-5, atol=1e-6)
    del arrays[tables[3]]
    np.savez(tmp_path / "bad.npz", **arrays)
    assert "no array 't3'" in one_line(run("predict", str(store), "--inputs",
                                           str(tmp_path / "bad.npz"), "--out",
                                           str(tmp_path / "x.npy"), check=2))


def test_predict_reads_criteo_rows_for_a_torchrec_dlrm(tmp_path):
    torch = pytest.importorskip("torch")
    torchrec = pytest.importorskip("torchrec")
    from torchrec.models.dlrm import DLRM

    from nearrec import models
    from nearrec.torch import from_torchrec
    torch.manual_seed(1)
    rows = [50 + 7 * i for i in range(26)]
    tables = [torchrec.EmbeddingBagConfig(name=f"c{i}", embedding_dim=4, num_embeddings=r,
                                          feature_names=[f"C{i + 1}"])
              for i, r in enumerate(rows)]
    model = DLRM(embedding_bag_collection=torchrec.EmbeddingBagCollection(tables=tables),
                 dense_in_features=13, dense_arch_layer_sizes=[8, 4],
                 over_arch_layer_sizes=[8, 1]).eval()
    models.save(from_torchrec(model, tmp_path / "dlrm"), tmp_path / "dlrm")
    rng = np.random.default_rng(5)
    lines, dense, ids = [], [], []
    for _ in range(20):
        d = rng.integers(-2, 1000, 13)
        d[rng.random(13) < 0.2] = 0
        cats = [f"{x:08x}" for x in rng.integers(0, 2**32, 26)]
        lines.append("\t".join(["1", *(str(x) if x else "" for x in d), *cats]))
        dense.append(np.log1p(np.maximum(d, 0)))
        ids.append([int(c, 16) % r for c, r in zip(cats, rows, strict=True)])
    (tmp_path / "day.tsv").write_text("\n".join(lines) + "\n")
    run("predict", str(tmp_path / "dlrm"), "--inputs", str(tmp_path / "day.tsv"), "--out",
        str(tmp_path / "p.npy"))
    ids_t = torch.tensor(ids).T.reshape(-1)
    kjt = torchrec.KeyedJaggedTensor(keys=[f"C{i + 1}" for i in range(26)], values=ids_t,
                                     lengths=torch.ones(26 * 20, dtype=torch.int64))
    with torch.inference_mode():
        want = model(torch.tensor(np.array(dense), dtype=torch.float32), kjt).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), want, rtol=1e-4, atol=1e-5)


def test_every_flag_says_what_it_does_and_its_default_and_every_verb_shows_an_example():
    """``--help`` as a new user reads it: no flag without a text, each default shown (set by
    the flag or, for the store settings, Rust's StoreConfig's), one example per verb that the
    parser itself accepts."""
    import argparse
    import shlex

    from nearrec.cli import EXAMPLES, parser

    p = parser()
    verbs = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(EXAMPLES) == set(verbs)
    for verb, sp in verbs.items():
        text = sp.format_help()
        assert f"example:\n  {EXAMPLES[verb]}" in text, verb
        p.parse_args(shlex.split(EXAMPLES[verb])[1:])  # the example is one the parser takes
        for a in sp._actions:
            if isinstance(a, argparse._HelpAction) or a.help == argparse.SUPPRESS:
                continue
            name = a.option_strings[0] if a.option_strings else a.dest
            assert a.help, f"nearrec {verb} {name} has no help"
            shown = sp._get_formatter()._get_help_string(a) or ""
            if a.option_strings and a.default not in (None, False, [], argparse.SUPPRESS):
                assert "default" in shown, f"nearrec {verb} {name} does not show its default"
    d = nearrec.StoreConfig()
    lookup = verbs["lookup"].format_help()
    assert f"(default: {d.io_queue_depth})" in lookup and "(default: 16)" in lookup


def test_info_keeps_its_columns_under_long_table_names(tmp_path):
    long = "sparse_arch.embedding_bag_collection.t_user_history"
    nearrec.from_numpy(tmp_path / "s", {long: np.zeros((3, 4), np.float32),
                                        "t": np.zeros((5, 4), np.float32)})
    lines = run("info", str(tmp_path / "s")).stdout.splitlines()
    header = next(line for line in lines if line.startswith("table"))
    rows = [line for line in lines if line.startswith((long, "t "))]
    assert len(rows) == 2
    # every row's columns start where the header's do
    at = header.index("rows") + len("rows")
    assert all(row[:at].rstrip().endswith(("3", "5")) for row in rows), lines
