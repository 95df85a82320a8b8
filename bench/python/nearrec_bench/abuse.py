"""``nearrec bench abuse``: what slow, flooding and greedy clients cost the others.

A node (``nearrec serve``, an ACL with two principals, ``--max-calls-per-principal`` and
``--request-timeout`` set) serves ``good`` clients an open-loop load (Poisson arrivals, latency
from when each call was due) in rounds of three phases:

- ``alone``: the good clients only;
- ``slow``: the same load, beside ``tricklers`` connections that each send a lookup's headers
  and then its body a byte every 100 ms (each cut at the request timeout, and started over) and
  ``flood`` connections opened and held, sending nothing after the HTTP/2 preface;
- ``greedy``: the same load, beside ``greedy`` threads of the other principal calling with
  batches 16 times as large as fast as they can, closed-loop, far past its share (refused
  ``Overloaded`` past it).

This machine has two cores, and the clients would take the node's CPU from it (and the
abusers the good clients'), as clients on other machines do not: the node runs on one core
(``node_cpus``), and the abusers in a process of their own at the lowest priority
(``abuser_nice``), where they take what CPU the good clients leave. The record, per phase:
the good clients' calls, errors, p50 and p99 (medians over the rounds, with their spread); the
tricklers cut, the connections opened, the greedy principal's calls answered and refused; the
node's refusals by reason. The claim it measures: the good clients keep their p99.
"""

from __future__ import annotations

import hashlib
import os
import random
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import nearrec

from .harness import Harness
from .report import Record
from .served import node, scrape

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Count:
    """A counter many threads add to."""

    def __init__(self) -> None:
        self.n = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        with self._lock:
            self.n += 1


@dataclass
class AbuseConfig:
    good: int = 8
    #: the good clients' calls a second, together
    rate: float = 400.0
    phase_s: float = 30.0
    rounds: int = 3
    tricklers: int = 200
    flood: int = 400
    greedy: int = 32
    #: the greedy principal's batches, this many times the good clients'
    greedy_scale: int = 16
    #: the node's limits under test
    #: a quarter of the node's engine slots (max_in_flight 8)
    max_calls_per_principal: int = 2
    request_timeout_s: float = 5.0
    rows: int = 50_000
    batch: int = 16
    pooling: int = 8
    seed: int = 0
    #: the cores the node runs on (empty: all), and the abusers' niceness: the clients' CPU
    #: kept from the node's, as another machine's would be
    node_cpus: tuple[int, ...] = (0,)
    abuser_nice: int = 19
    #: more flags for the node (an A/B of one of its settings: `--cpu-turns 64` lifts the
    #: bound on DRAM-resident work at once, and with it the fair order between principals)
    node_flags: tuple[str, ...] = ()
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> AbuseConfig:
        return cls(phase_s=5.0, rounds=1, tricklers=20, flood=40, greedy=8, rows=5_000,
                   request_timeout_s=2.0)


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(
        ">I", stream) + payload


def _literal(name_index: int, value: bytes) -> bytes:
    """An HPACK literal without indexing, its name from the static table (RFC 7541 §6.2.2)."""
    prefix = bytes([name_index]) if name_index < 15 else bytes([15, name_index - 15])
    return prefix + bytes([len(value)]) + value


def _trickle_head(token: str) -> bytes:
    """The preface, an empty SETTINGS, and a Lookup's HEADERS on stream 1 (HPACK, no Huffman)."""
    block = (b"\x83\x86"  # :method POST, :scheme http
             + _literal(4, b"/nearrec.v1.Node/Lookup") + _literal(1, b"node")
             + _literal(31, b"application/grpc")
             + b"\x00\x02te\x08trailers"
             + _literal(23, f"Bearer {token}".encode()))
    return PREFACE + _frame(4, 0, 0, b"") + _frame(1, 4, 1, block)


def _ended(received: bytearray) -> bool:
    """Whether the frames received so far hold the node's end of stream 1 (a HEADERS frame:
    its trailers) or of the connection (GOAWAY); the whole frames taken off ``received``."""
    while len(received) >= 9:
        length = int.from_bytes(received[:3], "big")
        if len(received) < 9 + length:
            return False
        kind = received[3]
        stream = int.from_bytes(received[5:9], "big") & 0x7FFFFFFF
        del received[:9 + length]
        if (kind == 1 and stream == 1) or kind == 7:
            return True
    return False


def _trickler(address: str, token: str, stop: threading.Event, cut: Count) -> None:
    """Sends a lookup's head, then a byte of body every 100 ms until the node ends it; again."""
    host, port = address.rsplit(":", 1)
    while not stop.is_set():
        try:
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(_trickle_head(token))
                s.setblocking(False)
                received = bytearray()
                body = b"\x00\x00\x00\x10\x00" + bytes(4096)
                for k in range(len(body)):
                    if stop.wait(0.1):
                        return
                    s.sendall(_frame(0, 0, 1, body[k:k + 1]))
                    try:
                        chunk = s.recv(65536)
                    except BlockingIOError:
                        continue
                    received += chunk
                    if not chunk or _ended(received):
                        cut.add()
                        break
        except OSError:
            time.sleep(0.1)


def _flooder(address: str, stop: threading.Event, opened: Count) -> None:
    """One connection held open, saying nothing after the preface; opened again when closed."""
    host, port = address.rsplit(":", 1)
    while not stop.is_set():
        try:
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(PREFACE + _frame(4, 0, 0, b""))
                opened.add()
                s.settimeout(0.5)
                while not stop.is_set():
                    try:
                        if not s.recv(65536):
                            break  # closed by the node
                    except TimeoutError:
                        continue
        except OSError:
            time.sleep(0.1)


def _lookups(rng: np.random.Generator, cfg: AbuseConfig, tables: list[str], scale: int = 1
             ) -> list[nearrec.TableLookup]:
    bags = cfg.batch * scale
    return [nearrec.TableLookup(t, rng.integers(0, cfg.rows, bags * cfg.pooling),
                                lengths=np.full(bags, cfg.pooling, np.int64))
            for t in tables]


def _good(cfg: AbuseConfig, stores: list[Any], tables: list[str], seconds: float
          ) -> tuple[list[float], int]:
    """The good clients' open-loop load for ``seconds``: latencies (s, from when each call was
    due) and errors."""
    stop = time.monotonic() + seconds
    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()

    def client(k: int, store: Any) -> None:
        rnd, rng = random.Random(k), np.random.default_rng([cfg.seed, k])
        due = time.monotonic()
        while True:
            due += rnd.expovariate(cfg.rate / cfg.good)
            if due >= stop:
                return
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                store.lookup_many(_lookups(rng, cfg, tables))
            except Exception:  # noqa: BLE001 - every failure of a good client counts
                with lock:
                    errors[0] += 1
                continue
            with lock:
                lat.append(time.monotonic() - due)

    threads = [threading.Thread(target=client, args=(k, s)) for k, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat, errors[0]


def _greedy(cfg: AbuseConfig, address: str, tables: list[str], k: int, stop: threading.Event,
            answered: Count, refused: Count) -> None:
    """The greedy principal's thread: batches ``greedy_scale`` times the good clients', as fast
    as it gets answers, never retried."""
    store = None
    while store is None and not stop.is_set():
        try:  # connecting asks the node for the store's tables: a call of the principal's too
            store = nearrec.connect(address, "s", token="greedy", timeout=30, retries=0)
        except Exception:  # noqa: BLE001 - refused past its share
            refused.add()
    if store is None:
        return
    rng = np.random.default_rng([cfg.seed, 1000 + k])
    while not stop.is_set():
        try:
            store.lookup_many(_lookups(rng, cfg, tables, cfg.greedy_scale))
            answered.add()
        except Exception:  # noqa: BLE001 - refused past its share
            refused.add()
    store.close()


def _refused(metrics: str) -> dict[str, float]:
    return {s.labels["reason"]: s.value for f in scrape(metrics)
            if f.name == "nearrec_refused" for s in f.samples if s.name.endswith("_total")}


PHASES = ("alone", "slow", "greedy")


def _abusers(phase: str, cfg: AbuseConfig, address: str, tables: list[str], stop: Any,
             out: Any) -> None:
    """A child process's abusers of ``phase`` (``slow``: tricklers and the flood; ``greedy``:
    the greedy principal) until ``stop`` is set; their counts into ``out``."""
    os.nice(cfg.abuser_nice)
    done = threading.Event()
    counts = {k: Count() for k in ("cut", "opened", "answered", "refused")}
    threads = []
    if phase == "slow":
        threads += [threading.Thread(target=_trickler, args=(
            address, "greedy", done, counts["cut"]), daemon=True) for _ in range(cfg.tricklers)]
        threads += [threading.Thread(target=_flooder, args=(
            address, done, counts["opened"]), daemon=True) for _ in range(cfg.flood)]
    else:
        threads += [threading.Thread(target=_greedy, args=(
            cfg, address, tables, k, done, counts["answered"], counts["refused"]),
            daemon=True) for k in range(cfg.greedy)]
    for t in threads:
        t.start()
    stop.wait()
    done.set()
    for t in threads:
        t.join(10)
    out.put({k: c.n for k, c in counts.items()})


def run(cfg: AbuseConfig, log: Callable[[str], None] = print) -> list[Record]:
    import multiprocessing

    cfg.scratch.mkdir(parents=True, exist_ok=True)
    path = cfg.scratch / f"abuse-{cfg.rows}"
    nearrec.build(path, "rmc1", rows=cfg.rows, seed=cfg.seed, overwrite=True, progress=False)
    tables = list(nearrec.open(path, tier="ssd").tables)
    acl = cfg.scratch / "abuse-acl.toml"
    acl.write_text("".join(
        f'[principal.{who}]\ntoken_sha256 = "{hashlib.sha256(who.encode()).hexdigest()}"\n'
        'read = ["*"]\n\n' for who in ("good", "greedy")))
    flags = ("--tier", "dram", "--acl", str(acl), "--max-calls-per-principal",
             str(cfg.max_calls_per_principal), "--request-timeout", str(cfg.request_timeout_s),
             *cfg.node_flags)
    phases: dict[str, list[dict[str, float]]] = {p: [] for p in PHASES}
    totals = {k: 0 for k in ("cut", "opened", "answered", "refused")}
    # the abusers run in a process of their own: their threads do not take the good clients'
    # interpreter
    ctx = multiprocessing.get_context("spawn")
    with node(path, "s", *flags, cpus=set(cfg.node_cpus) or None) as served:
        good = [nearrec.connect(served.address, "s", token="good", timeout=30)
                for _ in range(cfg.good)]
        _good(cfg, good, tables, min(2.0, cfg.phase_s))  # warm
        for r in range(cfg.rounds):
            for phase in PHASES:
                child, stop, out = None, ctx.Event(), ctx.Queue()
                if phase != "alone":
                    child = ctx.Process(target=_abusers,
                                        args=(phase, cfg, served.address, tables, stop, out))
                    child.start()
                    time.sleep(min(2.0, cfg.phase_s / 4))  # the abusers at work first
                lat, errors = _good(cfg, good, tables, cfg.phase_s)
                if child is not None:
                    stop.set()
                    for k, v in out.get(timeout=60).items():
                        totals[k] += v
                    child.join(30)
                p = np.percentile(lat, [50, 99]) * 1e6 if lat else [0.0, 0.0]
                phases[phase].append({"calls": len(lat), "errors": errors,
                                      "p50_us": float(p[0]), "p99_us": float(p[1])})
                log(f"round {r} {phase}: {len(lat)} calls, {errors} errors, "
                    f"p50 {p[0] / 1e3:.2f} ms, p99 {p[1] / 1e3:.2f} ms")
        refused = _refused(served.metrics)
        for s in good:
            s.close()
    records = []
    for phase, runs in phases.items():
        p50s, p99s = [x["p50_us"] for x in runs], [x["p99_us"] for x in runs]
        calls = sum(x["calls"] for x in runs)
        extra: dict[str, Any] = {
            "rounds": runs, "errors": sum(x["errors"] for x in runs),
            "p99_spread_us": [min(p99s), max(p99s)], "phase_s": cfg.phase_s,
            "good_clients": cfg.good, "offered_per_s": cfg.rate,
            "node_cpus": list(cfg.node_cpus), "abuser_nice": cfg.abuser_nice}
        if phase == "slow":
            extra.update(tricklers=cfg.tricklers, tricklers_cut=totals["cut"], flood=cfg.flood,
                         flood_opened=totals["opened"], request_timeout_s=cfg.request_timeout_s)
        if phase == "greedy":
            extra.update(greedy_threads=cfg.greedy, greedy_scale=cfg.greedy_scale,
                         greedy_answered=totals["answered"], greedy_refused=totals["refused"],
                         max_calls_per_principal=cfg.max_calls_per_principal)
        extra["node_refused"] = refused
        records.append(Record("abuse", "rmc1", cfg.batch, "uniform", f"good clients, {phase}",
                              calls / (cfg.phase_s * len(runs)),
                              calls * cfg.batch * cfg.pooling * len(tables)
                              / (cfg.phase_s * len(runs)),
                              float(np.median(p50s)), float(np.median(p99s)), extra))
    return records


def _cores(extra: dict[str, Any]) -> str:
    cpus = extra.get("node_cpus")
    if not cpus:
        return ("The abusers run in a process of their own; the node, the good clients and "
                "the abusers share the machine's cores.")
    return (f"The node runs on core {', '.join(map(str, cpus))} of this machine's "
            f"{os.cpu_count()}; the abusers in a process of their own at nice "
            f"{extra['abuser_nice']}, taking what CPU the good clients leave (the clients' CPU "
            "kept from the node's, as other machines' would be).")


def markdown(records: list[Record], command: str) -> str:
    alone, slow, greedy = records
    lines = [
        "# Slow, flooding and greedy clients beside good ones",
        "",
        f"`{command}`",
        "",
        f"{alone.extra['good_clients']} good clients offer {alone.extra['offered_per_s']:,.0f} "
        f"lookups a second, open-loop, in {len(alone.extra['rounds'])} rounds of three "
        f"{alone.extra['phase_s']:g} s phases: alone; beside {slow.extra['tricklers']} "
        f"tricklers (a body byte every 100 ms; request timeout "
        f"{slow.extra['request_timeout_s']:g} s) and {slow.extra['flood']} idle connections; "
        f"beside {greedy.extra['greedy_threads']} closed-loop threads of a greedy principal "
        f"(batches {greedy.extra.get('greedy_scale', 16)} times as large; its share: "
        f"{greedy.extra['max_calls_per_principal']} "
        f"calls). {_cores(alone.extra)}",
        "",
        "| good clients | answered/s | errors | p50 ms | p99 ms (median of rounds) "
        "| p99 spread ms | p99 ÷ alone |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lo, hi = r.extra["p99_spread_us"]
        lines.append(f"| {r.system.split(', ')[1]} | {r.samples_per_s:,.1f} | "
                     f"{r.extra['errors']} | {r.p50_us / 1e3:.2f} | {r.p99_us / 1e3:.2f} | "
                     f"{lo / 1e3:.2f}–{hi / 1e3:.2f} | "
                     f"{r.p99_us / max(alone.p99_us, 1e-9):.2f}× |")
    lines += [
        "",
        f"Tricklers cut at the timeout: {slow.extra['tricklers_cut']:,}; flood connections "
        f"opened: {slow.extra['flood_opened']:,}; the greedy principal answered "
        f"{greedy.extra['greedy_answered']:,} times and refused "
        f"{greedy.extra['greedy_refused']:,}.",
        "",
        "The node's refusals (`nearrec_refused_total`): "
        + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(alone.extra["node_refused"].items())
                    if v) + ".",
    ]
    return "\n".join(lines) + "\n"


HARNESSES = {"abuse": Harness(AbuseConfig, AbuseConfig.quick, {"--scratch": "scratch"}, run,
                              markdown)}
