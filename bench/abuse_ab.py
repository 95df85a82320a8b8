"""A/B of node settings in `nearrec bench abuse`: each round runs the three phases once per
variant, the variants alternating.
`python bench/abuse_ab.py ROUNDS PHASE_S [SCALE] [NAME=FLAGS ...]`
(SCALE: the greedy principal's batches, that many times the good clients', 16 unless given;
FLAGS: the node's flags, space-separated; none given: the fair CPU turns against
`--cpu-turns 64`, no bound); prints each round's p50 / p99 (ms) and, last, everything as JSON."""

import json
import sys
from dataclasses import replace

from nearrec_bench.abuse import AbuseConfig, run

#: the default A/B: one turn per core in fair order, against the kernel's time-slicing
TURNS = {"fair": (), "unbounded": ("--cpu-turns", "64")}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    phase_s = float(sys.argv[2]) if len(sys.argv) > 2 else 15.0
    rest = sys.argv[3:]
    scale = int(rest.pop(0)) if rest and "=" not in rest[0] else 16
    variants = {name: tuple(flags.split()) for name, _, flags in
                (a.partition("=") for a in rest)} or TURNS
    base = AbuseConfig(phase_s=phase_s, rounds=1, greedy_scale=scale)
    out: dict[str, list[dict[str, tuple[float, float]]]] = {name: [] for name in variants}
    for r in range(rounds):
        for name, flags in variants.items():
            recs = run(replace(base, node_flags=flags), log=lambda m: None)
            row = {rec.system.split(", ")[-1]: (rec.p50_us, rec.p99_us) for rec in recs}
            out[name].append(row)
            said = {k: (round(v[0] / 1e3, 2), round(v[1] / 1e3, 2)) for k, v in row.items()}
            print(r, name, said, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
