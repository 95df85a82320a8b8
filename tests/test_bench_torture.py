"""The crash-torture harness (`nearrec bench torture`): a few kills of each writer leave a store
that its model holds, and a model that misses an acknowledged call is caught."""

from __future__ import annotations

import pytest

from nearrec_bench import torture


@pytest.mark.parametrize("writer", [torture.embedded, torture.through_node],
                         ids=["embedded", "node"])
def test_kills_leave_what_the_calls_acknowledged(tmp_path, writer):
    cfg = torture.TortureConfig(kills={"embedded": 4, "node": 3}, window=0.3, seed=5,
                                scratch=tmp_path)
    t = writer(cfg, tmp_path / "store", lambda _: None)
    assert t.kills in (3, 4) and not t.violations, t.violations
    assert t.acknowledged > 0 and t.kept + t.lost == t.kills


def test_a_model_missing_an_acknowledged_call_is_a_violation(tmp_path):
    cfg = torture.TortureConfig(kills={"embedded": 1, "node": 0}, window=0.3, seed=6,
                                scratch=tmp_path)
    path = tmp_path / "store"
    t = torture.embedded(cfg, path, lambda _: None)
    assert t.acknowledged > 2 and not t.violations
    # the store now holds calls 1 .. N; a model told of none of them sees the difference
    tally = torture.Tally()
    torture.check(path, torture.Model.initial(), [], 1, cfg.seed, tally)
    assert tally.violations and "differ" in tally.violations[0], tally.violations
