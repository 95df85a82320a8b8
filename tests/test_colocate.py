"""Row co-location: a co-located copy pools what the original pools on every path (DRAM tier, SSD
tier with and without DRAM tiers, the SSD-S baseline), reads fewer blocks where rows read together
now share them, refuses bad input by name, and the frozen version-2 fixture keeps opening."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_pools_as_frozen

import nearrec
import nearrec.trace as nt
from nearrec.plan import COLOCATIONS, colocate, make_plan
from nearrec_bench._native import MappedStore

FIXTURES = Path(__file__).parent / "fixtures"
ROWS = {"big": 40_000, "mid": 6_000}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(11)
    path = tmp_path_factory.mktemp("colocate") / "s"
    weights = {"big": rng.standard_normal((ROWS["big"], 16), np.float32),
               "mid": rng.standard_normal((ROWS["mid"], 8), np.float32)}
    nearrec.from_numpy(path, weights, dtype={"mid": "fp16"})
    return path, weights


def zipf(bags=1200, seed=5):
    return nt.generate(ROWS, bags, 12, nt.Generator.zipf(1.1), seed=seed)


def halves(tr):
    """The trace's first half (to learn from) and second half (to measure on)."""
    h = tr.bags // 2
    head = nt.Trace({n: nt.TableTrace(n, t.rows, t.pooling, t.offsets[:h + 1],
                                      t.indices[:t.offsets[h]]) for n, t in tr.tables.items()})
    return head, h


@pytest.mark.parametrize("how", COLOCATIONS)
def test_colocated_copies_pool_like_the_original(store, tmp_path, how):
    path, weights = store
    tr = zipf()
    head, h = halves(tr)
    out = colocate(path, head, tmp_path / "c", how=how, progress=False)
    assert out.format_version == 3 and all(t.colocated for t in out.tables)
    assert out.params["colocated"]["how"] == how
    assert nearrec.info(path).format_version == 3
    plan = make_plan(nearrec.info(path), head, "200KiB")
    opened = [nearrec.open(out.path, tier="dram"), nearrec.open(out.path, tier="ssd"),
              nearrec.open(out.path, tier="ssd", plan=plan, dram_budget="200KiB")]
    # "mid" is stored as fp16: the reference pools the stored values
    stored = {"big": weights["big"], "mid": weights["mid"].astype(np.float16).astype(np.float32)}
    bags = {n: torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(w), mode="sum")
            for n, w in stored.items()}
    for start in range(h, tr.bags, 100):
        batch = tr.batch(start, min(tr.bags, start + 100))
        for s in opened:
            got = s.lookup_many(batch)
            for r in batch:
                want = bags[r.table](torch.from_numpy(np.asarray(r.indices)),
                                     torch.from_numpy(np.asarray(r.offsets))).numpy()
                np.testing.assert_allclose(got[r.table], want, rtol=1e-5, atol=1e-5)
    assert opened[2].stats()["lookups_hot"] + opened[2].stats()["lookups_cache"] > 0
    # the table read whole comes back in row order
    np.testing.assert_array_equal(opened[0].table_array("big"), weights["big"])
    # SSD-S maps row ids through the order as well
    mapped = MappedStore(str(out.path), True)
    batch = tr.batch(h, h + 50)
    got = mapped.pool([(i, np.asarray(r.indices), np.append(r.offsets, len(r.indices)))
                       for i, r in enumerate(batch)])
    np.testing.assert_allclose(got, opened[0].lookup_many(batch).values, rtol=1e-6)


def test_rows_read_together_share_reads(store, tmp_path):
    path, _ = store
    tr = zipf(bags=2000)
    head, h = halves(tr)
    moved = colocate(path, head, tmp_path / "c", how="frequency", progress=False).path

    def reads(p, merge=True):
        s = nearrec.open(p, tier="ssd", merge=merge)
        for start in range(h, tr.bags, 64):
            s.lookup_many(tr.batch(start, min(tr.bags, start + 64)))
        st = s.stats()
        return st["device_reads"], st["unique_rows"]

    (plain, rows), (together, rows2) = reads(path), reads(moved)
    assert rows == rows2  # the same rows are wanted ...
    assert together < 0.8 * plain, (together, plain)  # ... in fewer reads (held-out half)
    # without merging every distinct row is one read, wherever it sits
    assert reads(path, False)[0] == reads(moved, False)[0] == rows


def test_bad_input_is_named(store, tmp_path):
    path, _ = store
    tr = zipf(bags=50)
    with pytest.raises(nearrec.InvalidRequest, match="unknown co-location"):
        colocate(path, tr, tmp_path / "c", how="random")
    with pytest.raises(nearrec.InvalidRequest, match="no table 'nope'"):
        colocate(path, tr, tmp_path / "c", tables=["nope"])
    bad = nt.Trace({"big": nt.TableTrace("big", ROWS["big"], 2, np.array([0, 2, 4]),
                                         np.array([1, 2, 3, ROWS["big"]]))})
    with pytest.raises(nearrec.InvalidRequest, match="position 3") as e:
        colocate(path, bad, tmp_path / "c")
    assert e.value.table == "big"
    assert not (tmp_path / "c").exists()
    colocate(path, tr, tmp_path / "c", tables=["mid"], progress=False)
    with pytest.raises(nearrec.StoreExists):
        colocate(path, tr, tmp_path / "c")
    info = nearrec.info(tmp_path / "c")
    assert [t.colocated for t in info.tables] == [False, True]
    # co-locating one more table keeps the order the other already has
    again = colocate(tmp_path / "c", tr, tmp_path / "d", tables=["big"], progress=False)
    assert [t.colocated for t in again.tables] == [True, True]
    assert again.tables[1].order == info.tables[1].order


def test_cli_colocate_and_info(store, tmp_path):
    path, _ = store
    trace_path = tmp_path / "t.nrtrace"
    zipf(bags=100).save(trace_path)
    cli = [sys.executable, "-m", "nearrec.cli"]
    out = subprocess.run([*cli, "colocate", str(path), str(trace_path), str(tmp_path / "c"),
                          "--how", "first_touch", "--json"], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout)["colocated"] == ["big", "mid"]
    shown = subprocess.run([*cli, "info", str(tmp_path / "c")], capture_output=True, text=True,
                           check=True).stdout
    assert "format v3" in shown and "co-located" in shown


def test_frozen_v2_fixture_still_opens_and_pools():
    store = nearrec.open(FIXTURES / "v2")
    assert store.info.format_version == 2
    assert [t.colocated for t in store.info.tables] == [True, False, False, True]
    expected = np.load(FIXTURES / "v1_expected.npz")
    for tier, tol in (("dram", 0.0), ("ssd", 1e-5)):  # the SSD tier adds rows as they land
        s = nearrec.open(FIXTURES / "v2", tier=tier)
        for name, t in s.tables.items():
            got = s.lookup(name, expected["indices"], expected["offsets"])
            assert_pools_as_frozen(got, expected[name], t.dtype, tol)
    assert all(c.ok for c in nearrec.verify(FIXTURES / "v2"))
