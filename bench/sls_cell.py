"""One cell of ``nearrec bench sls`` (Zipf 1.05, as ``--quick`` builds it: 200,000-row tables by
default) served by the store alone in a process of its own — no peers before it, no harness — for
telling a change in the store from a change in the harness's process:

    python bench/sls_cell.py rmc3 --batch 64 --seconds 2

Prints the median call's samples/s and which ``nearrec`` package served it (alternate it with an
older build on ``PYTHONPATH``). A diagnostic, not a result: the benchmark records those.

``--torch`` times ``nn.EmbeddingBag`` (one a table, its own copy of the rows, as ``bench sls``'s
peer) on the same bags, alternated with the store round by round; ``--rows-used 0,64`` serves
the same bags a second time with every id folded into a table's first 64 rows (``id % 64``), so
that every row sits in the caches: what a lookup costs with no memory to wait for, the compute
bound the full cell is measured against (issue 67, item 5). ``--name`` records JSON + Markdown
under ``bench/results``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import nearrec
from nearrec_bench.report import environment
from nearrec_bench.sls import _time_calls, embedding_bags, zipf_rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="rmc1, rmc2, rmc3, ...")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rows", type=int, default=200_000, help="rows a table")
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--torch", action="store_true", help="time nn.EmbeddingBag beside it")
    p.add_argument("--rows-used", default="0",
                   help="comma-separated: 0 serves the ids as drawn, K folds them into K rows")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="pooling threads (0: every core)")
    p.add_argument("--scratch", type=Path, default=Path("bench/scratch"))
    p.add_argument("--name", default="", help="record bench/results/NAME.{json,md}")
    args = p.parse_args()
    path = args.scratch / f"sls-cell-{args.model}-{args.rows}"
    if not path.exists():
        nearrec.build(path, args.model, rows=args.rows, seed=1, progress=False)
    threads = args.threads or os.cpu_count() or 1
    store = nearrec.open(path, threads=threads)
    names = list(store.tables)
    lookups = nearrec.model_spec(args.model).lookups
    n = args.batch * lookups
    rng = np.random.default_rng(0)
    perms = [rng.permutation(args.rows) for _ in names]
    sets = [[zipf_rows(rng, args.rows, 1.05, n, perm).astype(np.int64) for perm in perms]
            for _ in range(8)]
    offsets = np.arange(0, n, lookups, dtype=np.int64)
    systems: dict[str, Any] = {"nearrec": None}
    if args.torch:
        import torch

        torch.set_num_threads(threads)
        systems["torch.EmbeddingBag"] = embedding_bags(
            [torch.from_numpy(store.table_array(t)) for t in names])
    used = [int(k) for k in args.rows_used.split(",")]
    got: dict[str, list[float]] = {}
    for r in range(args.rounds):
        for k in used:
            folded = [[ids % k if k else ids for ids in s] for s in sets]
            for system, peer in systems.items():
                call = (_store_calls(store, names, folded, offsets) if peer is None
                        else _torch_calls(peer, folded, offsets))
                for i in range(50):
                    call(i % len(sets))
                took = _time_calls(call, args.seconds, len(sets))
                rate = args.batch / float(np.median(took))
                got.setdefault(f"{system} rows_used={k}", []).append(rate)
                print(f"round {r} {args.model} zipf1.05 batch {args.batch} rows {args.rows} "
                      f"rows_used {k or 'all'} {system}: {rate:,.0f} samples/s, "
                      f"{1e9 * threads / (rate * lookups * len(names)):.2f} ns a lookup a "
                      f"thread ({threads} threads; median of {len(took):,} calls)", flush=True)
    if args.name:
        record(args, got, threads, lookups * len(names))


def _store_calls(store: nearrec.Store, names: list[str], sets: list[list[np.ndarray]],
                 offsets: np.ndarray) -> Callable[[int], None]:
    reqs = [[nearrec.TableLookup(t, i, offsets) for t, i in zip(names, s, strict=True)]
            for s in sets]
    def call(i: int) -> None:
        store.lookup_many(reqs[i])

    return call


def _torch_calls(bags: list[Any], sets: list[list[np.ndarray]],
                 offsets: np.ndarray) -> Callable[[int], None]:
    import torch

    tensors = [[torch.from_numpy(ids) for ids in s] for s in sets]
    offs = torch.from_numpy(offsets)

    def call(i: int) -> None:
        with torch.inference_mode():
            torch.cat([b(ids, offs) for b, ids in zip(bags, tensors[i], strict=True)], dim=1)

    return call


def record(args: argparse.Namespace, got: dict[str, list[float]], threads: int,
           per_sample: int) -> None:
    command = (f"python bench/sls_cell.py {args.model} --batch {args.batch} --rows {args.rows} "
               f"--seconds {args.seconds} --rows-used {args.rows_used} --rounds {args.rounds} "
               f"--threads {threads}"
               + (" --torch" if args.torch else "") + f" --name {args.name}")
    out = {"command": command, "environment": environment(), "threads": threads,
           "lookups_per_sample": per_sample, "samples_per_s": got}
    results = Path("bench/results")
    (results / f"{args.name}.json").write_text(json.dumps(out, indent=1))
    lines = [f"<!-- produced by: {command} -->", f"Command: `{command}`", "",
             f"{args.model}, Zipf 1.05, batch {args.batch}, {args.rows:,} rows a table, "
             f"{threads} threads; rounds alternate the systems. rows_used K: every id folded "
             "into a table's first K rows (all in the caches); all: as drawn.", "",
             "| system | rows used | samples/s (median of rounds) | rounds (min–max) "
             "| ns a lookup a thread |", "|---|---|---:|---:|---:|"]
    for key, rates in got.items():
        system, k = key.split(" rows_used=")
        rate = statistics.median(rates)
        lines.append(f"| {system} | {k if k != '0' else 'all'} | {rate:,.0f} | "
                     f"{min(rates):,.0f}–{max(rates):,.0f} | "
                     f"{1e9 * threads / (rate * per_sample):.2f} |")
    (results / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
