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


def _kjt_want(tables, keys, values, lengths, weights, batch):
    """Per key, torch.nn.EmbeddingBag's sum over the KJT's bags (the reference)."""
    out, at = {}, 0
    for k, name in enumerate(keys):
        lens = lengths[k * batch:(k + 1) * batch]
        n = int(lens.sum())
        bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(tables[name]), mode="sum")
        off = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(lens, 0)[:-1]])
        w = None if weights is None else weights[at:at + n].detach()
        out[name] = bag(values[at:at + n].long(), off, per_sample_weights=w).detach()
        at += n
    return out


@pytest.mark.parametrize("form", ["int64", "int32", "offset view", "strided view", "numpy",
                                  "weights with grad", "weights strided", "empty"])
def test_collection_reads_every_buffer_form(fp32_store, form):
    """The EBC reads contiguous CPU tensors in place and converts every other form (views
    with strides, numpy arrays, int32, weights that require grad): all pool the same bags."""
    store, tables = fp32_store
    ebc = ntorch.EmbeddingBagCollection(store)
    keys, batch = ["t0", "t1", "t2"], 4
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(0, 5, (3 * batch,), generator=g)
    if form == "empty":
        lengths = torch.zeros(3 * batch, dtype=torch.long)
    values = torch.cat([torch.randint(0, 100, (int(lengths[k * batch:(k + 1) * batch].sum()),),
                                      generator=g) for k in range(3)])
    weights = torch.rand(values.shape, generator=g) if form.startswith("weights") else None
    want = _kjt_want(tables, keys, values, lengths, weights, batch)
    v, ln, w = values, lengths, weights
    if form == "int32":
        v, ln = values.int(), lengths.int()
    elif form == "offset view":
        v = torch.cat([torch.tensor([7, 7]), values])[2:]
        ln = torch.cat([lengths, lengths])[len(lengths):]
        assert v.storage_offset() == 2 and ln.storage_offset() == len(lengths)
    elif form == "strided view":
        v = torch.stack([values, -values], 1)[:, 0]
        assert not v.is_contiguous()
    elif form == "numpy":
        v, ln = values.numpy(), lengths.numpy()
    elif form == "weights with grad":
        w = weights.clone().requires_grad_(True)
    elif form == "weights strided":
        w = torch.stack([weights, weights * 0], 1)[:, 0]
    if form == "numpy":  # a KJT-shaped object whose buffers are numpy arrays
        kjt = type("NumpyKJT", (), {"keys": lambda self: keys, "values": lambda self: v,
                                    "lengths": lambda self: ln,
                                    "weights_or_none": lambda self: None})()
    else:
        kjt = ntorch.KeyedJaggedTensor(keys, v, lengths=ln, weights=w)
    kt = ebc(kjt)
    for name in keys:
        torch.testing.assert_close(kt[name], want[name], rtol=1e-5, atol=1e-5)


def test_collection_follows_the_key_order(fp32_store):
    """The layout of a key order is kept between batches: another order, equal but not
    identical key strings, and then a missing key must each be read afresh."""
    store, tables = fp32_store
    ebc = ntorch.EmbeddingBagCollection(store, tables=["t0", "t2"])
    lengths = torch.tensor([1, 2, 1, 1])
    for keys in (["t0", "t2"], ["t2", "t0"], ["".join(["t", "2"]), "t0", "t1"], ["t2", "t0"]):
        values = torch.tensor([5, 6, 7, 8, 9][:int(lengths.sum())] + [3] * 2 * (len(keys) - 2))
        ln = torch.cat([lengths, torch.ones(2 * (len(keys) - 2), dtype=torch.long)])
        kt = ebc(ntorch.KeyedJaggedTensor(keys, values, lengths=ln))
        want = _kjt_want(tables, keys, values, ln, None, 2)
        for name in ("t0", "t2"):
            torch.testing.assert_close(kt[name], want[name], rtol=1e-5, atol=1e-5)
    with pytest.raises(nearrec.InvalidRequest, match="no key 't0'"):
        ebc(ntorch.KeyedJaggedTensor(["t2"], torch.tensor([1, 2]), lengths=torch.tensor([1, 1])))
