"""The trainer's side of a delta feed beyond plain collections (issue 65, item 3): a TorchRec
managed-collision (ZCH) collection trained with its ids churning is published by key — the
touched ids that hold slots, the ids admitted or moved, deletes for the evicted — and the store
``from_torchrec`` built from it ends holding exactly the module's ids with their trained rows,
pooling as the module does; a Publisher writing the store's dtype (int8 row-wise) gives the
rows the store's own writer would, and a store of another dtype refuses its files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import nearrec
import nearrec.feed
from nearrec.errors import NearrecError

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")


def held(module: object, table: str) -> tuple[np.ndarray, np.ndarray]:
    """The raw ids a managed collection's table holds slots for, and their slots — with, while
    it has an empty slot, the empty mark itself, which TorchRec's search matches to the first
    empty slot (so the served table holds it too)."""
    mcc = module._managed_collision_collection  # type: ignore[attr-defined]
    mc = mcc._managed_collision_modules[table]
    ids = mc._mch_sorted_raw_ids.detach().numpy()
    slots = mc._mch_remapped_ids_mapping.detach().numpy()
    empty = ids == np.iinfo(np.int64).max
    if not empty.any():
        return ids, slots
    return np.append(ids[~empty], ids[empty][0]), np.append(slots[~empty], slots[empty][0])


def test_a_managed_collision_collection_is_published_by_key(tmp_path: Path) -> None:
    from test_torchrec import managed
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from nearrec.torch import from_torchrec

    module = managed(24, None)
    from_torchrec(module, tmp_path / "mc")
    first = {t: set(held(module, t)[0].tolist()) for t in ("t_user", "t_item")}
    module.train()
    deltas = tmp_path / "deltas"
    publisher = nearrec.feed.Publisher(deltas, module, every_steps=3)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    rng = np.random.default_rng(3)
    pool = rng.integers(0, 10**12, 70)  # ids come back after their eviction
    for _ in range(40):
        ids = torch.from_numpy(rng.choice(pool, 64))
        kjt = KeyedJaggedTensor.from_lengths_sync(["user", "item"], ids, torch.full((32,), 2))
        pooled, _ = module(kjt)
        loss = sum((pooled[k] ** 2).sum() for k in pooled.keys())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        publisher.step(kjt)
    publisher.publish()  # no dense weights: the store keeps no model
    module.eval()
    with nearrec.open(tmp_path / "mc", writable=True, unknown_keys="zero") as store:
        applied = nearrec.feed.apply(deltas, store)
        assert [a.sequence for a in applied] == list(range(1, publisher.next_sequence))
        for table in ("t_user", "t_item"):
            ids, slots = held(module, table)
            weight = module._embedding_module.embedding_bags[table].weight.detach().numpy()
            # exactly the module's ids, each with its slot's trained row
            assert store.tables[table].keys == len(ids)
            np.testing.assert_array_equal(store.read_rows(table, ids), weight[slots])
            gone = np.array(sorted(first[table] - set(ids.tolist())), np.int64)
            assert len(gone), "the ids churned: some first held were evicted"
            assert (store.key_rows(table, gone) == -1).all(), "evicted ids deleted"
        # pooled as the trained module pools its held ids
        user, item = (held(module, t)[0] for t in ("t_user", "t_item"))
        n = min(len(user), len(item)) // 2 * 2
        ids = torch.from_numpy(np.concatenate([user[:n], item[:n]]))
        kjt = KeyedJaggedTensor.from_lengths_sync(["user", "item"], ids,
                                                  torch.full((n,), 2))
        want, _ = module(kjt)
        for table, feature, mode in (("t_user", "user", "sum"), ("t_item", "item", "mean")):
            got = store.lookup(table, kjt[feature].values().numpy(),
                               offsets=np.arange(0, n, 2), mode=mode)
            np.testing.assert_allclose(got, want[feature].detach().numpy(), rtol=1e-5,
                                       atol=1e-6)


def collection() -> object:
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    torch.manual_seed(4)
    return EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=16, num_embeddings=200,
                           feature_names=[f"f{i}"]) for i in range(2)])


def train(module: object, publisher: nearrec.feed.Publisher, steps: int) -> None:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    optimizer = torch.optim.SGD(module.parameters(), lr=0.3)  # type: ignore[attr-defined]
    rng = np.random.default_rng(5)
    for _ in range(steps):
        kjt = KeyedJaggedTensor.from_lengths_sync(
            ["f0", "f1"], torch.from_numpy(rng.integers(0, 200, 96)), torch.full((32,), 3))
        pooled = module(kjt)  # type: ignore[operator]
        loss = sum((pooled[k] - 1).pow(2).sum() for k in pooled.keys())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        publisher.step(kjt)
    publisher.publish()


def test_a_publisher_writes_the_stores_int8_rows(tmp_path: Path) -> None:
    from nearrec.torch import from_torchrec

    module = collection()
    from_torchrec(module, tmp_path / "q", dtype="int8")
    from_torchrec(module, tmp_path / "f")
    publisher = nearrec.feed.Publisher(tmp_path / "deltas", module, every_steps=4,
                                       dtype="int8")
    train(module, publisher, 12)
    with nearrec.open(tmp_path / "q", writable=True) as store:
        nearrec.feed.apply(tmp_path / "deltas", store)
        weights = {t: module.embedding_bags[t].weight.detach().numpy()  # type: ignore[attr-defined]
                   for t in ("t0", "t1")}
        # the rows the store's own writer makes of the trained tables, byte for byte
        nearrec.from_numpy(tmp_path / "want", weights, dtype="int8")
        with nearrec.open(tmp_path / "want") as want:
            for t in weights:
                ids = np.arange(200)
                np.testing.assert_array_equal(store.read_rows(t, ids), want.read_rows(t, ids))
                assert not np.array_equal(store.read_rows(t, ids),
                                          nearrec.open(tmp_path / "f").read_rows(t, ids))
    # an fp32 store refuses int8 rows, naming the table
    with nearrec.open(tmp_path / "f", writable=True) as other, \
            pytest.raises(NearrecError, match="t0|t1"):
        nearrec.feed.apply(tmp_path / "deltas", other)
    with pytest.raises(nearrec.InvalidRequest, match="dtype"):
        nearrec.feed.Publisher(tmp_path / "x", module, dtype="int9")


def test_a_publisher_numbers_on_from_the_files_there(tmp_path: Path) -> None:
    module = collection()
    deltas = tmp_path / "deltas"
    deltas.mkdir()
    (deltas / "00000000000000000007.arrow").write_bytes(b"")
    (deltas / "notes.txt").write_text("not a delta file")
    assert nearrec.feed.Publisher(deltas, module).next_sequence == 8
    # two files of one sequence: refused, naming them, not numbered past
    (deltas / "7.parquet").write_bytes(b"")
    with pytest.raises(NearrecError, match="sequence 7"):
        nearrec.feed.Publisher(deltas, module)
