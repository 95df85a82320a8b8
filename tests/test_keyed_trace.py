"""Keyed traces (issue 65, item 4): an ``.nrtrace`` table of a keyed table's keys — any 64-bit
value — written as file version 3 (a trace without keys stays version 2), profiled, recorded from
FBGEMM's layout and Criteo's raw categories; ``nearrec plan`` maps the keys to the rows they hold
with the store open, and the plan it writes pins the hottest keys' rows; warm-up fills the row
cache with them; a trace generated over a store's keyed table draws its keys; co-location,
which cannot take keys, is refused naming the table."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import nearrec
import nearrec.trace as nt
from nearrec import InvalidRequest, datasets
from nearrec.cli import main
from nearrec.plan import colocate, make_plan

N, DIM = 2000, 16


def keys_and_rows() -> tuple[np.ndarray, np.ndarray]:
    """Distinct keys over the whole 64-bit range (negative int64s too), and their rows."""
    rng = np.random.default_rng(5)
    keys = np.unique(rng.integers(-(2**63), 2**63 - 1, N * 2, dtype=np.int64))[:N]
    rng.shuffle(keys)
    return keys, rng.standard_normal((N, DIM), dtype=np.float32)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    keys, rows = keys_and_rows()
    path = tmp_path / "s"
    nearrec.from_numpy(path, {"k": rows, "r": rows[:500]}, keys={"k": keys})
    return path


def requests(hot: int = 50, cold: int = 1500, unknown: int = 200) -> np.ndarray:
    """Requests of keyed table ``k``: its first ``hot`` keys 30 times each, ``cold`` others once,
    and ``unknown`` keys it does not hold, shuffled."""
    keys, _ = keys_and_rows()
    held = set(keys.tolist())
    rng = np.random.default_rng(9)
    strangers = [k for k in rng.integers(-(2**63), 2**63 - 1, unknown * 2, dtype=np.int64)
                 if int(k) not in held][:unknown]
    ids = np.concatenate([np.repeat(keys[:hot], 30), keys[hot:hot + cold], strangers])
    rng.shuffle(ids)
    return ids.astype(np.int64)


def keyed_trace(ids: np.ndarray, pooling: int = 4) -> nt.Trace:
    bags = len(ids) // pooling
    ids = ids[:bags * pooling]
    offsets = np.arange(0, bags * pooling + 1, pooling, dtype=np.int64)
    return nt.Trace({"k": nt.TableTrace("k", N + 1, pooling, offsets, ids, keys=True)}, 16)


def version(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[8:12], "little")


def test_a_keyed_trace_round_trips_as_version_3(tmp_path: Path) -> None:
    keys = np.array([2**64 - 1, 2**63, 7, 2**40], np.uint64)
    tr = nt.from_fbgemm(keys, [0, 2, 3, 4, 4], {"k": 10, "r": 10}, keyed=["k"])
    assert tr["k"].keys and not tr["r"].keys
    # the row table's ids must be rows: the keyed one's any key
    with pytest.raises(InvalidRequest, match="outside 0..10"):
        tr.save(tmp_path / "bad.nrtrace")
    tr = nt.from_fbgemm(np.array([2**64 - 1, 2**63, 7, 1], np.uint64), [0, 2, 3, 4, 4],
                        {"k": 10, "r": 10}, keyed=["k"])
    saved = tr.save(tmp_path / "k.nrtrace")
    assert version(tmp_path / "k.nrtrace") == 3
    assert saved["k"].keys and not saved["r"].keys and saved.verified
    np.testing.assert_array_equal(saved["k"].indices.view(np.uint64),
                                  np.array([2**64 - 1, 2**63, 7], np.uint64))
    rows_only = nt.Trace({"r": tr["r"]}).save(tmp_path / "r.nrtrace")
    assert version(tmp_path / "r.nrtrace") == 2 and not rows_only["r"].keys
    with pytest.raises(InvalidRequest, match="lacks"):
        nt.from_fbgemm(keys, [0, 4], {"r": 10}, keyed=["k"])


def test_a_keyed_trace_profiles_its_keys() -> None:
    ids = requests()
    t = keyed_trace(ids)["k"]
    p = t.profile()
    kept = t.indices
    assert p.working_set == len(np.unique(kept))
    assert p.unique.dtype == np.uint64
    # first use order, as the keys' own values
    _, first = np.unique(kept, return_index=True)
    np.testing.assert_array_equal(p.unique, kept[np.sort(first)].view(np.uint64))
    # the same profile as the keys renumbered densely (what a row trace of them would give)
    _, codes = np.unique(kept, return_inverse=True)
    q = nt.profile(codes)
    np.testing.assert_array_equal(p.distances, q.distances)
    np.testing.assert_array_equal(p.counts, q.counts)


def test_the_plan_pins_the_rows_of_the_hottest_keys(store: Path, tmp_path: Path) -> None:
    keys, rows = keys_and_rows()
    tr = keyed_trace(requests()).save(tmp_path / "k.nrtrace")
    with nearrec.open(store, tier="ssd") as s:
        key_rows = s.key_rows("k", keys)
        assert (key_rows > 0).all() and len(set(key_rows.tolist())) == N
        assert (s.key_rows("k", np.array([keys[0]]).view(np.uint64)) == key_rows[0]).all()
        # a plan from an open store and one from its path agree
        from_open = make_plan(s, tr, "64KiB")
    plan = make_plan(store, tmp_path / "k.nrtrace", "64KiB")
    np.testing.assert_array_equal(from_open.tables["k"].hot_rows, plan.tables["k"].hot_rows)
    hot = set(np.asarray(plan.tables["k"].hot_rows).tolist())
    assert hot, plan.text()
    # the hot rows are the rows of the 50 hottest keys (most of them; the planner ranks on the
    # first half of the trace)
    hottest = set(key_rows[:50].tolist())
    assert len(hot & hottest) >= 0.8 * min(len(hot), 50), (len(hot), len(hot & hottest))
    assert hot <= set(key_rows.tolist()), "every pinned row holds a key"

    # the CLI: the same plan, and applied it serves the hot keys from DRAM
    out = tmp_path / "plan.toml"
    assert main(["plan", str(store), str(tmp_path / "k.nrtrace"), "--budget", "64KiB",
                 "--out", str(out), "--json"]) == 0
    with nearrec.open(store, tier="ssd", plan=out, dram_budget="64KiB") as s:
        ids = keys[:50]
        got = s.lookup("k", ids, np.arange(50))
        np.testing.assert_array_equal(got, rows[:50])
        k = next(r for r in s.tier_report() if r["table"] == "k")
        assert k["lookups_hot"] >= 40 and k["lookups_ssd"] <= 10, k


def test_a_plan_refuses_keys_where_the_table_is_addressed_by_row(store: Path,
                                                                   tmp_path: Path) -> None:
    t = nt.TableTrace("r", 500, 1, np.array([0, 1], np.int64), np.array([3], np.int64),
                      keys=True)
    with pytest.raises(InvalidRequest, match="'r'|\"r\""):
        make_plan(store, nt.Trace({"r": t}), "64KiB")
    with pytest.raises(InvalidRequest, match="keyed"):
        colocate(store, keyed_trace(requests()), tmp_path / "c")


def test_warm_up_fills_the_row_cache_with_the_hottest_keys(store: Path, tmp_path: Path) -> None:
    keys, rows = keys_and_rows()
    trace = keyed_trace(requests()).save(tmp_path / "k.nrtrace")
    plan = {"k": {"cache_bytes": 32 << 10}, "r": {"cache_bytes": 0}}
    with nearrec.open(store, tier="ssd", plan=plan) as cold:
        cold.lookup("k", keys[:50], np.arange(50))
        k = next(r for r in cold.tier_report() if r["table"] == "k")
        assert k["lookups_cache"] == 0 and k["lookups_ssd"] == 50
    with nearrec.open(store, tier="ssd", plan=plan, warm=trace.path) as warm:
        got = warm.lookup("k", keys[:50], np.arange(50))
        np.testing.assert_array_equal(got, rows[:50])
        k = next(r for r in warm.tier_report() if r["table"] == "k")
        assert k["lookups_cache"] == 50 and k["lookups_ssd"] == 0, k


def test_criteo_categories_are_recorded_as_keys(tmp_path: Path) -> None:
    lines = []
    for i in range(6):
        cats = [f"{(i * 7 + c) % 3 * 0x9e3779b1 & 0xFFFFFFFF:08x}" if (i + c) % 4 else ""
                for c in range(26)]
        lines.append("\t".join([str(i % 2), *[str(i)] * 13, *cats]))
    src = tmp_path / "day.tsv"
    src.write_text("\n".join(lines) + "\n")
    log = datasets.criteo(src, rows="keys")
    c1 = log.trace["C1"]
    assert c1.keys
    want = [int(line.split("\t")[14], 16) for line in lines if line.split("\t")[14]]
    np.testing.assert_array_equal(c1.indices, want)
    assert np.diff(c1.offsets).tolist() == [1 if line.split("\t")[14] else 0 for line in lines]
    assert c1.rows == len(set(want))
    out = tmp_path / "c.nrtrace"
    assert main(["trace", "import", "criteo", str(src), str(out), "--keys"]) == 0
    assert nt.load(out)["C1"].keys and version(out) == 3
    assert main(["trace", "import", "criteo", str(src), str(out), "--keys", "--dictionary",
                 "--overwrite"]) == 2


def test_trace_info_says_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keyed_trace(requests()).save(tmp_path / "k.nrtrace")
    assert main(["trace", "profile", str(tmp_path / "k.nrtrace"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tables"][0]["keys"] is True
    assert out["tables"][0]["working_set"] == len(np.unique(requests()[:len(requests()) // 4 * 4]))


def test_a_generated_trace_of_a_keyed_table_draws_its_keys(store: Path, tmp_path: Path) -> None:
    keys, _ = keys_and_rows()
    with nearrec.open(store, tier="ssd") as s:
        tr = nt.generate(s, 400, 3, nt.Generator.zipf(1.1), path=tmp_path / "g.nrtrace")
        assert tr["k"].keys and not tr["r"].keys
        assert tr["k"].rows == s.table("k").rows and tr["r"].rows == 500
        assert set(tr["k"].indices.tolist()) <= set(keys.tolist())
        # skewed over the keys: a few keys take many of the lookups
        _, counts = np.unique(tr["k"].indices, return_counts=True)
        assert counts.max() > 10 * np.median(counts)
    # and `trace gen --store` writes the same
    out = tmp_path / "cli.nrtrace"
    assert main(["trace", "gen", str(out), "--store", str(store), "--bags", "400", "--pooling",
                 "3", "--generator", "zipf", "--alpha", "1.1"]) == 0
    assert nt.load(out)["k"].keys and version(out) == 3
