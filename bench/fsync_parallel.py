"""What this machine's disk takes to sync 1, 2 or 3 files at once (4 KiB written to each, then
``fdatasync`` on a thread each): the bound of a step of a two-phase write whose replicas share
the disk (``bench cluster-write``).

    python bench/fsync_parallel.py [--rounds 150] [--dir bench/scratch]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--dir", type=Path, default=Path("bench/scratch"))
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    paths = [args.dir / f"fsync-{i}" for i in range(3)]
    fds = [os.open(p, os.O_WRONLY | os.O_CREAT, 0o644) for p in paths]

    def sync(fd: int) -> None:
        os.write(fd, b"x" * 4096)
        os.fdatasync(fd)

    try:
        for n in (1, 2, 3):
            took = []
            for _ in range(args.rounds):
                threads = [threading.Thread(target=sync, args=(fds[i],)) for i in range(n)]
                t = time.perf_counter()
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
                took.append(time.perf_counter() - t)
            took.sort()
            print(f"{n} files synced at once: p50 {1e6 * statistics.median(took):,.0f} µs, "
                  f"p90 {1e6 * took[int(0.9 * len(took))]:,.0f} µs")
    finally:
        for fd, p in zip(fds, paths, strict=True):
            os.close(fd)
            p.unlink()


if __name__ == "__main__":
    main()
