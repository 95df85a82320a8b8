"""Real-data loaders on small files written here (and on MovieLens-100K itself when the recbole
wheel was downloaded by `make`): values land in the right tables, ids stay in range, the traces
save, load and serve, and malformed input names its file and line."""

from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import nearrec
import nearrec.trace as nt
from nearrec.datasets import CRITEO_KAGGLE_ROWS, criteo, fbgemm_file, movielens_100k

RECBOLE = Path(__file__).parents[1] / ".cache" / "datasets" / "recbole-1.2.1-py3-none-any.whl"


def criteo_lines(n: int, seed: int = 0) -> tuple[list[str], list[list[str]]]:
    rng = np.random.default_rng(seed)
    vocab = [f"{v:08x}" for v in rng.integers(0, 2**32, 40)]
    lines, cats = [], []
    for _ in range(n):
        c = ["" if rng.random() < 0.1 else vocab[int(rng.integers(0, 40))] for _ in range(26)]
        dense = ["" if rng.random() < 0.2 else str(int(rng.integers(-2, 500))) for _ in range(13)]
        lines.append("\t".join([str(int(rng.integers(0, 2))), *dense, *c]))
        cats.append(c)
    return lines, cats


@pytest.mark.parametrize("gz", [False, True])
def test_criteo_hashing_and_dictionary(tmp_path, gz):
    lines, cats = criteo_lines(300)
    path = tmp_path / ("day.tsv.gz" if gz else "day.tsv")
    text = "\n".join(lines) + "\n"
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    log = criteo(path, chunk=64)
    assert log.trace.bags == 300 and list(log.trace) == [f"C{i}" for i in range(1, 27)]
    assert log.dense.shape == (300, 13) and log.labels.shape == (300,)
    assert log.labels[0] == int(lines[0].split("\t")[0])
    first = lines[0].split("\t")
    assert log.dense[0].tolist() == [float(x) if x else 0.0 for x in first[1:14]]
    for t in (0, 2, 25):
        tt = log.trace[f"C{t + 1}"]
        assert tt.rows == CRITEO_KAGGLE_ROWS[t] and tt.pooling == 1
        want = [int(c[t], 16) % CRITEO_KAGGLE_ROWS[t] if c[t] else 0 for c in cats]
        np.testing.assert_array_equal(tt.indices, want)
    # a dictionary numbers categories by first appearance; 0 is "missing"
    d = criteo(path, rows=None, samples=120)
    assert d.trace.bags == 120
    c1 = [c[0] for c in cats[:120]]
    ids = {"": 0}
    for c in c1:
        ids.setdefault(c, len(ids))
    np.testing.assert_array_equal(d.trace["C1"].indices, [ids[c] for c in c1])
    assert d.trace["C1"].rows == len(ids)
    # small hash sizes, then through a store: every id in range, pools like nn.EmbeddingBag
    small = criteo(path, rows=50, samples=64)
    saved = small.trace.save(tmp_path / "c.nrtrace")
    assert nt.load(saved.path)["C7"].indices.tolist() == small.trace["C7"].indices.tolist()
    rng = np.random.default_rng(1)
    weights = {n: rng.standard_normal((50, 4), np.float32) for n in small.trace}
    nearrec.from_numpy(tmp_path / "s", weights)
    out = nearrec.open(tmp_path / "s").lookup_many(small.trace.batch(0, 64))
    bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(weights["C3"]), mode="sum")
    want = bag(torch.from_numpy(small.trace["C3"].indices), torch.arange(64)).numpy()
    np.testing.assert_allclose(out["C3"], want, rtol=1e-6)


def test_criteo_malformed_lines_are_named(tmp_path):
    lines, _ = criteo_lines(5)
    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join([*lines[:3], "1\t2\t3"]) + "\n")
    with pytest.raises(nearrec.InvalidTrace, match="line 4: 3 fields"):
        criteo(bad)
    fields = lines[0].split("\t")
    fields[20] = "zz-not-hex"
    bad.write_text("\n".join([lines[1], "\t".join(fields)]) + "\n")
    with pytest.raises(nearrec.InvalidTrace, match="line 2"):
        criteo(bad)
    with pytest.raises(nearrec.InvalidTrace, match="26 positive hash sizes"):
        criteo(bad, rows=[10, 20])


def test_fbgemm_file_round_trip(tmp_path):
    tr = nt.generate({"a": 500, "b": 80}, 32, 6, nt.Generator.zipf(1.0), seed=3)
    indices, offsets, lengths = tr.to_fbgemm()
    path = tmp_path / "t.pt"
    torch.save((torch.from_numpy(indices), torch.from_numpy(offsets),
                torch.from_numpy(lengths).reshape(2, 32)), path)
    got = fbgemm_file(path, names=["a", "b"])
    assert got.batch_size == 32 and got.bags == 32
    for n in ("a", "b"):
        np.testing.assert_array_equal(got[n].indices, tr[n].indices)
        np.testing.assert_array_equal(got[n].offsets, tr[n].offsets)
        assert got[n].rows == int(tr[n].indices.max()) + 1
    assert fbgemm_file(path, rows=[500, 80])["t0"].rows == 500
    torch.save((torch.from_numpy(indices), torch.from_numpy(offsets)[:-1],
                torch.from_numpy(lengths).reshape(2, 32)), path)
    with pytest.raises(nearrec.InvalidTrace, match="do not describe"):
        fbgemm_file(path)


def test_movielens_from_a_ratings_file(tmp_path):
    # user item rating timestamp, out of time order
    (tmp_path / "u.data").write_text("7\t100\t3\t30\n7\t200\t4\t10\n9\t100\t5\t20\n"
                                     "7\t300\t1\t40\n")
    tr = movielens_100k(tmp_path, history=2)
    # in time order: (7,200) (9,100) (7,100) (7,300)
    assert tr["user"].indices.tolist() == [0, 1, 0, 0]
    assert tr["item"].indices.tolist() == [0, 1, 1, 2]
    h = tr["history"]
    assert [h.indices[h.offsets[k]:h.offsets[k + 1]].tolist() for k in range(4)] == \
        [[], [], [0], [0, 1]]
    assert (tr["user"].rows, tr["item"].rows) == (2, 3)
    (tmp_path / "u.data").write_text("7\t100\n")
    with pytest.raises(nearrec.InvalidTrace, match="rating 1 has 2 fields"):
        movielens_100k(tmp_path)


def test_cli_imports(tmp_path):
    lines, _ = criteo_lines(40)
    (tmp_path / "d.tsv").write_text("\n".join(lines) + "\n")
    cli = [sys.executable, "-m", "nearrec.cli", "trace", "import"]
    subprocess.run([*cli, "criteo", str(tmp_path / "d.tsv"), str(tmp_path / "c.nrtrace"),
                    "--hash-rows", "100", "--samples", "30"], check=True, capture_output=True)
    tr = nt.load(tmp_path / "c.nrtrace")
    assert tr.bags == 30 and tr["C1"].rows == 100
    (tmp_path / "u.data").write_text("1\t5\t3\t10\n2\t5\t4\t20\n")
    subprocess.run([*cli, "movielens", str(tmp_path / "u.data"), str(tmp_path / "m.nrtrace")],
                   check=True, capture_output=True)
    assert nt.load(tmp_path / "m.nrtrace")["item"].indices.tolist() == [0, 0]


@pytest.mark.skipif(not RECBOLE.exists(), reason="the recbole wheel was not downloaded")
def test_movielens_100k_itself():
    tr = movielens_100k(RECBOLE)
    assert tr.bags == 100_000
    assert (tr["user"].rows, tr["item"].rows) == (943, 1682)
    assert int(tr["history"].indices.max()) < 1682
    p = tr["item"].profile()
    # popular items: an LRU cache of a tenth of the items hits about 21 % (a uniform draw: 10 %)
    assert 0.15 < p.lru_hit_ratio(168) < 0.3
