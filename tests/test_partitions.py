"""The partition harness (``nearrec bench partitions``), short: its checks on hand-made
outcomes, then one schedule with the membership in etcd (no anomaly at all) and, without,
schedules that must find the split-brain ``docs/distributed.md`` describes. The runs need root
(network namespaces), nft and etcd (``make system-deps``); they are skipped, said, where those
lack."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from nearrec_bench import partitions as p
from nearrec_bench.partition_checks import costs, judge, phases


def h(router: int, kind: str, ids: list[int], values: list[int], invoke: float,
      complete: float, outcome: str = "ok", error: str | None = None) -> dict[str, Any]:
    return {"router": router, "thread": 0, "kind": kind, "ids": ids, "values": values,
            "invoke": int(invoke * 1e9), "complete": int(complete * 1e9), "outcome": outcome,
            "error": error}


def replicas(rows0: dict[int, int], rows1: dict[int, int] | None = None,
             versions: tuple[int, int] = (1, 1)) -> dict[str, Any]:
    def one(rows: dict[int, int], version: int) -> dict[str, Any]:
        return {"version": version, "digests": str(sorted(rows.items())),
                "rows": {str(k): v for k, v in rows.items()}}
    rows1 = rows0 if rows1 is None else rows1
    return {"n00": one(rows0, versions[0]), "n01": one(rows1, versions[1]),
            "n10": one({}, 1), "n11": one({}, 1)}


def test_a_clean_history_passes() -> None:
    history = [h(0, "write", [1], [5], 0, 1), h(1, "read", [1], [5], 2, 3),
               h(0, "write", [10, 42], [7, 7], 3, 4), h(1, "read", [10, 42], [7, 7], 5, 6)]
    last = {"reads": [h(-1, "read", [1], [5], 9, 10)], "replicas": replicas({1: 5})}
    assert judge(history + last["reads"], last) == []


@pytest.mark.parametrize("history,last,found", [
    # a read that returns what was overwritten before it began
    ([h(0, "write", [1], [5], 0, 1), h(0, "write", [1], [6], 2, 3),
      h(1, "read", [1], [5], 4, 5)], None, "not linearizable"),
    # one row of a cross-shard write without the other
    ([h(0, "write", [10, 42], [7, 7], 0, 1), h(1, "read", [10, 42], [7, 0], 2, 3)], None,
     "half of a cross-shard write"),
    # a router's read going back to a value written before the one it read
    ([h(0, "write", [1], [5], 0, 1), h(0, "write", [1], [6], 2, 3),
      h(1, "read", [1], [6], 4, 5), h(1, "read", [1], [5], 6, 7)], None, "went back"),
    # a write reported failed (not in doubt) whose value is read: it was applied after all
    ([h(0, "write", [1], [5], 0, 1, "fail", "Unavailable: no replica prepared the write"),
      h(1, "read", [1], [5], 2, 3)], None, "not linearizable"),
    # replicas that differ after the heal
    ([], {"reads": [], "replicas": replicas({1: 5}, {1: 6}, (3, 2))}, "replicas differ"),
    # a replica that does not serve after the heal
    ([], {"reads": [], "replicas": {**replicas({}), "n01": {"error": "Unavailable"}}},
     "does not serve after the heal"),
])
def test_each_anomaly_is_found(history: list[dict[str, Any]], last: dict[str, Any] | None,
                               found: str) -> None:
    last = last or {"reads": [], "replicas": replicas({})}
    anomalies = judge(history + last["reads"], last)
    assert any(found in a for a in anomalies), anomalies


def test_a_write_in_doubt_may_have_been_applied() -> None:
    history = [h(0, "write", [1], [5], 0, 1, "fail", "Unavailable: transaction 01 is in doubt"),
               h(1, "read", [1], [5], 2, 3)]
    assert judge(history, {"reads": [], "replicas": replicas({})}) == []


def _can_run() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("etcd") is None:
        return "etcd is not installed (Debian's etcd-server; make system-deps)"
    return p.nft_works()


@pytest.mark.skipif(_can_run() is not None, reason=str(_can_run()))
def test_with_etcd_a_schedule_of_partitions_finds_nothing(tmp_path: Path) -> None:
    cfg = p.PartitionsConfig(schedules=1, seconds=8.0, seed=5, scratch=tmp_path,
                             faults=("split-routers", "partition-replica", "kill-replica"))
    [record] = p.run(cfg, print)
    [result] = record.extra["results"]
    assert result["faults"], "the schedule did nothing"
    # replicas alike after the heal, every one serving, every row read; no read half of a
    # write across shards, none going back, each row's history linearizable
    assert result["anomalies"] == [], result
    assert result["ops"].get("write.ok", 0) > 50 and result["ops"].get("read.ok", 0) > 50


@pytest.mark.skipif(_can_run() is not None, reason=str(_can_run()))
def test_without_etcd_the_documented_split_brain_is_found(tmp_path: Path) -> None:
    # the split lasts all but three seconds of the run: long enough for both routers to leave
    # the other's replica out and go on apart (their writes wait out deadlines first). It is
    # found in 4 schedules of 5 (bench/results/partitions-no-etcd.md): of up to three, one
    # must; the first that finds it ends the run (each waits out the heal's minute: three took
    # 317 s of CI's)
    cfg = p.PartitionsConfig(schedules=3, seconds=12.0, etcd=False, scratch=tmp_path,
                             until_found=True)
    [record] = p.run(cfg, print)
    found = [r["anomalies"] for r in record.extra["results"]]
    assert any(found), "no anomaly: the harness no longer finds the split"


def test_each_call_counts_for_the_fault_under_way_when_it_began() -> None:
    history = [h(0, "write", [1], [1], 0.1, 0.2), h(0, "write", [1], [2], 1.5, 1.6),
               h(1, "write", [1], [3], 0.9, 1.1), h(0, "read", [1], [], 1.2, 1.3, "fail", "x"),
               h(0, "write", [1], [4], 3.0, 3.01)]
    got = phases(history, [("partition-replica", 1.0e9, 2.0e9)])
    # begun before the fault and still running when it began: the fault's
    assert sorted(got["partition-replica"]["write"]) == [100.0, 200.0]
    assert got["partition-replica"]["read"] == [-1.0]
    assert got["none"]["write"] == [100.0, 10.0]
    cost = costs([{"phases": got}])
    assert cost["partition-replica"]["read"]["error_rate"] == 1.0
    assert cost["none"]["write"] == {"calls": 2, "error_rate": 0.0, "p50_ms": 100.0,
                                     "p99_ms": 100.0}
