"""The soak harness (`nearrec bench soak`), in its short form: a node under a few clients with a
swap and a compaction in the middle answers every call, and every checked answer equals the
embedded reference's; a reference that differs is caught."""

from __future__ import annotations

from pathlib import Path

import nearrec
from nearrec_bench import soak
from nearrec_bench.served import node


def test_a_short_soak_answers_every_call_and_every_checked_answer_is_right(tmp_path,
                                                                           monkeypatch):
    # a scratch folder given relative, as `nearrec bench` gives its default
    monkeypatch.chdir(tmp_path)
    cfg = soak.SoakConfig(minutes=0.3, clients=4, rows=4_000, live_rows=2_000, sample_s=1.0,
                          probe_s=1.0, check_every=2, scratch=Path("scratch"))
    [r] = soak.run(cfg, lambda _: None)
    x = r.extra
    assert x["error_count"] == 0, x["errors"]
    assert x["wrong"] == 0, x["wrong_first"]
    assert x["checked"] > 20
    assert all(x["calls"][k] > 0 for k in soak.KINDS), x["calls"]
    assert [e["result"] for e in x["events"]] == ["done", "done"], x["events"]
    assert len(x["samples"]) >= 5 and x["rss_max_mib"] > 0
    assert "| minute |" in soak.markdown([r], "nearrec bench soak")


def test_an_answer_that_differs_from_the_reference_is_counted_wrong(tmp_path):
    served_path, other = tmp_path / "a", tmp_path / "b"
    nearrec.build(served_path, "rmc1", rows=500, seed=1, progress=False)
    nearrec.build(other, "rmc1", rows=500, seed=2, progress=False)
    cfg = soak.SoakConfig(clients=1, rows=500, live_rows=500, infer=0.0, live=0.0,
                          check_every=1)
    tally = soak.Tally()
    refs = {"main": nearrec.open(other, tier="dram"), "live": nearrec.open(other, tier="dram")}
    with node(served_path, "main", extra=[f"{served_path}=live"]) as served:
        client = soak.Client(0, cfg, served.address, refs, 13, False, tally)
        try:
            assert [client.one() for _ in range(3)] == ["lookup"] * 3
        finally:
            client.close()
    assert tally.checked == 3 and len(tally.wrong) == 3, tally.wrong
