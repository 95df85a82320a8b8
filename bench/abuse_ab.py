"""A/B of the node's fair CPU turns in `nearrec bench abuse`: each round runs the three phases
once with the default (one turn per core, in fair order) and once with `--cpu-turns 64` (no
bound: the kernel's time-slicing), alternating. `python bench/abuse_ab.py ROUNDS PHASE_S`; prints
each round's p50 / p99 (ms) and, last, everything as JSON."""

import json
import sys
from dataclasses import replace

from nearrec_bench.abuse import AbuseConfig, run


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    phase_s = float(sys.argv[2]) if len(sys.argv) > 2 else 15.0
    base = AbuseConfig(phase_s=phase_s, rounds=1)
    out: dict[str, list[dict[str, tuple[float, float]]]] = {"fair": [], "unbounded": []}
    for r in range(rounds):
        for name, flags in (("fair", ()), ("unbounded", ("--cpu-turns", "64"))):
            recs = run(replace(base, node_flags=flags), log=lambda m: None)
            row = {rec.system.split(", ")[-1]: (rec.p50_us, rec.p99_us) for rec in recs}
            out[name].append(row)
            said = {k: (round(v[0] / 1e3, 2), round(v[1] / 1e3, 2)) for k, v in row.items()}
            print(r, name, said, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
