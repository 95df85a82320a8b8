"""A store cut into shards and served by several nodes (`nearrec.distributed`, `nearrec shard`):
every scheme's lookups held to the embedded store and to `torch.nn.EmbeddingBag`, a
`nearrec.torch` module run on it unchanged, the plan and its cut checked, and what only a
sharded store refuses, typed."""

from __future__ import annotations

import json
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import Node
from dlrm_requests import TORCHREC_INPUTS, TORCHREC_ROWS, body_for, torchrec_answer, torchrec_dlrm

import nearrec
import nearrec.torch
from nearrec import TableLookup, distributed

ROWS = {"a": 600, "b": 400, "c": 90}
DIMS = {"a": 16, "b": 8, "c": 4}


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(11)
    path = tmp_path_factory.mktemp("dist") / "store"
    nearrec.from_numpy(path, {t: rng.standard_normal((ROWS[t], DIMS[t]), dtype=np.float32)
                              for t in ROWS}, dtype={"b": "fp16", "c": "int8"})
    return path


@pytest.fixture(scope="module")
def trace_path(store_path: Path) -> Path:
    from nearrec import trace as nt

    out = store_path.parent / "t.nrtrace"
    nt.generate(ROWS, 2000, 4, nt.Generator.zipf(1.1), seed=3, path=out)
    return out


class Served:
    """A sharded store's nodes (each replica `nearrec serve` of a copy of its shard)."""

    def __init__(self, root: Path, plan: distributed.ShardPlan):
        self.plan, self.nodes = plan, [[] for _ in range(plan.shards)]
        for k in range(plan.shards):
            for r in range(plan.replicas):
                copy = root / f"copy-{k}-{r}"
                subprocess.run(["cp", "-r", str(root / f"shard-{k}"), str(copy)], check=True)
                self.nodes[k].append(Node(f"{copy}=s", "--tier", "ssd", "--dram-budget",
                                          "8KiB", "--writable"))

    def replicas(self) -> list[list[str]]:
        return [[f"{n.address}/s" for n in shard] for shard in self.nodes]

    def stop(self) -> None:
        for shard in self.nodes:
            for n in shard:
                n.stop()


def name_replicas(root: Path, replicas: list[list[str]], settings: str) -> None:
    """A front node's `replicas.toml` naming `replicas` (JSON's arrays of strings are TOML's),
    with `settings` lines after."""
    (root / "replicas.toml").write_text(f"shards = {json.dumps(replicas)}\n{settings}\n")


@pytest.fixture(scope="module", params=[("table", 3, 1, 0), ("row", 2, 2, 0),
                                        ("table-row", 4, 1, 0), ("row", 3, 1, 10)],
                ids=["table", "row-2x2", "table-row", "row-hot"])
def sharded(request: pytest.FixtureRequest, store_path: Path, trace_path: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[nearrec.Store, Served]]:
    scheme, shards, replicas, hot = request.param
    root = tmp_path_factory.mktemp("shards")
    plan = distributed.shard(store_path, root, shards, replicas=replicas, scheme=scheme,
                             trace=trace_path, replicate_hot=hot)
    served = Served(root, plan)
    try:
        yield distributed.connect(root, served.replicas()), served
    finally:
        served.stop()


def batch(rng: np.random.Generator, bags: int) -> list[TableLookup]:
    out = []
    for t, mode in zip(ROWS, ["sum", "mean", "max"], strict=True):
        lengths = rng.integers(0, 7, bags)
        ids = rng.integers(0, ROWS[t], int(lengths.sum()))
        out.append(TableLookup(t, ids, lengths=lengths, mode=mode))
    return out


def test_lookups_equal_the_embedded_store_and_torch(sharded, store_path):
    import torch

    store, _ = sharded
    local = nearrec.open(store_path)
    assert store.tables == local.tables
    rng = np.random.default_rng(5)
    for _ in range(15):
        reqs = batch(rng, int(rng.integers(1, 40)))
        np.testing.assert_allclose(store.lookup_many(reqs).values,
                                   local.lookup_many(reqs).values, rtol=1e-5, atol=1e-5)
    # a nearrec.torch module over the sharded store, against torch's own EmbeddingBag
    weights = torch.from_numpy(local.read_rows("a", np.arange(ROWS["a"])))
    ids = torch.from_numpy(rng.integers(0, ROWS["a"], 200))
    offsets = torch.arange(0, 200, 5)
    psw = torch.rand(200)
    bag = nearrec.torch.EmbeddingBag(store, "a", mode="sum")
    want = torch.nn.functional.embedding_bag(ids, weights, offsets, mode="sum",
                                             per_sample_weights=psw)
    torch.testing.assert_close(bag(ids, offsets, per_sample_weights=psw), want,
                               rtol=1e-5, atol=1e-5)
    # distinct rows, and a pickled store that connects again
    reqs = batch(rng, 9)
    for (table, got_ids, values), r in zip(store.lookup_rows(reqs), reqs, strict=True):
        np.testing.assert_array_equal(got_ids, np.unique(np.asarray(r.indices)))
        np.testing.assert_array_equal(values, local.read_rows(table, got_ids))
    again = pickle.loads(pickle.dumps(store))
    # (to rounding: the SSD tier pools rows in the order they land)
    np.testing.assert_allclose(again.lookup_many(reqs).values, store.lookup_many(reqs).values,
                               rtol=1e-5, atol=1e-6)


def test_bad_input_is_the_engines_error_and_no_shard_is_asked(sharded):
    store, _ = sharded
    before = store.stats()["cluster_reads"]
    with pytest.raises(nearrec.IndexOutOfRange) as e:
        store.lookup("b", np.array([1, 2, 400]), np.array([0, 2]))
    assert (e.value.table, e.value.position) == ("b", 2)
    with pytest.raises(nearrec.UnknownTable):
        store.lookup("z", np.array([1]), np.array([0]))
    assert store.stats()["cluster_reads"] == before


def test_writes_reach_one_shard_or_commit_across_shards_whole(sharded):
    store, served = sharded
    plan = served.plan
    a = next(t for t in plan.tables if t.name == "a")
    first, last = a.parts[0], a.parts[-1]
    row = np.full((1, DIMS["a"]), 3.5, np.float32)
    version = store.write("a", np.array([first.first]), row)
    np.testing.assert_array_equal(store.read_rows("a", np.array([first.first])), row)
    assert store.version == version
    # rows on two shards (or hot rows, on every shard of the table): all of it, or none
    two = [first.first + 1, last.first + last.rows - 1]
    ids = np.array(two + [h for h in a.hot if h not in two][:2])
    values = np.arange(len(ids) * DIMS["a"], dtype=np.float32).reshape(len(ids), -1)
    bad = values.copy()
    bad[1, 3] = np.nan
    with pytest.raises(nearrec.InvalidRequest) as e:
        store.write("a", ids, bad)
    assert (e.value.table, e.value.position) == ("a", 1)
    assert store.version == version
    after = store.write("a", ids, values)
    assert after > version
    np.testing.assert_array_equal(store.read_rows("a", ids), values)
    # every bag that reads them, on whichever shards it is sent to, reads the new rows
    got = store.lookup("a", ids, np.arange(len(ids)), mode="sum")
    np.testing.assert_array_equal(got, values)


def test_the_plan_and_its_cut(store_path, trace_path, tmp_path):
    out = tmp_path / "cut"
    r = subprocess.run([sys.executable, "-m", "nearrec.cli", "shard", str(store_path),
                        "--shards", "3", "--scheme", "row", "--trace", str(trace_path),
                        "--replicate-hot", "8", "--out", str(out), "--json"],
                       capture_output=True, text=True, check=True)
    data = json.loads(r.stdout)
    plan = distributed.load_plan(out)
    assert data["plan"] == plan.id and data["shards"] == 3 and plan.scheme == "row"
    assert all(len(t.hot) == 8 and len(t.parts) == 3 for t in plan.tables)
    assert sum(data["shard_bytes"]) == sum(plan.shard_bytes())
    # the hot rows are the trace's most read, and the cuts spread its reads
    from nearrec import trace as nt

    trace = nt.load(trace_path)
    for t in plan.tables:
        counts = np.bincount(trace.tables[t.name].indices, minlength=t.rows)
        hot = np.asarray(t.hot)
        assert counts[hot].min() >= np.delete(counts, hot).max(), t.name
        reads = [counts[p.first:p.first + p.rows].sum() for p in t.parts]
        assert max(reads) < 0.8 * counts.sum(), (t.name, reads)
    for k in range(3):
        # each shard a repository of versions, the cut its version 1 and the one it serves
        assert json.loads((out / f"shard-{k}" / "CURRENT").read_text())["current"] == 1
        info = nearrec.info(out / f"shard-{k}" / "1")
        assert {t.name for t in info.tables} == set(ROWS)
    # a second cut at OUT is refused; an edited plan is refused naming what is wrong
    with pytest.raises(nearrec.StoreExists):
        distributed.shard(store_path, out, 2)
    text = (out / "shards.json").read_text()
    (out / "shards.json").write_text(text.replace('"rows": 600', '"rows": 601', 1))
    with pytest.raises(nearrec.InvalidRequest, match="table \"a\""):
        distributed.load_plan(out)
    with pytest.raises(nearrec.StoreNotFound):
        distributed.load_plan(tmp_path)
    with pytest.raises(nearrec.InvalidRequest, match="scheme"):
        distributed.plan_shards(store_path, 2, scheme="diagonal")
    with pytest.raises(nearrec.InvalidRequest, match="replicate_hot"):
        distributed.plan_shards(store_path, 2, scheme="row", replicate_hot=3)


def test_replicas_that_do_not_fit_the_plan_are_refused_naming_the_shard(store_path, tmp_path):
    plan = distributed.shard(store_path, tmp_path / "s", 2, scheme="table")
    served = Served(tmp_path / "s", plan)
    try:
        replicas = served.replicas()
        with pytest.raises(nearrec.InvalidRequest, match="does not fit plan"):
            distributed.connect(tmp_path / "s", replicas[::-1])
        with pytest.raises(nearrec.InvalidRequest, match="2 shards"):
            distributed.connect(tmp_path / "s", replicas[:1])
        for bad in ("p100", "soon", -1.0):
            with pytest.raises(nearrec.InvalidRequest, match="hedge"):
                distributed.connect(tmp_path / "s", replicas, hedge=bad)
        # a shard's only node gone: its reads wait out their deadline (docs/distributed.md),
        # which this test keeps short
        store = distributed.connect(plan, replicas, hedge=None, timeout=2.0)
        served.nodes[1][0].stop()
        t = plan.shard_tables(1)[0][0]
        with pytest.raises(nearrec.Unavailable, match="shard 1 of store"):
            store.lookup(t.name, np.array([0]), np.array([0]))
    finally:
        served.stop()


def test_a_node_serves_a_sharded_store_at_one_address(store_path, tmp_path):
    root = tmp_path / "s"
    plan = distributed.shard(store_path, root, 2, scheme="row")
    served = Served(root, plan)
    try:
        name_replicas(root, served.replicas(), 'timeout = 2.0\nhedge = "off"')
        front = Node("--shards", f"{root}=dlrm")
        try:
            remote = nearrec.connect(front.address, "dlrm", retries=0)
            assert remote.tables == nearrec.open(store_path).tables
            local = nearrec.open(store_path)
            reqs = batch(np.random.default_rng(8), 12)
            np.testing.assert_allclose(remote.lookup_many(reqs).values,
                                       local.lookup_many(reqs).values, rtol=1e-5, atol=1e-5)
            # a shard's only node gone: the front answers, typed, naming the shard
            served.nodes[1][0].stop()
            with pytest.raises(nearrec.Unavailable, match="shard 1 of store"):
                remote.lookup_many(reqs)
            # the shard served again elsewhere, named in replicas.toml: a SIGHUP and the front
            # reads from it (a file that does not load leaves the replicas as they were)
            (root / "replicas.toml").write_text("shards = [[\"nowhere\"]]\n")
            front.proc.send_signal(signal.SIGHUP)
            time.sleep(1.0)
            moved = Node(f"{root / 'copy-1-0'}=s", "--tier", "ssd", "--dram-budget", "8KiB")
            try:
                replicas = served.replicas()
                replicas[1] = [f"{moved.address}/s"]
                name_replicas(root, replicas, 'timeout = 2.0\nhedge = "off"')
                front.proc.send_signal(signal.SIGHUP)
                deadline = time.monotonic() + 30
                while True:
                    try:
                        got = remote.lookup_many(reqs).values
                        break
                    except nearrec.Unavailable:
                        assert time.monotonic() < deadline, "the front never read the new node"
                        time.sleep(0.1)
                np.testing.assert_allclose(got, local.lookup_many(reqs).values, rtol=1e-5,
                                           atol=1e-5)
            finally:
                moved.stop()
        finally:
            front.stop()
        assert "replicas not reloaded" in front.proc.stderr.read()
    finally:
        served.stop()
    # a directory without replicas.toml: the node says so before it listens
    (root / "replicas.toml").unlink()
    r = subprocess.run([sys.executable, "-m", "nearrec.cli", "serve", "--shards", str(root)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "replicas.toml" in r.stderr, r.stderr


def test_a_kept_model_runs_on_a_sharded_store_and_a_front_node(tmp_path):
    """A TorchRec DLRM kept with its store, cut so that no shard holds every table: the router
    pools across the shards and runs the dense part itself (the model read from a shard), on
    a sharded store and behind a front node, equal to TorchRec's model."""
    import torch

    from nearrec.torch import KeyedJaggedTensor

    theirs, _ = torchrec_dlrm(tmp_path / "dlrm")
    root = tmp_path / "s"
    plan = distributed.shard(tmp_path / "dlrm", root, 2, scheme="table")
    for k in range(plan.shards):
        assert any(all(p.shard != k for p in t.parts) for t in plan.tables), k
    served = Served(root, plan)
    try:
        name_replicas(root, served.replicas(), 'timeout = 5.0\nhedge = "off"')
        front = Node("--shards", f"{root}=dlrm")
        try:
            stores = {"sharded": distributed.connect(root, served.replicas()),
                      "front": nearrec.connect(front.address, "dlrm"),
                      # as the front node opens it: the nodes its replicas.toml names
                      "dir": distributed.open_dir(root)}
            rng = np.random.default_rng(9)
            for batch in (1, 7):
                body = body_for(rng, TORCHREC_INPUTS, TORCHREC_ROWS, 5, batch)
                f = body["features"]
                kjt = KeyedJaggedTensor(
                    TORCHREC_INPUTS,
                    torch.tensor([i for k in TORCHREC_INPUTS for i in f[k]["ids"]]),
                    lengths=torch.tensor([n for k in TORCHREC_INPUTS for n in f[k]["lengths"]]))
                want = torchrec_answer(theirs, body)
                for name, store in stores.items():
                    got = store.infer(np.asarray(body["dense"], np.float32), kjt)
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)
        finally:
            front.stop()
    finally:
        served.stop()


def test_a_front_node_catches_up_a_replica_that_was_down(store_path, tmp_path):
    root = tmp_path / "s"
    plan = distributed.shard(store_path, root, 1, replicas=2, scheme="table")
    served = Served(root, plan)
    restarted = None
    try:
        name_replicas(root, served.replicas(), "timeout = 5.0")
        front = Node("--shards", f"{root}=dlrm")
        try:
            remote = nearrec.connect(front.address, "dlrm", retries=0)
            ids = np.arange(0, ROWS["a"], 5)
            for k in range(3):
                remote.write("a", ids, np.full((len(ids), DIMS["a"]), k, np.float32))
            # replica 1 down: the writes go on without it (it is left out of the shard)
            served.nodes[0][1].stop()
            for k in range(3, 6):
                remote.write("a", ids[::2], np.full((len(ids[::2]), DIMS["a"]), k, np.float32))
            want = remote.read_rows("a", np.arange(ROWS["a"]))
            # back at another address, behind: named in replicas.toml; the front node finds it
            # left out, catches it up by itself and serves it again
            restarted = Node(f"{root / 'copy-0-1'}=s", "--tier", "ssd", "--dram-budget", "8KiB",
                             "--writable")
            replicas = served.replicas()
            replicas[0][1] = f"{restarted.address}/s"
            name_replicas(root, replicas, "timeout = 5.0")
            front.proc.send_signal(signal.SIGHUP)
            back = nearrec.connect(restarted.address, "s")
            member = nearrec.connect(served.nodes[0][0].address, "s")
            deadline = time.monotonic() + 30
            while back.version != member.version:
                assert time.monotonic() < deadline, "the replica never caught up"
                time.sleep(0.2)
            np.testing.assert_array_equal(back.read_rows("a", np.arange(ROWS["a"])), want)
            # a write after it is admitted reaches it; with the member gone, it serves alone
            remote.write("a", ids[:1], np.full((1, DIMS["a"]), 9, np.float32))
            served.nodes[0][0].stop()
            want[ids[0]] = 9
            np.testing.assert_array_equal(remote.read_rows("a", np.arange(ROWS["a"])), want)
        finally:
            front.stop()
        assert "caught up" in front.proc.stderr.read()
    finally:
        served.stop()
        if restarted is not None:
            restarted.stop()


def test_a_front_node_with_a_shard_down_takes_new_clients_and_the_cli_prints_its_stats(
        store_path, tmp_path):
    """Issue 62, items 14 and 22: `nearrec lookup --remote` against a front node crashed on a
    router's stats (`KeyError: 'dram_hit_ratio'`); a front node with one shard down refused every
    new client. Its stats print (no `0.00 s` stage times), and with a shard down a new client
    connects, reads the other shard's tables, and a call that needs the missing one is named."""
    root = tmp_path / "s"
    plan = distributed.shard(store_path, root, 2, scheme="table")
    served = Served(root, plan)
    try:
        name_replicas(root, served.replicas(), 'timeout = 2.0\nhedge = "off"')
        front = Node("--shards", f"{root}=dlrm")
        try:
            out = subprocess.run([sys.executable, "-m", "nearrec.cli", "lookup", "--remote",
                                  front.address, "dlrm", "--batch", "4", "--repeat", "2"],
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            assert "router: shards 2" in out.stdout and "0.00 s" not in out.stdout, out.stdout
            served.nodes[1][0].stop()
            remote = nearrec.connect(front.address, "dlrm", retries=0)
            assert set(remote.tables) == {t.name for t in plan.tables}
            up = plan.shard_tables(0)[0][0].name
            gone = plan.shard_tables(1)[0][0].name
            assert remote.lookup(up, np.array([1]), np.array([0])).shape[0] == 1
            with pytest.raises(nearrec.Unavailable, match="shard 1"):
                remote.lookup(gone, np.array([1]), np.array([0]))
        finally:
            front.stop()
    finally:
        served.stop()
