"""``nearrec bench keyed``: keyed tables (rows by 64-bit ids) side by side, on the same requests:

- ``keyed``: :class:`nearrec.KeyedTable` pooling bags of ids (one caller thread, then two);
- ``dram.rows``: the DRAM tier pooling the same rows by their row numbers (what the id lookup
  costs on top of pooling);
- ``torch.searchsorted``: what a PyTorch user does without a hash table: ids mapped to rows with
  ``torch.searchsorted`` over the sorted ids, then ``nn.EmbeddingBag``.

Ids are random 64-bit values; requests draw them Zipf(1.05) over the table.
"""

from __future__ import annotations

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

from .harness import Harness
from .report import Record


@dataclass
class KeyedBenchConfig:
    rows: int = 1_000_000
    dim: int = 32
    batch: int = 256
    pooling: int = 80
    batches: int = 40
    rounds: int = 5
    seed: int = 0
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> KeyedBenchConfig:
        return cls(rows=100_000, batches=10, rounds=5)


def _time(fn: Callable[[int], Any], batches: int, threads: int = 1) -> float:
    """Seconds to serve `batches` batches split over `threads` caller threads."""
    def work(t: int) -> None:
        for b in range(t, batches, threads):
            fn(b)

    start = time.perf_counter()
    if threads == 1:
        work(0)
    else:
        ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
    return time.perf_counter() - start


def run(cfg: KeyedBenchConfig, log: Callable[[str], None] = print) -> list[Record]:
    import torch

    rng = np.random.default_rng(cfg.seed)
    keys = np.unique(rng.integers(-(2**63), 2**63 - 1, cfg.rows, dtype=np.int64))
    values = rng.standard_normal((len(keys), cfg.dim)).astype(np.float32)
    table = nearrec.KeyedTable.from_arrays("ids", keys, values, capacity=len(keys))
    path = cfg.scratch / f"keyed-{len(keys)}"
    nearrec.from_numpy(path, {"ids": values}, overwrite=True)
    dram = nearrec.open(path, tier="dram")
    tr = nt.zipf(len(keys), cfg.batch * cfg.batches, cfg.pooling, alpha=1.05, seed=cfg.seed)
    rows = [tr.lookup(b * cfg.batch, (b + 1) * cfg.batch) for b in range(cfg.batches)]
    ids = [keys[np.asarray(r.indices)] for r in rows]
    offsets = [np.asarray(r.offsets) for r in rows]
    sorted_keys = torch.from_numpy(keys)  # np.unique sorted them
    bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(values), mode="sum")

    def torch_fn(b: int) -> Any:
        with torch.inference_mode():
            pos = torch.searchsorted(sorted_keys, torch.from_numpy(ids[b]))
            return bag(pos, torch.from_numpy(offsets[b]))

    systems: list[tuple[str, Callable[[int], Any], int]] = [
        ("keyed", lambda b: table.lookup(ids[b], offsets[b]), 1),
        ("keyed.2threads", lambda b: table.lookup(ids[b], offsets[b]), 2),
        ("dram.rows", lambda b: dram.lookup("ids", rows[b].indices, rows[b].offsets), 1),
        ("torch.searchsorted", torch_fn, 1),
    ]
    np.testing.assert_allclose(table.lookup(ids[0], offsets[0]), torch_fn(0).numpy(),
                               rtol=1e-5, atol=1e-5)
    records = []
    lookups = cfg.batch * cfg.pooling * cfg.batches
    for name, fn, threads in systems:
        _time(fn, cfg.batches, threads)  # warm
        rounds = [lookups / _time(fn, cfg.batches, threads) for _ in range(cfg.rounds)]
        med = statistics.median(rounds)
        records.append(Record("keyed", f"{len(keys)}x{cfg.dim}", cfg.batch, "zipf1.05", name,
                              samples_per_s=med / cfg.pooling, lookups_per_s=med,
                              extra={"rounds_lookups_per_s": rounds, "threads": threads}))
        log(f"  {name:<20} {med / 1e6:6.2f} M lookups/s  (rounds "
            + ", ".join(f"{r / 1e6:.2f}" for r in rounds) + ")")
    return records


def markdown(records: list[Record], command: str) -> str:
    from .report import SPREAD_LIMIT, _spread, environment, ratio_text

    env = environment()
    base = next((r for r in records if r.system == "torch.searchsorted"), None)
    lines = [f"# nearrec bench keyed — {env['time']}", "",
             f"Command: `{command}`; machine: {env['cpus']} CPUs, torch {env.get('torch')} "
             f"({env.get('torch_threads')} threads).", "",
             "Pooled lookups of random 64-bit ids (Zipf 1.05 over the table), median of rounds; "
             "spread = (max − min) / 2 of the rounds over the median; a ratio whose rounds spread "
             f"beyond ±{100 * SPREAD_LIMIT:.0f} % (either side) is marked unreliable.", "",
             "| table | batch | system | caller threads | M lookups/s | spread "
             "| ÷ torch.searchsorted |",
             "|---|---|---|---|---|---|---|"]
    def rounds(r: Record) -> Record:  # the lookups' rounds where ratio_text reads them
        return Record(r.bench, r.model, r.batch, r.dist, r.system, r.lookups_per_s, 0.0,
                      extra={"rounds_samples_per_s": r.extra["rounds_lookups_per_s"]})

    for r in records:
        lines.append(f"| {r.model} | {r.batch} | {r.system} | {r.extra['threads']} | "
                     f"{r.lookups_per_s / 1e6:.2f} | {_spread(rounds(r))} | "
                     f"{ratio_text(rounds(r), rounds(base)) if base else '—'} |")
    return "\n".join(lines) + "\n"


#: ``nearrec bench keyed``
HARNESSES = {"keyed": Harness(KeyedBenchConfig, KeyedBenchConfig.quick,
                              {"--rows": "rows", "--scratch": "scratch"}, run, markdown)}


__all__ = ["HARNESSES", "KeyedBenchConfig", "markdown", "run"]
