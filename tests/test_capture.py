"""Your model, not only ours: a TorchRec DLRM (after ``from_torchrec``) and models of a user's
own run whole in the engine (``nearrec.models.offload`` through ``nearrec.capture``), kept with
their store (``save`` / ``load`` / ``Store.infer``), and pipelined by ``nearrec.models.infer``;
every output held to the PyTorch module on random KeyedJaggedTensors, on both tiers."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchrec = pytest.importorskip("torchrec")

from test_torchrec import TIERS, configs, dlrm, kjt  # noqa: E402
from torch import nn  # noqa: E402
from torchrec.modules.embedding_configs import PoolingType  # noqa: E402

import nearrec  # noqa: E402
import nearrec.models as nm  # noqa: E402
from nearrec import InvalidRequest  # noqa: E402
from nearrec.capture import capture  # noqa: E402
from nearrec.torch import EmbeddingBagCollection, from_torchrec  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def close(a: Any, b: Any) -> None:
    torch.testing.assert_close(torch.as_tensor(a), b, rtol=1e-5, atol=1e-5)


def served_dlrm(tmp_path: Any, options: dict[str, Any], seed: int = 4) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    model = dlrm().eval()
    return model, from_torchrec(model, tmp_path / "dlrm", **options)


def batches(model: Any, n: int, sizes: tuple[int, ...] = (7, 1, 33)) -> list[tuple[Any, Any]]:
    theirs = model.sparse_arch.embedding_bag_collection
    return [(torch.randn(b, 5), kjt(theirs, b, 100 * n + i)) for i, b in enumerate(sizes)]


@pytest.mark.parametrize("options", TIERS, ids=["dram", "ssd"])
def test_offload_runs_a_torchrec_dlrm_in_the_engine(tmp_path, options):
    model, served = served_dlrm(tmp_path, options)
    offloaded = nm.offload(served)  # a TorchRec DLRM needs no example batch
    # a shared table: four inputs (features) over three tables
    assert offloaded.inputs == ["f0", "f_shared", "f1", "f2"]
    assert offloaded.tables == ["t0", "t0", "t1", "t2"]
    ops = [op["op"] for op in offloaded.captured.spec["ops"]]
    assert ops == ["linear", "linear", "dots", "linear", "linear"]  # ReLUs folded in
    with torch.inference_mode():
        for dense, features in batches(model, 1):
            close(offloaded(dense, features), model(dense, features))
        assert offloaded.last_times["total"] > 0
        # the store runs it too, given the model
        dense, features = batches(model, 2)[0]
        close(served.sparse_arch.embedding_bag_collection.store.infer(
            dense, features, model=offloaded), model(dense, features))


@pytest.mark.parametrize("weighted", [False, True], ids=["mean", "weighted"])
def test_offload_takes_pooling_from_the_configs_and_weighted_features(tmp_path, weighted):
    """MEAN tables (or weights, which TorchRec pools with SUM only) and a table shared by two
    features: the captured program reads the collection's features as TorchRec pools them."""
    tables = configs()
    if weighted:
        tables = [dataclasses.replace(c, pooling=PoolingType.SUM) for c in tables]

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = torchrec.EmbeddingBagCollection(tables=tables, is_weighted=weighted)
            self.top = nn.Linear(16 * 3 + 8 * 2 + 3, 2)

        def forward(self, dense: Any, features: Any) -> Any:
            pooled = self.ebc(features)
            return torch.sigmoid(self.top(torch.cat([pooled.values(), dense], dim=1)))

    torch.manual_seed(5)
    model = Model().eval()
    served = from_torchrec(model, tmp_path / "s", tier="ssd", dram_budget="4KiB")
    example = (torch.randn(4, 3), kjt(model.ebc, 4, 1, weighted=weighted))
    offloaded = nm.offload(served, example=example)
    assert offloaded.captured.pooling == ["sum", "sum"] + ["sum" if weighted else "mean"] + \
        ["sum", "sum"]
    with torch.inference_mode():
        for seed, b in ((2, 9), (3, 1)):
            dense, features = torch.randn(b, 3), kjt(model.ebc, b, seed, weighted=weighted)
            close(offloaded(dense, features), model(dense, features))


class Mixed(nn.Module):
    """A model of a user's own over a nearrec collection: every operation the engine runs, in
    shapes a DLRM does not use (slices of features, sums and products, an activation on its
    own, a split, the dense features late, two outputs)."""

    def __init__(self, ebc: Any):
        super().__init__()
        self.ebc = ebc
        self.bottom = nn.Linear(3, 8)
        self.a = nn.Linear(8 + 16 + 8, 12, bias=False)
        self.b = nn.Linear(12 + 3, 2)

    def forward(self, dense: Any, features: Any) -> Any:
        kt = self.ebc(features)
        user, friend, item = kt["user_id"], kt["friend_id"], kt["item_id"]
        city = kt["city"]
        x = torch.tanh(self.bottom(dense))
        h = self.a(torch.cat([x * city, user + friend, item[:, 4:12]], dim=1))
        left, right = torch.split(h, [5, 7], dim=1)
        h = torch.cat([torch.relu(left), torch.sigmoid(right)], dim=1)
        stack = torch.stack([x, city, item[:, :8]], dim=1)
        dots = torch.bmm(stack, stack.transpose(1, 2))
        pairs = dots[:, [1, 2, 2], [0, 0, 1]]
        return self.b(torch.cat([h, dense], dim=1)) + pairs[:, 1:3]


@pytest.mark.parametrize("options", TIERS, ids=["dram", "ssd"])
def test_a_users_model_is_captured_op_by_op(tmp_path, options):
    torch.manual_seed(6)
    theirs = torchrec.EmbeddingBagCollection(tables=configs())
    served = from_torchrec(Mixed(theirs).eval(), tmp_path / "m", **options)
    reference = Mixed(theirs).eval()
    reference.load_state_dict(served.state_dict(), strict=False)
    example = (torch.randn(3, 3), kjt(theirs, 3, 1))
    offloaded = nm.offload(served, example=example)
    kinds = {op["op"] for op in offloaded.captured.spec["ops"]}
    assert kinds == {"linear", "mul", "add", "activation", "dots"}
    with torch.inference_mode():
        for seed, b in ((2, 5), (3, 17)):
            dense, features = torch.randn(b, 3), kjt(theirs, b, seed)
            close(offloaded(dense, features), reference(dense, features))


def test_what_the_engine_does_not_run_is_refused_by_name(tmp_path):
    torch.manual_seed(7)
    theirs = torchrec.EmbeddingBagCollection(tables=configs())
    ebc = from_torchrec(theirs, tmp_path / "e")

    class Gelu(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc, self.l = ebc, nn.Linear(64, 2)

        def forward(self, dense: Any, features: Any) -> Any:
            return nn.functional.gelu(self.l(self.ebc(features).values()))

    class Dropout(Gelu):
        def forward(self, dense: Any, features: Any) -> Any:
            return self.l(nn.functional.dropout(self.ebc(features).values(), 0.5, True))

    class Scaled(Gelu):
        def forward(self, dense: Any, features: Any) -> Any:
            return self.l(self.ebc(features).values()) * 2.0

    class Across(Gelu):  # mixes samples: a sum over the batch
        def forward(self, dense: Any, features: Any) -> Any:
            return self.l(self.ebc(features).values()).sum(dim=0, keepdim=True)

    class Wide(Gelu):
        def forward(self, dense: Any, features: Any) -> Any:
            return self.l(torch.cat([self.ebc(features).values(), dense], dim=1))

    example = (torch.randn(2, 3), kjt(theirs, 2, 1))
    for module, op in ((Gelu(), "aten.gelu"), (Dropout(), "aten.dropout"),
                       (Scaled(), "aten.mul"), (Across(), "aten.sum")):
        with pytest.raises(InvalidRequest, match=rf"cannot offload {type(module).__name__}: "
                                                 rf"its operation {op}"):
            nm.offload(module, example=example)
    with pytest.raises(InvalidRequest, match="holds no nearrec EmbeddingBagCollection"):
        capture(nn.Linear(2, 2), None, example[1])
    with pytest.raises(InvalidRequest, match="give an example batch"):
        nm.offload(Gelu())
    with pytest.raises(InvalidRequest, match="must be a KeyedJaggedTensor"):
        nm.offload(Gelu(), example=(torch.randn(2, 3), "not features"))
    with pytest.raises(InvalidRequest, match="could not be captured by torch.export"):
        nm.offload(Wide(), example=example)  # 64 + 3 columns into a layer of 64


@pytest.mark.parametrize("options", TIERS, ids=["dram", "ssd"])
def test_save_and_load_keep_a_captured_model_with_its_store(tmp_path, options):
    model, served = served_dlrm(tmp_path, options)
    nm.save(served, tmp_path / "dlrm")  # captured on a batch of its own: a TorchRec DLRM
    store = nearrec.open(tmp_path / "dlrm", **options)
    config = json.loads(nearrec.read_attachment(tmp_path / "dlrm", nm.CONFIG_ATTACHMENT))
    assert config["model"] == "graph" and config["features"] == ["f0", "f_shared", "f1", "f2"]
    loaded = nm.load(store)
    assert isinstance(loaded, nm.Offloaded)
    with torch.inference_mode():
        for dense, features in batches(model, 3):
            want = model(dense, features)
            # the engine alone, from the store's attachments: inputs matched by feature
            close(store.infer(dense.numpy(), features), want)
            close(loaded(dense, features), want)
    # lookups given as a list are matched to the inputs (features) by name, by the engine
    with pytest.raises(InvalidRequest, match=r'missing \["f0", "f_shared", "f1", "f2"\]'):
        store.infer(torch.randn(2, 5).numpy(), [], model=loaded)
    with pytest.raises(InvalidRequest, match=r'table "t0".*missing \["f_shared"\]'):
        theirs = model.sparse_arch.embedding_bag_collection
        store.infer(torch.randn(2, 5).numpy(), kjt(theirs, 2, 1, keys=["f0", "f1", "f2"]))
    other = nearrec.from_numpy(tmp_path / "other", {"t": np.zeros((4, 8), np.float32)})
    with pytest.raises(InvalidRequest, match="keep it with the store it reads"):
        nm.save(served, tmp_path / "other")
    del other


def test_a_stored_program_that_does_not_hold_together_is_refused(tmp_path):
    nearrec.from_numpy(tmp_path / "s", {"t": np.ones((10, 4), np.float32)})
    config = {"model": "graph", "tables": ["t"], "features": ["f"], "pooling": ["sum"],
              "graph": {"dense": 0, "ops": [{"op": "linear", "input": [[5, 0, 4]],
                                             "weight": "w"}], "output": [[2, 0, 1]]}}
    nearrec._native.model_save(str(tmp_path / "s"), json.dumps(config),
                               [("w", np.ones((1, 4), np.float32))])
    store = nearrec.open(tmp_path / "s")
    features = nearrec.torch.KeyedJaggedTensor(["f"], torch.tensor([1, 2]), torch.tensor([2]))
    with pytest.raises(nearrec.StoreCorrupted, match="op 0: its input reads value 5"):
        store.infer(None, features)
    config["graph"]["ops"][0]["input"] = [[1, 0, 4]]
    nearrec._native.model_save(str(tmp_path / "s"), json.dumps(config),
                               [("w", np.ones((1, 4), np.float32))])
    store = nearrec.open(tmp_path / "s")
    np.testing.assert_allclose(store.infer(None, features), [[8.0]])  # rows 1 + 2, all ones


class _Renamed(nn.Module):
    """A module that hands its collection a KJT of its own: nothing read ahead is taken."""

    def __init__(self, inner: Any):
        super().__init__()
        self.inner = inner

    def forward(self, dense: Any, features: Any) -> Any:
        again = torchrec.KeyedJaggedTensor(keys=features.keys(), values=features.values(),
                                           lengths=features.lengths())
        return self.inner(dense, again)


@pytest.mark.parametrize("options", TIERS, ids=["dram", "ssd"])
def test_infer_pipelines_any_module_over_nearrec_collections(tmp_path, options):
    model, served = served_dlrm(tmp_path, options)
    work = batches(model, 4, (9, 4, 1, 16, 9))
    with torch.inference_mode():
        want = [model(d, f) for d, f in work]
        for depth, sub in ((0, None), (2, None), (3, 4)):
            result = nm.infer(served, work, depth=depth, sub_batch=sub)
            assert result.unused == 0 and result.samples == sum(d.shape[0] for d, _ in work)
            assert set(result.breakdown) == {"embedding_wait", "forward"}
            for got, w in zip(result.outputs, want, strict=True):
                close(got, w)
        renamed = nm.infer(_Renamed(served), work, depth=2)
        assert renamed.unused == len(work)  # read ahead, then read again: counted
        for got, w in zip(renamed.outputs, want, strict=True):
            close(got, w)
        offloaded = nm.infer(nm.offload(served), work, depth=2)
        for got, w in zip(offloaded.outputs, want, strict=True):
            close(got, w)
    with pytest.raises(InvalidRequest, match="holds no nearrec EmbeddingBagCollection"):
        nm.infer(model, work)


def test_a_collection_forward_takes_what_was_read_ahead_only_for_its_own_batch(tmp_path):
    theirs = torchrec.EmbeddingBagCollection(tables=configs())
    ebc = from_torchrec(theirs, tmp_path / "c")
    assert isinstance(ebc, EmbeddingBagCollection)
    a, b = kjt(theirs, 3, 1), kjt(theirs, 3, 2)
    ahead = ebc(a)
    ebc.ahead(a, ahead)
    close(ebc(b).values(), theirs(b).values())  # another batch: looked up
    assert ebc(a).values() is ahead.values()  # its own: taken, not looked up again
    close(ebc(a).values(), theirs(a).values())  # once
    ebc.ahead(b, ahead)
    assert ebc.unused() == 1 and ebc.unused() == 0
