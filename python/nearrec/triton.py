"""A store on Triton Inference Server: :func:`export` writes a model repository whose Python
backend model serves the store's kept model (a TorchRec DLRM after ``from_torchrec``, one of
nearrec's models, a captured model of your own) — or, for a store that keeps none, its pooled
lookups — from the store opened in the Triton instance, or through a node or a sharded store.

Tensors, each with the batch first (``max_batch_size`` > 0, so Triton's dynamic batcher groups
requests; a group runs as one store call, each request answered with its own rows):

- ``dense``: FP32 ``[B, dense_width]`` (only for a model with dense features);
- per model input (a captured model's features, else its tables; for lookups, every table)
  ``INPUT``: INT64 ``[B, L]``, each sample's ids in its row, padded past its length (ragged:
  ``L`` may differ between requests), and ``INPUT__lengths``: INT64 ``[B, 1]``;
- out: ``predictions`` FP32 ``[B, outputs]``, or for lookups ``pooled`` FP32 ``[B, Σ dim]``.

A bad request is answered with a Triton error naming the input and the sample (a length past
its row, an id past its table), while the requests batched with it are answered. Triton's
Python backend runs ``1/model.py`` in a stub process whose Python knows only what ``sys.path``
says: ``model.py`` puts this environment's site-packages on it (after ``python_path``: the
stub needs numpy < 2, which a directory of its own can give, ahead of this environment's), then
loads :class:`TritonPythonModel` from here.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import site
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ._serve import Request, Runner
from .errors import InvalidRequest, NearrecError
from .request import TableLookup, count, path_arg
from .store import Store

#: The kinds of model :func:`export` writes.
KINDS = ("model", "lookups")


def _open(location: dict[str, str]) -> Store:
    import nearrec

    if location.get("remote"):
        return nearrec.connect(location["remote"], location.get("store", ""))
    if location.get("sharded"):
        from .distributed import open_dir

        return open_dir(location["sharded"])
    return nearrec.open(location["path"])


def export(store: str | os.PathLike[str], repo: str | os.PathLike[str], *,
           name: str = "nearrec", remote: str | None = None, sharded: bool = False,
           max_batch_size: int = 64, queue_delay_us: int = 500, instances: int = 1,
           python_path: Sequence[str | os.PathLike[str]] = ()) -> Path:
    """Writes the model ``name`` into the Triton model repository ``repo``
    (``repo/name/config.pbtxt``, ``repo/name/1/model.py``) serving the store at ``store`` —
    or with ``remote`` (``host:port``), the store named ``store`` on that node; with
    ``sharded``, the sharded store in the directory ``store`` through the nodes its
    ``replicas.toml`` names (:func:`nearrec.distributed.open_dir`). Returns the model's
    directory. ``python_path``: directories put first on the Python backend's path
    (numpy < 2 for the stub)."""
    if remote and sharded:
        raise InvalidRequest("a store is served through a node (remote) or sharded, not both")
    local = str(Path(path_arg(store, "the store")).resolve()) if not remote else ""
    location = ({"remote": remote, "store": os.fspath(store)} if remote else
                {"sharded": local} if sharded else {"path": local})
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise InvalidRequest(f"a Triton model's name is letters, digits, '_', '.' and '-', "
                             f"not {name!r}")
    max_batch_size = count(max_batch_size, "max_batch_size")
    queue_delay_us = count(queue_delay_us, "queue_delay_us", 0)
    instances = count(instances, "instances")
    opened = _open(location)
    try:
        tensors, kind, inputs, dense = _shapes(opened)
    finally:
        opened.close()
    where = Path(path_arg(repo, "the model repository")) / name
    (where / "1").mkdir(parents=True, exist_ok=True)
    parameters = {"location": json.dumps(location), "kind": kind, "inputs": json.dumps(inputs),
                  "dense": str(dense)}
    config = [f"name: {json.dumps(name)}", 'backend: "python"',
              f"max_batch_size: {int(max_batch_size)}",
              f"dynamic_batching {{ max_queue_delay_microseconds: {int(queue_delay_us)} }}",
              "input [", ",\n".join(tensors[0]), "]", "output [", ",\n".join(tensors[1]), "]",
              f"instance_group [ {{ kind: KIND_CPU count: {int(instances)} }} ]",
              "parameters [", ",\n".join(
                  f'  {{ key: "nearrec_{k}" value: {{ string_value: {json.dumps(v)} }} }}'
                  for k, v in parameters.items()), "]"]
    (where / "config.pbtxt").write_text("\n".join(config) + "\n")
    paths = [str(Path(p).resolve()) for p in python_path] + _site_paths()
    (where / "1" / "model.py").write_text(
        '"""nearrec on Triton (written by nearrec.triton.export)."""\n'
        "import sys\n\n"
        f"sys.path[:0] = {paths!r}\n\n"
        "from nearrec.triton import TritonPythonModel  # noqa: E402,F401\n")
    return where


def _site_paths() -> list[str]:
    """Where this environment's packages are, nearrec's own first (a source checkout's
    ``python/`` when it runs from one)."""
    here = str(Path(__file__).resolve().parent.parent)
    return [here] + [p for p in site.getsitepackages() if p != here]


def _shapes(store: Store) -> tuple[tuple[list[str], list[str]], str, list[str], int]:
    """The config's inputs and outputs, the kind, the inputs' names and the dense width."""
    from ._native import NativeModel

    def tensor(name: str, dtype: str, dims: str, ragged: bool = False) -> str:
        tail = " allow_ragged_batch: true" if ragged else ""
        return f"  {{ name: {json.dumps(name)} data_type: {dtype} dims: [ {dims} ]{tail} }}"

    if store.has_model:
        raw, arrays = store._native.saved_model()
        config = json.loads(raw)
        tables = list(config["tables"])
        native = NativeModel.from_config(raw, arrays, [store.table(t).dim for t in tables])
        inputs, dense, outputs = list(native.inputs), int(native.dense_width), native.outputs
        kind, out = "model", tensor("predictions", "TYPE_FP32", str(outputs))
    else:
        inputs, dense = list(store.tables), 0
        width = sum(store.table(t).dim for t in inputs)
        kind, out = "lookups", tensor("pooled", "TYPE_FP32", str(width))
    ins = [tensor("dense", "TYPE_FP32", str(dense))] if dense else []
    for f in inputs:
        ins += [tensor(f, "TYPE_INT64", "-1", ragged=True),
                tensor(f"{f}__lengths", "TYPE_INT64", "1")]
    return (ins, [out]), kind, inputs, dense


def padded(ids: Any, lengths: Any) -> np.ndarray:
    """Flat ids and each sample's count of them as the exported model takes an input:
    ``[samples, longest]`` int64, each sample's ids in its row, zeros past its length."""
    n = np.asarray(lengths, np.int64).reshape(-1)
    flat = np.asarray(ids, np.int64).reshape(-1)
    if (n < 0).any() or int(n.sum()) != flat.size:
        raise InvalidRequest(f"lengths are counts ≥ 0 adding up to the {flat.size} ids")
    out = np.zeros((n.size, int(n.max(initial=0))), np.int64)
    out[np.arange(out.shape[1]) < n[:, None]] = flat
    return out


#: One store per location per process: the instances of a model in one stub share it.
_STORES: dict[str, tuple[Store, int]] = {}


class TritonPythonModel:
    """The Python backend's model (``model.py`` imports it): see the module docs."""

    def initialize(self, args: dict[str, Any]) -> None:
        self.pb: Any = importlib.import_module("triton_python_backend_utils")
        config = json.loads(args["model_config"])
        params = {k.removeprefix("nearrec_"): v["string_value"]
                  for k, v in config.get("parameters", {}).items()}
        self.where = params["location"]
        store, users = _STORES.get(self.where, (None, 0))
        if store is None:
            store = _open(json.loads(self.where))
        _STORES[self.where] = (store, users + 1)
        self.store: Store = store
        self.kind = params["kind"]
        self.inputs: list[str] = json.loads(params["inputs"])
        self.dense = int(params["dense"])
        self.runner = (Runner(store, {"tables": self.inputs}, {}, self.dense, offload=True)
                       if self.kind == "model" else None)

    def finalize(self) -> None:
        store, users = _STORES.pop(self.where, (None, 0))
        if store is not None and users > 1:
            _STORES[self.where] = (store, users - 1)
        elif store is not None:
            store.close()

    def _request(self, r: Any) -> Request:
        """A Triton request as a checked :class:`Request`, or an error naming its input."""
        def tensor(name: str) -> np.ndarray:
            t = self.pb.get_input_tensor_by_name(r, name)
            if t is None:
                raise InvalidRequest(f"input {name!r} is missing", table=name)
            return np.asarray(t.as_numpy())

        dense = tensor("dense") if self.dense else None
        features = {}
        for f in self.inputs:
            ids, lengths = tensor(f), tensor(f"{f}__lengths").reshape(-1)
            if ids.ndim != 2 or ids.shape[0] != lengths.shape[0]:
                raise InvalidRequest(f"input {f!r}: ids are [batch, longest] padded, not "
                                     f"{list(ids.shape)}", table=f)
            bad = np.flatnonzero((lengths < 0) | (lengths > ids.shape[1]))
            if bad.size:
                raise InvalidRequest(f"input {f}__lengths: sample {int(bad[0])} has length "
                                     f"{int(lengths[bad[0]])}, not 0 to the {ids.shape[1]} ids "
                                     "of its row", table=f, position=int(bad[0]))
            if (lengths == ids.shape[1]).all():  # every sample fills its row: as it is
                features[f] = (ids.reshape(-1), lengths)
            else:
                features[f] = (ids[np.arange(ids.shape[1]) < lengths[:, None]], lengths)
        batch = len(next(iter(features.values()))[1]) if features else 0
        return Request.checked(batch, dense, features, self.inputs, self.dense)

    def _pooled(self, items: Sequence[Request]) -> list[np.ndarray | NearrecError]:
        out: list[np.ndarray | NearrecError] = []
        for it in items:
            try:
                out.append(self.store.lookup_many(
                    [TableLookup(t, it.ids[t], lengths=it.lengths[t]) for t in self.inputs]
                ).values)
            except NearrecError as e:
                out.append(e)
        return out

    def execute(self, requests: list[Any]) -> list[Any]:
        pb = self.pb
        items: list[Request | NearrecError] = []
        for r in requests:
            try:
                items.append(self._request(r))
            except NearrecError as e:
                items.append(e)
        good = [it for it in items if isinstance(it, Request)]
        if not good:
            answers: list[Any] = []
        elif self.runner is not None:
            try:
                answers = self.runner.run(good)
            except NearrecError as e:
                answers = [e]
        else:
            answers = self._pooled(good)
        answered = iter(answers)
        name = "predictions" if self.kind == "model" else "pooled"
        responses = []
        for it in items:
            out = next(answered) if isinstance(it, Request) else it
            if isinstance(out, NearrecError):
                responses.append(pb.InferenceResponse(error=pb.TritonError(str(out))))
            else:
                arr = np.ascontiguousarray(out, dtype=np.float32)
                responses.append(pb.InferenceResponse([pb.Tensor(name, arr)]))
        return responses


__all__ = ["KINDS", "TritonPythonModel", "export", "padded"]
