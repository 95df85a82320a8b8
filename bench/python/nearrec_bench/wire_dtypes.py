"""``nearrec bench serve-dtypes``: a storage node's pooled answers in fp32, fp16, bf16 and int8
(``out_dtype``) side by side — bytes on the wire, requests/s past saturation and p50 / p99 at
one offered load — on loopback and across a network namespace joined by a veth pair that tc's
token bucket limits (where the link, not the node's core, binds).

The same DRAM-resident store, node and batches for every dtype; the dtypes interleaved round by
round (a drifting neighbour falls on all of them alike), medians over rounds. Requests leave
open-loop (``nearrec-loadgen``: latency from each intended send time). Each dtype's answer to
the first batch is compared with fp32's: the error the narrower answer costs."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import _native
from .harness import Harness
from .report import Record
from .serve import Cell, ServeConfig, _answered_per_s, _median, build_store, requests
from .served import can_make_namespaces, namespace, node


@dataclass
class WireDtypeConfig:
    tables: int = 8
    rows: int = 50_000  # per table, DRAM-resident (8 × 50k × 512 B = 200 MiB)
    dim: int = 128
    pooling: int = 10
    zipf: float = 1.05
    batches: tuple[int, ...] = (64, 256)
    dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8")
    #: "loopback", or a rate tc's token bucket limits a veth pair to (each way)
    links: tuple[str, ...] = ("loopback", "1gbit")
    distinct_batches: int = 32
    seconds: float = 2.0
    rounds: int = 3
    connections: int = 4
    #: offered past every dtype's saturation
    offered: float = 20_000.0
    #: latency is taken at this share of fp32's saturation on the same link and batch
    load_share: float = 0.7
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> WireDtypeConfig:
        return cls(rows=5_000, batches=(64,), links=("loopback",), seconds=0.5, rounds=1,
                   distinct_batches=8)

    def serve(self, batch: int) -> ServeConfig:
        """The serve harness's config for the same tables and ``batch`` bags a request."""
        return ServeConfig(tables=self.tables, rows=self.rows, dim=self.dim, bags=batch,
                           pooling=self.pooling, zipf=self.zipf,
                           distinct_batches=self.distinct_batches, seed=self.seed,
                           scratch=self.scratch)


def answer_bytes(dtype: str, batch: int, tables: int, dim: int) -> int:
    """The pooled answer's bytes (``nearrec::OutDtype::bytes``)."""
    per = {"fp32": 4 * dim, "fp16": 2 * dim, "bf16": 2 * dim, "int8": dim + 8}[dtype]
    return batch * tables * per


def run(cfg: WireDtypeConfig, log: Callable[[str], None] = print) -> list[Record]:
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    path = cfg.scratch / f"serve-dtypes-{cfg.rows}-{cfg.dim}"
    log(f"building {cfg.tables} tables × {cfg.rows:,} rows × {cfg.dim}")
    build_store(cfg.serve(cfg.batches[0]), path, cfg.rows)
    work = {b: requests(cfg.serve(b), cfg.rows)[1] for b in cfg.batches}
    records: list[Record] = []
    for link in cfg.links:
        if link != "loopback" and not can_make_namespaces():
            log(f"{link}: skipped (no network namespaces or no tc on this host)")
            continue
        with namespace(link) if link != "loopback" else nullcontext() as ns:
            netns, host = ns if ns else (None, "127.0.0.1")
            with node(path, "s", "--tier", "dram", netns=netns, host=host) as served:
                for batch in cfg.batches:
                    records += _cell(cfg, link, batch, work[batch], served.address, log)
    return records


def _cell(cfg: WireDtypeConfig, link: str, batch: int, work: list[Any], address: str,
          log: Callable[[str], None]) -> list[Record]:
    """Every dtype on one link at one batch size: saturation, then latency at one load."""

    def drive(dtype: str, rate: float, seconds: float, seed: int) -> dict[str, Any]:
        return _native.load_run("pooled", work, rate, seconds, target=address, store="s",
                                connections=cfg.connections, seed=seed, out_dtype=dtype)

    first = {d: np.asarray(drive(d, 50.0, 0.2, 0)["first"]) for d in cfg.dtypes}
    ref = first["fp32"]
    scale = float(np.abs(ref).max()) or 1.0
    errors = {d: {"max_abs": float(np.abs(first[d] - ref).max()),
                  "max_rel_to_max": float(np.abs(first[d] - ref).max() / scale),
                  "rms_rel": float(np.sqrt(np.mean((first[d] - ref) ** 2))
                                   / (np.sqrt(np.mean(ref ** 2)) or 1.0))}
              for d in cfg.dtypes}
    for d in cfg.dtypes:  # one round each, not counted, warms the connections and caches
        drive(d, cfg.offered, min(cfg.seconds, 1.0), 99)
    saturation: dict[str, list[float]] = {d: [] for d in cfg.dtypes}
    wire: dict[str, list[float]] = {d: [] for d in cfg.dtypes}
    for rnd in range(cfg.rounds):
        for d in cfg.dtypes:
            out = drive(d, cfg.offered, cfg.seconds, 100 + rnd)
            saturation[d].append(_answered_per_s(out))
            answered = len(out["latencies_us"])
            wire[d].append(out["wire_bytes"] / answered if answered else 0.0)
    rate = cfg.load_share * _median(saturation["fp32"])
    cells = {d: Cell(d, rate) for d in cfg.dtypes}
    for rnd in range(cfg.rounds):
        for d in cfg.dtypes:
            cells[d].add(drive(d, rate, cfg.seconds, 200 + rnd))
    records = []
    base = _median(saturation["fp32"])
    for d in cfg.dtypes:
        sat = _median(saturation[d])
        c = cells[d]
        log(f"{link} batch {batch} {d}: {sat:,.0f} requests/s ({sat / base:.2f}× fp32; rounds "
            f"{', '.join(f'{s:,.0f}' for s in saturation[d])}), {_median(wire[d]):,.0f} B a "
            f"request; at {rate:,.0f}/s: {c.summary()}")
        records.append(Record(
            "serve.dtype", link, batch, "zipf", d, samples_per_s=sat * batch,
            lookups_per_s=sat * batch * cfg.tables * cfg.pooling,
            p50_us=_median(c.p50), p99_us=_median(c.p99),
            extra={"dtype": d, "link": link, "requests_per_s": sat,
                   "rounds_requests_per_s": saturation[d], "x_fp32": sat / base,
                   "wire_bytes_per_request": _median(wire[d]),
                   "answer_bytes": answer_bytes(d, batch, cfg.tables, cfg.dim),
                   "offered_per_s": rate, "rounds_p50_us": c.p50, "rounds_p99_us": c.p99,
                   "served_at_load_per_s": _median(c.served), "failed": c.failed,
                   "dropped": c.dropped, "error": errors[d], "tables": cfg.tables,
                   "dim": cfg.dim, "pooling": cfg.pooling}))
    return records


def markdown(records: list[Record], command: str) -> str:
    r0 = next((r for r in records if r.bench == "serve.dtype"), None)
    shape = (f"{r0.extra['tables']} fp32 tables × dim {r0.extra['dim']}, {r0.extra['pooling']} "
             f"Zipf lookups a bag" if r0 else "")
    lines = [f"Command: `{command}`", "",
             f"One storage node on a DRAM-resident store ({shape}); its pooled answers asked in "
             "each dtype (`out_dtype`), the dtypes interleaved round by round, medians over "
             "rounds. `requests/s`: answered past saturation (open-loop, offered far above); "
             "p50 / p99 at one offered load, a share of fp32's saturation on the same link and "
             "batch; `B / request`: the request's and the answer's message bytes; `loopback` "
             "shares this machine's 2 cores between the load generator and the node; a rate is "
             "a veth pair into a network namespace, limited each way by tc's token bucket.", "",
             "| link | batch | dtype | answer B | B / request | requests/s | × fp32 | "
             "p50 / p99 ms at load | max error ÷ max |fp32| |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in records:
        if r.bench != "serve.dtype":
            continue
        e = r.extra
        lines.append(
            f"| {e['link']} | {r.batch} | {e['dtype']} | {e['answer_bytes']:,} | "
            f"{e['wire_bytes_per_request']:,.0f} | {e['requests_per_s']:,.0f} | "
            f"{e['x_fp32']:.2f} | {r.p50_us / 1e3:,.2f} / {r.p99_us / 1e3:,.2f} | "
            f"{e['error']['max_rel_to_max']:.1e} |")
    return "\n".join(lines) + "\n"


HARNESSES = {"serve-dtypes": Harness(WireDtypeConfig, WireDtypeConfig.quick,
                                     {"--scratch": "scratch"}, run, markdown)}
