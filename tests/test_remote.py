"""The storage node from Python: `nearrec serve` started here on a free loopback port, a
`RemoteStore` from `nearrec.connect` against it, held to the embedded store on random requests
(both tiers; lookups, background lookups, streams, rows), errors typed as the local store's,
writes visible to the next lookup, deadlines (by default; a stopped node's calls fail at
theirs), `nearrec lookup --remote`, the stock grpcio health stub, and a drain on SIGTERM."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Lookups, Node

import nearrec
from nearrec import IndexOutOfRange, InvalidRequest, TableLookup, UnknownTable

ROWS = {"a": 500, "b": 300}
DIMS = {"a": 16, "b": 8}


def build(root: Path) -> Path:
    rng = np.random.default_rng(7)
    path = root / "store"
    nearrec.from_numpy(path, {t: rng.standard_normal((ROWS[t], DIMS[t]), dtype=np.float32)
                              for t in ROWS}, dtype={"b": "fp16"})
    return path


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("remote"))


@pytest.fixture(scope="module", params=["dram", "ssd"])
def served(request: pytest.FixtureRequest, store_path: Path
           ) -> Iterator[tuple[nearrec.Store, nearrec.RemoteStore]]:
    tier = request.param
    node = Node(f"{store_path}=s", "--tier", tier, "--dram-budget", "4KiB")
    try:
        local = nearrec.open(store_path, tier=tier, dram_budget="4KiB")
        yield local, nearrec.connect(node.address, "s")
    finally:
        assert node.stop() == 0


def batch(rng: np.random.Generator, bags: int) -> list[TableLookup]:
    out = []
    for t, mode in zip(ROWS, ["sum", "mean"], strict=True):
        lengths = rng.integers(0, 6, bags)
        ids = rng.integers(0, ROWS[t], int(lengths.sum()))
        dtype = np.int32 if rng.random() < 0.5 else np.int64
        out.append(TableLookup(t, ids.astype(dtype), lengths=lengths.astype(dtype),
                               mode=mode))
    return out


def close(a: np.ndarray, b: np.ndarray) -> None:
    # the SSD tier pools rows as they land: fp32 sums may differ in their last bits
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_lookups_over_the_network_equal_the_embedded_store(served):
    local, remote = served
    assert set(remote.tables) == set(ROWS)
    assert remote.table("b") == nearrec.RemoteTable("b", 300, 8, "fp16")
    rng = np.random.default_rng(3)
    for _ in range(20):
        reqs = batch(rng, int(rng.integers(1, 50)))
        want = local.lookup_many(reqs)
        got = remote.lookup_many(reqs)
        assert got.keys == want.keys and got.dims == want.dims
        close(got.values, want.values)
        close(got["b"], want["b"])
    # one table, PyTorch's arguments
    ids, offsets = np.array([1, 2, 3, 499]), np.array([0, 1])
    close(remote.lookup("a", ids, offsets, mode="max"), local.lookup("a", ids, offsets,
                                                                     mode="max"))
    # rows, and each table's distinct rows
    rows = np.array([5, 0, 5, 299])
    np.testing.assert_array_equal(remote.read_rows("b", rows), local.read_rows("b", rows))
    reqs = batch(rng, 10)
    for (table, ids, values), r in zip(remote.lookup_rows(reqs), reqs, strict=True):
        assert table == r.table
        np.testing.assert_array_equal(ids, np.unique(np.asarray(r.indices)))
        np.testing.assert_array_equal(values, local.read_rows(table, ids))


def test_background_lookups_and_streams_come_back_in_order(served):
    local, remote = served
    rng = np.random.default_rng(5)
    batches = [batch(rng, 16) for _ in range(12)]
    pending = [remote.submit(b) for b in batches]
    for p, b in zip(pending, batches, strict=True):
        close(p.result(timeout=30).values, local.lookup_many(b).values)
    for got, b in zip(remote.lookup_stream(iter(batches), depth=4), batches, strict=True):
        close(got.values, local.lookup_many(b).values)


def test_a_coalescing_node_answers_concurrent_small_lookups_as_if_each_ran_alone(store_path):
    # lookups that read the device coalesce (DRAM-resident ones run at once, alone)
    node = Node(f"{store_path}=s", "--tier", "ssd", "--dram-budget", "4KiB",
                "--coalesce-bags", "64", "--coalesce-window-us", "20000")
    try:
        local = nearrec.open(store_path, tier="ssd", dram_budget="4KiB")
        remote = nearrec.connect(node.address, "s")
        rng = np.random.default_rng(11)
        batches = [batch(rng, int(rng.integers(1, 6))) for _ in range(24)]
        pending = [remote.submit(b) for b in batches]
        for p, b in zip(pending, batches, strict=True):
            close(p.result(timeout=30).values, local.lookup_many(b).values)
        samples = node.histogram("nearrec_batch_requests")
        assert samples["count"] < 24, samples  # fewer engine batches than requests
        assert samples["sum"] == 24, samples  # every request in one of them
    finally:
        assert node.stop() == 0


def test_errors_arrive_as_the_local_store_raises_them(served, store_path):
    _, remote = served
    with pytest.raises(IndexOutOfRange) as e:
        remote.lookup_many([TableLookup("a", np.array([1, 2]), np.array([0, 1])),
                            TableLookup("b", np.array([0, 300]), np.array([0, 1]))])
    assert (e.value.table, e.value.position) == ("b", 1)
    with pytest.raises(UnknownTable) as u:
        remote.lookup("nope", np.array([1]), np.array([0]))
    assert u.value.table == "nope"
    with pytest.raises(InvalidRequest, match="offsets"):
        remote.lookup("a", np.array([1, 2]), np.array([0, 3]))
    with pytest.raises(nearrec.StoreReadOnly):
        remote.write("a", np.array([1]), np.zeros((1, 16), np.float32))
    with pytest.raises(nearrec.StoreNotFound, match="it serves: s"):
        nearrec.connect(remote.address, "other")
    with pytest.raises(nearrec.Unavailable, match="connection refused at 127.0.0.1:1"):
        nearrec.connect("127.0.0.1:1")
    # several addresses: the first that answers
    several = nearrec.connect(["127.0.0.1:1", remote.address], "s")
    assert several.lookup("a", np.array([1]), np.array([0])).shape == (1, 16)
    assert issubclass(nearrec.Unavailable, ConnectionError)
    assert issubclass(nearrec.DeadlineExceeded, TimeoutError)
    assert issubclass(nearrec.PermissionDenied, PermissionError)


def test_the_cli_looks_up_on_a_node_and_prints_what_its_stats_carry(served):
    # the node's stats carry the SSD tier's counters and how its device reads (direct or
    # buffered, its block size), as a local store's do
    _, remote = served
    lookup = [sys.executable, "-m", "nearrec.cli", "lookup", "--remote", remote.address, "s",
              "--batch", "4", "--pooling", "3", "--repeat", "2"]
    out = subprocess.run(lookup, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "2 batches of 4 bags x 2 tables, each drawn afresh" in out.stdout
    device = remote.stats()["device"]
    if remote.tier == "ssd":
        assert f"ssd tier: {device} (direct, " in out.stdout, out.stdout
    else:
        assert device == "dram" and "ssd tier" not in out.stdout, out.stdout
    out = subprocess.run([*lookup, "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    stats = json.loads(out.stdout).get("stats", {})
    assert bool(stats) == (remote.tier == "ssd"), stats
    assert not stats or (stats["direct_io"] is True and stats["block_bytes"] > 0), stats


def test_the_cli_scrubs_a_node_s_store_on_the_node(served):
    # the node reads its own disk; only the checks come back, as a local scrub prints them
    local, remote = served
    out = subprocess.run([sys.executable, "-m", "nearrec.cli", "scrub", "--remote",
                          remote.address, "s", "--rate", "0", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] and {t["table"] for t in report["tables"]} == set(local.tables)
    assert [(c.table, c.bytes) for c in remote.scrub()] == [
        (t["table"], t["bytes"]) for t in report["tables"]]


def test_the_cli_shows_what_a_node_serves(served):
    # what the node serves, as its client sees it: tables with their shapes, version, tier
    local, remote = served
    cli = [sys.executable, "-m", "nearrec.cli", "info", "--remote", remote.address, "s"]
    out = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert [(t["name"], t["rows"], t["dim"], t["dtype"]) for t in info["tables"]] == [
        (t.name, t.rows, t.dim, t.dtype) for t in local.tables.values()]
    assert (info["version"], info["tier"], info["name"]) == (remote.version, remote.tier,
                                                             remote.name)
    assert set(info["capabilities"]) == set(remote.capabilities)
    out = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"{remote.name} on {remote.address}: version "), out.stdout
    for t in local.tables.values():
        assert f"{t.rows:>12,} {t.dim:>6} {t.dtype:>6}" in out.stdout, out.stdout
    # a store the node does not serve is refused, named
    out = subprocess.run([*cli[:-1], "nope"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "nope" in out.stderr, out.stderr


def how_of(store: nearrec.Store) -> Any:
    """How a node's store was connected: what its pickle carries."""
    return store.__reduce__()[1][0]


def test_calls_have_a_default_deadline_that_a_pickle_keeps(store_path):
    node = Node(str(store_path))
    try:
        how = how_of(nearrec.connect(node.address))
        assert how is not None and how.timeout == nearrec.remote.DEFAULT_TIMEOUT
        assert how_of(nearrec.connect(node.address, timeout=2)).timeout == 2.0
        # None: no deadline at all, and a store connected again keeps that
        unbounded = nearrec.connect(node.address, timeout=None)
        assert how_of(unbounded).timeout is None
        assert how_of(pickle.loads(pickle.dumps(unbounded))).timeout is None
        with pytest.raises(InvalidRequest, match="timeout"):
            nearrec.connect(node.address, timeout=0)
    finally:
        assert node.stop() == 0


def test_a_node_whose_logs_nobody_reads_goes_on_serving(store_path):
    """Every call logged (an access line each) into a stderr pipe nobody reads: once the pipe
    is full the node drops log lines rather than block the calls that write them (it hung in
    `bench serve` when a saturation test filled the pipe with slow-request lines)."""
    node = Node(str(store_path), "--access-log-every", "1")
    try:
        remote = nearrec.connect(node.address, timeout=10.0)
        done: list[int] = []

        def calls() -> None:
            ids, offsets = np.array([1, 2]), np.array([0])
            for i in range(3000):  # ~150 bytes a line: several times a pipe's 64 KiB
                remote.lookup("a", ids, offsets)
                done.append(i)

        t = threading.Thread(target=calls, daemon=True)
        t.start()
        t.join(120)
        assert not t.is_alive() and len(done) == 3000, f"stalled after {len(done)} calls"
    finally:
        assert node.stop() == 0


def _wait_stopped(pid: int, seconds: float = 10.0) -> None:
    """Until every thread of process ``pid`` is stopped (``T`` in its ``stat``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except (FileNotFoundError, IndexError):
                continue
        if states and all(s in ("T", "t") for s in states):
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} did not stop: {states}")


def test_a_call_to_a_stopped_node_fails_at_its_deadline(store_path):
    """A node that stops answering (SIGSTOP: the socket stays open, nothing reads it) fails
    each call at its deadline with DeadlineExceeded; the calls run on a thread joined with a
    bound, so that a call that waits for ever fails this test instead of hanging the suite."""
    node = Node(str(store_path))
    try:
        remote = nearrec.connect(node.address, timeout=1.0)
        outcome: list[BaseException | None] = []

        def calls() -> None:
            ids, offsets = np.array([1, 2]), np.array([0])
            for call in (lambda: remote.lookup("a", ids, offsets),
                         lambda: remote.submit({"a": (ids, offsets)}).result(),
                         remote.stats):
                try:
                    call()
                    outcome.append(None)
                except BaseException as e:
                    outcome.append(e)

        node.proc.send_signal(signal.SIGSTOP)
        try:
            # a group stop completes thread by thread after kill() returns: the calls start
            # once every thread of the node is stopped (state T), not while one still serves
            _wait_stopped(node.proc.pid)
            t = threading.Thread(target=calls, daemon=True)
            t.start()
            t.join(30)
            assert not t.is_alive(), f"a call to a stopped node is still waiting: {outcome}"
        finally:
            node.proc.send_signal(signal.SIGCONT)
        assert len(outcome) == 3
        assert all(isinstance(e, nearrec.DeadlineExceeded) for e in outcome), outcome
    finally:
        assert node.stop() == 0


def test_writes_over_the_network_are_seen_by_the_next_lookup(tmp_path):
    path = build(tmp_path)
    node = Node(str(path), "--writable", "--tier", "ssd")
    try:
        remote = nearrec.connect(node.address)
        assert remote.name == "store" and remote.writable
        rows = np.arange(3 * 16, dtype=np.float32).reshape(3, 16)
        v = remote.write("a", np.array([4, 9, 499]), rows)
        assert v >= 1 and remote.version == v
        np.testing.assert_array_equal(remote.read_rows("a", np.array([499, 4, 9])),
                                      rows[[2, 0, 1]])
        remote.remove("a", np.array([9]))
        np.testing.assert_array_equal(remote.read_rows("a", np.array([9])), 0)
        with pytest.raises(InvalidRequest) as e:
            remote.write("a", np.array([1]), np.full((1, 16), np.nan, np.float32))
        assert e.value.table == "a"
        remote.create_table("c", 10, 4, "int8", init="zeros")
        assert remote.table("c") == nearrec.RemoteTable("c", 10, 4, "int8")
        np.testing.assert_array_equal(remote.lookup("c", np.array([3]), np.array([0])), 0)
        remote.drop_table("c")
        assert "c" not in remote.tables
    finally:
        assert node.stop() == 0
    # what the node acknowledged is in the store
    after = nearrec.open(path)
    np.testing.assert_array_equal(after.read_rows("a", np.array([4, 499])), rows[[0, 2]])


def test_metrics_and_logs_an_operator_runs_on(tmp_path):
    """/metrics, read with Prometheus's parser: compaction counters, the delta against its
    budget, the log's bytes, the process (under the names every exporter uses), the build, and
    every status a client saw — a deadline that passed on arrival included; the JSON log has a
    line for a compaction's start and end, with its bytes."""
    path = build(tmp_path)
    node = Node(str(path), "--writable", "--log-format", "json", "--access-log-every", "1")
    try:
        remote = nearrec.connect(node.address)
        remote.write("a", np.array([4, 9]), np.ones((2, 16), np.float32))
        before = node.metrics()
        assert before["nearrec_delta_rows"] == [({"store": "store"}, 2.0)]
        (labels, used), = before["nearrec_delta_bytes"]
        (_, budget), = before["nearrec_delta_budget_bytes"]
        assert 0 < used < budget
        assert before["nearrec_log_bytes"][0][1] > 0
        assert before["nearrec_compactions"] == [({"store": "store"}, 0)]
        remote.compact()
        with pytest.raises(nearrec.DeadlineExceeded):
            nearrec.connect(node.address, timeout=1e-6)
        m = node.metrics()
        assert m["nearrec_compactions"] == [({"store": "store"}, 1)]
        assert m["nearrec_compaction_bytes"][0][1] > 0
        assert m["nearrec_compaction_running"] == [({"store": "store"}, 0.0)]
        assert m["nearrec_delta_rows"] == [({"store": "store"}, 0.0)]
        assert m["nearrec_build_info"] == [({"version": nearrec.__version__}, 1.0)]
        process = {k: v[0][1] for k, v in m.items() if k.startswith("process_")}
        assert process["process_resident_memory_bytes"] > 1e6
        assert 3 <= process["process_open_fds"] <= process["process_max_fds"]
        assert process["process_threads"] >= 2 and process["process_cpu_seconds"] > 0
        assert abs(time.time() - process["process_start_time_seconds"]) < 600
        seen = {(s["call"], s["code"]): n for s, n in m["nearrec_requests"]}
        assert seen[("Write", "Ok")] == 1 and seen[("Compact", "Ok")] == 1
        assert seen[("Info", "DeadlineExceeded")] == 1, seen
    finally:
        assert node.stop() == 0
    events = [json.loads(line) for line in node.proc.stderr.read().splitlines() if line.strip()]
    messages = [e["fields"].get("message") for e in events]
    assert messages.index("compaction started") < messages.index("compaction finished")
    finished = next(e["fields"] for e in events
                    if e["fields"].get("message") == "compaction finished")
    assert finished["rows"] == 2 and finished["bytes"] > 0
    # the access log: every call (one in 1), its principal (no ACL: "-"), tables and rows
    access = [e["fields"] for e in events if e.get("target") == "nearrec_server::access"]
    write = next(a for a in access if a["call"] == "Write")
    assert (write["principal"], write["store"], write["tables"], write["rows"],
            write["status"]) == ("-", "store", "a", 2, "Ok")
    assert write["ms"] >= 0 and {a["call"] for a in access} >= {"Info", "Write", "Compact"}


def test_update_through_a_node_sends_only_the_rows_that_changed(tmp_path):
    """A trainer's whole table given to `nearrec update --remote`: the node answers each row's
    digest, and only the two rows that changed cross the wire (no lookup reads the table
    back); the token comes from a file, not the command line."""
    path = build(tmp_path)
    node = Node(str(path), "--writable", "--tier", "ssd")
    try:
        remote = nearrec.connect(node.address)
        table = remote.read_rows("a", np.arange(ROWS["a"]))
        table[5] += 1.0
        table[321, 3] = -7.0
        np.savez(tmp_path / "table.npz", a=table)
        (tmp_path / "token").write_text("trainer-secret\n")
        before = _calls(node)
        cli = [sys.executable, "-m", "nearrec.cli", "update", "--remote", node.address,
               "--from", str(tmp_path / "table.npz"), "--json"]
        out = subprocess.run(cli + ["--token-file", str(tmp_path / "token")],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        done = json.loads(out.stdout)
        assert done["tables"]["a"]["compared"] == ROWS["a"]
        assert done["tables"]["a"]["written"] == 2 and done["version"] == remote.version
        after = _calls(node)
        np.testing.assert_array_equal(remote.read_rows("a", np.array([5, 321])), table[[5, 321]])
        if after is not None and before is not None:
            assert after[("RowDigests", "calls")] - before.get(("RowDigests", "calls"), 0) == 1
            assert after.get(("Lookup", "calls"), 0) == before.get(("Lookup", "calls"), 0)
            # 8 bytes a row of digests back; two rows of 16 floats (and their ids) written
            assert after[("RowDigests", "sent")] - before.get(("RowDigests", "sent"), 0) \
                < ROWS["a"] * 8 + 64
            assert after[("Write", "received")] - before.get(("Write", "received"), 0) \
                < 2 * 16 * 4 + 128
        # nothing changed since: nothing is written
        again = subprocess.run(cli, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["tables"]["a"]["written"] == 0
        (tmp_path / "empty").write_text("")
        bad = subprocess.run(cli + ["--token-file", str(tmp_path / "empty")],
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode != 0 and "is empty" in bad.stderr
    finally:
        assert node.stop() == 0


def _calls(node: Node) -> dict[tuple[str, str], float] | None:
    """Per call: how many were answered, and the bytes received and sent (None without
    Prometheus's parser)."""
    if not importlib.util.find_spec("prometheus_client"):
        return None
    m = node.metrics()
    out: dict[tuple[str, str], float] = {}
    for family, what in (("nearrec_requests", "calls"), ("nearrec_received_bytes", "received"),
                         ("nearrec_sent_bytes", "sent")):
        for labels, value in m.get(family, []):
            if "call" in labels:
                key = (labels["call"], what)
                out[key] = out.get(key, 0.0) + value
    return out


def test_an_update_beside_a_read_only_node_is_served_within_its_follow_interval(tmp_path):
    """What an operator does: a node serves a store read-only, `nearrec update` writes rows to
    it from another process and says "the store is at version N" — and the node serves version
    N within about a second (it follows the writer's log), not only after a restart."""
    path = build(tmp_path)
    node = Node(str(path), "--tier", "ssd", "--dram-budget", "4KiB")
    try:
        remote = nearrec.connect(node.address)
        rows = np.full((2, 16), 0.5, np.float32)
        np.savez(tmp_path / "rows.npz", **{"a.ids": np.array([3, 77]), "a.rows": rows})
        out = subprocess.run([sys.executable, "-m", "nearrec.cli", "update", str(path),
                              "--from", str(tmp_path / "rows.npz")],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        version = int(re.search(r"at version (\d+)", out.stdout).group(1))
        deadline = time.monotonic() + 10
        while remote.stats()["version"] < version:
            assert time.monotonic() < deadline, "the node did not follow the update"
            time.sleep(0.05)
        np.testing.assert_array_equal(remote.read_rows("a", np.array([77, 3])), rows)
        stats = remote.stats()
        assert stats["follow_ms"] == 1000 and stats["follow_moved"] >= 1
    finally:
        assert node.stop() == 0


def test_stock_grpc_health_stub_reads_serving_and_the_cli_looks_up_remotely(store_path):
    grpc = pytest.importorskip("grpc")
    health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
    health_pb2_grpc = pytest.importorskip("grpc_health.v1.health_pb2_grpc")
    node = Node(str(store_path))
    try:
        with grpc.insecure_channel(node.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for service in ("", "nearrec.v1.Node"):
                r = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
                assert r.status == health_pb2.HealthCheckResponse.SERVING
        # reflection: a stock client finds the service and its methods without the .proto
        reflection = pytest.importorskip(
            "grpc_reflection.v1alpha.proto_reflection_descriptor_database")
        with grpc.insecure_channel(node.address) as channel:
            db = reflection.ProtoReflectionDescriptorDatabase(channel)
            assert "nearrec.v1.Node" in db.get_services()
            from google.protobuf.descriptor_pool import DescriptorPool
            service = DescriptorPool(db).FindServiceByName("nearrec.v1.Node")
            assert {"Lookup", "LookupStream", "Infer", "Write", "Info"} <= {
                m.name for m in service.methods}
        out = subprocess.run([sys.executable, "-m", "nearrec.cli", "lookup", "--remote",
                              node.address, "--batch", "4", "--repeat", "2", "--json"],
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert out.returncode == 0, out.stderr
        assert '"shape": [\n  4,\n  24\n ]' in out.stdout or '"shape"' in out.stdout
    finally:
        assert node.stop() == 0


def test_the_node_refuses_a_non_loopback_address_without_insecure(store_path):
    out = subprocess.run([sys.executable, "-m", "nearrec.cli", "serve", str(store_path),
                          "--listen", "0.0.0.0:0"], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "not a loopback address" in out.stderr


def test_a_node_config_file_serves_what_it_names_and_flags_override_it(store_path, tmp_path):
    """`nearrec serve --config node.toml`: the stores, the node's settings and the stores' own
    (`[store]`) from one file; a flag given wins over the file, a store config given where the
    node's is asked for is named as such, an unknown key is refused naming it."""
    node_toml = tmp_path / "node.toml"
    node_toml.write_text(f'stores = ["{store_path}=s"]\nmax_in_flight = 3\n'
                         f'idle_timeout = 60.0\n[store]\ntier = "ssd"\n'
                         f'dram_budget = "4KiB"\n')
    node = Node("--config", str(node_toml), "--writable")
    try:
        remote = nearrec.connect(node.address, "s")
        assert remote.tier == "ssd"
        assert remote.writable  # the flag, over the file
    finally:
        assert node.stop() == 0
    store_toml = tmp_path / "store.toml"
    store_toml.write_text('tier = "dram"\n')
    out = subprocess.run([sys.executable, "-m", "nearrec.cli", "serve", str(store_path),
                          "--config", str(store_toml)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2, out.stderr
    assert "--store-config" in out.stderr and "tier" in out.stderr
    node = Node(f"{store_path}=s", "--store-config", str(store_toml))
    try:
        assert nearrec.connect(node.address, "s").tier == "dram"
    finally:
        assert node.stop() == 0
    node_toml.write_text("max_in_flite = 3\n")
    out = subprocess.run([sys.executable, "-m", "nearrec.cli", "serve", str(store_path),
                          "--config", str(node_toml)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "max_in_flite" in out.stderr, out.stderr


def test_tokens_and_grants_refuse_with_typed_errors(tmp_path, monkeypatch):
    import hashlib
    path = build(tmp_path)

    def h(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    acl = tmp_path / "acl.toml"
    r, w, guess = "ranker-secret-7f3a", "trainer-secret-91bc", "guess-secret-55aa"
    acl.write_text(f'[principal.ranker]\ntoken_sha256 = "{h(r)}"\nread = ["store/a"]\n\n'
                   f'[principal.trainer]\ntoken_sha256 = "{h(w)}"\nread = ["*"]\n'
                   f'write = ["store/*"]\n')
    node = Node(str(path), "--writable", "--acl", str(acl), "--access-log-every", "1")
    try:
        # no token: the refusal says how to give one (issue 62, item 21)
        with pytest.raises(nearrec.Unauthenticated, match="token_file=.*NEARREC_TOKEN"):
            nearrec.connect(node.address)
        with pytest.raises(nearrec.Unauthenticated):
            nearrec.connect(node.address, token=guess)
        ranker = nearrec.connect(node.address, token=r)
        ranker.lookup("a", np.array([1, 2]), np.array([0]))
        with pytest.raises(nearrec.PermissionDenied, match="'b'|\"b\""):
            ranker.lookup("b", np.array([1]), np.array([0]))
        with pytest.raises(nearrec.PermissionDenied):
            ranker.write("a", np.array([1]), np.zeros((1, 16), np.float32))
        # the kept model's weights: write of the whole store
        with pytest.raises(nearrec.PermissionDenied, match="whole store"):
            ranker.update_model({"top.bias": np.zeros(1, np.float32)})
        trainer = nearrec.connect(node.address, token=w)
        # a swap, by version or path: admin of the whole store, which the trainer lacks
        with pytest.raises(nearrec.PermissionDenied, match="administer|admin"):
            trainer.swap(version=1)
        trainer.write("b", np.array([1]), np.ones((1, 8), np.float32))
        # a token need not be in code: from a file, or from NEARREC_TOKEN
        (tmp_path / "token").write_text(w + "\n")
        nearrec.connect(node.address, token_file=tmp_path / "token").write(
            "b", np.array([2]), np.ones((1, 8), np.float32))
        monkeypatch.setenv("NEARREC_TOKEN", w)
        nearrec.connect(node.address).write("b", np.array([3]), np.ones((1, 8), np.float32))
        monkeypatch.delenv("NEARREC_TOKEN")
        with pytest.raises(InvalidRequest, match="not both"):
            nearrec.connect(node.address, token=w, token_file=tmp_path / "token")
        with pytest.raises(nearrec.PermissionDenied):
            trainer.create_table("c", 4, 4)
        # a new ACL on SIGHUP: the ranker may now read b too
        acl.write_text(f'[principal.ranker]\ntoken_sha256 = "{h(r)}"\nread = ["*"]\n')
        node.proc.send_signal(signal.SIGHUP)
        import time
        for _ in range(100):
            try:
                np.testing.assert_array_equal(ranker.read_rows("b", np.array([1])), 1)
                break
            except nearrec.PermissionDenied:
                time.sleep(0.05)
        else:
            raise AssertionError("the reloaded ACL was not applied")
        with pytest.raises(nearrec.Unauthenticated):
            trainer.write("b", np.array([1]), np.ones((1, 8), np.float32))
        # counted, as Prometheus's parser reads them
        if importlib.util.find_spec("prometheus_client"):
            m = node.metrics()
            refused = {s[0]["reason"]: s[1] for s in m["nearrec_refused"]}
            # no token and a wrong one (at connect: Info), the trainer after the reload
            assert refused["unauthenticated"] == 3
            # b, the write, the table; the ranker's reads of b until the reload took
            assert refused["permission_denied"] >= 3
            calls = {(s[0]["call"], s[0]["code"]): s[1] for s in m["nearrec_requests"]
                     if "call" in s[0]}
            assert calls[("Write", "PermissionDenied")] == 1
            assert calls[("CreateTable", "PermissionDenied")] == 1
            assert calls[("Write", "Unauthenticated")] == 1
    finally:
        assert node.stop() == 0
    log = node.proc.stderr.read()
    assert "refused" in log and "ACL reloaded" in log, log  # refusals are logged ...
    assert not any(t in log for t in (r, w, guess)), log  # ... without the token
    # the access log names each call's principal (? for a token the ACL does not know)
    for who, call, status in (("ranker", "Lookup", "Ok"), ("trainer", "Write", "Ok"),
                              ("ranker", "Lookup", "PermissionDenied"),
                              ("?", "Info", "Unauthenticated")):
        line = rf'call="?{call}"? principal="?{re.escape(who)}"?.*status="?{status}'
        assert re.search(line, log), (who, call, status)


def test_the_audit_log_says_who_changed_what_and_who_was_refused(tmp_path):
    import hashlib
    path = build(tmp_path)

    def h(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    acl, log = tmp_path / "acl.toml", tmp_path / "audit.jsonl"
    r, w, old = "ranker-secret-7f3a", "trainer-secret-91bc", "trainer-old-0c4d"
    # the trainer's token being rotated: the old and the new both name it
    acl.write_text(f'[principal.ranker]\ntoken_sha256 = "{h(r)}"\nread = ["*"]\n\n'
                   f'[principal.trainer]\ntoken_sha256 = ["{h(old)}", "{h(w)}"]\n'
                   f'read = ["*"]\nwrite = ["*"]\nadmin = ["*"]\n')
    node = Node(str(path), "--writable", "--acl", str(acl), "--audit-log", str(log))
    try:
        ranker = nearrec.connect(node.address, token=r)
        trainer = nearrec.connect(node.address, token=w)
        nearrec.connect(node.address, token=old).write("b", np.array([4]),
                                                       np.ones((1, 8), np.float32))
        ranker.lookup("a", np.array([1, 2]), np.array([0]))  # a read: not audited
        trainer.write("b", np.array([1, 2]), np.ones((2, 8), np.float32))
        with pytest.raises(nearrec.PermissionDenied):
            ranker.write("a", np.array([1]), np.zeros((1, 16), np.float32))
        with pytest.raises(nearrec.Unauthenticated):
            nearrec.connect(node.address, token="not-a-token")
        trainer.compact()
        # rotated: moved aside, SIGHUP, and the node writes a new file at the path
        log.rename(tmp_path / "audit.1.jsonl")
        node.proc.send_signal(signal.SIGHUP)
        for _ in range(100):
            if log.exists():
                break
            time.sleep(0.05)
        trainer.write("b", np.array([3]), np.ones((1, 8), np.float32))
    finally:
        assert node.stop() == 0
    assert oct((tmp_path / "audit.1.jsonl").stat().st_mode & 0o777) == "0o600"
    text = (tmp_path / "audit.1.jsonl").read_text()
    lines = [json.loads(x) for x in text.splitlines()]
    said = [(x["call"], x["principal"], x["status"]) for x in lines]
    assert said == [("Write", "trainer", "Ok"), ("Write", "trainer", "Ok"),
                    ("Write", "ranker", "PermissionDenied"), ("Info", "?", "Unauthenticated"),
                    ("Compact", "trainer", "Ok")], said
    assert lines[1]["store"] == "store" and lines[1]["tables"] == [["b", 2]], lines[1]
    assert all(x["peer"].startswith("127.0.0.1:") and x["unix_ms"] > 0 for x in lines)
    assert not any(t in text for t in (r, w, old, "not-a-token"))
    after = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(x["call"], x["tables"]) for x in after] == [("Write", [["b", 1]])], after


def test_sigterm_under_load_loses_no_acknowledged_write(tmp_path):
    """Writers and readers hammer the node; SIGTERM drains it: it exits 0, every write it
    acknowledged is in the store, and every call either got its answer or a typed error."""
    import threading
    import time
    path = build(tmp_path)
    node = Node(str(path), "--writable", "--tier", "ssd")
    acked: list[tuple[int, float]] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def writer(k: int) -> None:
        remote = nearrec.connect(node.address)
        i = 0
        while not stop.is_set():
            row = k * 250 + i % 250  # each writer its own rows
            value = float(k * 100_000 + i)
            try:
                remote.write("a", np.array([row]), np.full((1, 16), value, np.float32))
            except (nearrec.Unavailable, nearrec.DeadlineExceeded) as e:
                failures.append(e)
                return
            acked.append((row, value))
            i += 1

    def reader() -> None:
        remote = nearrec.connect(node.address)
        rng = np.random.default_rng(1)
        while not stop.is_set():
            try:
                remote.lookup_many(batch(rng, 16))
            except (nearrec.Unavailable, nearrec.DeadlineExceeded) as e:
                failures.append(e)
                return

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(2)]
    threads.append(threading.Thread(target=reader))
    for t in threads:
        t.start()
    time.sleep(1.0)
    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(60) == 0, node.proc.stderr.read()
    stop.set()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a client hung on a draining node"
    assert len(acked) > 10, "the load never ran"
    # each row's last acknowledged value is what the store holds
    last: dict[int, float] = {}
    for row, value in acked:
        last[row] = value  # one writer per row range; a row's writes are in order
    store = nearrec.open(path)
    rows = np.array(sorted(last))
    got = store.read_rows("a", rows)[:, 0]
    want = np.array([last[r] for r in rows], np.float32)
    np.testing.assert_array_equal(got, want)


def _certificates(d: Path) -> dict[str, Path]:
    """A CA, a node certificate for 127.0.0.1 and a client certificate, made with openssl."""
    import shutil
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=nearrec test CA")
    for name, ext in [("node", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
                      ("client", "extendedKeyUsage=clientAuth")]:
        run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        (d / f"{name}.ext").write_text(ext + "\n")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return {n: d / n for n in ("ca.pem", "node.pem", "node.key", "client.pem", "client.key")}


def test_tls_and_client_certificates(tmp_path, store_path):
    c = _certificates(tmp_path)
    node = Node(str(store_path), "--tls-cert", str(c["node.pem"]), "--tls-key",
                str(c["node.key"]), "--tls-client-ca", str(c["ca.pem"]))
    try:
        ids, offsets = np.array([1, 2, 3]), np.array([0, 2])
        want = nearrec.open(store_path).lookup("a", ids, offsets)
        remote = nearrec.connect(node.address, tls_ca=c["ca.pem"], tls_cert=c["client.pem"],
                                 tls_key=c["client.key"])
        close(remote.lookup("a", ids, offsets), want)
        # no client certificate: the handshake fails; plaintext: no answer either. Each error
        # says what failed, not "transport error"
        with pytest.raises(nearrec.Unavailable, match="client certificate|the certificate"):
            nearrec.connect(node.address, tls_ca=c["ca.pem"]).lookup("a", ids, offsets)
        with pytest.raises(nearrec.Unavailable, match="a TLS node"):
            nearrec.connect(node.address).lookup("a", ids, offsets)  # racy: either message
        # a node certificate the client's CA does not sign; a name it does not hold
        with pytest.raises(nearrec.Unavailable, match="not signed by the CA"):
            nearrec.connect(node.address, tls_ca=c["node.pem"], tls_cert=c["client.pem"],
                            tls_key=c["client.key"])
        with pytest.raises(nearrec.Unavailable, match="not for the name"):
            nearrec.connect(node.address, tls_ca=c["ca.pem"], tls_domain="elsewhere",
                            tls_cert=c["client.pem"], tls_key=c["client.key"])
        plain = Node(str(store_path))
        try:
            with pytest.raises(nearrec.Unavailable, match="does not speak TLS"):
                nearrec.connect(plain.address, tls_ca=c["ca.pem"])
        finally:
            assert plain.stop() == 0
    finally:
        assert node.stop() == 0


def test_the_usual_self_signed_one_liner_is_named_once_and_the_docs_recipe_works(
        tmp_path, store_path):
    """Issue 62, item 19: `openssl req -x509` makes a CA certificate; served as the node's own,
    rustls refuses it as `CaUsedAsEndEntity`, once said in nearrec's words. The recipe in
    docs/serving.md ("TLS": a CA, then a leaf it signs) connects."""
    import shutil
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)

    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "self.key", "-out", "self.pem", "-days", "2", "-subj", "/CN=localhost",
        "-addext", "subjectAltName=IP:127.0.0.1")
    node = Node(str(store_path), "--tls-cert", str(tmp_path / "self.pem"), "--tls-key",
                str(tmp_path / "self.key"))
    try:
        with pytest.raises(nearrec.Unavailable, match="is a CA certificate") as e:
            nearrec.connect(node.address, tls_ca=tmp_path / "self.pem")
        assert str(e.value).count("CaUsedAsEndEntity") <= 1, e.value
    finally:
        assert node.stop() == 0
    docs = (Path(__file__).parent.parent / "docs" / "serving.md").read_text()
    recipe = docs.split("<!-- tls-recipe -->")[1]
    commands = [line.removeprefix("$ ") for line in recipe.splitlines()
                if line.startswith("$ ")]
    assert len(commands) == 4, commands
    for command in commands:
        subprocess.run(command, shell=True, check=True, capture_output=True, cwd=tmp_path)
    node = Node(str(store_path), "--tls-cert", str(tmp_path / "node.pem"), "--tls-key",
                str(tmp_path / "node.key"))
    try:
        remote = nearrec.connect(node.address, tls_ca=tmp_path / "ca.pem")
        assert remote.lookup("a", np.array([1]), np.array([0])).shape[0] == 1
    finally:
        assert node.stop() == 0


def test_a_stalled_tls_handshake_is_closed_at_the_handshake_timeout(tmp_path, store_path):
    """A client that connects to a TLS node and never finishes its handshake (nothing sent, or
    half a ClientHello) is closed once `--handshake-timeout` passes; clients that do finish are
    served meanwhile."""
    import socket
    c = _certificates(tmp_path)
    node = Node(str(store_path), "--tls-cert", str(c["node.pem"]), "--tls-key",
                str(c["node.key"]), "--handshake-timeout", "0.5")
    try:
        host, port = node.address.rsplit(":", 1)
        stalled = [socket.create_connection((host, int(port))) for _ in range(2)]
        stalled[1].sendall(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03")  # a cut ClientHello
        remote = nearrec.connect(node.address, tls_ca=c["ca.pem"])
        assert remote.lookup("a", np.array([1]), np.array([0])).shape == (1, 16)
        for s in stalled:
            s.settimeout(10)
            start = time.monotonic()
            try:
                while s.recv(4096):
                    pass
            except ConnectionResetError:
                pass
            assert time.monotonic() - start < 10
            s.close()
    finally:
        assert node.stop() == 0


def test_a_remote_swap_is_confined_and_checked(tmp_path):
    """`RemoteStore.swap` takes a store only from under the node's swap root and only one that
    answers what the served store answers, unless forced."""
    root = tmp_path / "stores"
    served, same = build(root / "v1"), build(root / "v2")
    rng = np.random.default_rng(1)
    nearrec.from_numpy(root / "other", {"z": rng.standard_normal((5, 4), dtype=np.float32)})
    outside = build(tmp_path / "elsewhere")
    node = Node(f"{served}=s", "--swap-root", str(root))
    try:
        remote = nearrec.connect(node.address, "s")
        with pytest.raises(nearrec.PermissionDenied):
            remote.swap(str(outside))
        with pytest.raises(InvalidRequest, match="no table"):
            remote.swap("other")
        remote.swap(str(same))
        remote.swap("other", force=True)
        assert list(remote.tables) == ["z"]
    finally:
        assert node.stop() == 0


def test_torch_modules_and_models_over_a_node_equal_the_local_ones(tmp_path):
    """nearrec.torch.EmbeddingBagCollection(remote) and nearrec.models.build(name, remote) give
    the local store's outputs; the model kept with the store runs on the node."""
    torch = pytest.importorskip("torch")
    from nearrec.models import build as build_model
    from nearrec.models import offload, save
    from nearrec.torch import EmbeddingBagCollection, KeyedJaggedTensor
    path = tmp_path / "rmc1"
    nearrec.build(path, "rmc1", rows=200, seed=1, progress=False)
    local = nearrec.open(path)
    model = build_model("rmc1", local, seed=3)
    save(model, path)
    node = Node(str(path), "--tier", "ssd")
    try:
        remote = nearrec.connect(node.address)
        assert remote.has_model
        tables = [f"t{i}" for i in range(len(local.tables))]
        rng = np.random.default_rng(2)
        lengths = torch.from_numpy(rng.integers(0, 5, 6 * len(tables)))
        values = torch.from_numpy(rng.integers(0, 200, int(lengths.sum())))
        kjt = KeyedJaggedTensor(tables, values, lengths)
        want = EmbeddingBagCollection(local, tables)(kjt)
        got = EmbeddingBagCollection(remote, tables)(kjt)
        assert got.keys() == want.keys()
        torch.testing.assert_close(got.values(), want.values(), rtol=1e-5, atol=1e-6)
        width = nearrec.model_spec("rmc1").dense_features
        dense = torch.from_numpy(rng.standard_normal((6, width)).astype(np.float32))
        over_node = build_model("rmc1", remote, seed=3)
        with torch.inference_mode():
            torch.testing.assert_close(over_node(dense, kjt), model(dense, kjt),
                                       rtol=1e-4, atol=2e-6)
            want_out = model(dense, kjt).numpy()
        np.testing.assert_allclose(remote.infer(dense.numpy(), kjt), want_out, rtol=1e-4,
                                   atol=2e-6)
        if importlib.util.find_spec("prometheus_client"):
            # the one Infer call, timed by stage as Prometheus's parser reads it: its
            # embeddings' route, I/O and pooling, the model's own time, and the answer's send
            seconds = {stage: node.histogram("nearrec_request_seconds", call="Infer", stage=stage)
                       for stage in ("queue", "route", "io", "pool", "infer", "engine", "total",
                                     "send")}
            assert all(h["count"] == 1 for h in seconds.values()), seconds
            assert seconds["infer"]["sum"] > 0
            assert seconds["io"]["sum"] > 0, seconds  # the SSD tier read
        # a model offloaded here runs over the node too: pooled there, its dense part here
        with torch.inference_mode():
            torch.testing.assert_close(offload(over_node)(dense, kjt), model(dense, kjt),
                                       rtol=1e-4, atol=2e-6)
    finally:
        assert node.stop() == 0


def _remote_forward(module: Any, *args: Any) -> Any:
    """Runs in a spawned process: ``module`` arrived pickled, connected again there."""
    import torch
    with torch.inference_mode():
        return module(*args).values()


def test_modules_over_a_node_pickle_fork_and_spawn_without_carrying_the_token(
        tmp_path, monkeypatch):
    import copy
    import hashlib
    import multiprocessing
    import pickle

    torch = pytest.importorskip("torch")
    from nearrec.remote import TOKEN_ENV
    from nearrec.torch import EmbeddingBagCollection, KeyedJaggedTensor
    path = build(tmp_path)
    token = "reader-secret-3c1d"
    acl = tmp_path / "acl.toml"
    digest = hashlib.sha256(token.encode()).hexdigest()
    acl.write_text(f'[principal.reader]\ntoken_sha256 = "{digest}"\nread = ["*"]\n')
    node = Node(f"{path}=s", "--acl", str(acl), "--tier", "ssd")
    try:
        remote = nearrec.connect(node.address, token=token, timeout=30)
        ebc = EmbeddingBagCollection(remote, ["a", "b"])
        rng = np.random.default_rng(4)

        def features(n: int) -> Any:
            lengths = torch.from_numpy(rng.integers(0, 4, 2 * n))
            values = torch.cat([torch.from_numpy(rng.integers(0, ROWS[t], int(k)))
                                for t, per in zip("ab", lengths.reshape(2, n), strict=True)
                                for k in per])
            return KeyedJaggedTensor(["a", "b"], values, lengths)

        kjt = features(5)
        want = ebc(kjt).values()
        local = EmbeddingBagCollection(nearrec.open(path), ["a", "b"])
        torch.testing.assert_close(want, local(kjt).values(), rtol=1e-3, atol=1e-3)
        assert copy.deepcopy(ebc).store is remote  # a copy shares the connection
        blob = pickle.dumps(ebc)
        assert token.encode() not in blob  # the token never travels
        monkeypatch.delenv(TOKEN_ENV, raising=False)
        with pytest.raises(nearrec.Unauthenticated, match=TOKEN_ENV):
            pickle.loads(blob)
        monkeypatch.setenv(TOKEN_ENV, token)
        again = pickle.loads(blob)
        assert again.store is not remote and again.store.name == "s"
        torch.testing.assert_close(again(kjt).values(), want)
        torch.save(ebc, tmp_path / "ebc.pt")
        torch.testing.assert_close(torch.load(tmp_path / "ebc.pt", weights_only=False)(kjt)
                                   .values(), want)
        # a spawned process: pickled there, connected again with the token from its environment
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            torch.testing.assert_close(pool.apply(_remote_forward, (ebc, kjt)), want)
        # forked DataLoader workers: each child makes its own connection on its first call
        batches = [features(3) for _ in range(6)]
        loader = torch.utils.data.DataLoader(Lookups(ebc, batches), batch_size=None,
                                             num_workers=2, multiprocessing_context="fork",
                                             timeout=60)  # a child hung on its parent's runtime
        for got, b in zip(loader, batches, strict=True):
            torch.testing.assert_close(got, ebc(b).values())
        torch.testing.assert_close(ebc(kjt).values(), want)  # the parent's connection still works
    finally:
        assert node.stop() == 0


def test_a_captured_torchrec_model_kept_with_its_store_runs_on_the_node(tmp_path):
    """A TorchRec DLRM after from_torchrec, saved with its store: the node runs its program,
    the features (two of which read one table) matched by name and pooled as its configs say."""
    torch = pytest.importorskip("torch")
    torchrec = pytest.importorskip("torchrec")
    from torchrec.models.dlrm import DLRM

    from nearrec.models import save
    from nearrec.torch import from_torchrec
    torch.manual_seed(3)
    tables = [torchrec.EmbeddingBagConfig(
        name=f"t{i}", embedding_dim=8, num_embeddings=100,
        feature_names=[f"f{i}"] + (["g"] if i == 0 else []),
        pooling=torchrec.PoolingType.MEAN if i == 1 else torchrec.PoolingType.SUM)
        for i in range(3)]
    model = DLRM(embedding_bag_collection=torchrec.EmbeddingBagCollection(tables=tables),
                 dense_in_features=4, dense_arch_layer_sizes=[8],
                 over_arch_layer_sizes=[8, 1]).eval()
    save(from_torchrec(model, tmp_path / "dlrm"), tmp_path / "dlrm")
    node = Node(str(tmp_path / "dlrm"), "--tier", "ssd")
    try:
        remote = nearrec.connect(node.address)
        assert remote.has_model
        rng = np.random.default_rng(1)
        keys = ["f0", "g", "f1", "f2"]
        lengths = torch.from_numpy(rng.integers(1, 4, 4 * 5))
        kjt = torchrec.KeyedJaggedTensor(
            keys=keys, values=torch.from_numpy(rng.integers(0, 100, int(lengths.sum()))),
            lengths=lengths)
        dense = torch.randn(5, 4)
        with torch.inference_mode():
            want = model(dense, kjt).numpy()
        np.testing.assert_allclose(remote.infer(dense.numpy(), kjt), want, rtol=1e-5, atol=1e-6)
    finally:
        assert node.stop() == 0
