"""Requests for a served DLRM as `nearrec.ray.serve_model` takes them (JSON bodies), and the
model's answer to one computed here, straight from the model: the reference the serving tests
(`test_serve_model.py`, `test_ray.py`) hold the served answers to."""

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
