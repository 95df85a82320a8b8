"""The store's conformance suite from Python (the twin of `crates/nearrec/tests/suite/`): every
kind of store — embedded on the DRAM tier, embedded on the SSD tier behind DRAM tiers smaller
than its tables, a node's through `nearrec.connect`, a store cut into two shards on two nodes
through `nearrec.distributed.connect`, and the same shards launched on a Ray cluster of two
nodes by `nearrec.ray.ShardedStore` — gives the same answers to the same calls, against
a pooling written here from the rows' values, and the same typed errors. A case that needs a
capability the store lacks (`Store.capabilities`), or what its opener says it lacks, is
skipped, saying which."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import Node, damage

import nearrec
from nearrec import (
    IndexOutOfRange,
    InvalidRequest,
    StoreReadOnly,
    TableLookup,
    Unavailable,
    UnknownTable,
    distributed,
)

ROWS, DIM = 300, 8
DTYPES = {"t0": "fp32", "t1": "fp16"}



def values(sign: float = 1.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    return {t: sign * rng.standard_normal((ROWS, DIM), dtype=np.float32) for t in DTYPES}


def write_store(path: Path, sign: float = 1.0, tables: tuple[str, ...] = tuple(DTYPES)) -> Path:
    v = values(sign)
    nearrec.from_numpy(path, {t: v[t] for t in tables}, dtype={t: DTYPES[t] for t in tables})
    return path


def served(t: str) -> np.ndarray:
    """Table `t` as the store serves it: written, then through its dtype."""
    v = values()[t]
    return v.astype(np.float16).astype(np.float32) if DTYPES[t] == "fp16" else v


class Open:
    """Opens a store directory as the implementation under test serves it; `lacks` is what that
    implementation cannot do beyond its capabilities, each with why."""

    def __init__(self, kind: str):
        self.kind, self.nodes, self.lacks = kind, list[Node](), dict[str, str]()
        self.launched = list[str]()
        if kind in ("sharded", "ray"):
            self.lacks["path swaps"] = ("a sharded store swaps to versions every shard holds "
                                        "(nearrec shard --publish), not to a directory")
            self.lacks["its table files at the path"] = ("each shard serves a copy of its part, "
                                                         "cut from the path")

    def __call__(self, path: Path, writable: bool) -> nearrec.Store:
        flags = ["--tier", "ssd", "--dram-budget", "16KiB", *(["--writable"] if writable else [])]
        if self.kind == "dram":
            return nearrec.open(path, tier="dram", writable=writable)
        if self.kind == "ssd":
            return nearrec.open(path, tier="ssd", dram_budget="16KiB", writable=writable)
        if self.kind == "node":
            # the suite swaps to stores beside the one served, not versions of a repository
            node = Node(f"{path}=s", "--swap-root", str(path.parent), *flags)
            self.nodes.append(node)
            return nearrec.connect(node.address, "s")
        root = path.parent / f"{path.name}-shards"
        plan = distributed.shard(path, root, 2, scheme="row")
        if self.kind == "ray":
            from nearrec.ray import ShardedStore
            name = f"contract-{path.parent.name}-{len(self.launched)}"
            self.launched.append(name)
            return ShardedStore.launch(root, name=name, num_cpus=0.25, tier="ssd",
                                       dram_budget="16KiB", writable=writable, timeout=30.0)
        shards = [Node(f"{root}/shard-{k}=s", *flags) for k in range(plan.shards)]
        self.nodes += shards
        return distributed.connect(root, [[f"{n.address}/s"] for n in shards])

    def needs(self, store: nearrec.Store, capability: str) -> None:
        if capability not in store.capabilities:
            pytest.skip(f"{self.kind}: the store has no {capability}")

    def lacking(self, what: str) -> None:
        if what in self.lacks:
            pytest.skip(f"{self.kind} lacks {what}: {self.lacks[what]}")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """A Ray cluster of two nodes on this machine, for the `ray` store."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    c.add_node(num_cpus=2)
    c.wait_for_nodes()
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(params=["dram", "ssd", "node", "sharded", "ray"])
def open_store(request: pytest.FixtureRequest) -> Iterator[Open]:
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
    opener = Open(request.param)
    yield opener
    for node in opener.nodes:
        assert node.stop() == 0
    if opener.launched:
        from nearrec.ray import ShardedStore
        for name in opener.launched:
            ShardedStore.shutdown(name)


def pool(t: str, ids: np.ndarray, lengths: np.ndarray, mode: str,
         weights: np.ndarray | None, padding: int | None) -> np.ndarray:
    """`torch.nn.EmbeddingBag`'s pooling of one table's bags, in numpy."""
    rows, out, at = served(t), [], 0
    for n in lengths:
        bag = [(i, 1.0 if weights is None else weights[k])
               for k, i in enumerate(ids[at:at + n], start=at) if i != padding]
        at += n
        if not bag:
            out.append(np.zeros(DIM, np.float32))
        elif mode == "max":
            out.append(np.max([rows[i] for i, _ in bag], axis=0))
        else:
            total = np.sum([w * rows[i] for i, w in bag], axis=0)
            out.append(total / len(bag) if mode == "mean" else total)
    return np.array(out, dtype=np.float32)


def test_lookups_pool_as_the_reference_for_every_mode(open_store: Open, tmp_path: Path):
    store = open_store(write_store(tmp_path / "s"), False)
    rng = np.random.default_rng(3)
    for round_, (mode, weighted) in enumerate([("sum", False), ("sum", True), ("mean", False),
                                               ("max", False)] * 3):
        batch = int(rng.integers(1, 9))
        padding = int(rng.integers(ROWS)) if round_ % 3 == 0 else None
        reqs, want = [], []
        for t in DTYPES:
            lengths = rng.integers(0, 6, batch)
            ids = rng.integers(0, ROWS, int(lengths.sum()))
            w = rng.uniform(-1, 1, ids.size).astype(np.float32) if weighted else None
            dtype = np.int32 if round_ % 2 else np.int64
            reqs.append(TableLookup(t, ids.astype(dtype), lengths=lengths,
                                    per_sample_weights=w, mode=mode, padding_idx=padding))
            want.append(pool(t, ids, lengths, mode, w, padding))
        got = store.lookup_many(reqs)
        for t, w in zip(DTYPES, want, strict=True):
            np.testing.assert_allclose(got[t], w, rtol=1e-5, atol=1e-5)
    # the distinct rows a batch reads, ascending; rows by id
    (table, ids, rows), = store.lookup_rows([TableLookup("t1", np.array([7, 3, 7, 299]),
                                                          lengths=np.array([2, 2]))])
    assert table == "t1" and ids.tolist() == [3, 7, 299]
    np.testing.assert_array_equal(rows, served("t1")[[3, 7, 299]])
    np.testing.assert_array_equal(store.read_rows("t0", [5, 0]), served("t0")[[5, 0]])


def test_writes_are_read_back_at_their_version(open_store: Open, tmp_path: Path):
    store = open_store(write_store(tmp_path / "s"), True)
    v0 = store.version
    new = np.arange(2 * DIM, dtype=np.float32).reshape(2, DIM) + 0.25
    v1 = store.write("t0", [4, 9], new)
    assert v1 > v0 and store.version == v1
    np.testing.assert_array_equal(store.read_rows("t0", [4, 9]), new)
    v2 = store.remove("t0", [4])
    assert v2 > v1
    np.testing.assert_array_equal(store.read_rows("t0", [4])[0], np.zeros(DIM))
    with pytest.raises(InvalidRequest) as e:
        store.write("t0", [1], np.full((1, DIM), np.nan, np.float32))
    assert e.value.table == "t0" and store.version == v2


def test_bad_input_gets_a_typed_error_naming_table_and_position(open_store: Open,
                                                               tmp_path: Path):
    store = open_store(write_store(tmp_path / "s"), False)
    with pytest.raises(IndexOutOfRange) as e:
        store.lookup("t0", np.array([1, 2, ROWS]), np.array([0]))
    assert (e.value.table, e.value.position) == ("t0", 2)
    with pytest.raises(UnknownTable) as u:
        store.lookup_many([TableLookup("nope", np.array([1]), np.array([0]))])
    assert u.value.table == "nope"
    with pytest.raises(InvalidRequest) as b:
        store.lookup_many([TableLookup("t1", np.array([1, 2]), lengths=np.array([1, 5]))])
    assert b.value.table == "t1"
    with pytest.raises(StoreReadOnly):
        store.write("t0", [0], np.zeros((1, DIM), np.float32))
    if "inference" in store.capabilities:
        with pytest.raises(InvalidRequest):  # no model is kept with it
            store.infer(None, [TableLookup("t0", np.array([1]), np.array([0]))])
    assert store.lookup("t0", np.array([1]), np.array([0])).shape == (1, DIM)


def test_readers_see_whole_writes_while_writes_go_on(open_store: Open, tmp_path: Path):
    store = open_store(write_store(tmp_path / "s"), True)
    ids = np.arange(32)
    stop, torn = threading.Event(), []

    def read() -> None:
        seen = 0.0
        while not stop.is_set():
            got = store.read_rows("t0", ids)
            first = float(got[0, 0])
            if first >= 1000 and (not (got == first).all() or first < seen):
                torn.append(first)
            seen = max(seen, first)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for r in readers:
        r.start()
    for k in range(15):
        store.write("t0", ids, np.full((ids.size, DIM), 1000.0 + k, np.float32))
    stop.set()
    for r in readers:
        r.join()
    assert not torn
    assert (store.read_rows("t0", ids) == 1014.0).all()


def test_tables_are_created_dropped_compacted_and_synced(open_store: Open, tmp_path: Path):
    store = open_store(write_store(tmp_path / "s"), True)
    open_store.needs(store, "schema")
    v = store.create_table("fresh", 50, 4, init="zeros")
    assert store.version == v and store.table("fresh").rows == 50
    trainer = np.zeros((50, 4), np.float32)
    trainer[1], trainer[49] = [1, 2, 3, 4], 5
    done = store.sync_table("fresh", trainer)
    assert (done.compared, done.written) == (50, 2)
    assert store.sync_table("fresh", trainer).written == 0
    assert store.compact().version == store.version
    np.testing.assert_array_equal(store.read_rows("fresh", [1, 49]), trainer[[1, 49]])
    store.drop_table("fresh")
    assert "fresh" not in store.tables
    with pytest.raises(UnknownTable):
        store.drop_table("fresh")


def test_a_swap_serves_the_new_store_and_refuses_an_incompatible_one(open_store: Open,
                                                                    tmp_path: Path):
    path = write_store(tmp_path / "s")
    negated = write_store(tmp_path / "next", sign=-1.0)
    smaller = write_store(tmp_path / "other", tables=("t0",))
    open_store.lacking("path swaps")
    store = open_store(path, False)
    before = store.read_rows("t0", [3, 8])
    with pytest.raises(InvalidRequest):
        store.swap(smaller, warm=False)
    np.testing.assert_array_equal(store.read_rows("t0", [3, 8]), before)
    store.swap(negated)
    np.testing.assert_array_equal(store.read_rows("t0", [3, 8]), -before)
    store.swap(smaller, warm=False, force=True)
    assert list(store.tables) == ["t0"]


def test_submitted_and_streamed_lookups_answer_as_lookups_do(open_store: Open, tmp_path: Path):
    store = open_store(write_store(tmp_path / "s"), False)
    batches = [[TableLookup("t0", np.arange(k, k + 4) % ROWS, lengths=np.array([2, 2]))]
               for k in range(0, 60, 10)]
    direct = [store.lookup_many(b).values for b in batches]
    pending = [store.submit(b) for b in batches]
    for p, want in zip(pending, direct, strict=True):
        np.testing.assert_allclose(p.result().values, want, rtol=1e-6)
    streamed = [b.values for b in store.lookup_stream(batches, depth=3)]
    np.testing.assert_allclose(np.stack(streamed), np.stack(direct), rtol=1e-6)
    stats = store.stats()
    assert stats["version"] == 0 and stats["device"] not in ("", None)
    assert store.tier == "dram" or {r["table"] for r in store.tier_report()} == set(DTYPES)


def test_answers_come_in_the_dtype_asked(open_store: Open, tmp_path: Path):
    """Every store answers fp16 / bf16 / int8 as its fp32 answer rounded once (pooled in fp32
    where the rows are): by lookup_many, submit and lookup_stream, in the asked numpy dtype."""
    import ml_dtypes

    store = open_store(write_store(tmp_path / "s"), False)
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 6, 9)
    reqs = [TableLookup(t, rng.integers(0, ROWS, lengths.sum()), lengths=lengths) for t in DTYPES]
    fp32 = store.lookup_many(reqs).values
    kinds = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "int8": np.float32}
    for out, kind in kinds.items():
        got = store.lookup_many(reqs, out_dtype=out).values
        assert got.dtype == kind and got.shape == fp32.shape, (out, got.dtype)
        wide = got.astype(np.float32)
        if out == "int8":
            want = fp32.copy()
            nearrec._native.round_out(want, [DIM] * len(DTYPES), "int8")
            if open_store.kind == "dram":  # its fp32 answer is the same every time
                assert np.array_equal(wide, want)
            # on each bag's vector of each table's grid of 256 steps, within a step of the fp32
            for seg, ref in zip(wide.reshape(-1, DIM), fp32.reshape(-1, DIM), strict=True):
                step = (seg.max() - seg.min()) / 255
                if step > 0:
                    k = (seg - seg.min()) / step
                    assert np.abs(k - np.round(k)).max() < 1e-2, seg
                assert np.abs(seg - ref).max() <= step * 0.51 + 1e-6
        else:
            want = fp32.astype(kind).astype(np.float32)
            # one rounding: as numpy rounds this fp32 answer, bar the SSD tier's last bits
            assert np.mean(wide == want) >= 0.9, out
            np.testing.assert_allclose(wide, fp32, rtol=2.0 ** -7 if out == "bf16" else 2.0 ** -10,
                                       atol=1e-6)
        assert np.array_equal(store.submit(reqs, out_dtype=out).result().values.astype(np.float32),
                              wide), out
        streamed = next(iter(store.lookup_stream([reqs], out_dtype=out))).values
        assert streamed.dtype == kind and np.array_equal(streamed.astype(np.float32), wide), out
    with pytest.raises(InvalidRequest, match='out_dtype "int4" is not one of'):
        store.lookup_many(reqs, out_dtype="int4")


def test_closing_lets_go_at_once(open_store: Open, tmp_path: Path):
    path = write_store(tmp_path / "s")
    with open_store(path, True) as store:
        store.write("t0", [1], np.ones((1, DIM), np.float32))
    if store.embedded:
        # the writer lock is free as soon as close returns, though `store` is still referenced
        with nearrec.open(path, writable=True) as again:
            np.testing.assert_array_equal(again.read_rows("t0", [1]), np.ones((1, DIM)))
        with pytest.raises(StoreReadOnly):
            store.write("t0", [1], np.ones((1, DIM), np.float32))
    else:
        with pytest.raises(Unavailable):
            store.read_rows("t0", [1])


def test_capabilities_are_the_implementations(open_store: Open, tmp_path: Path):
    store = open_store(write_store(tmp_path / "s"), False)
    every = {"writes", "schema", "versions", "replica", "inference"}
    want = {"writes", "schema", "versions"} if open_store.kind in ("sharded", "ray") else every
    assert store.capabilities == want
    if "schema" not in store.capabilities:
        with pytest.raises(nearrec.Unsupported, match="create_table"):
            store.create_table("fresh", 10, 4)


def test_a_scrub_reads_every_table_where_it_lies_and_names_the_damaged_one(open_store: Open,
                                                                           tmp_path: Path):
    path = write_store(tmp_path / "s")
    store = open_store(path, False)
    checks = store.scrub(rate="1GiB")
    for t in DTYPES:
        mine = [c for c in checks if c.table == t or c.table.startswith(f"{t} on ")]
        assert mine and all(c.ok and c.bytes > 0 for c in mine), checks
    open_store.lacking("its table files at the path")
    damage(path, "t1", "flip", 5)
    damaged = [c for c in store.scrub() if not c.ok]
    assert [c.table for c in damaged] == ["t1"], damaged
    np.testing.assert_allclose(store.lookup("t0", [1, 2], offsets=[0, 1]),
                               served("t0")[[1, 2]], rtol=1e-6)

