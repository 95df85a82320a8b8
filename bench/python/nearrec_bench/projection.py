"""``nearrec bench cluster-projection``: a **simulated** projection of a sharded store past this
two-core machine — 1 to 64 nodes, 1 to 100 TB of tables — showing where the SSDs, the network
or the CPU binds. Nothing here is measured except the inputs it names; every output is a model.

The model, per batch (RMC1's shape: ``tables`` tables of dim ``dim`` fp32, ``pooling`` ids a
bag, ``batch`` samples; ids drawn Zipf(``zipf``) over each table's rows):

- **DRAM hits**: each node keeps its shard's hottest rows in ``dram_per_node`` bytes; the share
  of lookups they serve is the Zipf mass of the top rows, H(k, s) / H(n, s) (generalised
  harmonic numbers, by their integral approximation).
- **SSD**: every miss is one device read; a node has ``drives`` drives, each reading at the
  flash device model's rate (``nearrec.simulate.read_rate``, preset ``device``, queue depth 64,
  ``read_bytes``: simulated).
- **CPU**: ``a`` µs per batch for its ids wherever they are, plus ``b`` µs per sub-request (a
  shard a batch reaches: table-wise, every shard holding one of its tables), plus ``miss_cpu_us``
  per device read; ``cores`` cores a node. ``a`` and ``b`` are fitted on this machine's
  measured ``sharded.table.1`` and ``sharded.table.4`` (``bench/results/cluster.json``: 2
  cores running client, router and nodes, so the whole per-batch cost is charged to the nodes:
  conservative), and checked against the measured ``sharded.table.2`` that the fit did not
  see. ``miss_cpu_us`` is ``bench ssd-cost``'s measured 0.63 µs a read.
- **Network**: each node's link carries its share of the batch's ids in (8 B each) and its
  partial results out (``batch × tables × dim × 4`` B over the shards); ``nic_gbit`` a node.
- The cluster's rate is the smallest of the three bounds, each N nodes' worth; the binding one
  is named. A cut whose shard would not fit the node's drives (``ssd_tb_per_node``) is marked.

Change any input in the config; the Markdown lists them all beside the table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from .harness import Harness
from .report import Record


@dataclass
class ProjectionConfig:
    tables: int = 8
    dim: int = 32
    pooling: int = 80
    batch: int = 64
    zipf: float = 1.05
    nodes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    terabytes: tuple[float, ...] = (1.0, 10.0, 100.0)
    cores: int = 32
    drives: int = 4
    ssd_tb_per_node: float = 30.72
    dram_per_node: int = 256 << 30
    nic_gbit: float = 25.0
    device: str = "rm-ssd"
    read_bytes: int = 4096
    miss_cpu_us: float = 0.634
    measured: Path = Path("bench/results/cluster.json")

    @classmethod
    def quick(cls) -> ProjectionConfig:
        return cls(nodes=(1, 4, 16, 64), terabytes=(1.0, 100.0))


def _harmonic(n: float, s: float) -> float:
    """H(n, s) = Σ_{i ≤ n} i^-s, by the Euler–Maclaurin start of its integral."""
    if n < 1:
        return 0.0
    return (n ** (1 - s) - 1) / (1 - s) + 0.5 * (1 + n ** -s) if s != 1 else math.log(n) + 0.5


def hit_ratio(cached: float, rows: float, s: float) -> float:
    """The Zipf(s) mass of the ``cached`` hottest of ``rows`` rows."""
    if cached >= rows:
        return 1.0
    return _harmonic(cached, s) / _harmonic(rows, s)


def _fit(path: Path, batch: int) -> tuple[float, float, dict[int, tuple[float, float]]]:
    """``a`` and ``b`` (µs of core time per batch and per sub-request) from the measured
    table-wise points on this machine's 2 cores; each N's (measured, predicted) µs a batch."""
    records = json.loads(path.read_text())["records"]
    per_batch = {}
    for r in records:
        if r["system"].startswith("sharded.table."):
            n = int(r["system"].rsplit(".", 1)[1])
            per_batch[n] = 2 * 1e6 / (r["samples_per_s"] / batch)
    b = (per_batch[4] - per_batch[1]) / 3
    a = per_batch[1] - b
    return a, b, {n: (v, a + n * b) for n, v in sorted(per_batch.items())}


def run(cfg: ProjectionConfig, log: Callable[[str], None] = print) -> list[Record]:
    from nearrec.simulate import read_rate

    a, b, check = _fit(cfg.measured, cfg.batch)
    reads_per_s = read_rate(cfg.device, 64, cfg.read_bytes)
    log(f"fitted on this machine: a = {a:,.0f} µs a batch, b = {b:,.0f} µs a sub-request; "
        f"{cfg.device}: {reads_per_s:,.0f} reads/s a drive (simulated)")
    ids = cfg.batch * cfg.tables * cfg.pooling
    row_bytes = cfg.dim * 4
    out_bytes = cfg.batch * cfg.tables * cfg.dim * 4
    records = []
    for tb in cfg.terabytes:
        total = tb * 1e12
        rows_per_table = total / cfg.tables / row_bytes
        for n in cfg.nodes:
            # table-wise up to one node a table, then each table's rows over n / tables nodes
            # (cut by cost, so each node's slice holds its share of the table's hot rows):
            # either way the cluster's DRAM holds the hottest n × dram / row bytes / tables
            # rows of every table, and every node takes part in every batch
            hit = hit_ratio(n * cfg.dram_per_node / row_bytes / cfg.tables, rows_per_table,
                            cfg.zipf)
            reach = n
            misses = ids * (1 - hit)
            ssd = n * cfg.drives * reads_per_s / misses if misses > 0 else math.inf
            cpu = n * cfg.cores * 1e6 / (a + reach * b + misses * cfg.miss_cpu_us)
            # ids in, partial sums out: one per table, or one per slice of a split table
            wire = ids * 8 + out_bytes * max(1.0, n / cfg.tables)
            net = n * cfg.nic_gbit * 1e9 / 8 / wire
            bounds = {"ssd": ssd, "cpu": cpu, "network": net}
            binding = min(bounds, key=lambda k: bounds[k])
            rate = bounds[binding]
            fits = total / n <= cfg.ssd_tb_per_node * 1e12
            records.append(Record(
                "cluster-projection", "rmc1-shape", cfg.batch, f"zipf{cfg.zipf}",
                f"{n} nodes, {tb:g} TB", samples_per_s=rate * cfg.batch,
                lookups_per_s=rate * ids,
                extra={"nodes": n, "terabytes": tb, "batches_per_s": rate,
                       "binding": binding, "dram_hit_ratio": hit,
                       "bounds_batches_per_s": bounds, "fits_on_drives": fits,
                       "sub_requests": reach, "simulated": True,
                       "fit": {"a_us": a, "b_us": b,
                               "check": {str(k): v for k, v in check.items()}},
                       "drive_reads_per_s": reads_per_s, "config": {
                           k: (str(v) if isinstance(v, Path) else v)
                           for k, v in asdict(cfg).items()}}))
    return records


def markdown(records: list[Record], command: str) -> str:
    e = records[0].extra
    cfg, fit = e["config"], e["fit"]
    lines = [f"Command: `{command}`", "",
             "**Simulated, not measured**: a model of a sharded store on machines this one is "
             "not (`bench/python/nearrec_bench/projection.py` says how). Inputs: "
             f"{cfg['tables']} tables of dim {cfg['dim']} fp32, {cfg['pooling']} ids a bag, "
             f"batches of {cfg['batch']}, Zipf({cfg['zipf']}); a node has {cfg['cores']} cores, "
             f"{cfg['drives']} drives of the flash device model's `{cfg['device']}` "
             f"({e['drive_reads_per_s']:,.0f} reads/s each at queue depth 64, "
             f"{cfg['read_bytes']} B reads: simulated), {cfg['dram_per_node'] / 2**30:,.0f} GiB "
             f"of DRAM for hot rows, a {cfg['nic_gbit']:g} Gbit/s link, "
             f"{cfg['ssd_tb_per_node']:g} TB of drives.", "",
             f"CPU, fitted on this machine's measured table-wise points (2 cores for client, "
             f"router and nodes, all charged to the nodes): a = {fit['a_us']:,.0f} µs a batch, "
             f"b = {fit['b_us']:,.0f} µs a sub-request, and {cfg['miss_cpu_us']} µs a device "
             "read (`bench ssd-cost`). Check on the measured points (µs of core time a batch, "
             "measured vs the fit):", ""]
    lines.append(" · ".join(f"{n} shard{'s' if n != '1' else ''}: {m:,.0f} vs {p:,.0f}"
                            f"{' (not fitted on)' if n == '2' else ''}"
                            for n, (m, p) in fit["check"].items()))
    lines += ["", "| nodes | TB | DRAM hit | batches/s (binding) | SSD / CPU / network bound | "
              "fits |", "|---:|---:|---:|---:|---:|---|"]
    for r in records:
        x = r.extra
        bd = x["bounds_batches_per_s"]
        lines.append(f"| {x['nodes']} | {x['terabytes']:g} | {x['dram_hit_ratio']:.1%} | "
                     f"{x['batches_per_s']:,.0f} ({x['binding']}) | {bd['ssd']:,.0f} / "
                     f"{bd['cpu']:,.0f} / {bd['network']:,.0f} | "
                     f"{'yes' if x['fits_on_drives'] else 'no: shard > drives'} |")
    return "\n".join(lines) + "\n"


#: ``nearrec bench cluster-projection``
HARNESSES = {"cluster-projection": Harness(ProjectionConfig, ProjectionConfig.quick, {},
                                           run, markdown)}
