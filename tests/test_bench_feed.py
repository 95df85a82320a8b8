"""The feeder-kill harness (`nearrec bench feed-kills`): a few kills of each feeder leave a
store its model holds, and a store that took part of a file, or a row no file wrote, is caught."""

from __future__ import annotations

import numpy as np
import pytest

import nearrec
import nearrec.feed
from nearrec_bench import feed


@pytest.mark.parametrize("feeder", [feed.embedded, feed.through_node], ids=["embedded", "node"])
def test_kills_leave_each_file_applied_once(tmp_path, feeder):
    # a window wide enough that a loaded host's feeder applies a file before some kill: the
    # files are 10, so a fast one finishes them and the kill still finds the cursor moved
    cfg = feed.FeedKillsConfig(kills={"embedded": 4, "node": 3}, window=1.0, ahead=10, seed=5,
                               scratch=tmp_path)
    t = feeder(cfg, tmp_path, lambda _: None)
    assert t.kills in (3, 4) and not t.violations, t.violations
    assert t.files > 0 and t.in_flight > 0


def test_a_row_no_file_wrote_is_a_violation(tmp_path):
    cfg = feed.FeedKillsConfig(kills={"embedded": 2, "node": 0}, window=0.2, ahead=6, seed=6,
                               scratch=tmp_path)
    store_path, deltas = feed.fresh(tmp_path / "s")

    def kill_once(store, deltas, after):
        # a feeder that applied the pending files, and then one row of its own
        s = nearrec.open(store, writable=True)
        nearrec.feed.apply(deltas, s, name=feed.FEED)
        s.write("a", [3], np.full((1, feed.TABLES["a"][1]), 0.125, np.float32))
        s.close()

    t = feed.rounds("embedded", cfg, store_path, deltas, lambda _: None, kill_once,
                    lambda p: nearrec.open(p))
    assert t.violations and "table a differs" in t.violations[0], t.violations


def test_the_rate_harness_files_hold_what_write_many_is_given(tmp_path):
    """`nearrec bench feed` sets a feed against write_many of the same rows: its int8 files'
    encoded rows must decode to the float32 rows write_many gets, and its fp32 files must hold
    them bit for bit — else the two would not write the same store."""
    from nearrec_bench import feed_rate

    cfg = feed_rate.FeedRateConfig(rows=500, dim=16, cell_rows=120, file_rows=(60,),
                                   scratch=tmp_path)
    rng = np.random.default_rng(0)
    nearrec.from_numpy(tmp_path / "s", {t: rng.standard_normal((500, 16), dtype=np.float32)
                                        for t in feed_rate.TABLES}, {"f": "fp32", "q": "int8"})
    fed = nearrec.open(tmp_path / "s", writable=True)
    deltas = tmp_path / "d"
    deltas.mkdir()
    sequence = 0
    expected = {}
    for table in feed_rate.TABLES:
        for ids, rows, floats in feed_rate._files(cfg, table, 60, seed=len(table)):
            sequence += 1
            feed_rate.publish(deltas, sequence, table, ids, rows)
            assert rows.dtype == (np.uint8 if table == "q" else np.float32)
            expected.setdefault(table, {}).update(zip(ids.tolist(), floats, strict=True))
    done = nearrec.feed.apply(deltas, fed)
    assert [a.sequence for a in done] == [1, 2, 3, 4] and all(a.calls == 1 for a in done)
    for table, rows in expected.items():
        ids = np.array(list(rows), np.int64)
        want = np.stack(list(rows.values()))
        # int8 rows written as they are decode to exactly what the harness computed
        np.testing.assert_array_equal(fed.read_rows(table, ids), want)
