"""The planner: it fits the budget, pins the rows a skewed trace keeps coming back to, keeps a
small busy table whole, round-trips through its file, and the plan it writes opens and serves."""

from __future__ import annotations

import json

import numpy as np
import pytest

import nearrec
import nearrec.plan as npl
import nearrec.trace as nt
from nearrec.cli import main


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(1)
    path = tmp_path_factory.mktemp("plan") / "s"
    nearrec.from_numpy(path, {"big": rng.standard_normal((40_000, 16), np.float32),
                              "tiny": rng.standard_normal((500, 16), np.float32)})
    return path


def test_plan_fits_the_budget_and_follows_the_trace(store):
    info = nearrec.info(store)
    tr = nt.generate({"big": 40_000, "tiny": 500}, 3_000, {"big": 10, "tiny": 10},
                     nt.Generator.zipf(1.1), seed=2)
    budget = info.total_bytes // 16
    plan = npl.make_plan(info, tr, budget)
    assert 0 < plan.bytes <= budget
    tiny, big = plan.tables["tiny"], plan.tables["big"]
    # the small table is as busy as the big one: keeping it whole buys the most hits per byte
    assert tiny.resident and tiny.expected_hit_ratio == 1.0
    # Zipf, a cache too small for the tail: the pinned rows are the trace's most frequent ones
    assert len(big.hot_rows) > 0
    rows, counts = np.unique(tr["big"].indices, return_counts=True)
    top = set(rows[np.argsort(-counts)][:100].tolist())
    assert len(top & set(big.hot_rows.tolist())) >= 90
    assert 0.3 < big.expected_hit_ratio < 1
    # EMB-SSD's type, from the working set and the locality the plan reports (the rule written
    # out again here: a type that does not follow them fails)
    assert big.working_set <= 40_000
    for t in (big, tiny):
        small = t.working_set <= 0.1 * t.rows
        want = ("A" if t.locality >= 0.5 else "B") if small else \
            ("C" if t.locality >= 0.2 else "D")
        assert t.kind == want, t
    # this seeded trace's answer: the big table's hot set is a tenth of it, LRU-friendly (A);
    # the tiny one is read whole (C)
    assert (big.kind, tiny.kind) == ("A", "C")
    # the expected hit ratio grows with the budget
    more = npl.make_plan(info, tr, 2 * budget)
    assert more.expected_hit_ratio >= plan.expected_hit_ratio
    # with room for what the trace reads, a warm cache serves what pinned rows would: the cache
    # alone, not pinned rows beside it (a second probe for every lookup, for nothing)
    assert len(more.tables["big"].hot_rows) == 0 and more.tables["big"].cache_bytes > 0


def test_stack_distance_traces_get_caches_not_pinned_rows(store):
    info = nearrec.info(store)
    tr = nt.generate({"big": 40_000}, 2_000, 20, nt.Generator.stack_distance(0.0), seed=3)
    plan = npl.make_plan(info, tr, info.total_bytes // 8)
    big = plan.tables["big"]
    # recency, not a fixed hot set: most of the share goes to the row cache
    assert big.cache_bytes > len(big.hot_rows) * (big.row_bytes + npl.HOT_OVERHEAD)
    assert big.expected_hit_ratio > 0.5


def test_plan_file_round_trip_opens_and_serves(store, tmp_path):
    info = nearrec.info(store)
    tr = nt.generate({"big": 40_000, "tiny": 500}, 4_000, 10, nt.Generator.zipf(1.1), seed=4,
                     path=tmp_path / "t.nrtrace")
    plan = npl.make_plan(info, tr, info.total_bytes // 8)
    path = plan.save(tmp_path / "p.toml")
    placement = npl.load_plan(path)
    assert placement["tiny"]["resident"]
    np.testing.assert_array_equal(placement["big"]["hot_rows"], plan.tables["big"].hot_rows)
    s = nearrec.open(store, tier="ssd", dram_budget=info.total_bytes // 8, plan=path)
    dram = nearrec.open(store, tier="dram")
    half = tr.bags // 2
    for start in range(half, tr.bags, 256):
        batch = tr.batch(start, min(tr.bags, start + 256))
        np.testing.assert_allclose(s.lookup_many(batch).values, dram.lookup_many(batch).values,
                                   rtol=1e-5, atol=1e-5)
    # the hit ratio on the half the planner scored on is about what it expected
    assert abs(s.stats()["dram_hit_ratio"] - plan.expected_hit_ratio) < 0.1
    (tmp_path / "bad.toml").write_text("budget_bytes = [")
    with pytest.raises(nearrec.InvalidRequest, match="not a readable plan"):
        nearrec.open(store, tier="ssd", plan=tmp_path / "bad.toml")


def test_plan_command(store, tmp_path, capsys):
    tp = tmp_path / "t.nrtrace"
    assert main(["trace", "gen", str(tp), "--store", str(store), "--bags", "500",
                 "--pooling", "5", "--generator", "zipf"]) == 0
    capsys.readouterr()
    out = tmp_path / "plan.toml"
    assert main(["plan", str(store), str(tp), "--budget", "200KiB", "--out", str(out),
                 "--plot", str(tmp_path / "plan.png"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bytes"] <= 200 * 1024 and out.exists() and (tmp_path / "plan.png").exists()
    assert {t["table"] for t in data["tables"]} == {"big", "tiny"}
    assert (tmp_path / "plan.png").read_bytes()[:4] == b"\x89PNG"
