"""``nearrec bench torchrec``: a TorchRec model served as it is. One ``torchrec.models.dlrm.DLRM``
(DeepRecInfra RMC1's shapes: 13 dense features, bottom MLP 128-64-32, dot interaction, top MLP
256-64-1; eight tables of dim 32, one serving two features, 20 lookups per feature, Zipf(1.05)
ids over a random permutation of each table's rows), its forward timed side by side on the same
batches:

- ``torchrec``: the model with TorchRec's own ``EmbeddingBagCollection`` (tables in DRAM: the
  peer a TorchRec user has; TorchRec's open-source build has no SSD path);
- ``nearrec dram``: the same model after ``nearrec.torch.from_torchrec(..., tier="dram")``;
- ``nearrec ssd``: after ``from_torchrec(..., tier="ssd", dram_budget=25 % of the tables)``:
  rows read with direct I/O, row caches in that budget;
- ``+ offload``: the model run whole in the engine (``nearrec.models.offload``: the captured
  dense part next to the embeddings, only the outputs back);
- ``+ pipelined``: ``nearrec.models.infer(model, depth=2)``, the next batches' embeddings read
  while the current batch's MLPs run.

Rounds rotate the systems' order; in a round each system walks on through the trace (its own
cursor, so it never repeats a batch before the trace wraps) for ``seconds``; a cell is the
median of the rounds' samples/s with p50 / p99 per batch over all rounds, and the rounds'
spread. The disk's random-read rate is measured beside the SSD systems in every round. Every
system's outputs are first checked against TorchRec's on the same batch."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import nearrec
from nearrec import trace as nt

from . import _native
from .harness import Harness
from .report import SPREAD_LIMIT, Record, _spread, ratio_text
from .ssd import drop_page_cache

SYSTEMS = ("torchrec", "nearrec dram", "nearrec dram + offload", "nearrec dram + pipelined",
           "nearrec ssd", "nearrec ssd + offload", "nearrec ssd + pipelined")


@dataclass
class TorchRecConfig:
    tables: int = 8
    rows: int = 500_000
    dim: int = 32
    pooling: int = 20
    dense: int = 13
    batches: tuple[int, ...] = (64, 256, 1024)
    #: the SSD systems' DRAM budget, as a share of the tables' bytes
    budget_share: float = 0.25
    alpha: float = 1.05
    #: samples in the trace every system walks through
    samples: int = 60_000
    rounds: int = 5
    seconds: float = 1.0
    #: seconds each SSD system runs before the timed rounds (its caches fill)
    warm_seconds: float = 3.0
    limit_reads: int = 50_000
    threads: int = 2
    seed: int = 0
    scratch: Path = field(default_factory=lambda: Path("bench/scratch"))

    @classmethod
    def quick(cls) -> TorchRecConfig:
        # five short rounds: a median that one slow round cannot move
        return cls(rows=50_000, batches=(64, 512), samples=12_000, rounds=5, seconds=0.2,
                   warm_seconds=1.0, limit_reads=10_000)


def _model(cfg: TorchRecConfig) -> Any:
    import torch
    import torchrec
    from torchrec.models.dlrm import DLRM

    torch.manual_seed(cfg.seed)
    tables = [torchrec.EmbeddingBagConfig(
        name=f"t{i}", embedding_dim=cfg.dim, num_embeddings=cfg.rows,
        feature_names=[f"f{i}"] + (["f_shared"] if i == 0 else [])) for i in range(cfg.tables)]
    return DLRM(embedding_bag_collection=torchrec.EmbeddingBagCollection(tables=tables),
                dense_in_features=cfg.dense, dense_arch_layer_sizes=[128, 64, cfg.dim],
                over_arch_layer_sizes=[256, 64, 1]).eval()


def _batches(cfg: TorchRecConfig, features: list[str], batch: int) -> list[tuple[Any, Any]]:
    """The trace cut into batches: per feature an independent Zipf stream of its table."""
    import torch
    import torchrec

    streams = [nt.generate_table(f, cfg.rows, cfg.pooling, cfg.samples,
                                 nt.Generator.zipf(cfg.alpha), cfg.seed, k).indices
               for k, f in enumerate(features)]
    rng = np.random.default_rng(cfg.seed)
    dense = rng.standard_normal((cfg.samples, cfg.dense), dtype=np.float32)
    out = []
    L = cfg.pooling
    lengths = torch.full((batch * len(features),), L, dtype=torch.int64)
    for lo in range(0, cfg.samples - batch + 1, batch):
        values = np.concatenate([s[lo * L:(lo + batch) * L] for s in streams])
        out.append((torch.from_numpy(dense[lo:lo + batch]),
                    torchrec.KeyedJaggedTensor(keys=features, values=torch.from_numpy(values),
                                               lengths=lengths)))
    return out


class _Walker:
    """A system walking on through the batches from where it stopped: per-batch latencies."""

    def __init__(self, call: Callable[[Any, Any], Any] | None, model: Any, pipelined: bool,
                 batches: list[tuple[Any, Any]]):
        self.call, self.model, self.pipelined, self.batches = call, model, pipelined, batches
        self.at = 0

    def take(self, n: int) -> list[tuple[Any, Any]]:
        out = [self.batches[(self.at + i) % len(self.batches)] for i in range(n)]
        self.at += n
        return out

    def run(self, seconds: float, batches: int = 12) -> tuple[float, list[float]]:
        """Samples/s and per-batch seconds over about ``seconds``, and at least ``batches``
        batches (an SSD batch of 1,024 samples takes a fifth of a second: a round of five would
        be all noise)."""
        import torch

        from nearrec.models import infer

        if self.pipelined:
            # one stream until the time is up; latency from the start of a batch's reads to its
            # output, as infer measures it (a batch read ahead waits its turn)
            start = time.perf_counter()

            def stream() -> Any:
                n = 0
                while time.perf_counter() - start < seconds or n < batches:
                    n += 1
                    yield self.take(1)[0]

            res = infer(self.model, stream(), depth=2)
            return res.samples_per_s, res.latencies
        lat: list[float] = []
        samples = 0
        with torch.inference_mode():
            start = time.perf_counter()
            while time.perf_counter() - start < seconds or len(lat) < batches:
                dense, features = self.take(1)[0]
                t0 = time.perf_counter()
                self.call(dense, features)
                lat.append(time.perf_counter() - t0)
                samples += dense.shape[0]
        return samples / sum(lat), lat


def run(cfg: TorchRecConfig, log: Callable[[str], None] = print) -> list[Record]:
    import torch

    from nearrec.models import offload
    from nearrec.torch import from_torchrec

    torch.set_num_threads(cfg.threads)
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    model = _model(cfg)
    table_bytes = cfg.tables * cfg.rows * cfg.dim * 4
    budget = int(cfg.budget_share * table_bytes)
    log(f"TorchRec DLRM: {cfg.tables} tables x {cfg.rows:,} rows x dim {cfg.dim} "
        f"({table_bytes / 2**20:,.0f} MiB), SSD tier's DRAM budget {budget / 2**20:,.0f} MiB")
    path = cfg.scratch / f"torchrec-dlrm-{cfg.rows}"
    dram = from_torchrec(model, path, overwrite=True, tier="dram", threads=cfg.threads)
    ssd = from_torchrec(model, path.with_name(path.name + "-ssd"), overwrite=True, tier="ssd",
                        dram_budget=budget, threads=cfg.threads)
    ssd_store: Any = ssd.sparse_arch.embedding_bag_collection.store  # type: ignore[union-attr]
    files = [str(path.with_name(path.name + "-ssd") / t.file)
             for t in nearrec.info(path.with_name(path.name + "-ssd")).tables]
    features = [f for c in model.sparse_arch.embedding_bag_collection.embedding_bag_configs()
                for f in c.feature_names]
    dram_off, ssd_off = offload(dram), offload(ssd)
    drop_page_cache()
    records: list[Record] = []
    for batch in cfg.batches:
        batches = _batches(cfg, features, batch)
        with torch.inference_mode():
            calls: dict[str, tuple[Callable[[Any, Any], Any] | None, Any, bool]] = {
                "torchrec": (model, None, False),
                "nearrec dram": (dram, None, False),
                "nearrec dram + offload": (dram_off, None, False),
                "nearrec dram + pipelined": (None, dram, True),
                "nearrec ssd": (ssd, None, False),
                "nearrec ssd + offload": (ssd_off, None, False),
                "nearrec ssd + pipelined": (None, ssd, True),
            }
            dense, kjt = batches[0]
            want = model(dense, kjt)
            for name, system in (("dram", dram), ("ssd", ssd), ("dram offload", dram_off),
                                 ("ssd offload", ssd_off)):
                torch.testing.assert_close(system(dense, kjt), want, rtol=1e-4, atol=1e-5,
                                           msg=lambda m, n=name: f"{n}: {m}")
        walkers = {s: _Walker(c, m, p, batches) for s, (c, m, p) in calls.items()}
        for s in ("nearrec ssd", "nearrec ssd + offload", "nearrec ssd + pipelined"):
            walkers[s].run(cfg.warm_seconds)
        before = ssd_store.stats()
        per: dict[str, list[tuple[float, list[float]]]] = {s: [] for s in walkers}
        disk: list[float] = []
        order = list(walkers)
        for rnd in range(cfg.rounds):
            for s in order[rnd % len(order):] + order[:rnd % len(order)]:
                per[s].append(walkers[s].run(cfg.seconds))
            disk.append(_native.random_read(files, cfg.limit_reads, 128)["items_per_s"])
        after = ssd_store.stats()
        delta = {k: after[k] - before[k] for k in ("device_reads", "lookups_resident",
                                                   "lookups_hot", "lookups_cache", "lookups_ssd")}
        hits = delta["lookups_resident"] + delta["lookups_hot"] + delta["lookups_cache"]
        hit = hits / max(1, hits + delta["lookups_ssd"])
        device_reads = delta["device_reads"]
        cell: dict[str, Record] = {}
        for s, rounds in per.items():
            rates = [r for r, _ in rounds]
            lat = np.concatenate([x for _, x in rounds]) * 1e6
            rec = Record("torchrec", "dlrm", batch, f"zipf{cfg.alpha}", s,
                         samples_per_s=float(np.median(rates)),
                         lookups_per_s=float(np.median(rates)) * cfg.pooling * len(features),
                         p50_us=float(np.percentile(lat, 50)),
                         p99_us=float(np.percentile(lat, 99)),
                         extra={"rounds_samples_per_s": rates})
            cell[s] = rec
            records.append(rec)
        peer = cell["torchrec"].samples_per_s
        for rec in cell.values():
            rec.extra["ratio_vs_torchrec"] = round(rec.samples_per_s / peer, 3)
        cell["nearrec ssd"].extra.update({
            "disk_reads_per_s": disk, "dram_hit_ratio": hit, "dram_budget_bytes": budget,
            "table_bytes": table_bytes, "device_reads": device_reads})
        log(f"  batch {batch}: " + ", ".join(
            f"{s} {r.samples_per_s:,.0f}/s ({r.extra['ratio_vs_torchrec']:.2f}x)"
            for s, r in cell.items()) + f"; disk {np.median(disk):,.0f} reads/s, "
            f"DRAM hits {100 * hit:.0f} %")
    return records


def markdown(records: list[Record], command: str) -> str:
    ssd = [r for r in records if r.system == "nearrec ssd"]
    first = ssd[0].extra if ssd else {}
    lines = [f"Command: `{command}`", "",
             "A `torchrec.models.dlrm.DLRM` (RMC1's shapes: 13 dense features, bottom MLP "
             "128-64-32, dot interaction, top MLP 256-64-1; eight tables of dim 32, `t0` serving "
             "two features, 20 lookups per feature, Zipf(1.05) ids), its forward on the same "
             "batches: TorchRec's own collection (tables in DRAM) against the same model after "
             "`nearrec.torch.from_torchrec` with the tables in DRAM or on the SSD tier "
             f"({first.get('table_bytes', 0) / 2**20:,.0f} MiB of tables, a DRAM budget of "
             f"{first.get('dram_budget_bytes', 0) / 2**20:,.0f} MiB, direct I/O), run by the "
             "model's own MLPs, whole in the engine (`offload`), or pipelined "
             "(`nearrec.models.infer`, depth 2). Samples/s: median of the rounds (rotating "
             "order, each system walking on through the trace), × TorchRec's (unreliable where "
             f"its rounds or TorchRec's spread beyond ±{100 * SPREAD_LIMIT:.0f} %); p50 / p99 µs "
             "per batch; spread: half the rounds' range. 2 threads.", "",
             "| batch | system | samples/s | ÷ torchrec | p50 / p99 µs | spread |",
             "|---:|---|---:|---:|---:|---:|"]
    peers = {r.batch: r for r in records if r.system == "torchrec"}
    for r in records:
        ratio = ratio_text(r, peers[r.batch])
        lines.append(f"| {r.batch} | {r.system} | {r.samples_per_s:,.0f} | "
                     f"{ratio}{'×' if ratio[0].isdigit() else ''} | "
                     f"{r.p50_us:,.0f} / {r.p99_us:,.0f} | {_spread(r)} |")
    lines += ["", "| batch | disk random reads/s (median, range) | SSD tier DRAM hit ratio | "
              "device reads |", "|---:|---:|---:|---:|"]
    for r in ssd:
        d = r.extra["disk_reads_per_s"]
        lines.append(f"| {r.batch} | {np.median(d):,.0f} ({min(d):,.0f}–{max(d):,.0f}) | "
                     f"{100 * r.extra['dram_hit_ratio']:.0f} % | "
                     f"{int(r.extra['device_reads']):,} |")
    return "\n".join(lines) + "\n"


# ---- the model quantised for serving ---------------------------------------------------------

#: TorchRec's quantisations compared, by the dtype nearrec keeps
QUANTISED = ("int4", "int8", "fp16")


def _quantised(model: Any, dtype: str) -> Any:
    """``model`` with its collection quantised by TorchRec (``quantize_embeddings``)."""
    import copy

    import torch
    from torchrec.inference.modules import quantize_embeddings

    kind = {"int4": torch.quint4x2, "int8": torch.qint8, "fp16": torch.half}[dtype]
    return quantize_embeddings(copy.deepcopy(model), dtype=kind, inplace=False).eval()


def run_quantised(cfg: TorchRecConfig, log: Callable[[str], None] = print) -> list[Record]:
    """The DLRM quantised by TorchRec to int4, int8 and fp16, each served from SSD by
    ``from_torchrec`` (its bytes taken as they are) behind one DRAM budget — a share of the
    fp16 tables' bytes, the same bytes for every dtype — beside TorchRec's own quantised model
    (its CPU TBE, tables in DRAM) on the same batches."""
    import torch

    from nearrec.torch import from_torchrec

    torch.set_num_threads(cfg.threads)
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    model = _model(cfg)
    fp16_bytes = cfg.tables * cfg.rows * cfg.dim * 2
    budget = int(cfg.budget_share * fp16_bytes)
    log(f"TorchRec DLRM quantised: {cfg.tables} tables x {cfg.rows:,} rows x dim {cfg.dim}; "
        f"one DRAM budget of {budget / 2**20:,.0f} MiB ({100 * cfg.budget_share:g} % of the "
        f"fp16 tables)")
    theirs: dict[str, Any] = {}
    ours: dict[str, Any] = {}
    files: dict[str, list[str]] = {}
    stores: dict[str, Any] = {}
    for dtype in QUANTISED:
        theirs[dtype] = _quantised(model, dtype)
        path = cfg.scratch / f"torchrec-dlrm-{dtype}-{cfg.rows}"
        ours[dtype] = from_torchrec(theirs[dtype], path, overwrite=True, tier="ssd",
                                    dram_budget=budget, threads=cfg.threads)
        stores[dtype] = ours[dtype].sparse_arch.embedding_bag_collection.store
        files[dtype] = [str(path / t.file) for t in nearrec.info(path).tables]
        log(f"  {dtype}: {nearrec.info(path).total_bytes / 2**20:,.0f} MiB of tables")
    features = [f for c in model.sparse_arch.embedding_bag_collection.embedding_bag_configs()
                for f in c.feature_names]
    drop_page_cache()
    records: list[Record] = []
    for batch in cfg.batches:
        batches = _batches(cfg, features, batch)
        with torch.inference_mode():
            dense, kjt = batches[0]
            for dtype in QUANTISED:  # the same answers as TorchRec's quantised model
                torch.testing.assert_close(ours[dtype](dense, kjt), theirs[dtype](dense, kjt),
                                           rtol=1e-5, atol=1e-5)
        walkers = {}
        for dtype in QUANTISED:
            walkers[f"torchrec[{dtype}]"] = _Walker(theirs[dtype], None, False, batches)
            walkers[f"nearrec ssd[{dtype}]"] = _Walker(ours[dtype], None, False, batches)
            walkers[f"nearrec ssd[{dtype}]"].run(cfg.warm_seconds)
        before = {d: stores[d].stats() for d in QUANTISED}
        per: dict[str, list[tuple[float, list[float]]]] = {s: [] for s in walkers}
        disk: list[float] = []
        order = list(walkers)
        for rnd in range(cfg.rounds):
            for s in order[rnd % len(order):] + order[:rnd % len(order)]:
                per[s].append(walkers[s].run(cfg.seconds))
            disk.append(_native.random_read(files["fp16"], cfg.limit_reads, 128)["items_per_s"])
        cell: dict[str, Record] = {}
        for s, rounds in per.items():
            rates = [r for r, _ in rounds]
            lat = np.concatenate([x for _, x in rounds]) * 1e6
            dtype = s[s.index("[") + 1:-1]
            extra: dict[str, Any] = {"dtype": dtype, "rounds_samples_per_s": rates}
            if s.startswith("nearrec"):
                after = stores[dtype].stats()
                delta = {k: after[k] - before[dtype][k] for k in (
                    "device_reads", "lookups_resident", "lookups_hot", "lookups_cache",
                    "lookups_ssd")}
                hits = delta["lookups_resident"] + delta["lookups_hot"] + delta["lookups_cache"]
                samples = sum(len(x) for _, x in rounds) * batch
                extra.update({"dram_hit_ratio": hits / max(1, hits + delta["lookups_ssd"]),
                              "device_reads_per_sample": delta["device_reads"] / max(1, samples),
                              "disk_reads_per_s": disk, "dram_budget_bytes": budget,
                              "table_bytes": nearrec.info(
                                  cfg.scratch / f"torchrec-dlrm-{dtype}-{cfg.rows}").total_bytes})
            rec = Record("torchrec.quant", "dlrm", batch, f"zipf{cfg.alpha}", s,
                         samples_per_s=float(np.median(rates)),
                         lookups_per_s=float(np.median(rates)) * cfg.pooling * len(features),
                         p50_us=float(np.percentile(lat, 50)),
                         p99_us=float(np.percentile(lat, 99)), extra=extra)
            cell[s] = rec
            records.append(rec)
        log(f"  batch {batch}: " + ", ".join(f"{s} {r.samples_per_s:,.0f}/s"
                                             for s, r in cell.items())
            + f"; disk {np.median(disk):,.0f} reads/s")
    return records


def quantised_markdown(records: list[Record], command: str) -> str:
    first = next((r.extra for r in records if "dram_budget_bytes" in r.extra), {})
    lines = [f"Command: `{command}`", "",
             "The same `torchrec.models.dlrm.DLRM` as `bench torchrec` (RMC1's shapes), its "
             "collection quantised by TorchRec (`quantize_embeddings`) to int4, int8 and fp16. "
             "`torchrec[dtype]`: TorchRec's quantised model as it runs (its CPU inference TBE, "
             "tables in DRAM); `nearrec ssd[dtype]`: that model after "
             "`nearrec.torch.from_torchrec(..., tier=\"ssd\")`, its bytes taken as they are, "
             "rows read with direct I/O behind one DRAM budget of "
             f"{first.get('dram_budget_bytes', 0) / 2**20:,.0f} MiB for every dtype (a share of "
             "the fp16 tables' bytes), so a narrower dtype keeps more of its tables in it. "
             "Outputs checked against TorchRec's first. Samples/s: median of rotating rounds; "
             "p50 / p99 µs per batch; 2 threads.", "",
             "| batch | system | tables MiB | samples/s | × nearrec ssd[fp16] | × torchrec[same] "
             "| p50 / p99 µs | DRAM hits | device reads / sample | disk reads/s |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    cells: dict[int, dict[str, Record]] = {}
    for r in records:
        cells.setdefault(r.batch, {})[r.system] = r
    for batch, c in cells.items():
        for s, r in c.items():
            e = r.extra
            base = c.get("nearrec ssd[fp16]")
            peer = c.get(f"torchrec[{e['dtype']}]")
            ours = s.startswith("nearrec")
            lines.append(
                f"| {batch} | {s} | "
                f"{e['table_bytes'] / 2**20:,.0f} | " if ours else f"| {batch} | {s} | — | ")
            lines[-1] += (
                f"{r.samples_per_s:,.0f} | "
                f"{ratio_text(r, base) if ours and base is not None and r is not base else '—'}"
                f" | {ratio_text(r, peer) if ours and peer is not None else '—'} | "
                f"{r.p50_us:,.0f} / {r.p99_us:,.0f} | "
                + (f"{100 * e['dram_hit_ratio']:.0f} % | {e['device_reads_per_sample']:.2f} | "
                   f"{np.median(e['disk_reads_per_s']):,.0f} |" if ours else "— | — | — |"))
    return "\n".join(lines) + "\n"


#: ``nearrec bench torchrec`` and ``torchrec-quant``
_FLAGS = {"--rows": "rows", "--batches": "batches", "--scratch": "scratch"}
HARNESSES = {"torchrec": Harness(TorchRecConfig, TorchRecConfig.quick, _FLAGS, run, markdown),
             "torchrec-quant": Harness(TorchRecConfig, TorchRecConfig.quick, _FLAGS,
                                       run_quantised, quantised_markdown)}
