"""The node at saturation on a core of its own, recorded with ``perf``: serve-pinned's DRAM
tier, its load generator on CPU 0 and the node on CPU 1, ``perf record --call-graph dwarf``
of the node's process for ``--seconds`` once the load has run a second.

    python bench/profile_node.py --out /tmp/node.perf.data [--seconds 8]
    perf report -i /tmp/node.perf.data --no-children --sort symbol

``--alloc`` prints, from the recording, the share of the node's samples in ``malloc`` /
``free`` (and their kin) and which function of the node's path called them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from nearrec_bench.serve import _tiers, pinned_command, pinned_config
from nearrec_bench.served import node

# glibc's entry points; its internals (`_int_*`, `tcache_*`) are matched by prefix below
ALLOCATOR = ("malloc", "free", "realloc", "calloc", "cfree", "malloc_consolidate",
             "unlink_chunk", "__GI___libc_free", "__GI___libc_malloc", "__libc_malloc",
             "_mid_memalign", "__libc_calloc", "__GI___libc_realloc")
OWNERS = ("nearrec", "tonic", "h2::", "hyper", "tower", "axum", "http::", "http_body",
          "bytes::", "prost", "tokio")


def record(out: Path, seconds: float) -> float:
    cfg = replace(pinned_config(), tiers=("dram",), rounds=1,
                  saturation_seconds=seconds + 4)
    tier = next(_tiers(cfg, print))
    with node(tier.path, "s", *tier.flags, cpus={1}) as served:
        load = subprocess.Popen(pinned_command(cfg, tier, "pooled", served.address, 7),
                                stdout=subprocess.PIPE, text=True)
        time.sleep(2.0)  # the child's warm-up run, then its counted round
        subprocess.run(["perf", "record", "-q", "--call-graph", "dwarf", "-F", "499",
                        "-p", str(served.pid), "-o", str(out), "--", "sleep", str(seconds)],
                       check=True)
        rates, _ = load.communicate()
        rate: float = json.loads(rates.strip().splitlines()[-1])[0]
        print(f"the node answered {rate:,.0f} requests/s in the round recorded")
        return rate


def allocation(data: Path) -> dict[str, Any]:
    """The allocator's share of the samples, by the first caller outside it."""
    script = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym"],
                            capture_output=True, text=True, check=True).stdout
    total, inside, callers, owners = 0, 0, Counter[str](), Counter[str]()
    for sample in script.split("\n\n"):
        # "ADDRESS SYMBOL", an inlined call's frame marked "(inlined)"
        frames = [f.split(None, 1)[-1].removesuffix(" (inlined)").split("+0x")[0]
                  for f in sample.strip().splitlines() if f.strip()]
        if not frames:
            continue
        total += 1
        if frames[0] not in ALLOCATOR and not frames[0].startswith(("_int_", "tcache")):
            continue
        inside += 1
        # the first frame that names its crate: the node's own (nearrec) or the transport's
        caller = next((f for f in frames if any(c in f for c in OWNERS)), "?")
        owner = "ours" if "nearrec" in caller else "transport" if caller != "?" else "?"
        owners[owner] += 1
        callers[caller[:140]] += 1
    print(f"{total} samples; the allocator {inside} ({100 * inside / max(total, 1):.1f} %)")
    print(", ".join(f"{k} {100 * n / max(total, 1):.1f} %" for k, n in owners.most_common()))
    for caller, n in callers.most_common(25):
        print(f"{100 * n / total:6.2f} %  {caller}")
    return {"samples": total, "allocator_share": inside / max(total, 1),
            "by_owner": {k: n / max(total, 1) for k, n in owners.items()},
            "callers": {k: n / max(total, 1) for k, n in callers.most_common(25)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("node.perf.data"))
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--json", type=Path, help="append the run's figures to this JSON list")
    parser.add_argument("--alloc", action="store_true",
                        help="only read an existing recording for the allocator's share")
    args = parser.parse_args()
    rate = None if args.alloc else record(args.out, args.seconds)
    got = {"requests_per_s": rate, "seconds": args.seconds, **allocation(args.out)}
    if args.json:
        runs = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps([*runs, got], indent=1) + "\n")


if __name__ == "__main__":
    main()
