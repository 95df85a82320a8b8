"""``nearrec bench triton``: one model served the ways a user of NVIDIA's and KServe's stacks
would serve it, side by side in one run, against the model run in the caller.

A DLRM (``rmc1`` with the spec's layer shapes, dense weights seeded) kept with its store (DRAM
tier). The same requests — ``batch`` samples of the spec's lookups a table, a Zipf trace's ids
— go to:

- ``in-process``: ``store.infer`` on the store opened in this process (the whole model next to
  its rows, no hop): the floor;
- ``native``: ``store.infer`` through ``nearrec.connect`` — the node's own protocol
  (``nearrec.v1.Node/Infer``), nearrec's Rust client;
- ``oip``: the node's Open Inference Protocol (``inference.GRPCInferenceService/ModelInfer``)
  through ``tritonclient.grpc``, no nearrec code on the client side;
- ``oip.raw``: the same messages built once by ``tritonclient`` and sent as bytes by a bare
  ``grpcio`` stub: the protocol's cost without the client's per-request work;
- ``triton``: Triton Inference Server's Python backend serving the store opened in the Triton
  instance (``nearrec triton export``), through ``tritonclient.grpc``;
- ``triton.node``: the same through the node (``--remote``);
- ``triton.echo``: a Python-backend model of the same tensors answering zeros at once:
  Triton's own hop on this machine, apart from anything of nearrec's.

Load is open-loop: ``clients`` threads, each its own connection and its own Poisson schedule,
together offering ``load`` × the slowest system's one-at-a-time rate at that batch size (the
same rate for every system), each latency counted from its request's intended send time.
Rounds repeat in a rotated order; medians of rounds, with their spread. Everything — the
clients, the node, Triton — shares this machine's cores.
"""

from __future__ import annotations

import random
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import nearrec
from nearrec import trace as nt

from .cache import generator
from .harness import Harness
from .ingress import kept_model
from .report import Record
from .served import TRITON, node, scrape, stage_seconds, tritonserver

#: The systems, in the order the tables show them.
SYSTEMS = ("in-process", "native", "oip", "oip.raw", "triton", "triton.node", "triton.echo")

ECHO = '''"""Triton's own hop: the tensors of the exported model taken, zeros answered at once."""
import sys

sys.path[:0] = {paths!r}

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb  # noqa: E402


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            n = pb.get_input_tensor_by_name(r, "dense").as_numpy().shape[0]
            out.append(pb.InferenceResponse([pb.Tensor("predictions",
                                                       np.zeros((n, {width}), np.float32))]))
        return out
'''


@dataclass
class TritonConfig:
    model: str = "rmc1"
    rows: int = 50_000
    trace: str = "zipf1.05"
    batches: tuple[int, ...] = (1, 16, 64)
    requests: int = 300
    rounds: int = 3
    #: the offered rate, as a share of the slowest system's one-at-a-time rate
    load: float = 0.5
    clients: int = 8
    queue_delay_us: int = 200
    #: native and OIP requests sent alternately, one at a time, for what the node saw of each
    pairs: int = 200
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> TritonConfig:
        return cls(rows=10_000, requests=60, rounds=2, batches=(1, 64), pairs=40)


@dataclass
class Body:
    """One request: its dense features and each table's ids, ``lookups`` a sample."""

    dense: np.ndarray
    ids: dict[str, np.ndarray]
    lookups: int

    def lookups_of(self) -> list[nearrec.TableLookup]:
        n = self.dense.shape[0]
        return [nearrec.TableLookup(t, ids, lengths=np.full(n, self.lookups, np.int64))
                for t, ids in self.ids.items()]

    def tensors(self, grpcclient: Any) -> list[Any]:
        """As the exported model and the node's OIP take them: ids ``[B, lookups]`` (every
        sample fills its row) and their lengths, dense ``[B, D]``."""
        n = self.dense.shape[0]
        arrays = {"dense": self.dense}
        for t, ids in self.ids.items():
            arrays[t] = ids.reshape(n, self.lookups)
            arrays[f"{t}__lengths"] = np.full((n, 1), self.lookups, np.int64)
        out = []
        for name, a in arrays.items():
            x = grpcclient.InferInput(name, list(a.shape),
                                      "FP32" if a.dtype == np.float32 else "INT64")
            x.set_data_from_numpy(a)
            out.append(x)
        return out


def _bodies(cfg: TritonConfig, tables: list[str], dense: int, batch: int) -> list[Body]:
    spec = nearrec.model_spec(cfg.model)
    count = 16
    tr = nt.generate({t: cfg.rows for t in tables}, count * batch, spec.lookups,
                     generator(cfg.trace), seed=cfg.seed + batch)
    rng = np.random.default_rng(cfg.seed + batch)
    out = []
    for b in range(count):
        lo, hi = b * batch * spec.lookups, (b + 1) * batch * spec.lookups
        ids = {t: np.asarray(tr.tables[t].indices[lo:hi], np.int64) for t in tables}
        out.append(Body(rng.standard_normal((batch, dense)).astype(np.float32), ids,
                        spec.lookups))
    return out


def open_loop(calls: list[Callable[[int], None]], rate: float, n: int, seed: int
              ) -> tuple[list[float], float]:
    """``n`` requests at ``rate`` a second in all, over one thread per entry of ``calls`` (each
    its own connection and Poisson schedule, ``call(k)`` sending request ``k``): each latency
    from the request's intended send time, and the requests answered per second."""
    latencies: list[float] = []
    lock = threading.Lock()
    share = rate / len(calls)
    start = time.perf_counter() + 0.05

    def loop(i: int, call: Callable[[int], None]) -> None:
        rnd, due, mine = random.Random(seed * 1000 + i), start, []
        for k in range(i, n, len(calls)):
            due += rnd.expovariate(share)
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            call(k)
            mine.append(time.perf_counter() - due)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=loop, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, n / (time.perf_counter() - start)


def _export(cfg: TritonConfig, path: Path, repo: Path, node_address: str, width: int) -> None:
    from nearrec.triton import _site_paths, export

    numpy1 = [TRITON / "numpy1"]
    export(path, repo, name="embedded", python_path=numpy1, queue_delay_us=cfg.queue_delay_us)
    export("s", repo, name="remote", remote=node_address, python_path=numpy1,
           queue_delay_us=cfg.queue_delay_us)
    echo = repo / "echo"
    (echo / "1").mkdir(parents=True, exist_ok=True)
    config = (repo / "embedded" / "config.pbtxt").read_text()
    config = config.replace('name: "embedded"', 'name: "echo"')
    (echo / "config.pbtxt").write_text(config.split("parameters [")[0])
    paths = [str(p) for p in numpy1] + _site_paths()
    (echo / "1" / "model.py").write_text(ECHO.format(paths=paths, width=width))


def run(cfg: TritonConfig, log: Callable[[str], None] = print) -> list[Record]:
    import tritonclient.grpc as grpcclient

    tag = f"triton-{cfg.model}-{cfg.rows}"
    path, model = kept_model(cfg.scratch / tag, cfg.model, cfg.rows, cfg.seed, log)
    tables, dense = list(model.table_names), int(model.dense_features)
    work = cfg.scratch / f"{tag}-triton"
    repo = work / "repo"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    results: dict[tuple[int, str], list[tuple[list[float], float]]] = {}
    alone: dict[tuple[int, str], float] = {}
    offered: dict[int, float] = {}
    #: per batch and call, what the node saw of one call: seconds from handler to answer,
    #: seconds sending it, bytes received
    node_side: dict[tuple[int, str], list[float]] = {}
    with node(path, "s", "--tier", "dram") as served:
        _export(cfg, path, repo, served.address, width=1)
        with tritonserver(repo, work) as triton, nearrec.open(path, tier="dram") as local:
            remote = nearrec.connect(served.address, "s")
            clients = [_Clients(grpcclient, served.address, triton.grpc)
                       for _ in range(cfg.clients)]
            for batch in cfg.batches:
                systems = _Systems(grpcclient, local, remote, clients,
                                   _bodies(cfg, tables, dense, batch))
                # each system one request at a time: its rate alone, and its answers checked
                for name in SYSTEMS:
                    alone[(batch, name)] = systems.alone(name)
                rate = cfg.load * min(alone[(batch, s)] for s in SYSTEMS)
                offered[batch] = rate
                log(f"batch {batch}: one at a time "
                    + ", ".join(f"{s} {alone[(batch, s)]:,.0f}/s" for s in SYSTEMS)
                    + f"; offering {rate:,.1f} requests/s")
                node_side.update({(batch, call): v for call, v in
                                  systems.node_side(served.metrics, cfg.pairs).items()})
                for round_ in range(cfg.rounds):
                    order = list(SYSTEMS)
                    order = order[round_ % len(order):] + order[:round_ % len(order)]
                    for name in order:
                        calls = [systems.call(name, i) for i in range(len(clients))]
                        lat, answered = open_loop(calls, rate, cfg.requests, cfg.seed + round_)
                        results.setdefault((batch, name), []).append((lat, answered))
                    log(f"  round {round_ + 1}: " + "  ".join(
                        f"{s} p50 {1e6 * statistics.median(results[(batch, s)][-1][0]):,.0f} µs"
                        for s in SYSTEMS))
            for c in clients:
                c.close()
            remote.close()
    spec = nearrec.model_spec(cfg.model)
    records = []
    for (batch, name), rounds in results.items():
        p50s = [float(statistics.median(lat)) for lat, _ in rounds]
        p99s = [float(np.percentile(lat, 99)) for lat, _ in rounds]
        rps = statistics.median([a for _, a in rounds])
        records.append(Record(
            "triton", cfg.model, batch, cfg.trace, name, samples_per_s=rps * batch,
            lookups_per_s=rps * batch * spec.lookups * len(tables),
            p50_us=1e6 * statistics.median(p50s), p99_us=1e6 * statistics.median(p99s),
            extra={"rounds_p50_us": [1e6 * x for x in p50s],
                   "rounds_p99_us": [1e6 * x for x in p99s],
                   "requests_per_s": rps, "offered_per_s": offered[batch],
                   "alone_per_s": alone[(batch, name)], "requests": cfg.requests,
                   "clients": cfg.clients, "rows": cfg.rows, "tables": len(tables),
                   "queue_delay_us": cfg.queue_delay_us, "load": cfg.load,
                   "pairs": cfg.pairs}))
        call = {"native": "Infer", "oip": "ModelInfer", "oip.raw": "ModelInfer"}.get(name)
        if call is not None:
            total, send, received = node_side[(batch, call)]
            records[-1].extra.update(node_total_us=1e6 * total, node_send_us=1e6 * send,
                                     request_bytes=received)
    return records


def _node_side(metrics: str) -> dict[str, list[float]]:
    """Per call (``Infer``, ``ModelInfer``) the node's sums so far: seconds from handler to
    answer, seconds sending answers, calls, bytes received."""
    stages = stage_seconds(metrics)
    received = {s.labels["call"]: s.value for f in scrape(metrics)
                if f.name == "nearrec_received_bytes" for s in f.samples
                if s.name.endswith("_total")}
    return {call: [stages.get((call, "total"), (0.0, 0.0))[0],
                   stages.get((call, "send"), (0.0, 0.0))[0],
                   stages.get((call, "total"), (0.0, 0.0))[1], received.get(call, 0.0)]
            for call in ("Infer", "ModelInfer")}


class _Systems:
    """One batch size's requests as each system takes them, and the calls that send them."""

    def __init__(self, grpcclient: Any, local: Any, remote: Any, clients: list[_Clients],
                 bodies: list[Body]):
        self.local, self.remote, self.clients, self.bodies = local, remote, clients, bodies
        self.lookups = [b.lookups_of() for b in bodies]
        self.tensors = [[b.tensors(grpcclient) for b in bodies] for _ in clients]
        from tritonclient.grpc._utils import _get_inference_request

        self.raw = [_get_inference_request("s", t, "", "", None, 0, False, False, 0, None,
                                           None).SerializeToString() for t in self.tensors[0]]

    def call(self, name: str, i: int) -> Callable[[int], None]:
        """Client ``i``'s call of system ``name``: ``call(k)`` sends request ``k``."""
        n, bodies, lookups = len(self.bodies), self.bodies, self.lookups
        if name in ("in-process", "native"):
            store = self.local if name == "in-process" else self.remote
            return lambda k: store.infer(bodies[k % n].dense, lookups[k % n])
        if name == "oip.raw":
            raw, send = self.raw, self.clients[i].raw
            return lambda k: send(raw[k % n], timeout=60)
        server, model = self._target(name, i)
        mine = self.tensors[i]
        return lambda k: server.infer(model, mine[k % n])

    def _target(self, name: str, i: int) -> tuple[Any, str]:
        """Which of client ``i``'s connections system ``name`` is asked through, and the model
        it asks."""
        c = self.clients[i]
        return {"oip": (c.node, "s"), "triton": (c.triton, "embedded"),
                "triton.node": (c.triton, "remote"), "triton.echo": (c.triton, "echo")}[name]

    def node_side(self, metrics: str, pairs: int) -> dict[str, list[float]]:
        """What the node saw of one native ``Infer`` and one OIP ``ModelInfer`` (sent raw),
        ``pairs`` of each sent alternately one at a time, so that the machine's drift falls on
        both: per call its mean seconds from handler to answer and sending the answer, and its
        request bytes."""
        calls = {"Infer": self.call("native", 0), "ModelInfer": self.call("oip.raw", 0)}
        before = _node_side(metrics)
        for k in range(pairs):
            for call in calls.values():
                call(k)
        after = _node_side(metrics)
        out = {}
        for name in calls:
            total, send, count, received = (a - b for a, b in
                                            zip(after[name], before[name], strict=True))
            out[name] = [total / count, send / count, received / count]
        return out

    def alone(self, name: str) -> float:
        """System ``name``'s requests a second one at a time, after its first answer is held
        to the model in-process (the echo's excepted)."""
        call = self.call(name, 0)
        if name in ("oip", "triton", "triton.node"):
            server, model = self._target(name, 0)
            got = server.infer(model, self.tensors[0][0]).as_numpy("predictions")
            want = self.local.infer(self.bodies[0].dense, self.lookups[0])
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        for k in range(5):
            call(k)
        start = time.perf_counter()
        for k in range(20):
            call(k)
        return 20 / (time.perf_counter() - start)


class _Clients:
    """One load thread's connections: a tritonclient to the node's OIP and one to Triton."""

    def __init__(self, grpcclient: Any, node_address: str, triton: str):
        import grpc

        self.node = grpcclient.InferenceServerClient(node_address)
        self.triton = grpcclient.InferenceServerClient(triton)
        big = [("grpc.max_send_message_length", 1 << 30),
               ("grpc.max_receive_message_length", 1 << 30)]
        self.channel = grpc.insecure_channel(node_address, options=big)
        # serialized messages in, the answer's bytes out: no per-request work in Python
        self.raw = self.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

    def close(self) -> None:
        self.node.close()
        self.triton.close()
        self.channel.close()


def markdown(records: list[Record], command: str) -> str:
    from .report import rounds_spread

    cells = {(r.batch, r.system): r for r in records}
    e = records[0].extra
    lines = [f"Command: `{command}`", "",
             f"`{records[0].model}` ({e['tables']} tables of {e['rows']:,} rows, DRAM tier, the "
             f"model kept with the store); requests of `{records[0].dist}`, open-loop: "
             f"{e['clients']} clients on Poisson schedules offering {e['load']:g} × the "
             f"slowest system's one-at-a-time rate (the same rate for every system), "
             f"{e['requests']} requests per system, batch and round; latency from each "
             f"request's intended send time. Triton's dynamic batcher waits "
             f"{e['queue_delay_us']} µs. Medians of rounds; spread = half the rounds' range "
             "over their median. Clients, node and Triton share the machine's cores.", ""]
    for batch in sorted({r.batch for r in records}):
        inproc, native = cells[(batch, "in-process")], cells[(batch, "native")]
        offered = native.extra["offered_per_s"]
        lines += [f"### Batch {batch} (offered {offered:,.1f} requests/s)", "",
                  "| system | p50 µs (rounds) | spread | p99 µs | requests/s | alone /s | "
                  "p50 ÷ in-process | p50 ÷ native |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name in SYSTEMS:
            r = cells.get((batch, name))
            if r is None:
                continue
            rounds = ", ".join(f"{v:,.0f}" for v in r.extra["rounds_p50_us"])
            lines.append(
                f"| {name} | {r.p50_us:,.0f} ({rounds}) | "
                f"{rounds_spread(r.extra['rounds_p50_us']):.0%} | {r.p99_us:,.0f} | "
                f"{r.extra['requests_per_s']:,.1f} | {r.extra['alone_per_s']:,.0f} | "
                f"{r.p50_us / inproc.p50_us:.2f} | {r.p50_us / native.p50_us:.2f} |")
        lines.append("")
    top = max(r.batch for r in records)
    oip, native = cells[(top, "oip")], cells[(top, "native")]
    triton, inproc = cells[(top, "triton")], cells[(top, "in-process")]
    echo = cells[(top, "triton.echo")]
    node_ratio = oip.extra["node_total_us"] / native.extra["node_total_us"]
    lines += [f"Goals at batch {top}: the node's OIP p50 ÷ its native protocol's "
              f"**{oip.p50_us / native.p50_us:.2f}×** (goal ≤ 1.15×; the node's own time for "
              f"the two calls {node_ratio:.2f}×, below); Triton's Python "
              f"backend with the store embedded ÷ the model in-process "
              f"**{triton.p50_us / inproc.p50_us:.2f}×** (goal ≤ 1.5×), of which Triton's own "
              f"hop (echo) is {echo.p50_us:,.0f} µs.", "",
              "What the node saw of one call, batch by batch (its `total` and `send` stages, "
              "`nearrec_request_seconds`; request bytes, `nearrec_received_bytes_total`), native "
              f"and OIP requests sent alternately one at a time, {e['pairs']} of each:", "",
              "| batch | call | node µs (handler to answer) | send µs | request bytes |",
              "|---:|---|---:|---:|---:|"]
    for r in records:
        if "node_total_us" in r.extra and r.system != "oip.raw":
            call = "Infer (native)" if r.system == "native" else "ModelInfer (OIP)"
            lines.append(f"| {r.batch} | {call} | {r.extra['node_total_us']:,.0f} | "
                         f"{r.extra['node_send_us']:,.0f} | {r.extra['request_bytes']:,.0f} |")
    return "\n".join(lines) + "\n"


#: ``nearrec bench triton``
HARNESSES = {"triton": Harness(TritonConfig, TritonConfig.quick,
                               {"--rows": "rows", "--scratch": "scratch",
                                "--batches": "batches", "--clients": "clients"}, run, markdown)}
