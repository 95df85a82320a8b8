"""A TorchRec model served as it is: nearrec's EmbeddingBagCollection built from TorchRec's
configs (tables shared by several features, SUM / MEAN, outputs keyed by feature) against
TorchRec's own collection on random KeyedJaggedTensors, and ``from_torchrec`` on a TorchRec
DLRM, on the DRAM and SSD tiers."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchrec = pytest.importorskip("torchrec")

from conftest import Lookups, Node  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType  # noqa: E402

import nearrec  # noqa: E402
from nearrec import InvalidRequest, UnknownTable  # noqa: E402
from nearrec.torch import EmbeddingBagCollection, from_torchrec  # noqa: E402

TIERS = [{"tier": "dram"}, {"tier": "ssd", "dram_budget": "8KiB"}]


def configs() -> list[Any]:
    """Three tables: one serving two features (SUM), one MEAN, one of another dim."""
    return [
        EmbeddingBagConfig(name="t_user", embedding_dim=16, num_embeddings=300,
                           feature_names=["user_id", "friend_id"]),
        EmbeddingBagConfig(name="t_item", embedding_dim=16, num_embeddings=500,
                           feature_names=["item_id"], pooling=PoolingType.MEAN),
        EmbeddingBagConfig(name="t_geo", embedding_dim=8, num_embeddings=40,
                           feature_names=["city", "country"]),
    ]


def kjt(collection: Any, batch: int, seed: int, keys: list[str] | None = None,
        weighted: bool = False) -> Any:
    """Random bags (about a fifth empty) for every feature of ``collection``'s configs."""
    rng = np.random.default_rng(seed)
    rows = {f: c.num_embeddings for c in collection.embedding_bag_configs()
            for f in c.feature_names}
    keys = keys or list(rows)
    lengths = rng.integers(0, 6, batch * len(keys)) * (rng.random(batch * len(keys)) > 0.2)
    values = np.concatenate([rng.integers(0, rows.get(k, 10), int(n))
                             for k, per in zip(keys, lengths.reshape(len(keys), batch),
                                               strict=True) for n in per])
    weights = torch.from_numpy(rng.random(values.size).astype(np.float32)) if weighted else None
    return torchrec.KeyedJaggedTensor(keys=keys, values=torch.from_numpy(values),
                                      lengths=torch.from_numpy(lengths), weights=weights)


def store_of(tmp_path: Any, ebc: Any, **options: Any) -> nearrec.Store:
    nearrec.from_numpy(tmp_path / "s", {c.name: ebc.embedding_bags[c.name].weight.detach()
                                        .numpy() for c in ebc.embedding_bag_configs()})
    return nearrec.open(tmp_path / "s", **options)


@pytest.mark.parametrize("options", TIERS, ids=["dram", "ssd"])
def test_collection_from_configs_equals_torchrecs(tmp_path, options):
    torch.manual_seed(0)
    theirs = torchrec.EmbeddingBagCollection(tables=configs())
    ours = EmbeddingBagCollection(store_of(tmp_path, theirs, **options), tables=configs())
    assert ours.features == ["user_id", "friend_id", "item_id", "city", "country"]
    for seed, batch in enumerate([1, 5, 64]):
        # the KJT's keys in another order, and one key no feature uses
        features = kjt(theirs, batch, seed)
        shuffled = kjt(theirs, batch, seed, keys=["country", "extra", "item_id", "city",
                                                  "friend_id", "user_id"]) if seed else features
        want, got = theirs(shuffled), ours(shuffled)
        assert got.keys() == want.keys()
        assert got.length_per_key() == want.length_per_key()
        torch.testing.assert_close(got.values(), want.values(), rtol=1e-5, atol=1e-6)
        for f in want.keys():
            torch.testing.assert_close(got[f], want[f], rtol=1e-5, atol=1e-6)


def test_weighted_features_equal_torchrecs(tmp_path):
    torch.manual_seed(1)
    sums = [EmbeddingBagConfig(name=c.name, embedding_dim=c.embedding_dim,
                               num_embeddings=c.num_embeddings, feature_names=c.feature_names)
            for c in configs()]
    theirs = torchrec.EmbeddingBagCollection(tables=sums, is_weighted=True)
    ours = EmbeddingBagCollection(store_of(tmp_path, theirs), tables=sums)
    features = kjt(theirs, 16, 3, weighted=True)
    torch.testing.assert_close(ours(features).values(), theirs(features).values(), rtol=1e-5,
                               atol=1e-6)
    # an unweighted collection ignores the KJT's weights, as TorchRec's does
    plain = torchrec.EmbeddingBagCollection(tables=sums)
    plain.load_state_dict(theirs.state_dict())
    unweighted = EmbeddingBagCollection(ours.store, tables=sums, is_weighted=False)
    torch.testing.assert_close(unweighted(features).values(), plain(features).values(),
                               rtol=1e-5, atol=1e-6)
    assert not torch.allclose(unweighted(features).values(), ours(features).values())
    with pytest.raises(InvalidRequest, match="weights"):
        EmbeddingBagCollection(ours.store, tables=sums, is_weighted=True)(kjt(theirs, 2, 4))


def test_a_table_shared_by_features_answers_each_feature(tmp_path):
    """The new user's first try: ``feature_names`` with one table serving two features gives
    every feature its own block, keyed by feature."""
    torch.manual_seed(2)
    theirs = torchrec.EmbeddingBagCollection(tables=configs()[:2])
    store = store_of(tmp_path, theirs)
    ours = EmbeddingBagCollection(store, feature_names={
        "user_id": "t_user", "friend_id": "t_user", "item_id": "t_item"},
        pooling={"t_item": "mean"})
    features = kjt(theirs, 8, 4)
    out, want = ours(features), theirs(features)
    assert out.keys() == ["user_id", "friend_id", "item_id"] == want.keys()
    assert tuple(out.values().shape) == (8, 48)
    torch.testing.assert_close(out.values(), want.values(), rtol=1e-5, atol=1e-6)
    # TorchRec's configs of the collection, as torchrec.models.dlrm reads them
    made = ours.embedding_bag_configs()
    assert [(c.name, c.feature_names, c.embedding_dim, c.num_embeddings, c.pooling)
            for c in made] == [(c.name, c.feature_names, c.embedding_dim, c.num_embeddings,
                                c.pooling) for c in configs()[:2]]


def test_mappings_and_configs_that_do_not_fit_are_typed_errors(tmp_path):
    torch.manual_seed(3)
    theirs = torchrec.EmbeddingBagCollection(tables=configs())
    store = store_of(tmp_path, theirs)
    with pytest.raises(UnknownTable) as e:
        EmbeddingBagCollection(store, feature_names={"user_id": "t_nope"})
    assert e.value.table == "t_nope"
    wrong_dim = EmbeddingBagConfig(name="t_item", embedding_dim=32, num_embeddings=500,
                                   feature_names=["item_id"])
    with pytest.raises(InvalidRequest, match="dim") as e:
        EmbeddingBagCollection(store, tables=[wrong_dim])
    assert e.value.table == "t_item"
    wrong_rows = EmbeddingBagConfig(name="t_item", embedding_dim=16, num_embeddings=50,
                                    feature_names=["item_id"])
    with pytest.raises(InvalidRequest, match="rows") as e:
        EmbeddingBagCollection(store, tables=[wrong_rows])
    twice = [configs()[0], EmbeddingBagConfig(name="t_item", embedding_dim=16,
                                              num_embeddings=500, feature_names=["user_id"])]
    with pytest.raises(InvalidRequest, match="user_id"):
        EmbeddingBagCollection(store, tables=twice)
    sequence = EmbeddingBagConfig(name="t_item", embedding_dim=16, num_embeddings=500,
                                  feature_names=["item_id"], pooling=PoolingType.NONE)
    with pytest.raises(InvalidRequest, match="sequence"):
        EmbeddingBagCollection(store, tables=[sequence])
    ours = EmbeddingBagCollection(store, tables=configs())
    with pytest.raises(InvalidRequest, match="city") as e:
        ours(kjt(theirs, 4, 5, keys=["user_id", "friend_id", "item_id", "country"]))
    assert e.value.table == "t_geo"
    # TorchRec's KJT in, TorchRec's KeyedTensor out (its own KeyError for a key it lacks);
    # nearrec's KJT in, nearrec's KeyedTensor, whose error names the key
    out = ours(kjt(theirs, 2, 6))
    assert isinstance(out, torchrec.KeyedTensor)
    with pytest.raises(KeyError, match="nope"):
        out["nope"]
    mine = kjt(theirs, 2, 6)
    mine = nearrec.torch.KeyedJaggedTensor(mine.keys(), mine.values(), mine.lengths())
    with pytest.raises(UnknownTable, match="nope"):
        ours(mine)["nope"]


def dlrm(dense_in: int = 5) -> Any:
    from torchrec.models.dlrm import DLRM
    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=100 + 50 * i,
                                 feature_names=[f"f{i}"] + (["f_shared"] if i == 0 else []))
              for i in range(3)]
    ebc = torchrec.EmbeddingBagCollection(tables=tables)
    return DLRM(embedding_bag_collection=ebc, dense_in_features=dense_in,
                dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1])


@pytest.mark.parametrize("options", TIERS, ids=["dram", "ssd"])
def test_from_torchrec_serves_a_dlrm_with_the_same_outputs(tmp_path, options):
    torch.manual_seed(4)
    model = dlrm().eval()
    served = from_torchrec(model, tmp_path / "dlrm", **options)
    # the original keeps its own tables; the copy reads the store
    assert isinstance(model.sparse_arch.embedding_bag_collection,
                      torchrec.EmbeddingBagCollection)
    sparse = served.sparse_arch.embedding_bag_collection
    assert isinstance(sparse, EmbeddingBagCollection)
    assert sparse.store.tier == options["tier"]
    assert {t.name for t in nearrec.info(tmp_path / "dlrm").tables} >= {"t0", "t1", "t2"}
    for seed, batch in enumerate([1, 7, 32]):
        features = kjt(model.sparse_arch.embedding_bag_collection, batch, 10 + seed)
        dense = torch.randn(batch, 5)
        with torch.inference_mode():
            torch.testing.assert_close(served(dense, features), model(dense, features),
                                       rtol=1e-5, atol=1e-6)


def test_a_trainers_dlrm_checkpoint_updates_a_node(tmp_path):
    """What a trainer checkpoints, the state_dict of TorchRec's ``DLRMTrain`` around a DLRM,
    fed to a node serving the model's store with the model kept: the tables found at their
    TorchRec paths and only the rows that changed written; the dense weights found by their
    names under the wrapper's ``model.`` and replaced in the kept model, so the node's
    inferences equal the trained model's; nothing written when the dense part is refused."""
    from torchrec.models.dlrm import DLRMTrain

    import nearrec.models as nm
    torch.manual_seed(5)
    model = dlrm().eval()
    served = from_torchrec(model, tmp_path / "dlrm")
    nm.save(nm.offload(served), tmp_path / "dlrm")
    node = Node(str(tmp_path / "dlrm"), "--writable")
    try:
        remote = nearrec.connect(node.address)
        theirs = model.sparse_arch.embedding_bag_collection
        dense, features = torch.randn(6, 5), kjt(theirs, 6, 3)
        with torch.inference_mode():
            np.testing.assert_allclose(remote.infer(dense, features),
                                       model(dense, features).numpy(), rtol=1e-5, atol=1e-6)
        # training: rows of one table and the dense part move
        with torch.no_grad():
            theirs.embedding_bags["t1"].weight[[3, 60]] += 0.5
            for p in model.over_arch.parameters():
                p.mul_(-1.5)
            next(model.dense_arch.parameters()).add_(0.25)
        trainer = DLRMTrain(model)
        torch.save(trainer.state_dict(), tmp_path / "ckpt.pt")
        cli = [sys.executable, "-m", "nearrec.cli", "update", "--remote", node.address,
               "--from", str(tmp_path / "ckpt.pt"), "--json"]
        v = remote.version
        refused = subprocess.run(cli + ["--dense", "error"], capture_output=True, text=True,
                                 timeout=120)
        assert refused.returncode != 0 and "dense weights" in refused.stderr
        assert remote.version == v
        out = subprocess.run(cli, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        done = json.loads(out.stdout)
        assert {t: d["written"] for t, d in done["tables"].items()} == {"t0": 0, "t1": 2, "t2": 0}
        dense_names = [k for k in trainer.state_dict() if "embedding_bags" not in k]
        assert sorted(done["dense"]) == sorted(dense_names) and dense_names
        for t in ("t0", "t1", "t2"):
            want = theirs.embedding_bags[t].weight.detach().numpy()
            np.testing.assert_array_equal(remote.read_rows(t, np.arange(len(want))), want)
        with torch.inference_mode():
            np.testing.assert_allclose(remote.infer(dense, features),
                                       model(dense, features).numpy(), rtol=1e-5, atol=1e-6)
        # a weight the kept model does not have refuses the update whole, naming it
        extra = dict(trainer.state_dict())
        extra["model.over_arch.extra.weight"] = torch.zeros(2, 2)
        with pytest.raises(InvalidRequest, match="over_arch.extra.weight"):
            nearrec.update(remote, extra)
    finally:
        assert node.stop() == 0


def test_from_torchrec_names_a_clash_by_place_and_refuses_other_modules(tmp_path):
    class TwoTowers(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.users = torchrec.EmbeddingBagCollection(tables=configs()[:1])
            self.items = torchrec.EmbeddingBagCollection(tables=[EmbeddingBagConfig(
                name="t_user", embedding_dim=4, num_embeddings=30, feature_names=["seen"])])

        def forward(self, features: Any) -> Any:
            return torch.cat([self.users(features).values(), self.items(features).values()], 1)

    torch.manual_seed(5)
    towers = TwoTowers()
    served = from_torchrec(towers, tmp_path / "towers")
    stored = {t.name for t in nearrec.info(tmp_path / "towers").tables}
    assert stored == {"users.t_user", "items.t_user"}
    keys = ["user_id", "friend_id", "seen"]
    rng = np.random.default_rng(0)
    lengths = torch.from_numpy(rng.integers(0, 4, 3 * 6))
    values = torch.from_numpy(rng.integers(0, 30, int(lengths.sum())))
    features = torchrec.KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)
    torch.testing.assert_close(served(features), towers(features), rtol=1e-5, atol=1e-6)
    with pytest.raises(InvalidRequest, match="holds no TorchRec"):
        from_torchrec(torch.nn.Linear(2, 2), tmp_path / "none")


def sequence_configs() -> list[Any]:
    from torchrec.modules.embedding_configs import EmbeddingConfig
    return [EmbeddingConfig(name="t_item", embedding_dim=8, num_embeddings=200,
                            feature_names=["history", "candidate"]),
            EmbeddingConfig(name="t_cat", embedding_dim=8, num_embeddings=30,
                            feature_names=["category"])]


@pytest.mark.parametrize("options", TIERS, ids=["dram", "ssd"])
def test_sequence_embeddings_equal_torchrecs(tmp_path, options):
    from nearrec.torch import EmbeddingCollection
    torch.manual_seed(6)
    theirs = torchrec.EmbeddingCollection(tables=sequence_configs())
    nearrec.from_numpy(tmp_path / "s", {n: m.weight.detach().numpy()
                                        for n, m in theirs.embeddings.items()})
    ours = EmbeddingCollection(nearrec.open(tmp_path / "s", **options),
                               tables=sequence_configs())
    assert ours.features == ["history", "candidate", "category"]
    rows = {"history": 200, "candidate": 200, "category": 30}
    for seed, batch in enumerate([1, 6, 40]):
        rng = np.random.default_rng(seed)
        keys = ["category", "history", "candidate"]
        lengths = rng.integers(0, 7, batch * 3) * (rng.random(batch * 3) > 0.25)
        values = np.concatenate([rng.integers(0, rows[k], int(n)) for k, per in
                                 zip(keys, lengths.reshape(3, batch), strict=True) for n in per])
        features = torchrec.KeyedJaggedTensor(keys=keys, values=torch.from_numpy(values),
                                              lengths=torch.from_numpy(lengths))
        want, got = theirs(features), ours(features)
        assert list(got) == ours.features and set(got) == set(want)
        for f in want:
            torch.testing.assert_close(got[f].values(), want[f].values())
            torch.testing.assert_close(got[f].lengths(), want[f].lengths().long())
            for a, b in zip(got[f].to_dense(), want[f].to_dense(), strict=True):
                torch.testing.assert_close(a, b)
            torch.testing.assert_close(got[f].to_padded_dense(3),
                                       want[f].to_padded_dense(3))
    bad = torchrec.KeyedJaggedTensor(keys=["history", "candidate", "category"],
                                     values=torch.tensor([1, 2, 200, 5]),
                                     lengths=torch.tensor([2, 1, 1]))
    with pytest.raises(nearrec.IndexOutOfRange, match="candidate") as e:
        ours(bad)
    assert (e.value.table, e.value.position) == ("t_item", 2)  # among the KJT's values


def _forward(module: Any, *args: Any) -> Any:
    """Runs in a spawned process: ``module`` arrived pickled, its store opened again there."""
    with torch.inference_mode():
        return module(*args)


def test_modules_pickle_copy_save_and_run_in_other_processes(tmp_path):
    import copy
    import multiprocessing
    import pickle
    import warnings

    from nearrec.torch import EmbeddingBag, EmbeddingCollection
    torch.manual_seed(7)
    model = dlrm().eval()
    served = from_torchrec(model, tmp_path / "dlrm", tier="ssd", dram_budget="8KiB")
    ebc = served.sparse_arch.embedding_bag_collection
    features = kjt(model.sparse_arch.embedding_bag_collection, 6, 20)
    dense = torch.randn(6, 5)
    want = _forward(served, dense, features)
    # a deep copy shares the store; a pickle opens it again (same path, same tier)
    copied = copy.deepcopy(served)
    assert copied.sparse_arch.embedding_bag_collection.store is ebc.store
    again = pickle.loads(pickle.dumps(served))
    store = again.sparse_arch.embedding_bag_collection.store
    assert store is not ebc.store and (store.path, store.tier) == (ebc.store.path, "ssd")
    for other in (copied, again):
        torch.testing.assert_close(_forward(other, dense, features), want)
    torch.save(served, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    torch.testing.assert_close(_forward(loaded, dense, features), want)
    for module, args in ((EmbeddingBag(ebc.store, "t1", mode="mean"),
                          (torch.tensor([[1, 2], [3, 4]]),)),
                         (EmbeddingCollection(ebc.store, feature_names={"f1": "t1"}),
                          (features,))):
        got, expect = _forward(pickle.loads(pickle.dumps(module)), *args), _forward(module, *args)
        if isinstance(expect, dict):
            got, expect = got["f1"].values(), expect["f1"].values()
        torch.testing.assert_close(got, expect)
    # a spawned process: the module pickled there and run
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        torch.testing.assert_close(pool.apply(_forward, (served, dense, features)), want)
    # forked DataLoader workers, each looking up its batches through the collection
    batches = [kjt(model.sparse_arch.embedding_bag_collection, 4, 30 + i) for i in range(6)]
    loader = torch.utils.data.DataLoader(Lookups(ebc, batches), batch_size=None,
                                         num_workers=2, multiprocessing_context="fork")
    for got, b in zip(loader, batches, strict=True):
        torch.testing.assert_close(got, ebc(b).values())
    # tracing would freeze the lookup: refused
    with pytest.raises(InvalidRequest, match="jit.trace"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch deprecates jit.trace itself
        torch.jit.trace(EmbeddingBag(ebc.store, "t1"), (torch.tensor([[1, 2]]),))


def test_a_writable_store_pickles_as_read_only(tmp_path):
    import pickle
    nearrec.from_numpy(tmp_path / "s", {"t": np.ones((10, 4), np.float32)})
    store = nearrec.open(tmp_path / "s", writable=True)
    copy_ = pickle.loads(pickle.dumps(store))
    assert not copy_.config.writable and store.config.writable
    store.write("t", np.array([3]), np.full((1, 4), 2.0, np.float32))
    copy_.refresh()
    np.testing.assert_array_equal(copy_.read_rows("t", np.array([3])), 2.0)


class _Flat(torch.nn.Module):
    """A served DLRM taking the KJT's tensors, so that export can make the batch dynamic."""

    def __init__(self, model: Any, keys: list[str]):
        super().__init__()
        self.model, self.keys = model, keys

    def forward(self, dense: Any, values: Any, lengths: Any) -> Any:
        return self.model(dense, torchrec.KeyedJaggedTensor(keys=self.keys, values=values,
                                                            lengths=lengths))


def export_served(served: Any, features: Any, dense: Any) -> tuple[Any, list[Any]]:
    """``served`` exported on a KJT's tensors (``_Flat``) with the batch dynamic: the program
    and the operations its graph calls."""
    from torch.export import Dim

    batch = Dim("batch", min=1, max=4096)
    program = torch.export.export(
        _Flat(served, features.keys()), (dense, features.values(), features.lengths()),
        dynamic_shapes=({0: batch}, {0: Dim.AUTO}, {0: 4 * batch}))
    return program, [n.target for n in program.graph.nodes if n.op == "call_function"]


def test_compile_and_export_keep_the_lookup_as_one_op(tmp_path):
    torch.manual_seed(8)
    model = dlrm().eval()
    served = from_torchrec(model, tmp_path / "dlrm", tier="ssd", dram_budget="8KiB")
    theirs = model.sparse_arch.embedding_bag_collection
    ebc = served.sparse_arch.embedding_bag_collection
    compiled = torch.compile(served, fullgraph=True)  # a graph break would fail here
    compiled_ebc = torch.compile(ebc, fullgraph=True)
    with torch.inference_mode():
        for seed, batch in ((1, 6), (2, 6), (3, 11)):  # new ids each time: nothing frozen
            features, dense = kjt(theirs, batch, seed), torch.randn(batch, 5)
            torch.testing.assert_close(compiled(dense, features), model(dense, features),
                                       rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(compiled_ebc(features).values(),
                                       theirs(features).values(), rtol=1e-5, atol=1e-6)
    program, ops = export_served(served, kjt(theirs, 6, 1), torch.randn(6, 5))
    assert torch.ops.nearrec.pooled_lookup.default in ops
    for seed, n in ((4, 6), (5, 13)):
        features, dense = kjt(theirs, n, seed), torch.randn(n, 5)
        torch.testing.assert_close(
            program.module()(dense, features.values(), features.lengths()),
            model(dense, features), rtol=1e-5, atol=1e-6)
    with pytest.raises(InvalidRequest, match="handle"):
        torch.ops.nearrec.pooled_lookup(10**9, features.values(), features.lengths(), None,
                                        [0], 4)


class _Sequences(torch.nn.Module):
    """A sequence model's sparse part and a little of what follows it, taking the KJT's
    tensors: ids summed, a padded history, a candidate's rows."""

    def __init__(self, collection: Any):
        super().__init__()
        self.collection = collection

    def forward(self, values: Any, lengths: Any) -> Any:
        out = self.collection(torchrec.KeyedJaggedTensor(
            keys=["history", "candidate", "category"], values=values, lengths=lengths))
        return (out["history"].to_padded_dense(4), out["candidate"].values().sum(dim=0),
                out["category"].to_padded_dense(2).sum(dim=1))


@pytest.mark.parametrize("options", TIERS, ids=["dram", "ssd"])
def test_sequence_embeddings_compile_and_export_as_one_op(tmp_path, options):
    from torch.export import Dim

    from nearrec.torch import EmbeddingCollection
    torch.manual_seed(9)
    theirs = torchrec.EmbeddingCollection(tables=sequence_configs())
    nearrec.from_numpy(tmp_path / "s", {n: m.weight.detach().numpy()
                                        for n, m in theirs.embeddings.items()})
    ours = EmbeddingCollection(nearrec.open(tmp_path / "s", **options),
                               tables=sequence_configs())
    eager, reference = _Sequences(ours), _Sequences(theirs)
    compiled = torch.compile(eager, fullgraph=True)  # a graph break would fail here

    def batch(seed: int, n: int) -> tuple[Any, Any]:
        rng = np.random.default_rng(seed)
        lengths = rng.integers(0, 6, 3 * n)
        rows = np.repeat([200, 200, 30], n)
        return (torch.from_numpy(np.concatenate([rng.integers(0, r, k)
                                                 for r, k in zip(rows, lengths, strict=True)])),
                torch.from_numpy(lengths))

    with torch.inference_mode():
        for seed, n in ((1, 5), (2, 5), (3, 9)):  # new ids and sizes: nothing frozen
            for got, want in zip(compiled(*batch(seed, n)), reference(*batch(seed, n)),
                                 strict=True):
                torch.testing.assert_close(got, want)
    samples = Dim("samples", min=1, max=4096)
    program = torch.export.export(eager, batch(4, 6),
                                  dynamic_shapes=({0: Dim.AUTO}, {0: 3 * samples}))
    ops = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert torch.ops.nearrec.sequence_lookup.default in ops
    for seed, n in ((5, 6), (6, 17)):
        for got, want in zip(program.module()(*batch(seed, n)), reference(*batch(seed, n)),
                             strict=True):
            torch.testing.assert_close(got, want)
    # a copy (pickled and back) registers its own handle and answers the same
    copy = pickle.loads(pickle.dumps(ours))
    assert copy._handle != ours._handle
    for a, b in zip(_Sequences(copy)(*batch(7, 3)), eager(*batch(7, 3)), strict=True):
        torch.testing.assert_close(a, b)


def managed(zch: int, hash_size: int | None) -> Any:
    """A TorchRec managed-collision (ZCH) collection of two tables, trained on a few batches so
    that its modules have given slots to some ids and not to others."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection as TorchRecEBC
    from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
    from torchrec.modules.mc_modules import (
        DistanceLFU_EvictionPolicy,
        ManagedCollisionCollection,
        MCHManagedCollisionModule,
    )
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    torch.manual_seed(0)
    tables = [EmbeddingBagConfig(name="t_user", embedding_dim=8, num_embeddings=zch,
                                 feature_names=["user"]),
              EmbeddingBagConfig(name="t_item", embedding_dim=4, num_embeddings=zch,
                                 feature_names=["item"], pooling=PoolingType.MEAN)]
    hash_fn = None if hash_size is None else (lambda ids, n: ids % n)
    mcc = ManagedCollisionCollection(
        {t.name: MCHManagedCollisionModule(
            zch_size=zch, device=torch.device("cpu"), eviction_interval=1,
            eviction_policy=DistanceLFU_EvictionPolicy(), input_hash_size=hash_size or 2**62,
            input_hash_func=hash_fn) for t in tables},
        tables)
    module = ManagedCollisionEmbeddingBagCollection(TorchRecEBC(tables=tables), mcc)
    rng = np.random.default_rng(1)
    module.train()
    for _ in range(4):
        ids = torch.from_numpy(rng.integers(0, 10**12, 64))
        module(KeyedJaggedTensor.from_lengths_sync(["user", "item"], ids,
                                                   torch.full((32,), 2)))
    return module.eval()


@pytest.mark.parametrize("hash_size", [None, 1 << 30])
@pytest.mark.parametrize("options", TIERS)
def test_a_managed_collision_collection_is_served_by_key_with_torchrecs_outputs(
        tmp_path, options, hash_size):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    module = managed(24, hash_size)
    served = from_torchrec(module, tmp_path / "mc", **options)
    mc = module._managed_collision_collection._managed_collision_modules["t_user"]
    held = mc._mch_sorted_raw_ids[mc._mch_sorted_raw_ids != torch.iinfo(torch.int64).max]
    assert 0 < len(held) <= 24
    store = nearrec.open(tmp_path / "mc")
    assert store.tables["t_user"].keyed and store.tables["t_user"].keys >= len(held)
    rng = np.random.default_rng(2)
    for _ in range(3):
        # ids the modules hold slots for (their raw ids, before any hash) and ids they do not
        known = held.numpy() if hash_size is None else held.numpy() + (1 << 30) * 7
        ids = np.concatenate([rng.choice(known, 20), rng.integers(0, 10**12, 20)])
        rng.shuffle(ids)
        lengths = torch.from_numpy(rng.multinomial(40, [1 / 20] * 20))  # empty bags too
        kjt = KeyedJaggedTensor.from_lengths_sync(["user", "item"], torch.from_numpy(ids),
                                                  lengths)
        want, _ = module(kjt)
        got, remapped = served(kjt)
        assert remapped is None
        assert got.keys() == want.keys()
        torch.testing.assert_close(got.values(), want.values(), rtol=1e-5, atol=1e-5)
    # an id without a slot pools TorchRec's default slot, not zeros
    default = module._embedding_module.embedding_bags["t_user"].weight[23]
    assert default.abs().sum() > 0


def test_a_newcomers_first_screen_holds_nearrecs_output_only():
    """Issue 62, item 11: the quick start's TorchRec part printed PyTorch's internal notice
    `is_fx_tracing will return true ...` (TorchRec's KeyedJaggedTensor asks is_fx_tracing());
    with nearrec.torch imported it is not printed."""
    code = ("import torch, torchrec, nearrec.torch\n"
            "torchrec.KeyedJaggedTensor.from_lengths_sync(keys=['f'], values=torch.arange(3), "
            "lengths=torch.tensor([2, 1]))\n"
            "from torch.fx._symbolic_trace import is_fx_tracing\n"
            "assert not is_fx_tracing()\n"
            "print('done')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
    assert "is_fx_tracing" not in out.stderr, out.stderr


def test_the_operations_walkthrough_trains_on_and_feeds_the_store(tmp_path):
    """docs/operations.md §1, 2 and 4 as a user runs them (issue 62, item 21: §4 fed a
    `ckpt-2.pt` the page never showed how to make): its train.py, export.py and continue.py,
    then `nearrec update` from the continued checkpoint writes the rows it changed and its dense
    weights, and nothing else."""
    import re
    from pathlib import Path
    page = (Path(__file__).parent.parent / "docs" / "operations.md").read_text()
    for name in ("train.py", "export.py", "continue.py"):
        block = next(b for b in re.findall(r"```python\n(.*?)```", page, re.S)
                     if b.startswith(f"# {name}"))
        (tmp_path / name).write_text(block)

    def run(*args: str) -> str:
        out = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                             cwd=tmp_path, timeout=600)
        assert out.returncode == 0, out.stderr
        return out.stdout

    run("train.py", "ckpt-1.pt", "1")
    run("export.py", "ckpt-1.pt", "build-1")
    run("continue.py", "ckpt-1.pt", "ckpt-2.pt", "16")
    done = json.loads(run("-m", "nearrec.cli", "update", "build-1", "--from", "ckpt-2.pt",
                          "--json"))
    written = {t: d["written"] for t, d in done["tables"].items()}
    assert written["t_item"] == written["t_geo"] == 0, written
    assert 1_900 < written["t_user"] < 2_048, written  # 2,048 draws of 200,000 users
    assert len(done["dense"]) == 8, done["dense"]
