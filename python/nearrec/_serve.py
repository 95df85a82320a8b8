"""A whole model on Ray Serve over a sharded store (:func:`nearrec.ray.serve_model`): the
deployment, its requests over HTTP (JSON) and gRPC (``model_service.proto``), and their
batching.

A replica of the deployment holds the sharded store (the Rust router, connected once) and the
model: its dense part rebuilt here over that store (``nearrec.models.rebuild``; any model
``nearrec.models.kept`` gives), or with ``offload`` none, the model kept with the store then run
by ``Store.infer`` (on the shard that holds every table of the model, else by the router over
the vectors it pools). Requests are
checked one by one as they arrive, so a bad one is answered alone; checked requests wait up
to the batch timeout for others (``@serve.batch``), run as one batch — one lookup of every
table, one pass of the MLPs — and each gets its rows of the outputs back. A batch the store
refuses as a whole (an id past its table) is run again request by request, so that only the
request at fault fails.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import InvalidRequest, NearrecError
from .request import TableLookup
from .store import Store

#: The proto of the gRPC ingress, loaded at run time (``grpc.protos_and_services``: no
#: generated code is kept), and its import path for Ray Serve's ``grpc_servicer_functions``.
PROTO = "nearrec/model_service.proto"
SERVICER = "nearrec._serve.add_model_servicer"


def _grpc_modules() -> tuple[Any, Any]:
    import grpc

    return grpc.protos_and_services(PROTO)  # type: ignore[no-any-return]


def add_model_servicer(servicer: Any, server: Any) -> None:
    """Registers the ``nearrec.serve.v1.Model`` service on ``server`` (what Ray Serve's gRPC
    proxy calls, by its import path :data:`SERVICER`)."""
    _grpc_modules()[1].add_ModelServicer_to_server(servicer, server)


def messages() -> Any:
    """The gRPC ingress's message classes (``PredictRequest``, ``Feature``,
    ``PredictResponse``), for a Python client."""
    return _grpc_modules()[0]


@dataclass
class Request:
    """One request, checked: ``batch`` samples, their dense features and each table's ids."""

    batch: int
    dense: npt.NDArray[np.float32] | None
    ids: dict[str, npt.NDArray[np.int64]]
    lengths: dict[str, npt.NDArray[np.int64]]

    @classmethod
    def checked(cls, batch: int, dense: Any, features: Mapping[str, tuple[Any, Any]],
                tables: Sequence[str], dense_features: int) -> Request:
        """A request of ``batch`` samples against a model of inputs ``tables`` (its tables, or a
        captured model's features) and ``dense_features``, or an
        :class:`~nearrec.errors.InvalidRequest` naming what is wrong (``table``: the input)."""
        if not isinstance(batch, int) or batch < 1:
            raise InvalidRequest(f"batch is a count of samples ≥ 1, not {batch!r}")
        d: npt.NDArray[np.float32] | None = None
        if dense_features:
            try:
                d = np.ascontiguousarray(np.asarray(dense, dtype=np.float32))
            except (TypeError, ValueError) as e:
                raise InvalidRequest(f"dense is [batch, {dense_features}] floats: {e}") from None
            if d.shape != (batch, dense_features):
                raise InvalidRequest(f"dense is [batch, {dense_features}] = [{batch}, "
                                     f"{dense_features}], not {list(d.shape)}")
        elif dense is not None and np.asarray(dense).size:
            raise InvalidRequest("the model takes no dense features")
        missing = [t for t in tables if t not in features]
        unknown = [t for t in features if t not in tables]
        if missing or unknown:
            name = (missing or unknown)[0]
            raise InvalidRequest(f"table {name!r}: " + (
                "the model reads it and the request has none" if missing
                else f"the model has no such input (its inputs: {list(tables)})"), table=name)
        ids, lengths = {}, {}
        for t in tables:
            try:
                i = np.ascontiguousarray(np.asarray(features[t][0], dtype=np.int64).reshape(-1))
                n = np.ascontiguousarray(np.asarray(features[t][1], dtype=np.int64).reshape(-1))
            except (TypeError, ValueError, OverflowError) as e:
                raise InvalidRequest(f"table {t!r}: ids and lengths are integers: {e}",
                                     table=t) from None
            if n.shape != (batch,) or (n < 0).any() or int(n.sum()) != i.size:
                raise InvalidRequest(f"table {t!r}: lengths are {batch} counts ≥ 0 adding up to "
                                     f"its {i.size} ids", table=t)
            ids[t], lengths[t] = i, n
        return cls(batch, d, ids, lengths)

    @classmethod
    def from_json(cls, body: Any, tables: Sequence[str], dense_features: int) -> Request:
        """``{"dense": [[...]], "features": {"t0": {"ids": [...], "lengths": [...]}}}``."""
        if not isinstance(body, Mapping) or not isinstance(body.get("features"), Mapping):
            raise InvalidRequest('a request is {"dense": [[...]], "features": {INPUT: {"ids": '
                                 '[...], "lengths": [...]}}}')
        features = {}
        for t, f in body["features"].items():
            if not isinstance(f, Mapping) or "ids" not in f or "lengths" not in f:
                raise InvalidRequest(f"table {t!r}: a feature is {{\"ids\": [...], \"lengths\": "
                                     "[...]}")
            features[t] = (f["ids"], f["lengths"])
        first: Any = next(iter(features.values()), ((), ()))[1]
        batch = len(first) if isinstance(first, list | tuple) else 0
        return cls.checked(batch, body.get("dense"), features, tables, dense_features)

    @classmethod
    def from_proto(cls, m: Any, tables: Sequence[str], dense_features: int) -> Request:
        features = {}
        for f in m.features:
            if len(f.ids) % 8 or len(f.lengths) % 8:
                raise InvalidRequest(f"table {f.table!r}: ids and lengths are int64 bytes")
            features[f.table] = (np.frombuffer(f.ids, np.int64),
                                 np.frombuffer(f.lengths, np.int64))
        dense = None
        if m.dense:
            if len(m.dense) % 4:
                raise InvalidRequest("dense is float32 bytes")
            dense = np.frombuffer(m.dense, np.float32).reshape(m.batch, -1) if m.batch else None
        return cls.checked(int(m.batch), dense, features, tables, dense_features)


class Runner:
    """A replica's model over its store: :meth:`run` takes checked requests, runs them as one
    batch and returns each one's outputs (or the error that is its own)."""

    def __init__(self, store: Store, config: dict[str, Any], weights: dict[str, np.ndarray],
                 dense_features: int, offload: bool):
        self.store = store
        #: the model's inputs, which a request's features are keyed by: its tables, or a
        #: captured model's features
        self.inputs: list[str] = list(config.get("features") or config["tables"])
        self.dense_features = dense_features
        self.model: Any = None
        if not offload:
            from .models import rebuild

            self.model = rebuild(store, config, weights).eval()
        self.lock = threading.Lock()
        self.requests = 0
        self.batches = 0

    def _outputs(self, items: Sequence[Request]) -> npt.NDArray[np.float32]:
        dense = (np.concatenate([it.dense for it in items if it.dense is not None])
                 if self.dense_features else None)
        if self.model is None:
            # one lookup per input straight to the store: no KeyedJaggedTensor to build and
            # take apart again (a quarter of a 64-sample RMC1 request's time)
            lookups = [TableLookup(t, np.concatenate([it.ids[t] for it in items]),
                                   lengths=np.concatenate([it.lengths[t] for it in items]))
                       for t in self.inputs]
            return np.asarray(self.store.infer(dense, lookups), dtype=np.float32)
        import torch

        from .torch import KeyedJaggedTensor

        values = np.concatenate([it.ids[t] for t in self.inputs for it in items])
        lengths = np.concatenate([it.lengths[t] for t in self.inputs for it in items])
        features = KeyedJaggedTensor(self.inputs, torch.from_numpy(values),
                                     lengths=torch.from_numpy(lengths))
        with torch.no_grad():
            out = self.model(None if dense is None else torch.from_numpy(dense), features)
        return np.ascontiguousarray(out.detach().numpy(), dtype=np.float32).reshape(
            sum(it.batch for it in items), -1)

    def run(self, items: Sequence[Request]) -> list[npt.NDArray[np.float32] | NearrecError]:
        with self.lock:
            self.requests += len(items)
            self.batches += 1
        try:
            out = self._outputs(items)
        except NearrecError:
            if len(items) == 1:
                raise
            # one of them is at fault: each alone, so that the others are answered
            return [self._alone(it) for it in items]
        bounds = np.cumsum([0] + [it.batch for it in items])
        return [out[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def _alone(self, item: Request) -> npt.NDArray[np.float32] | NearrecError:
        try:
            return self._outputs([item])
        except NearrecError as e:
            return e


def deployment(connect: Callable[[], Store], config: dict[str, Any],
               weights: dict[str, np.ndarray], dense_features: int, offload: bool,
               max_batch_size: int, batch_wait_timeout_s: float, num_replicas: int,
               ray_actor_options: dict[str, Any]) -> Any:
    """The Ray Serve application: the deployment bound to its arguments."""
    from ray import serve
    from starlette.requests import Request as HttpRequest
    from starlette.responses import JSONResponse

    @serve.deployment(num_replicas=num_replicas, ray_actor_options=ray_actor_options)
    class NearrecModel:
        def __init__(self) -> None:
            # the gRPC proxy hands a request over pickled as a message of the proto's module,
            # which exists in a process once the proto is loaded there
            messages()
            self.runner = Runner(connect(), config, weights, dense_features, offload)
            batching: Any = self.predict  # serve.batch's queue, set as serve_model was told
            batching.set_max_batch_size(max_batch_size)
            batching.set_batch_wait_timeout_s(batch_wait_timeout_s)

        @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.002)
        async def predict(self, items: list[Request]) -> list[Any]:
            return self.runner.run(items)

        async def _answer(self, item: Request) -> npt.NDArray[np.float32]:
            out = await self.predict(item)
            if isinstance(out, NearrecError):
                raise out
            return out  # type: ignore[no-any-return]

        async def __call__(self, request: HttpRequest) -> JSONResponse:
            try:
                body = await request.json()
            except ValueError as e:
                return JSONResponse({"error": f"the body is not JSON: {e}",
                                     "kind": "InvalidRequest"}, status_code=400)
            try:
                item = Request.from_json(body, self.runner.inputs, self.runner.dense_features)
                out = await self._answer(item)
            except NearrecError as e:
                status = 400 if isinstance(e, InvalidRequest) or e.table else 500
                return JSONResponse({"error": str(e), "kind": type(e).__name__,
                                     "table": e.table}, status_code=status)
            return JSONResponse({"outputs": out.tolist()})

        async def Predict(self, message: Any) -> Any:  # noqa: N802 (the RPC's name)
            item = Request.from_proto(message, self.runner.inputs, self.runner.dense_features)
            out = await self._answer(item)
            return messages().PredictResponse(batch=out.shape[0], width=out.shape[1],
                                              outputs=out.tobytes())

        def counts(self) -> tuple[int, int]:
            """Requests and batches this replica ran."""
            return self.runner.requests, self.runner.batches

    return NearrecModel.bind()  # type: ignore[attr-defined]
