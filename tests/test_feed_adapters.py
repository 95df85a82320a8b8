"""Adapters of trainers' own dumps. TorchEasyRec's delta embedding dumps fed to a store
(``nearrec feed --format tzrec``): files
written as ``tzrec/utils/delta_embedding_dump.py`` (schema version 2) writes them — its schema
and metadata, its ``ListArray`` of int32 offsets, ``ParquetWriter`` into a temporary name and
``os.replace`` — one a step with one rank, one a rank under ``step_<N>/`` with several.
NVIDIA dynamicemb's incremental dumps written as delta files (``nearrec.feed.from_dynamicemb``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import nearrec
import nearrec.cli
import nearrec.feed
from nearrec.errors import InvalidRequest

DIM, ROWS = 8, 100
VERSION = "2"


def dump_schema(version: str = VERSION) -> pa.Schema:
    return pa.schema(
        [("global_step", pa.int64()), ("rank", pa.int32()), ("world_size", pa.int32()),
         ("embedding_name", pa.string()), ("embedding_role", pa.string()),
         ("feature_name", pa.string()), ("table_fqn", pa.string()), ("key_id", pa.int64()),
         ("embedding", pa.list_(pa.float32()))],
        metadata={b"tzrec.delta_embedding.schema_version": version.encode(),
                  b"tzrec.delta_embedding.dynamic_key_encoding":
                      b"UINT64_BIT_PATTERN_IN_SIGNED_INT64",
                  b"tzrec.delta_embedding.invalid_key": b"-1"})


def dump(directory: Path, step: int, tables: dict[str, tuple[list[int], np.ndarray]], *,
         rank: int = 0, world: int = 1, prefix: str = "delta_embedding",
         version: str = VERSION) -> Path:
    """Rank ``rank``'s dump of ``step``: per embedding name, its key ids and rows."""
    schema = dump_schema(version)
    chunks = []
    for name, (keys, rows) in tables.items():
        n = len(keys)
        rows = np.ascontiguousarray(rows, np.float32)
        dim = rows.shape[1]
        offsets = np.arange(0, (n + 1) * dim, dim, dtype=np.int32)
        embedding = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()),
                                             pa.array(rows.reshape(-1), pa.float32()))
        chunks.append(pa.Table.from_arrays(
            [pa.repeat(pa.scalar(step, pa.int64()), n), pa.repeat(pa.scalar(rank, pa.int32()), n),
             pa.repeat(pa.scalar(world, pa.int32()), n), pa.repeat(pa.scalar(name), n),
             pa.repeat(pa.scalar("ebc"), n), pa.repeat(pa.scalar(f"f_{name}"), n),
             pa.repeat(pa.scalar(f"model.ebc.{name}"), n), pa.array(keys, pa.int64()),
             embedding], schema=schema))
    if world == 1:
        path = directory / f"{prefix}_step_{step}.parquet"
    else:
        (directory / f"step_{step}").mkdir(exist_ok=True)
        path = directory / f"step_{step}" / f"{prefix}_step_{step}_rank_{rank}_of_{world}.parquet"
    tmp = f"{path}.rank{rank}.tmp"
    with pq.ParquetWriter(tmp, schema) as w:
        for chunk in chunks or [schema.empty_table()]:
            w.write_table(chunk)
    os.replace(tmp, path)
    return path


def keys_as_int64(keys: list[int]) -> list[int]:
    """u64 keys as the dump writes them: their bits in an int64."""
    return np.array(keys, np.uint64).view(np.int64).tolist()


@pytest.fixture
def store(tmp_path: Path) -> nearrec.Store:
    rng = np.random.default_rng(0)
    keys = np.array([5, 2**63 + 9, 2**64 - 2], np.uint64).view(np.int64)
    nearrec.from_numpy(tmp_path / "store",
                       {"user": rng.standard_normal((ROWS, DIM), dtype=np.float32),
                        "item": rng.standard_normal((3, DIM), dtype=np.float32)},
                       keys={"item": keys}, capacity={"item": 8})
    (tmp_path / "dumps").mkdir()
    return nearrec.open(tmp_path / "store", writable=True)


def rows(store: nearrec.Store, table: str, ids: list[int]) -> np.ndarray:
    return store.lookup(table, np.array(ids), offsets=np.arange(len(ids)))


def test_steps_are_applied_in_order_once_rows_by_global_row_and_keys_by_bits(
        store: nearrec.Store, tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    u1 = np.full((2, DIM), 1.25, np.float32)
    dump(dumps, 1000, {"user": ([3, 97], u1)})
    i2 = np.arange(3 * DIM, dtype=np.float32).reshape(3, DIM)
    u2 = np.full((1, DIM), -2.0, np.float32)
    # a dynamic table's keys, u64 bits in int64: one it holds, two new ones
    dump(dumps, 2000, {"item": (keys_as_int64([2**63 + 9, 11, 2**64 - 7]), i2),
                       "user": ([3], u2)})
    done = nearrec.feed.apply(dumps, store, format="tzrec")
    assert [(a.sequence, a.rows, a.applied) for a in done] == [(1000, 2, True), (2000, 4, True)]
    assert all(a.lag_seconds is not None and 0 <= a.lag_seconds < 60 for a in done)
    np.testing.assert_array_equal(rows(store, "user", [3, 97]), [u2[0], u1[1]])
    item_keys = np.array([2**63 + 9, 11, 2**64 - 7], np.uint64).view(np.int64)
    np.testing.assert_array_equal(rows(store, "item", item_keys.tolist()), i2)
    # the cursor holds the step, and the steps applied as its sequence
    cursor = store.feed_status()["default"]
    assert (cursor.sequence, cursor.step, cursor.rows) == (2, 2000, 4)
    # steps are 1000 apart: the next is the next listed, and nothing is taken twice
    assert nearrec.feed.apply(dumps, store, format="tzrec") == []
    dump(dumps, 3000, {"user": ([4], u1[:1])})
    assert [a.sequence for a in nearrec.feed.apply(dumps, store, format="tzrec")] == [3000]


def test_a_step_of_several_ranks_waits_for_all_and_a_shared_key_must_agree(
        store: nearrec.Store, tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    a = np.full((2, DIM), 3.0, np.float32)
    b = np.full((1, DIM), 4.0, np.float32)
    dump(dumps, 500, {"user": ([1, 2], a)}, rank=0, world=3)
    dump(dumps, 500, {"user": ([50], b)}, rank=2, world=3)
    dump(dumps, 900, {"user": ([9], b)}, rank=0, world=1, prefix="delta_embedding")
    # rank 1 of step 500 not there yet: neither 500 nor the step after it is applied
    assert nearrec.feed.apply(dumps, store, format="tzrec") == []
    # rank 1 writes an empty shard, as a rank that touched nothing does
    dump(dumps, 500, {}, rank=1, world=3)
    done = nearrec.feed.apply(dumps, store, format="tzrec")
    assert [(x.sequence, x.rows) for x in done] == [(500, 3), (900, 1)]
    np.testing.assert_array_equal(rows(store, "user", [1, 2, 50, 9]), [a[0], a[1], b[0], b[0]])
    # a data-parallel table's key in two ranks' files: once, if they agree
    c = np.full((1, DIM), 7.0, np.float32)
    for r in range(2):
        dump(dumps, 1200, {"user": ([6], c)}, rank=r, world=2)
    assert [x.rows for x in nearrec.feed.apply(dumps, store, format="tzrec")] == [1]
    dump(dumps, 1500, {"user": ([6], c)}, rank=0, world=2)
    other = dump(dumps, 1500, {"user": ([6], c + 1)}, rank=1, world=2)
    with pytest.raises(InvalidRequest, match="key 6 of \"user\" holds other values") as e:
        nearrec.feed.apply(dumps, store, format="tzrec")
    assert str(other) in str(e.value)
    np.testing.assert_array_equal(rows(store, "user", [6]), c)


def test_misfits_are_refused_naming_file_row_and_column(store: nearrec.Store,
                                                        tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    ok = np.ones((2, DIM), np.float32)

    def refused(match: str, path: Path) -> None:
        with pytest.raises(InvalidRequest, match=match) as e:
            nearrec.feed.apply(dumps, store, format="tzrec")
        assert str(path) in str(e.value)
        path.unlink()

    refused(r"row 1, column \"embedding_name\".*\"nope\" is not a table",
            dump(dumps, 10, {"user": ([1], ok[:1]), "nope": ([1], ok[:1])}))
    refused(r"row 1, column \"embedding\".*4 values, table \"user\" has dim 8",
            _ragged(dumps, 10))
    refused(r"row 0, column \"key_id\".*not a row of table \"user\"",
            dump(dumps, 10, {"user": ([ROWS], ok[:1])}))
    refused(r"row 1, column \"key_id\".*reserved invalid key",
            dump(dumps, 10, {"item": ([5, -1], ok)}))
    refused(r"schema version 2", dump(dumps, 10, {"user": ([1], ok[:1])}, version="1"))
    assert "default" not in store.feed_status(), "nothing of a refused step is applied"
    # an embedding name the store calls otherwise: mapped
    dump(dumps, 10, {"user_emb": ([1, 2], ok)})
    with pytest.raises(InvalidRequest, match="\"user_emb\" is not a table"):
        nearrec.feed.apply(dumps, store, format="tzrec")
    done = nearrec.feed.apply(dumps, store, format="tzrec", tables={"user_emb": "user"})
    assert [x.rows for x in done] == [2]
    np.testing.assert_array_equal(rows(store, "user", [1, 2]), ok)
    with pytest.raises(InvalidRequest, match="TorchEasyRec's dumps' \\(format \"tzrec\"\\)"):
        nearrec.feed.apply(dumps, store, tables={"user_emb": "user"})
    with pytest.raises(InvalidRequest, match="delta format \"tfrecord\""):
        nearrec.feed.apply(dumps, store, format="tfrecord")


def _ragged(directory: Path, step: int) -> Path:
    """A dump whose second row is 4 wide in a table of dim 8."""
    schema = dump_schema()
    path = directory / f"delta_embedding_step_{step}.parquet"
    pq.write_table(pa.table(
        [pa.array([step] * 2, pa.int64()), pa.array([0, 0], pa.int32()),
         pa.array([1, 1], pa.int32()), pa.array(["user"] * 2), pa.array(["ebc"] * 2),
         pa.array(["f"] * 2), pa.array(["m"] * 2), pa.array([1, 2], pa.int64()),
         pa.array([[1.0] * DIM, [1.0] * 4], pa.list_(pa.float32()))], schema=schema), path)
    return path


def test_the_command_feeds_a_store_from_a_trainers_dump_directory(
        store: nearrec.Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dumps = tmp_path / "dumps"
    store.close()
    v = np.full((1, DIM), 0.5, np.float32)
    dump(dumps, 40, {"u": ([8], v)}, prefix="run7")
    dump(dumps, 80, {"u": ([9], v)}, prefix="other")
    assert nearrec.cli.main(["feed", str(dumps), "--to", str(tmp_path / "store"),
                             "--format", "tzrec", "--prefix", "run7", "--table", "u=user",
                             "--name", "tzrec"]) == 0
    s = nearrec.open(tmp_path / "store")
    assert s.feed_status()["tzrec"].step == 40
    assert "step 40: 1 rows applied" in capsys.readouterr().out
    np.testing.assert_array_equal(rows(s, "user", [8]), v)
    # a store built from the checkpoint of step 60 takes the steps after it only
    dump(dumps, 60, {"u": ([10], v)}, prefix="run7")
    dump(dumps, 70, {"u": ([11], v)}, prefix="run7")
    assert nearrec.cli.main(["feed", str(dumps), "--to", str(tmp_path / "store"),
                             "--format", "tzrec", "--prefix", "run7", "--table", "u=user",
                             "--name", "from-ckpt", "--from", "61"]) == 0
    s = nearrec.open(tmp_path / "store")
    assert (s.feed_status()["from-ckpt"].step, s.feed_status()["from-ckpt"].sequence) == (70, 1)
    assert nearrec.cli.main(["feed", str(dumps), "--to", str(tmp_path / "store"), "--format",
                             "tzrec", "--table", "u"]) != 0
    assert "--table 'u' is not EMBEDDING=TABLE" in capsys.readouterr().err


# NVIDIA dynamicemb's incremental dump (``dynamicemb/incremental_dump.py``, recsys-examples
# d9a73286): ``incremental_dump`` returns ``{collection_path: DeltaDumpResult}`` in memory, its
# per-table lists column-aligned by index. The same fields, without CUDA:
@dataclass
class DeltaDumpResult:
    table_names: list[str] = field(default_factory=list)
    keys: list[Any] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    optimizer_states: list[Any] = field(default_factory=list)
    scores: list[Any] = field(default_factory=list)
    evicted_keys: list[Any] = field(default_factory=list)
    erased_keys: list[Any] = field(default_factory=list)
    meta: list[dict[str, Any]] = field(default_factory=list)

    def add(self, name: str, keys: Any, values: Any, *, evicted: Any = None,
            erased: Any = None) -> DeltaDumpResult:
        import torch

        self.table_names.append(name)
        self.keys.append(keys)
        self.values.append(values)
        self.optimizer_states.append(None)  # plain SGD keeps none
        self.scores.append(torch.zeros((len(keys), 1), dtype=torch.int64))
        self.evicted_keys.append(evicted)
        self.erased_keys.append(torch.empty(0, dtype=torch.int64) if erased is None else erased)
        self.meta.append({"current_score": 7, "world_size": 1, "shard_index": 0})
        return self


def test_dynamicembs_incremental_dumps_feed_a_keyed_table(store: nearrec.Store,
                                                          tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    dumps = tmp_path / "dumps"
    big = 2**64 - 3
    v1 = torch.arange(3 * DIM, dtype=torch.float32).reshape(3, DIM)
    first = {"model.sparse.ec": DeltaDumpResult().add(
        "item", torch.tensor([5, 11, big], dtype=torch.uint64), v1)}
    p1 = nearrec.feed.from_dynamicemb(first, dumps, step=100)
    assert p1 is not None and p1.name == f"{1:020d}.arrow"
    # the next interval: 11 was evicted (RETAIN_KEY) for 12, 5 erased, `big` evicted and
    # admitted again: it stays, with its new row
    v2 = torch.full((2, DIM), 9.0)
    second = {"model.sparse.ec": DeltaDumpResult().add(
        "item", torch.tensor([12, big], dtype=torch.uint64), v2,
        evicted=torch.tensor([11, big], dtype=torch.uint64),
        erased=torch.tensor([5], dtype=torch.uint64))}
    nearrec.feed.from_dynamicemb(second, dumps, step=200)
    done = nearrec.feed.apply(dumps, store)
    assert [(a.sequence, a.rows) for a in done] == [(1, 3), (2, 4)]
    assert store.feed_status()["default"].step == 200
    as_ids = np.array([12, big, 5, 11], np.uint64).view(np.int64)
    store.close()
    served = nearrec.open(tmp_path / "store", unknown_keys="zero")
    got = served.lookup("item", as_ids, offsets=np.arange(4))
    np.testing.assert_array_equal(got, [v2[0].numpy(), v2[1].numpy(), np.zeros(DIM),
                                        np.zeros(DIM)])
    # kept evictions: the served table keeps a key the trainer let go of
    third = {"c": DeltaDumpResult().add("item", torch.tensor([13]), torch.ones(1, DIM),
                                        evicted=torch.tensor([12]))}
    path = nearrec.feed.from_dynamicemb(third, dumps, evictions=False)
    table = pq.read_table(path) if path.suffix == ".parquet" else \
        pa.ipc.open_stream(path.read_bytes()).read_all()
    assert table.column("id").to_pylist() == [13]
    # nothing dumped: no file; one rank's key twice, or keys and values apart: refused
    assert nearrec.feed.from_dynamicemb({"c": DeltaDumpResult()}, dumps) is None
    twice = [{"c": DeltaDumpResult().add("item", torch.tensor([1]), torch.ones(1, DIM))}] * 2
    with pytest.raises(InvalidRequest, match="key 1 of table 'item' twice"):
        nearrec.feed.from_dynamicemb(twice, dumps)
    with pytest.raises(InvalidRequest, match="2 keys and values of shape"):
        nearrec.feed.from_dynamicemb(
            {"c": DeltaDumpResult().add("emb", torch.tensor([1, 2]), torch.ones(1, DIM))},
            dumps, tables={"c.emb": "item"})
