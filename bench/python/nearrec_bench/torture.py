"""``nearrec bench torture``: a writer killed with SIGKILL at random moments, again and again,
and what it left checked against a model after every kill.

Two writers, in turn on one store each:

- ``embedded``: a child process opens the store writable and runs a stream of calls — writes
  of one or two tables at once, removals, compactions, a scratch table created and dropped — and
  appends each call's number to a journal once the call has returned. The parent kills it at a
  random moment.
- ``node``: ``nearrec serve --writable`` over the store; the parent runs the same stream through
  a client and kills the node at a random moment.

Every call is numbered, and every row it writes holds its number in every column (a removed row
holds zeros, as the store's rows did at first), so a row says which call wrote it. After each
kill the store is opened for writing (its log recovered, as a restart does) and checked:

- it opens;
- every table's rows equal the model of the acknowledged calls, or that model with the one call
  that may have been in flight applied whole — never part of a call, never a row whose columns
  disagree (a torn row);
- the scratch table is there exactly when one of those two models says so.

The stream then goes on from the next number, the model set to what the store holds. A
violation is recorded with its round and what differed. Records: one per writer, with kills,
violations, calls acknowledged and, of the calls in flight at a kill, how many the store kept.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import nearrec

from .harness import Harness
from .report import Record
from .served import node

#: the tables the stream writes (rows, dim), and the one it creates and drops
TABLES = {"a": (4000, 16), "b": (1000, 8)}
SCRATCH = ("scratch", 100, 4)
SYSTEMS = ("embedded", "node")


@dataclass
class TortureConfig:
    #: kills per writer
    kills: dict[str, int] = field(default_factory=lambda: {"embedded": 600, "node": 400})
    #: a kill comes this many seconds after the writer is ready, uniformly at most
    window: float = 0.4
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> TortureConfig:
        return cls(kills={"embedded": 20, "node": 12})


def call(n: int, seed: int) -> dict[str, Any]:
    """Call ``n`` of the stream: what it does, the same wherever it is made."""
    rng = np.random.default_rng([seed, n])
    r = rng.random()
    if r < 0.06:
        return {"kind": "compact"}
    if r < 0.10:
        return {"kind": "scratch"}  # created if missing, else dropped
    if r < 0.22:
        ids = np.unique(rng.integers(0, TABLES["a"][0], int(rng.integers(1, 64))))
        return {"kind": "remove", "table": "a", "ids": ids.tolist()}
    tables = ["a", "b"] if rng.random() < 0.4 else [str(rng.choice(["a", "b"]))]
    writes = {}
    for t in tables:
        rows = TABLES[t][0]
        writes[t] = np.unique(rng.integers(0, rows, int(rng.integers(1, 256)))).tolist()
    return {"kind": "write", "writes": writes}


def apply(store: Any, n: int, c: dict[str, Any]) -> None:
    """Makes call ``n`` on ``store`` (embedded or through a node)."""
    if c["kind"] == "compact":
        store.compact()
    elif c["kind"] == "scratch":
        if SCRATCH[0] in store.tables:
            store.drop_table(SCRATCH[0])
        else:
            store.create_table(*SCRATCH)
    elif c["kind"] == "remove":
        store.remove(c["table"], np.asarray(c["ids"], np.int64))
    else:
        store.write_many({t: (np.asarray(ids, np.int64),
                              np.full((len(ids), TABLES[t][1]), n, np.float32))
                          for t, ids in c["writes"].items()})


@dataclass
class Model:
    """What the store holds by the calls' account: each row's writing call (0: none), and
    whether the scratch table is there."""

    rows: dict[str, np.ndarray]
    scratch: bool = False

    @classmethod
    def initial(cls) -> Model:
        return cls({t: np.zeros(r, np.int64) for t, (r, _) in TABLES.items()})

    def after(self, n: int, c: dict[str, Any]) -> Model:
        rows = {t: v.copy() for t, v in self.rows.items()}
        scratch = self.scratch
        if c["kind"] == "scratch":
            scratch = not scratch
        elif c["kind"] == "remove":
            rows[c["table"]][c["ids"]] = 0
        elif c["kind"] == "write":
            for t, ids in c["writes"].items():
                rows[t][ids] = n
        return Model(rows, scratch)


def child(path: str, start: int, seed: int, journal: str) -> None:
    """The embedded writer: opens the store, says it is ready, and runs calls ``start, start +
    1, ...`` until killed, appending each number to ``journal`` once its call returned."""
    store = nearrec.open(path, writable=True, tier="dram")
    print("ready", flush=True)
    with open(journal, "a") as j:
        n = start
        while True:
            apply(store, n, call(n, seed))
            j.write(f"{n}\n")
            j.flush()
            n += 1


def observe(path: Path) -> tuple[dict[str, np.ndarray] | str, bool]:
    """What the store holds: each row's writing call by its first column, or why it cannot be
    read (it does not open, a row is torn); and whether the scratch table is there."""
    try:
        store = nearrec.open(path, writable=True, tier="dram")
    except Exception as e:  # noqa: BLE001 - the violation recorded
        return f"the store does not open: {type(e).__name__}: {e}", False
    try:
        out = {}
        for t, (rows, _) in TABLES.items():
            values = store.read_rows(t, np.arange(rows))
            if not (values == values[:, :1]).all():
                torn = int(np.flatnonzero((values != values[:, :1]).any(1))[0])
                return f"row {torn} of {t} is torn: {values[torn].tolist()}", False
            out[t] = values[:, 0].astype(np.int64)
        return out, SCRATCH[0] in store.tables
    finally:
        store.close()


def same(m: Model, rows: dict[str, np.ndarray], scratch: bool) -> bool:
    return m.scratch == scratch and all(np.array_equal(m.rows[t], rows[t]) for t in TABLES)


def differs(m: Model, rows: dict[str, np.ndarray]) -> str:
    for t in TABLES:
        bad = np.flatnonzero(m.rows[t] != rows[t])
        if len(bad):
            r = int(bad[0])
            return f"{len(bad)} rows of {t} differ, e.g. row {r}: {rows[t][r]}, not {m.rows[t][r]}"
    return "the scratch table differs"


class Unreadable(Exception):
    """The store did not open, or held a torn row: this writer's run ends there."""


@dataclass
class Tally:
    kills: int = 0
    violations: list[str] = field(default_factory=list)
    acknowledged: int = 0
    kept: int = 0
    lost: int = 0
    seconds: float = 0.0


def check(path: Path, model: Model, acked: list[int], start: int, seed: int,
          tally: Tally) -> tuple[Model, int]:
    """The model after the acknowledged calls, checked against the store with the call in flight
    (the next one) applied whole or not at all; the model the store holds, and the number of the
    next call."""
    for n in acked:
        model = model.after(n, call(n, seed))
    tally.acknowledged += len(acked)
    nxt = (acked[-1] if acked else start - 1) + 1
    rows, scratch = observe(path)
    if isinstance(rows, str):
        tally.violations.append(f"kill {tally.kills}: {rows}")
        raise Unreadable(rows)
    with_it = model.after(nxt, call(nxt, seed))
    if same(model, rows, scratch):
        tally.lost += 1
        return model, nxt + 1
    if same(with_it, rows, scratch):
        tally.kept += 1
        return with_it, nxt + 1
    tally.violations.append(f"kill {tally.kills} (call {nxt} in flight): "
                            f"{differs(model, rows)}; with it: {differs(with_it, rows)}")
    # go on from what the store holds
    return Model(rows, scratch), nxt + 1


def fresh(path: Path) -> None:
    nearrec.from_numpy(path, {t: np.zeros((r, d), np.float32) for t, (r, d) in TABLES.items()},
                       overwrite=True)


class NotStarted(Exception):
    """The writer did not start: this writer's run ends there."""


def rounds(system: str, kills: int, path: Path, seed: int, log: Callable[[str], None],
           kill_once: Callable[[int, random.Random], list[int]], moments: int) -> Tally:
    """``kills`` rounds on a fresh store at ``path``: each ``kill_once(start, rnd)`` runs the
    stream from call ``start``, kills its writer and returns the calls it acknowledged; the
    store is then checked and the next round starts after the call that was in flight. The kill
    moments are drawn from ``random.Random(moments)``."""
    fresh(path)
    tally, model, start = Tally(), Model.initial(), 1
    rnd = random.Random(moments)
    began = time.monotonic()
    for k in range(kills):
        try:
            acked = kill_once(start, rnd)
        except NotStarted as e:
            tally.violations.append(f"kill {k}: the writer did not start: {e}")
            break
        tally.kills += 1
        try:
            model, start = check(path, model, acked, start, seed, tally)
        except Unreadable:
            break
        if k % 50 == 49:
            log(f"{system}: {tally.kills} kills, {tally.acknowledged} calls acknowledged, "
                f"{len(tally.violations)} violations")
    tally.seconds = time.monotonic() - began
    return tally


def embedded(cfg: TortureConfig, path: Path, log: Callable[[str], None]) -> Tally:
    """The embedded writer, a child process, killed ``cfg.kills["embedded"]`` times."""
    with tempfile.TemporaryDirectory() as tmp:
        journal = Path(tmp) / "journal"

        def kill_once(start: int, rnd: random.Random) -> list[int]:
            journal.write_text("")
            proc = subprocess.Popen(
                [sys.executable, "-c",
                 "import sys; from nearrec_bench.torture import child; "
                 "child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])",
                 str(path), str(start), str(cfg.seed), str(journal)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                proc.kill()
                raise NotStarted(proc.communicate()[1][-400:])
            time.sleep(rnd.uniform(0, cfg.window))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return [int(x) for x in journal.read_text().split()]

        return rounds("embedded", cfg.kills["embedded"], path, cfg.seed, log, kill_once,
                      cfg.seed)


def _writes(store: Any, start: int, seed: int, stop: threading.Event, acked: list[int]
            ) -> None:
    """Calls ``start, start + 1, ...`` through a node until ``stop`` or a call fails (the node
    killed under it); each number into ``acked`` once its call returned."""
    c = start
    while not stop.is_set():
        try:
            apply(store, c, call(c, seed))
        except Exception:  # noqa: BLE001 - the node killed under the call
            return
        acked.append(c)
        c += 1


def through_node(cfg: TortureConfig, path: Path, log: Callable[[str], None]) -> Tally:
    """A node over the store, written through by this process, killed ``cfg.kills["node"]``
    times."""

    def kill_once(start: int, rnd: random.Random) -> list[int]:
        acked: list[int] = []
        with node(path, "s", "--writable", "--tier", "dram") as n:
            store = nearrec.connect(n.address, "s", timeout=10.0, retries=0)
            stop = threading.Event()
            writer = threading.Thread(target=_writes, args=(store, start, cfg.seed, stop, acked))
            writer.start()
            time.sleep(rnd.uniform(0, cfg.window))
            os.kill(n.pid, signal.SIGKILL)
            stop.set()
            writer.join()
        return acked

    return rounds("node", cfg.kills["node"], path, cfg.seed, log, kill_once, cfg.seed + 1)


def run(cfg: TortureConfig, log: Callable[[str], None] = print) -> list[Record]:
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    records = []
    for system, fn in (("embedded", embedded), ("node", through_node)):
        path = cfg.scratch / f"torture-{system}"
        log(f"{system}: {cfg.kills[system]} kills of a writer on {path}")
        t = fn(cfg, path, log)
        records.append(Record(
            "torture", "a+b+scratch", 0, "random", system, 0.0, 0.0,
            extra={"kills": t.kills, "violations": len(t.violations),
                   "found": t.violations[:20], "acknowledged": t.acknowledged,
                   "in_flight_kept": t.kept, "in_flight_lost": t.lost,
                   "seconds": round(t.seconds, 1), "window_s": cfg.window}))
        log(f"{system}: {t.kills} kills, {len(t.violations)} violations, "
            f"{t.acknowledged} calls acknowledged, in flight at a kill: {t.kept} kept, "
            f"{t.lost} not")
    return records


def markdown(records: list[Record], command: str) -> str:
    lines = [
        "# Crash torture: a writer killed with SIGKILL, the store checked after every kill",
        "",
        f"`{command}`",
        "",
        "Each kill comes at a random moment of a stream of writes (one or two tables at once), "
        "removals, compactions and a table created and dropped; the store is then reopened and "
        "held to a model of the acknowledged calls: every one present, the call in flight "
        "whole or absent, no torn row (`bench/python/nearrec_bench/torture.py`).",
        "",
        "| writer | kills | violations | calls acknowledged | in flight at a kill: kept / not "
        "| seconds |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        e = r.extra
        lines.append(f"| {r.system} | {e['kills']} | {e['violations']} | {e['acknowledged']:,} "
                     f"| {e['in_flight_kept']} / {e['in_flight_lost']} | {e['seconds']} |")
    found = [f for r in records for f in r.extra["found"]]
    if found:
        lines += ["", "Violations:", ""] + [f"- {f}" for f in found]
    return "\n".join(lines) + "\n"


HARNESSES = {"torture": Harness(TortureConfig, TortureConfig.quick, {"--scratch": "scratch"},
                                run, markdown)}


if __name__ == "__main__":  # pragma: no cover - `nearrec bench torture` is the way in
    print(json.dumps([r.extra for r in run(TortureConfig.quick())], indent=1))
