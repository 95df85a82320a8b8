"""``nearrec bench build``: store build throughput against the disk's sequential write bandwidth,
measured back to back in the same run on the same disk (both: buffered writes + fsync)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nearrec

from . import _native
from .harness import Harness
from .report import Record


@dataclass
class BuildConfig:
    #: bytes each round writes, to the disk and as the store's tables
    table_bytes: int = 4 << 30
    scratch: Path = Path("bench/scratch")

    @classmethod
    def quick(cls) -> BuildConfig:
        return cls(table_bytes=1 << 30)


def run(cfg: BuildConfig, log: Callable[[str], None] = print, model: str = "rmc1",
        repeats: int = 3) -> list[Record]:
    scratch, table_bytes = cfg.scratch, cfg.table_bytes
    scratch.mkdir(parents=True, exist_ok=True)
    records = []
    disk, build = [], []
    for k in range(repeats):
        d = _native.sequential_write(str(scratch), table_bytes)
        disk.append(d["bytes_per_s"])
        path = scratch / "build-bench"
        t = time.perf_counter()
        info = nearrec.build(path, model, table_bytes=table_bytes, seed=k, overwrite=True,
                             progress=False)
        s = time.perf_counter() - t
        build.append(info.total_bytes / s)
        log(f"  round {k}: disk {disk[-1] / 1e9:.2f} GB/s, build {build[-1] / 1e9:.2f} GB/s "
            f"({info.total_bytes / 1e9:.2f} GB in {s:.2f} s)")
        nearrec.remove(path)
    for name, vals in (("limit.seq_write", disk), ("nearrec.build", build)):
        vals = sorted(vals)
        records.append(Record("build", model, 0, "-", name, samples_per_s=0.0, lookups_per_s=0.0,
                              extra={"bytes_per_s": vals[len(vals) // 2],
                                     "rounds_bytes_per_s": vals, "bytes": table_bytes}))
    return records


def markdown(records: list[Record], command: str) -> str:
    by = {r.system: r for r in records}
    disk = by["limit.seq_write"].extra
    build = by["nearrec.build"].extra
    ratio = build["bytes_per_s"] / disk["bytes_per_s"]
    return (f"Command: `{command}`\n\n"
            "| what | median GB/s | rounds GB/s |\n|---|---:|---|\n"
            f"| disk sequential write (16 MiB writes + fsync) | {disk['bytes_per_s'] / 1e9:.2f} | "
            f"{', '.join(f'{v / 1e9:.2f}' for v in disk['rounds_bytes_per_s'])} |\n"
            f"| nearrec build (random init, fsync, atomic commit) | "
            f"{build['bytes_per_s'] / 1e9:.2f} | "
            f"{', '.join(f'{v / 1e9:.2f}' for v in build['rounds_bytes_per_s'])} |\n\n"
            f"Build throughput = **{100 * ratio:.0f} %** of the disk's sequential write "
            f"bandwidth ({build['bytes'] / 2**30:.1f} GiB per round).\n")


#: ``nearrec bench build``
HARNESSES = {"build": Harness(BuildConfig, BuildConfig.quick,
                              {"--table-bytes": "table_bytes", "--scratch": "scratch"},
                              run, markdown)}
