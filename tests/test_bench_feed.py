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
    cfg = feed.FeedKillsConfig(kills={"embedded": 4, "node": 3}, window=0.3, ahead=10, seed=5,
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
