"""Requests for a served model as `nearrec.ray.serve_model` takes them (JSON bodies), and the
model's answer to one computed here, straight from the model (nearrec's DLRM, or TorchRec's):
the reference the serving tests (`test_serve_model.py`, `test_ray.py`) hold the served answers
to."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from nearrec.torch import KeyedJaggedTensor


def request(rng: np.random.Generator, model: Any, rows: int, batch: int) -> dict[str, Any]:
    """A body of `batch` samples: 0–3 ids a table and sample below `rows`, random dense."""
    features = {}
    for t in model.table_names:
        lengths = rng.integers(0, 4, batch)
        features[t] = {"ids": rng.integers(0, rows, int(lengths.sum())).tolist(),
                       "lengths": lengths.tolist()}
    dense = rng.standard_normal((batch, model.dense_features)).astype(np.float32)
    return {"dense": dense.tolist(), "features": features}


def answer(model: Any, body: dict[str, Any]) -> np.ndarray:
    """What `model` outputs for `body` run by itself."""
    tables = model.table_names
    values = np.concatenate([np.asarray(body["features"][t]["ids"], np.int64) for t in tables])
    lengths = np.concatenate([np.asarray(body["features"][t]["lengths"], np.int64)
                              for t in tables])
    kjt = KeyedJaggedTensor(tables, torch.from_numpy(values), lengths=torch.from_numpy(lengths))
    with torch.no_grad():
        return model(torch.tensor(body["dense"], dtype=torch.float32), kjt).numpy()


def body_for(rng: np.random.Generator, inputs: list[str], rows: list[int], dense: int,
             batch: int) -> dict[str, Any]:
    """A body of `batch` samples for a model of `inputs` (its features: a TorchRec model's),
    input `k` reading a table of `rows[k]` rows."""
    lengths = {f: rng.integers(0, 4, batch) for f in inputs}
    return {"dense": rng.standard_normal((batch, dense)).astype(np.float32).tolist(),
            "features": {f: {"ids": rng.integers(0, n, int(lengths[f].sum())).tolist(),
                             "lengths": lengths[f].tolist()}
                         for f, n in zip(inputs, rows, strict=True)}}


def torchrec_kjt(body: dict[str, Any]) -> Any:
    """`body`'s features as TorchRec's KeyedJaggedTensor."""
    import torchrec

    f = body["features"]
    return torchrec.KeyedJaggedTensor(
        list(f), torch.tensor([i for k in f for i in f[k]["ids"]], dtype=torch.int64),
        lengths=torch.tensor([n for k in f for n in f[k]["lengths"]], dtype=torch.int64))


def torchrec_answer(model: Any, body: dict[str, Any]) -> np.ndarray:
    """What TorchRec's `model` outputs for `body` run by itself."""
    with torch.inference_mode():
        return model(torch.tensor(body["dense"]), torchrec_kjt(body)).numpy()


def train_step(model: Any, optimizer: Any, rng: np.random.Generator) -> Any:
    """One SGD step of `torchrec_dlrm`'s model on 16 random samples and clicks; the step's KJT."""
    body = body_for(rng, TORCHREC_INPUTS, TORCHREC_ROWS, 5, 16)
    kjt = torchrec_kjt(body)
    clicks = torch.from_numpy(rng.integers(0, 2, (16, 1)).astype(np.float32))
    loss = torch.nn.functional.binary_cross_entropy_with_logits(
        model(torch.tensor(body["dense"]), kjt), clicks)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return kjt


def tensors(module: Any, body: dict[str, Any]) -> list[Any]:
    """`body`'s tensors as a store's model takes them on Triton and over the Open Inference
    Protocol (`nearrec.triton`, `docs/serving.md`), as `module`'s `InferInput`s (tritonclient's
    grpc or http, or KServe's)."""
    from nearrec.triton import padded

    dense = np.asarray(body["dense"], np.float32)
    arrays = {"dense": dense} if dense.size else {}
    for f, x in body["features"].items():
        arrays[f] = padded(x["ids"], x["lengths"])
        arrays[f"{f}__lengths"] = np.asarray(x["lengths"], np.int64).reshape(-1, 1)
    out = []
    for name, a in arrays.items():
        t = module.InferInput(name, list(a.shape), "FP32" if a.dtype == np.float32 else "INT64")
        t.set_data_from_numpy(a)
        out.append(t)
    return out


#: A body's inputs for `torchrec_dlrm`'s model, and the rows of the table each reads.
TORCHREC_INPUTS, TORCHREC_ROWS = ["f0", "f_shared", "f1", "f2"], [100, 100, 150, 200]


def torchrec_dlrm(path: Any, steps: int = 20) -> tuple[Any, Any]:
    """TorchRec's DLRM (`test_torchrec.dlrm`: 5 dense features) trained `steps` steps of SGD on
    random clicks — its tables and its MLPs both moved off their initial values — and its copy
    over a nearrec store at `path`, which keeps the copy's captured model
    (`nearrec.models.save`)."""
    import pytest

    pytest.importorskip("torchrec")
    from test_torchrec import dlrm

    import nearrec.models
    from nearrec.torch import from_torchrec

    torch.manual_seed(6)
    theirs = dlrm()
    rng = np.random.default_rng(6)
    optimizer = torch.optim.SGD(theirs.parameters(), lr=0.1)
    for _ in range(steps):
        train_step(theirs, optimizer, rng)
    theirs = theirs.eval()
    ours = from_torchrec(theirs, path)
    nearrec.models.save(ours, path)
    return theirs, ours
