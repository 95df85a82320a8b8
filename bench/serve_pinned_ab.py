"""Before / after of `nearrec bench serve-pinned` on DRAM-resident tables: the harness run
alternately on an older build and on this tree, each run a fresh process; node ÷ embedded is
taken within each run (the machine drifts between runs), then compared after ÷ before.

    python bench/serve_pinned_ab.py --before-path /tmp/before/python --before-rev 50f61e86 \
        --runs 3 --rounds 3 --name serve-pinned-issue67-ab

``--before-path`` is the ``PYTHONPATH`` of the older build (its package and extension, built in
a git worktree); the after runs use this tree's installed package. Recorded as JSON + Markdown
under ``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHILD = """
import json, sys
from dataclasses import replace
from nearrec_bench.serve import pinned_config, run_pinned
cfg = replace(pinned_config(), tiers=("dram",), rounds=int(sys.argv[1]))
recs = run_pinned(cfg, log=lambda m: print(m, file=sys.stderr))
print(json.dumps({r.system: r.extra["rounds"] for r in recs}))
"""


def run_once(side: str, args: argparse.Namespace) -> dict[str, list[float]]:
    env = dict(os.environ)
    if side == "before":
        env["PYTHONPATH"] = os.pathsep.join([args.before_path, "bench/python"])
    out = subprocess.run([sys.executable, "-c", CHILD, str(args.rounds)], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{side}: {out.stderr}")
    got: dict[str, list[float]] = json.loads(out.stdout.strip().splitlines()[-1])
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before-path", required=True)
    p.add_argument("--before-rev", required=True)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--name", required=True)
    args = p.parse_args()
    runs: dict[str, list[dict[str, list[float]]]] = {"before": [], "after": []}
    for i in range(args.runs):
        for side in ("before", "after"):
            got = run_once(side, args)
            runs[side].append(got)
            ratio = statistics.median(got["node"]) / statistics.median(got["embedded"])
            print(f"[{side} {i}] node {statistics.median(got['node']):,.0f} embedded "
                  f"{statistics.median(got['embedded']):,.0f} requests/s: {ratio:.2f}x",
                  file=sys.stderr, flush=True)
    summary: dict[str, dict[str, Any]] = {}
    for side, side_runs in runs.items():
        node = [r for g in side_runs for r in g["node"]]
        emb = [r for g in side_runs for r in g["embedded"]]
        by_round = [n / e for g in side_runs for n, e in zip(g["node"], g["embedded"], strict=True)]
        summary[side] = {"node": statistics.median(node), "embedded": statistics.median(emb),
                         "ratio": statistics.median(node) / statistics.median(emb),
                         "by_round": by_round, "node_rounds": node, "embedded_rounds": emb}
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, check=False).stdout.strip()
    cmd = " ".join(["python", "bench/serve_pinned_ab.py", *sys.argv[1:]])
    res = Path("bench/results")
    (res / f"{args.name}.json").write_text(json.dumps(
        {"command": cmd, "before": args.before_rev, "after": rev,
         "date": time.strftime("%Y-%m-%d"), "runs": runs, "summary": summary}, indent=1))
    lines = [f"<!-- produced by: {cmd} -->",
             f"Command: `{cmd}` ({time.strftime('%Y-%m-%d')}; before {args.before_rev}, "
             f"after {rev})", "",
             f"`bench serve-pinned`'s DRAM tier (8 tables × 250,000 rows, dim 32; 64 bags × 20 "
             f"Zipf ids a table), {args.runs} runs of each build alternating, {args.rounds} "
             f"rounds a run (node and embedded interleaved round by round): answered "
             f"requests/s past saturation, the system under test alone on CPU 1.", "",
             "| build | node requests/s | embedded requests/s | node ÷ embedded | "
             "by round (min–median–max) |", "|---|---:|---:|---:|---:|"]
    for side, s in summary.items():
        r = sorted(s["by_round"])
        lines.append(f"| {side} | {s['node']:,.0f} | {s['embedded']:,.0f} | "
                     f"**{s['ratio']:.2f}×** | {r[0]:.2f}–{statistics.median(r):.2f}–"
                     f"{r[-1]:.2f}× |")
    lines += ["", f"After ÷ before, node ÷ embedded: "
              f"**{summary['after']['ratio'] / summary['before']['ratio']:.2f}×**; the node's "
              f"own requests/s after ÷ before: "
              f"{summary['after']['node'] / summary['before']['node']:.2f}×."]
    (res / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
