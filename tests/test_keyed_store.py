"""Keyed tables kept in a store (format version 5): built from ``(keys, rows)``, looked up by raw
64-bit key on every implementation of the store — embedded on the DRAM tier, on the SSD tier
behind DRAM tiers smaller than the table, and a node's through ``nearrec.connect`` — pooled as
``torch.nn.EmbeddingBag`` pools the keys' rows (here in numpy, from a dict of keys to rows);
unknown keys answered by the store's ``unknown_keys``; bad input refused naming the table."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import Node

import nearrec
from nearrec import InvalidRequest, UnknownKey

N, DIM = 500, 8


def keyed() -> tuple[np.ndarray, np.ndarray]:
    """Distinct int64 keys over the whole 64-bit range (negative ones too), and their rows."""
    rng = np.random.default_rng(3)
    keys = np.unique(rng.integers(-(2**63), 2**63 - 1, N * 2, dtype=np.int64))[:N]
    rng.shuffle(keys)
    return keys, rng.standard_normal((N, DIM), dtype=np.float32)


def build(path: Path) -> Path:
    keys, rows = keyed()
    nearrec.from_numpy(path, {"ids": rows, "dense": rows[:100]}, keys={"ids": keys})
    return path


Open = Callable[..., nearrec.Store]


@pytest.fixture(params=["dram", "ssd", "node"])
def open_store(request: pytest.FixtureRequest) -> Iterator[Open]:
    nodes: list[Node] = []

    def opener(path: Path, unknown_keys: str = "error") -> nearrec.Store:
        if request.param == "dram":
            return nearrec.open(path, tier="dram", unknown_keys=unknown_keys)
        if request.param == "ssd":
            return nearrec.open(path, tier="ssd", dram_budget="64KiB", unknown_keys=unknown_keys)
        # the policy from the node's store config, or its flag
        config = path.with_suffix(".toml")
        config.write_text(f'unknown_keys = "{unknown_keys}"\n')
        policy = (["--unknown-keys", unknown_keys] if unknown_keys == "zero"
                  else ["--store-config", str(config)])
        node = Node(f"{path}=s", "--tier", "ssd", "--dram-budget", "64KiB", *policy)
        nodes.append(node)
        return nearrec.connect(node.address, "s")

    yield opener
    for node in nodes:
        assert node.stop() == 0


def pool(row_of: Callable[[int], np.ndarray], ids: np.ndarray, lengths: np.ndarray, mode: str,
         weights: np.ndarray | None = None) -> np.ndarray:
    out, at = [], 0
    for n in lengths:
        rows = [row_of(int(k)) for k in ids[at:at + n]]
        w = [1.0] * n if weights is None else list(weights[at:at + n])
        at += n
        if not rows:
            out.append(np.zeros(DIM, np.float32))
        elif mode == "max":
            out.append(np.max(rows, axis=0))
        else:
            s = np.sum([wi * r for wi, r in zip(w, rows, strict=True)], axis=0)
            out.append(s / len(rows) if mode == "mean" else s)
    return np.array(out, np.float32)


def batch(seed: int, unknown: int = 0) -> tuple[np.ndarray, np.ndarray]:
    keys, _ = keyed()
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 6, 40)
    ids = keys[rng.integers(0, N, int(lengths.sum()))]
    for p in rng.choice(len(ids), min(unknown, len(ids)), replace=False):
        ids[p] = int(rng.integers(1, 2**62)) * 2 + 1  # odd, and not among the keys
    return ids, lengths


def test_keyed_lookups_pool_the_keys_rows_everywhere(tmp_path, open_store):
    path = build(tmp_path / "s")
    keys, rows = keyed()
    model = dict(zip(keys.tolist(), rows, strict=True))
    store = open_store(path)
    t = store.tables["ids"]
    assert t.keyed and t.keys == N and not store.tables["dense"].keyed
    for seed in range(3):
        ids, lengths = batch(seed)
        w = np.linspace(0.5, 1.5, len(ids), dtype=np.float32)
        for mode, weights in [("sum", None), ("sum", w), ("mean", None), ("max", None)]:
            got = store.lookup("ids", ids, lengths=lengths, mode=mode,
                               per_sample_weights=weights)
            want = pool(model.__getitem__, ids, lengths, mode, weights)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # a keyed table beside a dense one in one batch
    ids, lengths = batch(7)
    dense = np.arange(len(lengths)) % 100
    out = store.lookup_many({"ids": nearrec.TableLookup("ids", ids, lengths=lengths),
                             "dense": nearrec.TableLookup("dense", dense,
                                                          np.arange(len(lengths)))})
    np.testing.assert_allclose(out["ids"], pool(model.__getitem__, ids, lengths, "sum"),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["dense"], rows[:100][dense])
    # the rows a batch reads, by key
    (table, got_ids, got_rows), = store.lookup_rows({"ids": (ids[:5], np.array([0]))})
    assert table == "ids"
    np.testing.assert_array_equal(got_rows, np.array([model[int(k)] for k in got_ids]))
    assert sorted(got_ids.tolist()) == sorted(set(ids[:5].tolist()))


def test_an_unknown_key_is_named_or_answered_by_the_policy(tmp_path, open_store):
    path = build(tmp_path / "s")
    keys, rows = keyed()
    model = dict(zip(keys.tolist(), rows, strict=True))
    ids, lengths = batch(11, unknown=5)
    first = next(p for p, k in enumerate(ids.tolist()) if k not in model)
    with pytest.raises(UnknownKey) as e:
        open_store(path).lookup("ids", ids, lengths=lengths)
    assert (e.value.table, e.value.position) == ("ids", first)
    assert str(ids[first]) in str(e.value)

    zero = open_store(path, "zero")
    for mode in ("sum", "mean", "max"):
        want = pool(lambda k: model.get(k, np.zeros(DIM, np.float32)), ids, lengths, mode)
        np.testing.assert_allclose(zero.lookup("ids", ids, lengths=lengths, mode=mode), want,
                                   rtol=1e-5, atol=1e-6)

    # an init row is the one a DRAM keyed table with the same seed and scale gives the key
    table = nearrec.KeyedTable("probe", DIM, capacity=64, unknown="init", init_scale=0.01,
                               seed=0)

    def init(k: int) -> np.ndarray:
        return model[k] if k in model else table.lookup([k], [0])[0]

    store = open_store(path, "init")
    for mode in ("sum", "mean", "max"):
        np.testing.assert_allclose(store.lookup("ids", ids, lengths=lengths, mode=mode),
                                   pool(init, ids, lengths, mode), rtol=1e-5, atol=1e-6)
    # each answer counted, on the node too
    unknown = sum(k not in model for k in ids.tolist())
    stats = store.stats()
    assert stats["unknown_keys_init"] == 3 * unknown
    assert stats["keyed_hits"] == 3 * (len(ids) - unknown)
    assert stats["keyed_keys"] == N and stats["keyed_index_bytes"] <= 16 * N + 64
    assert zero.stats()["unknown_keys_zero"] == 3 * unknown


def test_stores_and_their_manifests_say_which_tables_are_keyed(tmp_path):
    info = nearrec.info(build(tmp_path / "s"))
    assert info.format_version == 5
    by_name = {t.name: t for t in info.tables}
    assert by_name["ids"].keyed and by_name["ids"].rows == N + 1  # the zero row first
    assert not by_name["dense"].keyed
    checks = {c.table: c for c in nearrec.verify(info.path)}
    assert checks["keys of ids"].error is None and checks["keys of ids"].bytes == N * 12
    keys_file = info.path / by_name["ids"].keys["file"]
    damaged = bytearray(keys_file.read_bytes())
    damaged[5] ^= 1
    keys_file.write_bytes(bytes(damaged))
    checks = {c.table: c for c in nearrec.verify(info.path)}
    assert "checksum" in checks["keys of ids"].error
    with pytest.raises(nearrec.StoreCorrupted):
        nearrec.open(info.path)


def test_uint64_keys_keep_their_bits(tmp_path):
    keys = np.array([2**64 - 1, 2**63, 5], np.uint64)
    rows = np.arange(3 * DIM, dtype=np.float32).reshape(3, DIM)
    nearrec.from_numpy(tmp_path / "s", {"ids": rows}, keys={"ids": keys})
    store = nearrec.open(tmp_path / "s")
    got = store.lookup("ids", keys.view(np.int64), np.arange(3))
    np.testing.assert_array_equal(got, rows)
    np.testing.assert_array_equal(store.lookup("ids", [-1], [0]), rows[:1])
    with pytest.raises(InvalidRequest, match=r"keys.view\(np.int64\)"):
        store.lookup("ids", keys, np.arange(3))


@pytest.mark.parametrize("keys,match", [
    (np.array([1.0, 2.0, 3.0]), "1-D integer array"),
    (np.array([[1, 2, 3]]), "1-D integer array"),
    (np.array([1, 2]), "2 keys for 3 rows"),
    (np.array([4, 9, 4]), "key 4 is given twice, at positions 0 and 2"),
])
def test_bad_keys_are_refused_naming_the_table_and_nothing_is_written(tmp_path, keys, match):
    rows = np.ones((3, DIM), np.float32)
    with pytest.raises(InvalidRequest, match=match) as e:
        nearrec.from_numpy(tmp_path / "s", {"ids": rows}, keys={"ids": keys})
    assert e.value.table == "ids"
    assert not (tmp_path / "s").exists()
    with pytest.raises(InvalidRequest, match="not among the tables"):
        nearrec.from_numpy(tmp_path / "s", {"ids": rows}, keys={"other": [1, 2, 3]})


def test_what_keyed_tables_do_not_take_is_refused_not_misread(tmp_path):
    path = build(tmp_path / "s")
    store = nearrec.open(path, writable=True)
    with pytest.raises(InvalidRequest, match="padding_idx"):
        store.lookup("ids", [1], [0], padding_idx=0)
    # built without room: a new key is refused whole, naming it; nothing applied
    keys, rows = keyed()
    with pytest.raises(nearrec.KeysFull) as e:
        store.write("ids", np.array([keys[0], 12345]), np.ones((2, DIM), np.float32))
    assert (e.value.table, e.value.position) == ("ids", 1)
    np.testing.assert_array_equal(store.read_rows("ids", keys[:1]), rows[:1])
    store.write("dense", [1], np.ones((1, DIM), np.float32))  # dense tables beside it write


def test_live_keys_bad_limits_are_typed_errors_naming_the_table(tmp_path):
    path = build(tmp_path / "s")
    for limits, match in [({"ttl_s": 0}, "ttl_s = 0"), ({"ttl_s": -5}, "ttl_s = -5"),
                          ({"cap": 0}, "cap = 0"), ({"admit_window_s": 0}, "admit_window_s")]:
        with pytest.raises(InvalidRequest, match=match) as e:
            nearrec.StoreConfig(key_limits={"ids": limits})
        assert e.value.table == "ids"
    with pytest.raises(InvalidRequest, match="cap = 501") as e:
        nearrec.open(path, writable=True, key_limits={"ids": {"cap": 501}})
    assert e.value.table == "ids"
    with pytest.raises(InvalidRequest, match="not a keyed table") as e:
        nearrec.open(path, writable=True, key_limits={"dense": {"cap": 5}})
    assert e.value.table == "dense"
    with pytest.raises(InvalidRequest, match="manual_clock"):
        nearrec.open(path).advance_clock(5)


def test_keys_written_evict_at_the_cap_and_survive_a_reopen(tmp_path):
    """LFU eviction at a cap: the table never holds more than its cap, the keys read most
    stay, every key held reads its last write, across compactions and a reopen."""
    keys, rows = keyed()
    path = tmp_path / "s"
    nearrec.from_numpy(path, {"ids": rows[:50]}, keys={"ids": keys[:50]},
                       capacity={"ids": 80})
    config = {"writable": True, "unknown_keys": "zero", "auto_compact": False,
              "key_limits": {"ids": {"cap": 60, "evict": "lfu"}}}
    store = nearrec.open(path, **config)
    hot = keys[:5]
    for _ in range(20):
        store.lookup("ids", hot, np.arange(len(hot)))
    written = {int(k): rows[i] for i, k in enumerate(keys[:50])}
    for start in range(50, 200, 10):
        new = keys[start:start + 10]
        store.write("ids", new, rows[start:start + 10])
        written.update({int(k): rows[start + i] for i, k in enumerate(new)})
        if start == 100:
            store.compact()
        assert store.tables["ids"].keys == 60
    assert store.stats()["keys_evicted"] == 200 - 60
    store.close()
    store = nearrec.open(path, **config)
    assert store.tables["ids"].keys == 60
    held = [k for k in written
            if np.any(store.read_rows("ids", np.array([k], np.int64)) != 0)]
    assert len(held) == 60
    assert set(int(k) for k in hot) <= set(held)  # read most: never the victims
    np.testing.assert_array_equal(store.read_rows("ids", np.array(held, np.int64)),
                                  np.asarray([written[k] for k in held]))


def test_a_torchrec_kjt_of_raw_ids_pools_through_nearrec_torch(tmp_path):
    """``nearrec.torch.EmbeddingBagCollection`` over a keyed table takes a TorchRec KJT of raw
    ids and equals ``nn.EmbeddingBag`` over the rows the ids name."""
    torch = pytest.importorskip("torch")
    torchrec = pytest.importorskip("torchrec")
    from nearrec import torch as ntorch

    path = build(tmp_path / "s")
    keys, rows = keyed()
    position = {k: i for i, k in enumerate(keys.tolist())}
    for tier in ("dram", "ssd"):
        store = nearrec.open(path, tier=tier, dram_budget="64KiB")
        ebc = ntorch.EmbeddingBagCollection(store, tables=["ids"])
        assert ebc.embedding_bag_configs()[0].num_embeddings == N
        ids, lengths = batch(21)
        kjt = torchrec.KeyedJaggedTensor(keys=["ids"], values=torch.from_numpy(ids),
                                         lengths=torch.from_numpy(lengths))
        got = ebc(kjt)["ids"].numpy()
        bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(rows), mode="sum")
        local = torch.tensor([position[k] for k in ids.tolist()])
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]))
        np.testing.assert_allclose(got, bag(local, offsets).numpy(), rtol=1e-5, atol=1e-6)


def test_a_state_dict_with_an_id_column_builds_a_keyed_table(tmp_path):
    torch = pytest.importorskip("torch")
    keys, rows = keyed()
    sd = {"user.weight": torch.from_numpy(rows), "user.ids": torch.from_numpy(keys),
          "item.weight": torch.from_numpy(rows[:50])}
    nearrec.from_state_dict(tmp_path / "s", sd, keys={"user": "user.ids"})
    store = nearrec.open(tmp_path / "s")
    assert store.tables["user"].keys == N and not store.tables["item"].keyed
    np.testing.assert_array_equal(store.lookup("user", keys[[7, 3]], [0, 1]), rows[[7, 3]])
    with pytest.raises(InvalidRequest, match="no entry 'user.id'") as e:
        nearrec.from_state_dict(tmp_path / "t", sd, keys={"user": "user.id"})
    assert e.value.table == "user"
    with pytest.raises(InvalidRequest, match="1-D integer array"):
        nearrec.from_state_dict(tmp_path / "t", sd, keys={"user": "user.weight"})


def test_a_keyed_tables_keys_are_read_back_and_the_cli_looks_them_up(tmp_path, capsys):
    path = build(tmp_path / "s")
    keys, rows = keyed()
    np.testing.assert_array_equal(nearrec.keyed.keys_of(path, "ids"), keys)
    with pytest.raises(InvalidRequest, match="not keyed"):
        nearrec.keyed.keys_of(path, "dense")
    with pytest.raises(nearrec.UnknownTable):
        nearrec.keyed.keys_of(path, "nope")
    # `nearrec lookup` draws a keyed table's ids from its keys, not from row positions
    from nearrec.cli import main
    assert main(["lookup", str(path), "--table", "ids", "--batch", "8", "--repeat", "2",
                 "--json"]) == 0
    out = capsys.readouterr().out
    assert "first_row" in out and '"first_row": [0.0, 0.0' not in out


@pytest.mark.parametrize("tier", ["dram", "ssd"])
def test_a_default_row_answers_default_and_zero_still_answers_zeros(tmp_path, tier):
    keys, rows = keyed()
    default = np.arange(DIM, dtype=np.float32) + 1
    path = tmp_path / "s"
    nearrec.from_numpy(path, {"ids": rows}, keys={"ids": keys}, default_rows={"ids": default})
    ids = np.array([keys[3], 77, keys[4], 78], np.int64)  # 77 and 78 are not keys
    assert not np.isin([77, 78], keys).any()
    lengths = np.array([2, 2])
    for policy, unknown in [("default", default), ("zero", np.zeros(DIM, np.float32))]:
        store = nearrec.open(path, tier=tier, unknown_keys=policy, dram_budget="64KiB")
        for mode in ["sum", "mean"]:
            got = store.lookup("ids", ids, lengths=lengths, mode=mode)
            want = np.stack([rows[3] + unknown, rows[4] + unknown])
            np.testing.assert_allclose(got, want / (2 if mode == "mean" else 1), rtol=1e-6)
        np.testing.assert_array_equal(store.read_rows("ids", ids[1:2]), unknown[None])
        assert store.stats()[f"unknown_keys_{policy}"] == 5
    with pytest.raises(InvalidRequest, match="default row is 8 finite values") as e:
        nearrec.from_numpy(tmp_path / "t", {"ids": rows}, keys={"ids": keys},
                           default_rows={"ids": default[:3]})
    assert e.value.table == "ids"


@pytest.mark.parametrize("scheme,shards", [("row", 2), ("table-row", 3)])
def test_a_keyed_table_cut_by_key_hash_serves_as_the_embedded_store(tmp_path, scheme, shards):
    """`nearrec shard` cuts a keyed table by key hash (`key_part`): each shard its keys, their
    rows and its share of the room; the router sends each key to its part and merges the bags;
    an unknown key is named at the caller's position."""
    from nearrec import distributed

    keys, rows = keyed()
    path = tmp_path / "s"
    nearrec.from_numpy(path, {"ids": rows, "dense": rows[:100]}, keys={"ids": keys},
                       capacity={"ids": N + 60})
    root = tmp_path / "shards"
    plan = distributed.shard(path, root, shards, scheme=scheme)
    nodes = [Node(f"{root / f'shard-{k}'}=s", "--tier", "ssd", "--dram-budget", "16KiB",
                  "--unknown-keys", "zero") for k in range(plan.shards)]
    try:
        store = distributed.connect(root, [[f"{n.address}/s"] for n in nodes])
        embedded = nearrec.open(path, unknown_keys="zero")
        assert store.tables["ids"].keys == N
        rng = np.random.default_rng(5)
        ids = np.concatenate([rng.choice(keys, 300), rng.integers(-(2**63), 2**63 - 1, 20)])
        rng.shuffle(ids)
        lengths = rng.multinomial(len(ids), [1 / 40] * 40)
        for mode in ["sum", "mean", "max"]:
            np.testing.assert_allclose(store.lookup("ids", ids, lengths=lengths, mode=mode),
                                       embedded.lookup("ids", ids, lengths=lengths, mode=mode),
                                       rtol=1e-5, atol=1e-6)
        known = ids[np.isin(ids, keys)][:50]
        request = {"ids": (known, np.arange(len(known)))}
        [(_, got_ids, got)] = store.lookup_rows(request)
        [(_, want_ids, want)] = embedded.lookup_rows(request)
        np.testing.assert_array_equal(got_ids, want_ids)
        np.testing.assert_array_equal(got, want)
    finally:
        for n in nodes:
            assert n.stop() == 0


def test_expired_keys_go_in_the_background_when_nothing_is_written(tmp_path):
    import time

    keys, rows = keyed()
    path = build(tmp_path / "s")
    store = nearrec.open(path, writable=True, manual_clock=True, unknown_keys="zero",
                         key_limits={"ids": {"ttl_s": 10, "touch": "write"}})
    store.lookup("ids", keys[:3], [0, 1, 2])  # reads do not count as touches here
    store.advance_clock(11)
    deadline = time.monotonic() + 10
    while (store.lookup("ids", keys[:3], [0, 1, 2]).any()
           and time.monotonic() < deadline):
        time.sleep(0.1)
    np.testing.assert_array_equal(store.lookup("ids", keys[:3], [0, 1, 2]), np.zeros((3, DIM)))
    st = store.stats()
    assert (st["keyed_keys"], st["keys_expired"]) == (0, N)
    assert st["compactions"] == 0  # let go of in a record, not by a compaction


def test_a_compaction_that_replaces_most_keys_keeps_every_new_one(tmp_path):
    """A full table whose keys are nearly all evicted between two compactions: the compaction
    lets the old keys go from the index before it takes the new ones (new keys sorting first
    once filled the index past its slots, and were lost)."""
    rng = np.random.default_rng(9)
    old = np.arange(1, 41, dtype=np.int64) * 1000  # positive: they sort after the new ones
    rows = rng.standard_normal((40, DIM), dtype=np.float32)
    path = tmp_path / "s"
    nearrec.from_numpy(path, {"ids": rows}, keys={"ids": old})
    store = nearrec.open(path, writable=True, auto_compact=False, unknown_keys="zero",
                         key_limits={"ids": {"evict": "lru"}})
    new = -np.arange(1, 40, dtype=np.int64)
    values = rng.standard_normal((39, DIM), dtype=np.float32)
    store.write("ids", new, values)
    assert store.stats()["keys_evicted"] == 39
    store.compact()
    np.testing.assert_array_equal(store.read_rows("ids", new), values)
    store.close()
    store = nearrec.open(path, unknown_keys="zero")
    np.testing.assert_array_equal(store.read_rows("ids", new), values)


def test_the_keys_a_table_evicts_are_kept_with_their_rows_and_fed_back(tmp_path):
    """``evicted_log``: each key evicted at the cap is in ``evicted/`` once, with the row it
    served, as delta files pyarrow reads; a caller's removes are not; and the log is a feed
    that takes the keys back into another store."""
    import pyarrow as pa

    import nearrec.feed

    keys, rows = keyed()
    path = tmp_path / "s"
    nearrec.from_numpy(path, {"ids": rows[:20]}, keys={"ids": keys[:20]}, capacity={"ids": 60})
    config = {"writable": True, "unknown_keys": "zero", "auto_compact": False,
              "evicted_log": "1MiB", "key_limits": {"ids": {"cap": 20, "evict": "lru"}}}
    store = nearrec.open(path, **config)
    store.remove("ids", keys[:2])  # a caller's: not kept
    store.write("ids", keys[20:30], rows[20:30])  # 8 of the base evicted
    store.compact()
    store.write("ids", keys[30:35], rows[30:35])  # 5 more
    store.close()
    files = sorted((path / "evicted").glob("*.arrow"))
    assert len(files) == 2
    got = {}
    for f in files:
        t = pa.ipc.open_stream(f.read_bytes()).read_all()
        assert set(t.column("op").to_pylist()) == {1}
        assert set(t.column("table").to_pylist()) == {"ids"}
        got.update(zip(t.column("id").to_pylist(), t.column("values").to_pylist(),
                       strict=True))
    assert len(got) == 13 and not set(got) & set(keys[:2].tolist())
    position = {int(k): i for i, k in enumerate(keys)}
    for key, values in got.items():
        np.testing.assert_array_equal(np.array(values, np.float32), rows[position[key]])
    # fed to a store holding every key: the evicted ones are let go of there too
    other = tmp_path / "o"
    nearrec.from_numpy(other, {"ids": rows[:40]}, keys={"ids": keys[:40]})
    o = nearrec.open(other, writable=True, unknown_keys="zero")
    assert [a.rows for a in nearrec.feed.apply(path / "evicted", o)] == [8, 5]
    gone = np.array(list(got), np.int64)
    np.testing.assert_array_equal(o.read_rows("ids", gone), np.zeros((13, DIM)))
    assert o.stats()["keyed_keys"] == o.tables["ids"].keys == 40 - 13
