"""The GEMM crates against PyTorch's ``nn.Linear`` at the dense layers' shapes, alternated in
one session; the medians go to ``bench/results/gemm-compare.{json,md}``.

    python bench/gemm/run.py [--runs 3] [--batches 16,64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def torch_linear(shapes: list[tuple[int, int, int]]) -> list[float]:
    import torch

    torch.set_num_threads(2)
    out = []
    for m, k, n in shapes:
        lin, x = torch.nn.Linear(k, n), torch.randn(m, k)
        with torch.no_grad():
            for _ in range(20):
                lin(x)
            runs = []
            for _ in range(9):
                t = time.perf_counter()
                for _ in range(100):
                    lin(x)
                runs.append((time.perf_counter() - t) / 100)
        out.append(2 * m * k * n / statistics.median(runs) / 1e9)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--batches", default="16,64", help="the products' rows (m), comma-separated")
    p.add_argument("--out", default="bench/results")
    args = p.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q"], cwd=HERE, check=True)
    exe = HERE / "target" / "release" / "gemm-compare"
    rows: dict[tuple[int, int, int], dict[str, list[float]]] = {}
    for _ in range(args.runs):
        lines = subprocess.run([exe, *args.batches.split(",")], check=True, capture_output=True, text=True).stdout
        got = [json.loads(line) for line in lines.splitlines()]
        shapes = [(g["m"], g["k"], g["n"]) for g in got]
        for g, t in zip(got, torch_linear(shapes), strict=True):
            cell = rows.setdefault((g["m"], g["k"], g["n"]), {})
            for name, v in g.items():
                if name not in "mkn":
                    cell.setdefault(name, []).append(v)
            cell.setdefault("torch.linear.2t", []).append(t)
    command = f"python bench/gemm/run.py --runs {args.runs} --batches {args.batches}"
    records = [{"m": m, "k": k, "n": n, **{s: {"median_gflops": statistics.median(v),
                                              "runs": [round(x, 1) for x in v]}
                                          for s, v in cell.items()}}
               for (m, k, n), cell in rows.items()]
    out = Path(args.out)
    (out / "gemm-compare.json").write_text(json.dumps({"command": command, "records": records},
                                                      indent=1) + "\n")
    systems = list(next(iter(rows.values())))
    md = [f"<!-- produced by: {command} -->",
          "# GEMM at the dense layers' shapes: GFLOP/s, two threads unless `1t`",
          "", f"Command: `{command}` (median of the runs; each run a median of nine timings of "
          "100 products; the spread is the runs' range).", "",
          "| m × k × n | " + " | ".join(systems) + " |",
          "|---|" + "---:|" * len(systems)]
    for (m, k, n), cell in rows.items():
        md.append(f"| {m} × {k} × {n} | " + " | ".join(
            f"{statistics.median(cell[s]):.0f} ({min(cell[s]):.0f}–{max(cell[s]):.0f})"
            for s in systems) + " |")
    (out / "gemm-compare.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    sys.exit(main())
