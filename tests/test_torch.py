"""nearrec.torch modules behave like their PyTorch / TorchRec counterparts."""

from __future__ import annotations

import numpy as np
import pytest

import nearrec

torch = pytest.importorskip("torch")
ntorch = pytest.importorskip("nearrec.torch")


@pytest.fixture(scope="module")
def fp32_store(tmp_path_factory):
    rng = np.random.default_rng(0)
    tables = {f"t{i}": rng.standard_normal((100 + 10 * i, 8 * (i + 1)), dtype=np.float32)
              for i in range(3)}
    path = tmp_path_factory.mktemp("torch") / "s"
    nearrec.from_numpy(path, tables)
    return nearrec.open(path), tables


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_module(fp32_store, mode, include_last_offset):
    store, tables = fp32_store
    ours = ntorch.EmbeddingBag(store, "t1", mode=mode, include_last_offset=include_last_offset,
                               padding_idx=4)
    theirs = torch.nn.EmbeddingBag.from_pretrained(
        torch.from_numpy(tables["t1"]), mode=mode, include_last_offset=include_last_offset,
        padding_idx=4)
    x = torch.randint(0, 110, (40,))
    x[::5] = 4
    off = torch.tensor([0, 3, 3, 10, 25] + ([40] if include_last_offset else []))
    got = ours(x, off)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    torch.testing.assert_close(got, theirs(x, off).detach(), rtol=1e-5, atol=1e-5)
    x2 = torch.randint(0, 110, (6, 4), dtype=torch.int32)
    torch.testing.assert_close(ours(x2), theirs(x2).detach(), rtol=1e-5, atol=1e-5)
    if mode == "sum":
        w = torch.rand(40)
        torch.testing.assert_close(ours(x, off, w), theirs(x, off, w).detach(),
                                   rtol=1e-5, atol=1e-5)
    assert ours.embedding_dim == 16 and ours.num_embeddings == 110


def test_collection_with_own_kjt(fp32_store):
    store, tables = fp32_store
    ebc = ntorch.EmbeddingBagCollection(store)
    batch = 5
    lengths = torch.randint(0, 4, (3 * batch,))
    rows = [100, 110, 120]
    values = torch.cat([torch.randint(0, rows[k], (int(lengths[k * batch:(k + 1) * batch].sum()),))
                        for k in range(3)])
    kjt = ntorch.KeyedJaggedTensor(["t0", "t1", "t2", ], values, lengths=lengths)
    kt = ebc(kjt)
    assert kt.values().shape == (batch, 8 + 16 + 24)
    assert kt.keys() == ["t0", "t1", "t2"] and kt.length_per_key() == [8, 16, 24]
    at = 0
    for k, name in enumerate(["t0", "t1", "t2"]):
        n = int(lengths[k * batch:(k + 1) * batch].sum())
        bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(tables[name]), mode="sum")
        off = torch.cat([torch.zeros(1, dtype=torch.long),
                         torch.cumsum(lengths[k * batch:(k + 1) * batch], 0)[:-1]])
        want = bag(values[at:at + n], off).detach()
        torch.testing.assert_close(kt[name], want, rtol=1e-5, atol=1e-5)
        at += n


def test_collection_missing_feature_is_an_error(fp32_store):
    store, _ = fp32_store
    ebc = ntorch.EmbeddingBagCollection(store, tables=["t0", "t1"])
    kjt = ntorch.KeyedJaggedTensor(["t0"], torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))
    with pytest.raises(nearrec.InvalidRequest, match="no key 't1'"):
        ebc(kjt)


def test_collection_accepts_torchrec_kjt(fp32_store):
    torchrec = pytest.importorskip("torchrec")
    store, tables = fp32_store
    ebc = ntorch.EmbeddingBagCollection(store, tables=["t0", "t2"])
    kjt = torchrec.KeyedJaggedTensor(keys=["t0", "t2"], values=torch.tensor([1, 2, 3, 4]),
                                     lengths=torch.tensor([2, 0, 1, 1]))
    kt = ebc(kjt)
    want0 = tables["t0"][[1, 2]].sum(0)
    np.testing.assert_allclose(kt["t0"][0].numpy(), want0, rtol=1e-6)
    np.testing.assert_array_equal(kt["t0"][1].numpy(), np.zeros(8, np.float32))
    np.testing.assert_allclose(kt["t2"][1].numpy(), tables["t2"][4], rtol=1e-6)
