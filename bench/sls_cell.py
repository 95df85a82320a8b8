"""One cell of ``nearrec bench sls`` (Zipf 1.05 over 200,000-row tables, as ``--quick`` builds
them) served by the store alone in a process of its own — no peers before it, no harness — for
telling a change in the store from a change in the harness's process:

    python bench/sls_cell.py rmc3 --batch 64 --seconds 2

Prints the median call's samples/s and which ``nearrec`` package served it (alternate it with an
older build on ``PYTHONPATH``). A diagnostic, not a result: the benchmark records those.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import nearrec
from nearrec_bench.sls import _time_calls, zipf_rows

ROWS = 200_000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="rmc1, rmc2, rmc3, ...")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--scratch", type=Path, default=Path("bench/scratch"))
    args = p.parse_args()
    path = args.scratch / f"sls-cell-{args.model}-{ROWS}"
    if not path.exists():
        nearrec.build(path, args.model, rows=ROWS, seed=1, progress=False)
    store = nearrec.open(path)
    names = list(store.tables)
    lookups = nearrec.model_spec(args.model).lookups
    n = args.batch * lookups
    rng = np.random.default_rng(0)
    perms = [rng.permutation(ROWS) for _ in names]
    sets = [[zipf_rows(rng, ROWS, 1.05, n, perm).astype(np.int64) for perm in perms]
            for _ in range(8)]
    offsets = np.arange(0, n, lookups, dtype=np.int64)
    reqs = [[nearrec.TableLookup(t, i, offsets) for t, i in zip(names, s, strict=True)]
            for s in sets]
    for i in range(200):
        store.lookup_many(reqs[i % len(reqs)])
    took = _time_calls(lambda i: store.lookup_many(reqs[i]), args.seconds, len(reqs))
    print(f"{args.model} zipf1.05 batch {args.batch}: {args.batch / np.median(took):,.0f} "
          f"samples/s (median of {len(took):,} calls; nearrec from {nearrec.__file__})")


if __name__ == "__main__":
    main()
