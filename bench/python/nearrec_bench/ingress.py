"""``nearrec bench cluster-ingress``: a whole model behind Ray Serve's ingress
(``nearrec.ray.serve_model``) against the same model called directly, side by side, in one run.

A DLRM (``rmc1`` with the spec's layer shapes, dense weights seeded) over a store cut
table-wise into two shards, launched on a local Ray instance (``nearrec.ray.ShardedStore``,
DRAM tier). The same requests — ``batch`` samples each, a Zipf trace's ids — go to:

- ``direct``: the model in this process over the sharded store (the Rust router straight to
  the nodes' gRPC): what a caller without Serve pays;
- ``direct.offload``: ``store.infer`` through the router, the whole model on the node of a
  one-shard cut that keeps it (only the outputs come back);
- ``serve.http`` / ``serve.grpc``: the model on Ray Serve (one replica), its dense part in the
  replica, over HTTP (JSON) and over gRPC (``nearrec.serve.v1.Model/Predict``);
- ``serve.grpc.offload``: Serve's gRPC ingress in front of the whole model on the node;
- ``serve.echo`` / ``serve.echo.batched``: a Serve deployment that answers "ok" over HTTP at
  once, and the same through ``@serve.batch`` with the model's batching settings: Ray Serve's
  own floor on this machine, apart from anything of nearrec's.

Each request is sent alone (nothing else in flight: the hop's latency, not a queue's), p50 /
p99 over ``requests`` of them per round, rounds repeated in a rotated order, medians with the
rounds' spread. Everything shares this machine's cores.
"""

from __future__ import annotations

import json
import statistics
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import nearrec
from nearrec import distributed
from nearrec import trace as nt

from .cache import generator
from .harness import Harness
from .report import Record
from .served import free_port


@dataclass
class IngressConfig:
    model: str = "rmc1"
    rows: int = 100_000
    trace: str = "zipf1.05"
    batch: int = 64
    requests: int = 400
    rounds: int = 3
    max_batch_size: int = 16
    batch_wait_timeout_s: float = 0.0005
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> IngressConfig:
        return cls(rows=20_000, requests=100, rounds=2)


def _requests(cfg: IngressConfig, model: Any, path: Path) -> list[dict[str, Any]]:
    tables = model.table_names
    spec = nearrec.model_spec(cfg.model)
    tr = nt.generate({t: cfg.rows for t in tables}, 32 * cfg.batch, spec.lookups,
                     generator(cfg.trace), seed=cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    out = []
    for b in range(0, 32 * cfg.batch, cfg.batch):
        features = {}
        for t in tables:
            lengths = np.full(cfg.batch, spec.lookups, np.int64)
            ids = np.asarray(tr.tables[t].indices[b * spec.lookups:(b + cfg.batch)
                                                  * spec.lookups], np.int64)
            features[t] = {"ids": ids.tolist(), "lengths": lengths.tolist()}
        dense = rng.standard_normal((cfg.batch, model.dense_features)).astype(np.float32)
        out.append({"dense": dense.tolist(), "features": features})
    return out


def kept_model(path: Path, family: str, rows: int, seed: int, log: Callable[[str], None]
               ) -> tuple[Path, Any]:
    """A store of ``family`` built at ``path`` (``rows`` a table) keeping that model with its
    dense weights seeded: the store's path and the model."""
    import nearrec.models

    path.parent.mkdir(parents=True, exist_ok=True)
    log(f"building {path} ({rows:,} rows a table)")
    nearrec.build(path, family, rows=rows, seed=seed, overwrite=True, progress=False)
    with nearrec.open(path) as store:
        model = nearrec.models.build(family, store, seed=seed + 1).eval()
        nearrec.models.save(model, path)
    return path, model


def run(cfg: IngressConfig, log: Callable[[str], None] = print) -> list[Record]:
    import grpc
    import ray
    import torch
    from ray import serve

    import nearrec.models
    from nearrec.ray import ShardedStore, model_messages, serve_model, shutdown_model
    from nearrec.torch import KeyedJaggedTensor

    tag = f"ingress-{cfg.model}-{cfg.rows}"
    path, model = kept_model(cfg.scratch / tag, cfg.model, cfg.rows, cfg.seed, log)
    cut2, cut1 = cfg.scratch / f"{tag}-cut2", cfg.scratch / f"{tag}-cut1"
    distributed.shard(path, cut2, 2, scheme="table", overwrite=True)
    distributed.shard(path, cut1, 1, scheme="table", overwrite=True)
    bodies = _requests(cfg, model, path)
    pb = model_messages()
    messages = [pb.PredictRequest(
        batch=cfg.batch, dense=np.asarray(b["dense"], np.float32).tobytes(),
        features=[pb.Feature(table=t, ids=np.asarray(f["ids"], np.int64).tobytes(),
                             lengths=np.asarray(f["lengths"], np.int64).tobytes())
                  for t, f in b["features"].items()]) for b in bodies]
    tables = model.table_names

    def kjt(b: dict[str, Any]) -> Any:
        values = np.concatenate([np.asarray(b["features"][t]["ids"], np.int64) for t in tables])
        lengths = np.concatenate([np.asarray(b["features"][t]["lengths"], np.int64)
                                  for t in tables])
        return KeyedJaggedTensor(tables, torch.from_numpy(values),
                                 lengths=torch.from_numpy(lengths))

    http, grpc_port = free_port(), free_port()
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    try:
        ShardedStore.launch(cut2, name="ingress2", tier="dram", num_cpus=1)
        ShardedStore.launch(cut1, name="ingress1", tier="dram", num_cpus=1)
        serve_model("ingress2", model, name="dense", route_prefix="/dense", http_port=http,
                    grpc_port=grpc_port, num_cpus=1, max_batch_size=cfg.max_batch_size,
                    batch_wait_timeout_s=cfg.batch_wait_timeout_s)
        _echo_apps(cfg)
        serve_model("ingress1", model, name="whole", route_prefix="/whole", offload=True,
                    http_port=http, grpc_port=grpc_port, num_cpus=1,
                    max_batch_size=cfg.max_batch_size,
                    batch_wait_timeout_s=cfg.batch_wait_timeout_s)
        store2 = ShardedStore.connect("ingress2")
        store1 = ShardedStore.connect("ingress1")
        local = nearrec.models.rebuild(store2, model.kept_config(),
                                       dict(model.dense_weights())).eval()
        channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
        predict = channel.unary_unary("/nearrec.serve.v1.Model/Predict",
                                      request_serializer=pb.PredictRequest.SerializeToString,
                                      response_deserializer=pb.PredictResponse.FromString)
        encoded = [json.dumps(b).encode() for b in bodies]

        def direct(k: int) -> None:
            b = bodies[k]
            with torch.no_grad():
                local(torch.tensor(b["dense"], dtype=torch.float32), kjt(b))

        def offload(k: int) -> None:
            b = bodies[k]
            store1.infer(np.asarray(b["dense"], np.float32), kjt(b))

        def http_call(route: str) -> Callable[[int], None]:
            def call(k: int) -> None:
                req = urllib.request.Request(f"http://127.0.0.1:{http}/{route}", encoded[k],
                                             {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=60) as r:
                    r.read()
            return call

        def grpc_call(app: str) -> Callable[[int], None]:
            def call(k: int) -> None:
                predict(messages[k], metadata=(("application", app),), timeout=60)
            return call

        systems: dict[str, Callable[[int], None]] = {
            "direct": direct, "direct.offload": offload, "serve.http": http_call("dense"),
            "serve.grpc": grpc_call("dense"), "serve.grpc.offload": grpc_call("whole"),
            "serve.echo": http_call("echo"), "serve.echo.batched": http_call("echo-batched")}
        results: dict[str, list[list[float]]] = {s: [] for s in systems}
        for round_ in range(cfg.rounds):
            names = list(systems)
            names = names[round_ % len(names):] + names[:round_ % len(names)]
            for name in names:
                call = systems[name]
                for k in range(20):
                    call(k % len(bodies))
                lat = []
                for k in range(cfg.requests):
                    t = time.perf_counter()
                    call(k % len(bodies))
                    lat.append(time.perf_counter() - t)
                results[name].append(lat)
            log(f"  round {round_ + 1}: " + "  ".join(
                f"{s}: p50 {1e6 * statistics.median(v[-1]):,.0f} µs" for s, v in results.items()))
        channel.close()
        store1.close()
        store2.close()
    finally:
        for app in ("dense", "whole", "echo", "echo-batched"):
            try:
                shutdown_model(app)
            except Exception:  # noqa: BLE001 (already gone)
                pass
        serve.shutdown()  # type: ignore[no-untyped-call]
        ShardedStore.shutdown("ingress2")
        ShardedStore.shutdown("ingress1")
        ray.shutdown()
    records = []
    spec = nearrec.model_spec(cfg.model)
    for name, rounds in results.items():
        p50s = [statistics.median(r) for r in rounds]
        p99s = [float(np.percentile(r, 99)) for r in rounds]
        rate = cfg.batch / statistics.median([statistics.mean(r) for r in rounds])
        records.append(Record(
            "cluster-ingress", cfg.model, cfg.batch, cfg.trace, name, samples_per_s=rate,
            lookups_per_s=rate * spec.lookups * len(tables),
            p50_us=1e6 * statistics.median(p50s), p99_us=1e6 * statistics.median(p99s),
            extra={"rounds_p50_us": [1e6 * x for x in p50s],
                   "rounds_p99_us": [1e6 * x for x in p99s], "requests": cfg.requests,
                   "rows": cfg.rows, "tables": len(tables),
                   "max_batch_size": cfg.max_batch_size,
                   "batch_wait_timeout_s": cfg.batch_wait_timeout_s}))
    return records


def _echo_apps(cfg: IngressConfig) -> None:
    """Two Serve applications that answer "ok" at once over HTTP, one through
    ``@serve.batch`` (at ``/echo`` and ``/echo-batched``)."""
    from ray import serve

    @serve.deployment(ray_actor_options={"num_cpus": 1})
    class Echo:
        async def __call__(self, request: Any) -> str:
            return "ok"

    @serve.deployment(ray_actor_options={"num_cpus": 1})
    class EchoBatched:
        @serve.batch(max_batch_size=cfg.max_batch_size,
                     batch_wait_timeout_s=cfg.batch_wait_timeout_s)
        async def answer(self, items: list[int]) -> list[str]:
            return ["ok"] * len(items)

        async def __call__(self, request: Any) -> str:
            return await self.answer(1)

    serve.run(Echo.bind(), name="echo", route_prefix="/echo")  # type: ignore[attr-defined]
    serve.run(EchoBatched.bind(), name="echo-batched",  # type: ignore[attr-defined]
              route_prefix="/echo-batched")


def markdown(records: list[Record], command: str) -> str:
    cells = {r.system: r for r in records}
    e = records[0].extra
    lines = [f"Command: `{command}`", "",
             f"`{records[0].model}` ({e['tables']} tables of {e['rows']:,} rows, DRAM tier) cut "
             f"table-wise over 2 shards on a local Ray instance; requests of "
             f"{records[0].batch} samples of `{records[0].dist}`, each sent alone, "
             f"{e['requests']} per system and round; Serve batches up to "
             f"{e['max_batch_size']} requests, waiting {e['batch_wait_timeout_s'] * 1e3:g} ms. "
             "Medians of rounds; spread = half the rounds' range over their median.", "",
             "| system | p50 µs (rounds) | p99 µs | p50 ÷ direct (same model) | p50 − direct µs |",
             "|---|---:|---:|---:|---:|"]
    for r in records:
        base = cells["direct.offload"] if r.system.endswith("offload") else cells["direct"]
        if r.system.startswith("serve.echo"):
            lines.append(f"| {r.system} | {r.p50_us:,.0f} ("
                         + ", ".join(f"{v:,.0f}" for v in r.extra["rounds_p50_us"])
                         + f") | {r.p99_us:,.0f} | — | — |")
            continue
        p50s = ", ".join(f"{v:,.0f}" for v in r.extra["rounds_p50_us"])
        lines.append(f"| {r.system} | {r.p50_us:,.0f} ({p50s}) | {r.p99_us:,.0f} | "
                     f"{r.p50_us / base.p50_us:.2f} | {r.p50_us - base.p50_us:+,.0f} |")
    return "\n".join(lines) + "\n"


#: ``nearrec bench cluster-ingress``
HARNESSES = {"cluster-ingress": Harness(IngressConfig, IngressConfig.quick,
                                        {"--rows": "rows", "--scratch": "scratch"}, run,
                                        markdown)}
