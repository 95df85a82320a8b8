"""``nearrec bench feed-kills``: a delta feeder killed with SIGKILL at random moments, again
and again, and the store held after every kill to exactly the files its feed's cursor names —
each applied once, none in part.

A producer (pyarrow, as a trainer outside nearrec would write them) keeps a directory of delta
files ahead of the feeder: even files upsert and delete rows of an fp32 table ``a`` (every
column of a row written by file ``s`` holds ``s``), odd files upsert int8 rows of ``q`` given
as encoded bytes (scale 0, bias ``s``: they decode to ``s`` exactly). Two feeders, each on a
store of its own:

- ``embedded``: a child process opens the store writable (a delta budget of 1 MiB, so that it
  compacts as it goes) and applies the files (``nearrec.feed.apply``); killed, the store dies
  with it;
- ``node``: ``nearrec serve --writable`` over the store (compacting as its delta fills), and
  ``nearrec feed`` as a child process sending the files; the feeder is killed, the node goes
  on.

After each kill the store is opened again (its log recovered) or asked through the node, and
held to the model of files ``1..c`` applied in order, ``c`` its cursor: every row of both
tables equal, bit for bit. A cursor that went back, or any row that differs (a file applied
twice would not show — its rows are the same — but one applied in part, or one the cursor
names and the rows lack, would), is a violation. Records per feeder: kills, violations, files
applied, and the kills that caught a file in flight (the cursor moved during the round).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
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

#: (rows, dim) of the fp32 table written as floats and of the int8 table written encoded
TABLES = {"a": (2000, 8), "q": (500, 16)}
FEED = "kills"
SYSTEMS = ("embedded", "node")


@dataclass
class FeedKillsConfig:
    #: kills per feeder
    kills: dict[str, int] = field(default_factory=lambda: {"embedded": 200, "node": 200})
    #: a kill comes this many seconds after the feeder is ready, uniformly at most
    window: float = 0.3
    #: files kept ahead of the store's cursor: more than a feeder applies in the window, so
    #: that the kill finds it under way
    ahead: int = 1500
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> FeedKillsConfig:
        return cls(kills={"embedded": 12, "node": 8})


def publish(directory: Path, sequence: int, seed: int) -> None:
    """Delta file ``sequence``, as pyarrow writes it, renamed into place whole."""
    import pyarrow as pa

    rng = np.random.default_rng([seed, sequence])
    if sequence % 2 == 0:
        rows, dim = TABLES["a"]
        picked = rng.choice(rows, 48, replace=False)
        ups, dels = picked[:40], picked[40:]
        tables = ["a"] * 48
        ids = np.concatenate([ups, dels]).tolist()
        ops = [0] * 40 + [1] * 8
        values = pa.array([[float(sequence)] * dim] * 40 + [None] * 8, pa.list_(pa.float32(), dim))
        field_ = pa.field("values", pa.list_(pa.float32(), dim))
    else:
        rows, dim = TABLES["q"]
        ids = rng.choice(rows, 12, replace=False).tolist()
        tables, ops = ["q"] * 12, [0] * 12
        # FBGEMM's fused 8-bit row: the codes, then fp32 scale and bias (0 and s: exactly s)
        row = bytes(dim) + np.array([0.0, float(sequence)], np.float32).tobytes()
        values = pa.array([row] * 12, pa.binary(dim + 8))
        field_ = pa.field("values", pa.binary(dim + 8), metadata={"nearrec.dtype": "int8"})
    write_delta(directory, sequence, [pa.array(tables), pa.array(ids, pa.int64()),
                                      pa.array(ops, pa.int8()), values], field_)


def write_delta(directory: Path, sequence: int, columns: list[Any], values: Any) -> Path:
    """Delta file ``sequence`` of ``directory`` (``docs/format.md`` §17) of pyarrow's
    ``columns`` — table, id, op, values, the last of field ``values`` — with the producer's wall
    time now, as a trainer outside nearrec writes it: under another name, then renamed into
    place whole."""
    import pyarrow as pa

    table, ids, ops, _ = columns
    schema = pa.schema([("table", table.type), ("id", ids.type), ("op", ops.type), values],
                       metadata={"nearrec.delta": "1", "nearrec.sequence": str(sequence),
                                 "nearrec.wall_time_ms": str(int(time.time() * 1000))})
    path = directory / f"{sequence:020d}.arrow"
    tmp = directory / f".{path.name}.tmp"
    with pa.OSFile(str(tmp), "wb") as f, pa.ipc.new_stream(f, schema) as w:
        w.write_table(pa.table(columns, schema=schema))
    tmp.rename(path)
    return path


class Model:
    """The tables as files ``1..applied`` leave them."""

    def __init__(self, store: nearrec.Store) -> None:
        self.tables = {t: read(store, t) for t in TABLES}
        self.applied = 0

    def advance(self, to: int, seed: int) -> None:
        for s in range(self.applied + 1, to + 1):
            rng = np.random.default_rng([seed, s])
            if s % 2 == 0:
                picked = rng.choice(TABLES["a"][0], 48, replace=False)
                self.tables["a"][picked[:40]] = s
                self.tables["a"][picked[40:]] = 0
            else:
                self.tables["q"][rng.choice(TABLES["q"][0], 12, replace=False)] = s
        self.applied = max(self.applied, to)


def read(store: nearrec.Store, table: str) -> np.ndarray:
    return store.read_rows(table, np.arange(TABLES[table][0]))


def fresh(root: Path) -> tuple[Path, Path]:
    """A new store of the two tables (their rows the pattern of their index) and an empty
    directory of deltas, under ``root``."""
    import shutil

    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    rng = np.random.default_rng(1)
    nearrec.from_numpy(root / "store", {
        t: rng.standard_normal((rows, dim)).astype(np.float32)
        for t, (rows, dim) in TABLES.items()}, dtype={"a": "fp32", "q": "int8"})
    (root / "deltas").mkdir()
    return root / "store", root / "deltas"


@dataclass
class Tally:
    kills: int = 0
    violations: list[str] = field(default_factory=list)
    files: int = 0
    in_flight: int = 0
    #: rounds in which the feeder applied every file there before its kill
    finished: int = 0
    seconds: float = 0.0


def rounds(system: str, cfg: FeedKillsConfig, store_path: Path, deltas: Path,
           log: Callable[[str], None], kill_once: Callable[[Path, Path, float], None],
           open_store: Callable[[Path], nearrec.Store]) -> Tally:
    """``cfg.kills`` rounds on the store at ``store_path`` (as :func:`fresh` made it): the
    producer keeps ``cfg.ahead`` files past the cursor in ``deltas``, the feeder is started and
    killed (``kill_once``), the store checked against the model."""
    tally, rnd = Tally(), random.Random(cfg.seed + len(system))
    store = open_store(store_path)
    model, published = Model(store), 0
    began = time.monotonic()
    for k in range(cfg.kills[system]):
        while published < model.applied + cfg.ahead:
            published += 1
            publish(deltas, published, cfg.seed)
        kill_once(store_path, deltas, rnd.uniform(0, cfg.window))
        tally.kills += 1
        store = open_store(store_path)
        cursor = store.feed_status().get(FEED)
        c = cursor.sequence if cursor else 0
        if c < model.applied:
            tally.violations.append(f"kill {k}: the cursor went back from {model.applied} to {c}")
            break
        tally.in_flight += c > model.applied
        tally.finished += c == published
        model.advance(c, cfg.seed)
        for t in TABLES:
            got = read(store, t)
            if not np.array_equal(got, model.tables[t]):
                bad = np.flatnonzero((got != model.tables[t]).any(axis=1))
                tally.violations.append(
                    f"kill {k}: at file {c}, table {t} differs from the model at rows "
                    f"{bad[:5].tolist()}")
                model.tables[t] = got
        if k % 50 == 49:
            log(f"{system}: {tally.kills} kills, {c} files applied, "
                f"{len(tally.violations)} violations")
    tally.files = model.applied
    tally.seconds = time.monotonic() - began
    return tally


def _ready(proc: subprocess.Popen[str]) -> None:
    """Wait for the child's ``ready`` line (its imports done, about to feed)."""
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        raise RuntimeError(f"the feeder did not start: {proc.communicate()[1][-400:]}")


def _kill(proc: subprocess.Popen[str], after: float) -> None:
    time.sleep(after)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def embedded(cfg: FeedKillsConfig, root: Path, log: Callable[[str], None]) -> Tally:
    """A child process applying the files to the store it opened, killed with it."""
    child = ("import sys, nearrec, nearrec.feed; "
             "s = nearrec.open(sys.argv[1], writable=True, delta_budget='1MiB'); "
             "print('ready', flush=True); nearrec.feed.apply(sys.argv[2], s, name=sys.argv[3])")

    def kill_once(store: Path, deltas: Path, after: float) -> None:
        proc = subprocess.Popen([sys.executable, "-c", child, str(store), str(deltas), FEED],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _ready(proc)
        _kill(proc, after)

    def open_store(path: Path) -> nearrec.Store:
        # writable: its log recovered as the next feeder's open recovers it; then let go
        s = nearrec.open(path, writable=True)
        s.close()
        return nearrec.open(path)

    return rounds("embedded", cfg, *fresh(root / "embedded"), log, kill_once, open_store)


def through_node(cfg: FeedKillsConfig, root: Path, log: Callable[[str], None]) -> Tally:
    """``nearrec feed`` sending the files to a node, killed; the node goes on."""
    served: dict[str, Any] = {}

    # the command as its console script runs it, once its imports are done: a loaded host
    # takes longer than any fixed head start to start an interpreter
    child = ("import sys, nearrec.cli; print('ready', flush=True); "
             "sys.exit(nearrec.cli.main(sys.argv[1:]))")

    def kill_once(store: Path, deltas: Path, after: float) -> None:
        proc = subprocess.Popen([sys.executable, "-c", child, "feed", str(deltas), "s",
                                 "--remote", served["address"], "--name", FEED],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _ready(proc)
        _kill(proc, after)

    def open_store(path: Path) -> nearrec.Store:
        return nearrec.connect(served["address"], "s")

    store_path, deltas = fresh(root / "node")
    with node(store_path, "s", "--writable", "--tier", "dram") as n:
        served["address"] = n.address
        return rounds("node", cfg, store_path, deltas, log, kill_once, open_store)


def run(cfg: FeedKillsConfig, log: Callable[[str], None] = print) -> list[Record]:
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    records = []
    for system, fn in (("embedded", embedded), ("node", through_node)):
        log(f"{system}: {cfg.kills[system]} kills of a feeder")
        t = fn(cfg, cfg.scratch / "feed-kills", log)
        records.append(Record(
            "feed-kills", "a+q", 0, "random", system, 0.0, 0.0,
            extra={"kills": t.kills, "violations": len(t.violations),
                   "found": t.violations[:20], "files_applied": t.files,
                   "kills_in_flight": t.in_flight, "rounds_finished": t.finished,
                   "seconds": round(t.seconds, 1),
                   "window_s": cfg.window}))
        log(f"{system}: {t.kills} kills, {len(t.violations)} violations, {t.files} files "
            f"applied, {t.in_flight} kills with the cursor moved, {t.finished} rounds that "
            f"ran out of files before the kill")
    return records


def markdown(records: list[Record], command: str) -> str:
    lines = [
        "# A delta feeder killed with SIGKILL, the store checked after every kill",
        "",
        f"`{command}`",
        "",
        "Each kill comes at a random moment while a feeder applies delta files (pyarrow's "
        "Arrow IPC: fp32 rows upserted and deleted, int8 rows given encoded); the store is then "
        "opened again (or asked through its node) and held to the files its feed's cursor names, "
        "applied in order, bit for bit: none twice, none in part, the cursor never back "
        "(`bench/python/nearrec_bench/feed.py`).",
        "",
        "| feeder | kills | violations | files applied | rounds that applied a file | rounds "
        "that ran out of files before the kill | seconds |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        e = r.extra
        lines.append(f"| {r.system} | {e['kills']} | {e['violations']} | {e['files_applied']:,} "
                     f"| {e['kills_in_flight']} | {e['rounds_finished']} | {e['seconds']} |")
    found = [f for r in records for f in r.extra["found"]]
    if found:
        lines += ["", "Violations:", ""] + [f"- {f}" for f in found]
    return "\n".join(lines) + "\n"


HARNESSES = {"feed-kills": Harness(FeedKillsConfig, FeedKillsConfig.quick,
                                   {"--scratch": "scratch"}, run, markdown)}


if __name__ == "__main__":  # pragma: no cover - `nearrec bench feed-kills` is the way in
    print(json.dumps([r.extra for r in run(FeedKillsConfig.quick())], indent=1))
