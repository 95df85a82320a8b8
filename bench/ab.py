"""Before / after: one ``nearrec bench WHAT --quick`` harness run alternately on an older build
and on this tree, side by side in one session, recorded as JSON + Markdown under
``bench/results/``. The machine drifts between runs, so each system is also divided by a peer
measured in the same run (torch), and the fair figure is that ratio after ÷ before.

    python bench/ab.py sls --before-path /work/wt-old/python --before-rev de0f738 \
        --peer torch.EmbeddingBag --runs 3 --name sls-issue16-ab

``--before-path`` is the ``PYTHONPATH`` of the older build (its package and extension, built in
a git worktree); the after runs use this tree's installed package.
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


def run_once(what: str, side: str, i: int, args: argparse.Namespace) -> list[dict]:
    out = Path(args.tmp) / what / f"{side}-{i}"
    env = dict(os.environ)
    if side == "before":
        env["PYTHONPATH"] = args.before_path
    cmd = [sys.executable, "-m", "nearrec.cli", "bench", what, "--quick", "--out", str(out),
           "--scratch", str(Path(args.tmp) / "scratch")]
    print(f"[{side} {i}] {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    js = out / f"{what}-quick.json"
    return list(json.loads(js.read_text())["records"])


def cells(records: list[dict]) -> dict[tuple, dict[str, float]]:
    out: dict[tuple, dict[str, float]] = {}
    for r in records:
        if r.get("batch"):
            # a harness of several kinds of record (`serve-saturation`, `serve-load`, ...)
            # keeps them apart by kind
            kind = r.get("bench", "")
            dist = r.get("dist", "-")
            key = (r["model"], f"{kind} {dist}" if "-" in kind else dist, r["batch"])
            out.setdefault(key, {})[r["system"]] = r["samples_per_s"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", help="the harness: sls, e2e, ...")
    p.add_argument("--before-path", required=True)
    p.add_argument("--before-rev", required=True, help="the commit the before build is of")
    p.add_argument("--peer", required=True, help="the system every ratio is taken against")
    p.add_argument("--systems", default="nearrec", help="comma-separated systems to compare")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--name", required=True)
    p.add_argument("--tmp", default="bench/scratch/ab")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    systems = args.systems.split(",")
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for i in range(args.runs):
        for side in ("before", "after"):
            runs[side].append({"time": time.strftime("%H:%M:%S"),
                               "records": run_once(args.what, side, i, args)})
    table: list[dict] = []
    keys = sorted({k for side in runs.values() for r in side for k in cells(r["records"])},
                  key=str)
    for key in keys:
        for system in systems:
            row: dict = {"model": key[0], "dist": key[1], "batch": key[2], "system": system}
            for side in ("before", "after"):
                got = [cells(r["records"]).get(key, {}) for r in runs[side]]
                vals = [g[system] for g in got if system in g]
                rel = [g[system] / g[args.peer] for g in got
                       if system in g and g.get(args.peer)]
                row[side] = statistics.median(vals) if vals else None
                row[f"{side}_vs_peer"] = statistics.median(rel) if rel else None
                row[f"{side}_peer"] = statistics.median(
                    [g[args.peer] for g in got if g.get(args.peer)] or [0.0])
            if row["before"] and row["after"]:
                row["after_over_before"] = row["after"] / row["before"]
            if row["before_vs_peer"] and row["after_vs_peer"]:
                row["fair"] = row["after_vs_peer"] / row["before_vs_peer"]
            table.append(row)
    command = "python bench/ab.py " + " ".join(sys.argv[1:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(
        {"command": command, "before_rev": args.before_rev, "table": table, "runs": runs},
        indent=1))
    lines = [f"<!-- produced by: {command} -->",
             f"Command: `{command}` — `nearrec bench {args.what} --quick` run {args.runs} times on "
             f"the build of `{args.before_rev}` (before) and {args.runs} times on this tree "
             f"(after), alternating, in one session. Samples/s are medians over the runs; "
             f"`÷ {args.peer}` divides by the peer measured in the same run, and `fair` is that "
             f"ratio after ÷ before (the machine drifts between runs: the peer, the same code in "
             f"both, moved as the `peer after ÷ before` column shows).", "",
             "| model | dist | batch | system | before | after | after ÷ before | "
             "peer after ÷ before | fair |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in table:
        def f(x: float | None, fmt: str = ",.0f") -> str:
            return "—" if x is None else format(x, fmt)
        peer = r["after_peer"] / r["before_peer"] if r["before_peer"] else None
        lines.append(f"| {r['model']} | {r['dist']} | {r['batch']} | {r['system']} | "
                     f"{f(r['before'])} | {f(r['after'])} | {f(r.get('after_over_before'), '.2f')}"
                     f" | {f(peer, '.2f')} | {f(r.get('fair'), '.2f')} |")
    fair = [r["fair"] for r in table if r.get("fair")]
    if fair:
        lines += ["", f"Median fair ratio over the cells: {statistics.median(fair):.2f} "
                  f"(min {min(fair):.2f}, max {max(fair):.2f})."]
    (out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
