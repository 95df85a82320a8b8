"""One thread pooling RMC1's shapes (fp32, dim 32, 80 lookups a bag, 8 tables of 1M rows) with
nearrec or with ``nn.EmbeddingBag``, for counting instructions per lookup under callgrind, where
``perf stat`` has no hardware counters (this VM):

    valgrind --tool=callgrind --callgrind-out-file=cg.out \\
        python bench/sls_callgrind.py nearrec|torch --reps 4
    callgrind_annotate --inclusive=yes --threshold=100 cg.out | grep -E 'fast::run|at::native::embedding_bag'

Divide the bag loop's inclusive count by the lookups printed (the warm-up calls included). Run
without valgrind it prints the speed too, for a rough look (the benchmark is ``nearrec bench sls``).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

import nearrec


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("system", choices=["nearrec", "torch", "torch-shared"])
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--dist", choices=["uniform", "zipf1.05"], default="uniform")
    p.add_argument("--scratch", default="bench/scratch/sls-callgrind")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    spec = nearrec.model_spec("rmc1")
    rows = 1_000_000
    path = Path(args.scratch)
    if not path.exists():
        nearrec.build(path, "rmc1", rows=rows, seed=1, progress=False)
    store = nearrec.open(path, threads=1)
    names = list(store.tables)
    lookups, batch = spec.lookups, args.batch
    rng = np.random.default_rng(0)
    n = batch * lookups
    if args.dist == "uniform":
        sets = [[rng.integers(0, rows, n, dtype=np.int64) for _ in names] for _ in range(4)]
    else:
        from nearrec_bench.sls import zipf_rows

        perm = rng.permutation(rows)
        sets = [[zipf_rows(rng, rows, 1.05, n, perm).astype(np.int64) for _ in names]
                for _ in range(4)]
    offsets = np.arange(0, n, lookups, dtype=np.int64)
    if args.system == "nearrec":
        reqs = [[nearrec.TableLookup(t, i, offsets) for t, i in zip(names, s, strict=True)]
                for s in sets]

        def call(k: int) -> object:
            return store.lookup_many(reqs[k % 4])
    else:
        shared = args.system == "torch-shared"
        bags = []
        for t in names:
            w = torch.from_numpy(np.array(store.table_array(t), copy=not shared))
            bags.append(torch.nn.EmbeddingBag.from_pretrained(w, mode="sum", freeze=True))
        t_idx = [[torch.from_numpy(i) for i in s] for s in sets]
        t_off = torch.from_numpy(offsets)

        def call(k: int) -> object:
            with torch.no_grad():
                return [b(x, t_off) for b, x in zip(bags, t_idx[k % 4], strict=True)]
    for k in range(4):
        call(k)
    start = time.perf_counter()
    for k in range(args.reps):
        call(k)
    took = time.perf_counter() - start
    total = (4 + args.reps) * n * len(names)
    print(f"{args.system} {args.dist}: {total:,} lookups (warm-up included); "
          f"{took / (args.reps * n * len(names)) * 1e9:.2f} ns a lookup "
          f"(pid {os.getpid()})")


if __name__ == "__main__":
    main()
