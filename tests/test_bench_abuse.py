"""The abuse harness (`nearrec bench abuse`), short: beside tricklers, a connection flood and a
greedy principal, the good clients are answered every time, and the node's limits are what
refused the others."""

from __future__ import annotations

from nearrec_bench import abuse


def test_good_clients_are_answered_while_the_limits_refuse_the_abusers(tmp_path):
    cfg = abuse.AbuseConfig(good=2, rate=40.0, phase_s=4.0, rounds=1, tricklers=6, flood=20,
                            greedy=6, max_calls_per_principal=1, request_timeout_s=1.0,
                            rows=2_000, scratch=tmp_path)
    alone, slow, greedy = abuse.run(cfg, lambda _: None)
    assert [r.extra["errors"] for r in (alone, slow, greedy)] == [0, 0, 0]
    assert min(r.samples_per_s for r in (alone, slow, greedy)) > 0
    assert slow.extra["tricklers_cut"] >= cfg.tricklers, slow.extra
    assert slow.extra["flood_opened"] >= cfg.flood, slow.extra
    x = greedy.extra
    assert x["greedy_answered"] > 0 and x["greedy_refused"] > 0, x
    assert x["node_refused"]["principal_calls"] > 0, x["node_refused"]
    assert x["node_refused"]["slow_request"] >= cfg.tricklers, x["node_refused"]
    assert "| greedy |" in abuse.markdown([alone, slow, greedy], "nearrec bench abuse")
