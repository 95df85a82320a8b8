"""``nearrec bench e2e``: the eight benchmark models end to end (issue 5), side by side on the same
requests and dense features, in one run.

Per model, batch and placement (tables in DRAM; tables on SSD with a DRAM budget of a quarter of
their bytes, planned from the trace's warm-up part; DLRM's stack-distance trace, K = 1):

- ``torch`` — the ideal: the model over ``nn.EmbeddingBag`` with its own copy of every table in
  DRAM, one batch after another (DRAM placement only);
- ``ssds`` — RM-SSD's SSD-S: the table files memory-mapped and pooled on the host, in a child
  process whose memory cgroup caps the page cache to the budget (as ``bench cache``), PyTorch
  MLPs, the same pipeline as ``nearrec`` (SSD placement only); before each batch size the
  cgroup's page cache is emptied and warmed again on the warm-up part;
- ``nearrec`` — nearrec's embeddings + PyTorch MLPs, pipelined (:func:`nearrec.models.infer`,
  two batches in flight); ``nearrec.serial`` the same without overlap;
- ``offload`` — whole-model offload (:func:`nearrec.models.offload`), pipelined;
  ``offload.serial`` without overlap. DIN and DIEN have no offload.

On SSD every nearrec cell opens the store afresh and serves the warm-up part untimed, so no cell
inherits another's cache. The disk's random-read rate is measured in the same run: a batch's I/O
floor is its device reads ÷ that rate; its MLP time is the ideal's dense part per batch. The
pipelining goal holds where the SSD time per batch is within 1.25× of the larger of the two.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

import nearrec
from nearrec import trace as nt
from nearrec.plan import make_plan

from . import _native
from .cache import CGROUP, generator, ssds_available
from .harness import Harness
from .report import Record
from .ssd import drop_page_cache

MODELS = ("rmc1", "rmc2", "rmc3", "wnd", "mtwnd", "ncf", "din", "dien")


@dataclass
class E2EConfig:
    models: tuple[str, ...] = MODELS
    batches: tuple[int, ...] = (1, 16, 64, 256)
    #: bytes of tables per model store (4x the budget)
    table_bytes: int = 512 << 20
    #: the SSD placement's DRAM budget, as a share of the table bytes
    budget: float = 0.25
    trace: str = "k1"
    #: samples per trace (warm-up part included), by model; others get `default_samples`
    samples: dict[str, int] = field(default_factory=lambda: {"rmc1": 4_000, "rmc2": 2_000,
                                                             "rmc3": 6_000})
    default_samples: int = 12_000
    warm_share: float = 0.15
    #: most seconds a system spends on one cell's timed part (it may run out of samples first)
    seconds: float = 1.0
    #: batches in flight for the pipelined systems
    depth: int = 2
    #: DRAM cells: each system runs this many times, in turn with the others; the median is kept
    #: (SSD cells run once each: every run needs a fresh, warmed store)
    repeats: int = 3
    #: batches at which the serial (no overlap) systems run on SSD (all batches in DRAM)
    serial_ssd_batches: tuple[int, ...] = (64,)
    #: most seconds SSD-S may spend warming up, per batch size (the samples it got through are
    #: recorded)
    ssds_warm_seconds: float = 20.0
    #: RecSSD's row counts and trace variant, at `recssd_batch`: the SSD / DRAM loss per model
    recssd: bool = True
    recssd_batch: int = 64
    #: RecSSD's RMC2 has 8 GiB of tables; stores above this are scaled down to it
    recssd_max_bytes: int = 2 << 30
    limit_reads: int = 100_000
    seed: int = 0
    scratch: Path = Path("bench/scratch")
    progress_file: Path | None = None
    #: where the models run: "dram" (tables resident), "ssd" (behind the budget), or both
    places: tuple[str, ...] = ("dram", "ssd")

    @classmethod
    def quick(cls) -> E2EConfig:
        return cls(models=("rmc1", "ncf"), batches=(16,), table_bytes=64 << 20, repeats=3,
                   samples={"rmc1": 600}, default_samples=2_000, seconds=0.3,
                   serial_ssd_batches=(16,), ssds_warm_seconds=5.0, recssd=False,
                   limit_reads=20_000)


# ---- inputs -----------------------------------------------------------------------------------


def _store(cfg: E2EConfig, model: str, variant: str, log: Callable[[str], None]) -> Path:
    spec = nearrec.model_spec(model)
    table_bytes: int | None = cfg.table_bytes
    if variant == "recssd":
        full = sum(spec.table_rows("recssd")) * spec.table_dim("recssd") * 4
        table_bytes = None if full <= cfg.recssd_max_bytes else cfg.recssd_max_bytes
    tag = "full" if table_bytes is None else f"{table_bytes >> 20}m"
    path = cfg.scratch / f"e2e-{model}-{variant}-{tag}"
    try:
        if nearrec.info(path).params.get("seed") == cfg.seed:
            return path
    except nearrec.NearrecError:
        pass
    log(f"building {path}")
    nearrec.build(path, model, table_bytes=table_bytes, variant=variant,  # type: ignore[arg-type]
                  seed=cfg.seed, overwrite=True, progress=False)
    os.sync()  # no write-back during the first cells
    return path


def _trace(cfg: E2EConfig, path: Path, model: str, variant: str, trace: str) -> nt.Trace:
    """The model's trace, in memory (no system pays for reading the file)."""
    spec = nearrec.model_spec(model)
    bags = cfg.samples.get(model, cfg.default_samples)
    tp = cfg.scratch / f"{path.name}-{trace}-{bags}-{cfg.seed}.nrtrace"
    if not tp.exists():
        nt.generate(nearrec.open(path, tier="ssd"), bags, spec.pooling_factor(variant),  # type: ignore[arg-type]
                    generator(trace), seed=cfg.seed, path=tp, overwrite=True)
    tr = nt.load(tp)
    return nt.Trace({n: nt.TableTrace(n, t.rows, t.pooling, np.array(t.offsets),
                                      np.array(t.indices), t.generator, t.first_reference_share)
                     for n, t in tr.tables.items()}, tr.batch_size, tr.seed)


def _kjt(lookups: list[Any]) -> Any:
    import torch

    from nearrec.torch import KeyedJaggedTensor

    return KeyedJaggedTensor(
        [r.table for r in lookups],
        torch.from_numpy(np.concatenate([np.asarray(r.indices) for r in lookups])),
        torch.from_numpy(np.concatenate([np.diff(np.append(r.offsets, len(r.indices)))
                                         for r in lookups])))


def _inputs(tr: nt.Trace, dense: np.ndarray | None, start: int, batch: int) -> list[Any]:
    """The batches of samples ``start:`` as ``(dense, KeyedJaggedTensor)`` pairs."""
    import torch

    out = []
    for lo in range(start, tr.bags - batch + 1, batch):
        d = None if dense is None else torch.from_numpy(dense[lo:lo + batch])
        out.append((d, _kjt(tr.batch(lo, lo + batch))))
    return out


def _bounded(items: list[Any], seconds: float) -> Iterator[Any]:
    """``items`` until ``seconds`` have passed since the first was taken (at least three)."""
    start = time.perf_counter()
    for i, item in enumerate(items):
        if i >= 3 and time.perf_counter() - start > seconds:
            return
        yield item


# ---- measuring --------------------------------------------------------------------------------


def _measure(model: Any, batches: list[Any], depth: int, seconds: float,
             prerun: bool = True) -> dict[str, Any]:
    """Runs ``batches`` through ``model`` for about ``seconds``. ``prerun`` first runs two of
    them untimed (first-call costs); not where a cache could keep their rows (SSD cells)."""
    from nearrec.models import infer

    if prerun:
        infer(model, batches[:2], depth=depth)
    res = infer(model, _bounded(batches, seconds), depth=depth)
    n = len(res.outputs)
    # three rounds: the samples/s of each third of the batches, by when their outputs were ready
    # (with fewer than two batches a third, the pipeline's fill and drain would be all it shows)
    cuts = [(n * k) // 3 for k in range(4)] if n >= 6 else []
    at = [res.finished[c - 1] if c else 0.0 for c in cuts]
    per = res.samples / max(1, n)
    rounds = [per * (c1 - c0) / (t1 - t0)
              for (c0, c1), (t0, t1) in zip(pairwise(cuts), pairwise(at), strict=True) if t1 > t0]
    dense = sum(v for k, v in res.breakdown.items() if k != "embedding_wait"
                and not k.startswith("engine."))
    return {"samples_per_s": res.samples_per_s, "batches": n, "samples": res.samples,
            "p50_us": 1e6 * statistics.median(res.latencies),
            "p99_us": 1e6 * float(np.percentile(res.latencies, 99)),
            "rounds_samples_per_s": rounds,
            "breakdown_per_batch_us": {k: 1e6 * v / max(1, n) for k, v in res.breakdown.items()},
            "dense_per_batch_us": 1e6 * dense / max(1, n)}


def _record(model: str, batch: int, place: str, system: str, m: dict[str, Any],
            lookups_per_sample: int, extra: dict[str, Any] | None = None) -> Record:
    keep = {k: v for k, v in m.items() if k not in ("samples_per_s", "p50_us", "p99_us")}
    return Record("e2e", model, batch, place, system, m["samples_per_s"],
                  m["samples_per_s"] * lookups_per_sample, m["p50_us"], m["p99_us"],
                  extra={**keep, **(extra or {})})


class _MappedCollection:
    """SSD-S's sparse part: the mapped tables pooled on the host (a callable, like a module)."""

    def __init__(self, path: str, random: bool):
        info = nearrec.info(path)
        self.mapped = _native.MappedStore(path, random)
        self.ids = {t.name: i for i, t in enumerate(info.tables)}
        self.dims = {t.name: t.dim for t in info.tables}

    def __call__(self, kjt: Any) -> Any:
        import torch

        from nearrec.torch import KeyedTensor

        keys, values, lengths = kjt.keys(), kjt.values().numpy(), kjt.lengths().numpy()
        batch = len(lengths) // len(keys)
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        reqs = []
        for k, name in enumerate(keys):
            lo = bounds[k * batch]
            reqs.append((self.ids[name], values[lo:bounds[(k + 1) * batch]],
                         bounds[k * batch:(k + 1) * batch + 1] - lo))
        out = self.mapped.pool(reqs)
        return KeyedTensor(list(keys), [self.dims[k] for k in keys], torch.from_numpy(out))


def _ssds_worker() -> None:
    """Child entry: in the memory cgroup, warms SSD-S on the warm-up part, then runs each batch
    size over the timed part with PyTorch MLPs; prints the measurements as JSON."""
    import torch

    from nearrec.models import build

    job = json.loads(sys.stdin.read())
    torch.set_num_threads(job["threads"])
    cg = Path(job["cgroup"])
    (cg / "cgroup.procs").write_text(str(os.getpid()))
    cfg = E2EConfig(seed=job["seed"], scratch=Path(job["scratch"]),
                    samples={job["model"]: job["samples"]}, default_samples=job["samples"])
    tr = _trace(cfg, Path(job["store"]), job["model"], job["variant"], job["trace"])
    dense = np.load(job["dense"]) if job["dense"] else None
    sparse = _MappedCollection(job["store"], True)
    model = build(job["model"], None, seed=job["seed"], variant=job["variant"],
                  sparse=sparse)  # type: ignore[arg-type]
    batches = {b: _inputs(tr, dense, job["warm"], b) for b in job["batches"]}
    warm = _inputs(tr, dense, 0, 64)[:job["warm"] // 64]
    with torch.inference_mode():  # the model's own memory in place before the cap is set
        for b in job["batches"]:
            model(*batches[b][0])
    (cg / "memory.force_empty").write_text("0")
    usage = int((cg / "memory.usage_in_bytes").read_text())
    (cg / "memory.limit_in_bytes").write_text(str(usage + job["budget"]))
    out: dict[str, Any] = {"limit": usage + job["budget"], "cells": {}, "warmed_samples": {}}
    for b in job["batches"]:
        # each batch size from the same state: the page cache emptied, then the warm-up part
        (cg / "memory.force_empty").write_text("0")
        start, warmed = time.perf_counter(), 0
        with torch.inference_mode():
            for _, kjt in warm:
                sparse(kjt)
                warmed += 64
                if time.perf_counter() - start > job["warm_seconds"]:
                    break
        out["warmed_samples"][str(b)] = warmed
        out["cells"][str(b)] = _measure(model, batches[b], job["depth"], job["seconds"],
                                        prerun=False)
    print(json.dumps(out))


def _ssds(cfg: E2EConfig, path: Path, model: str, variant: str, budget: int, warm: int,
          dense_file: Path | None, batches: tuple[int, ...]) -> dict[str, Any]:
    import torch

    CGROUP.mkdir(exist_ok=True)
    (CGROUP / "memory.limit_in_bytes").write_text("-1")
    drop_page_cache()
    job = {"cgroup": str(CGROUP), "store": str(path), "model": model, "variant": variant,
           "trace": cfg.trace if variant != "recssd" else f"{cfg.trace}-recssd",
           "samples": cfg.samples.get(model, cfg.default_samples), "seed": cfg.seed,
           "scratch": str(cfg.scratch), "dense": str(dense_file) if dense_file else "",
           "budget": budget, "warm": warm, "batches": list(batches), "depth": cfg.depth,
           "seconds": cfg.seconds, "warm_seconds": cfg.ssds_warm_seconds,
           "threads": torch.get_num_threads()}
    res = subprocess.run([sys.executable, "-c",
                          "from nearrec_bench.e2e import _ssds_worker; _ssds_worker()"],
                         input=json.dumps(job), capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"SSD-S worker exited with {res.returncode} (a negative code is the "
                           f"signal; -9: killed by the cgroup's OOM killer): {res.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


class _TorchCollection:
    """The ideal's sparse part: ``nn.EmbeddingBag`` (sum) over copies of the store's tables."""

    def __init__(self, store: nearrec.Store | None):
        import torch

        tables = [] if store is None else list(store.tables)
        self.bags = {t: torch.nn.EmbeddingBag.from_pretrained(
            torch.from_numpy(np.array(store.table_array(t))), mode="sum")  # type: ignore[union-attr]
            for t in tables}
        self.dims = {t: store.table(t).dim for t in tables}  # type: ignore[union-attr]

    def __call__(self, kjt: Any) -> Any:
        import torch

        from nearrec.torch import KeyedTensor

        keys, values, lengths = kjt.keys(), kjt.values(), kjt.lengths()
        batch = lengths.numel() // len(keys)
        bounds = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
        out = []
        for k, name in enumerate(keys):
            lo, hi = int(bounds[k * batch]), int(bounds[(k + 1) * batch])
            out.append(self.bags[name](values[lo:hi], bounds[k * batch:(k + 1) * batch] - lo))
        return KeyedTensor(list(keys), [self.dims[k] for k in keys], torch.cat(out, dim=1))


# ---- the run ----------------------------------------------------------------------------------


def _model_run(cfg: E2EConfig, model: str, variant: str, batches: tuple[int, ...],
               systems: tuple[str, ...], log: Callable[[str], None]) -> list[Record]:
    from nearrec.models import OFFLOADABLE, build, offload

    spec = nearrec.model_spec(model)
    path = _store(cfg, model, variant, log)
    info = nearrec.info(path)
    total = info.total_bytes
    trace = cfg.trace if variant != "recssd" else f"{cfg.trace}-recssd"
    tr = _trace(cfg, path, model, variant, trace)
    warm = int(tr.bags * cfg.warm_share)
    width = build(model, None, variant=variant, sparse=_TorchCollection(None)).dense_features  # type: ignore[arg-type]
    rng = np.random.default_rng(cfg.seed)
    dense = rng.standard_normal((tr.bags, width), dtype=np.float32) if width else None
    lookups = spec.pooling_factor(variant) * len(info.tables)  # type: ignore[arg-type]
    files = [str(path / t.file) for t in info.tables]
    drop_page_cache()
    disk = _native.random_read(files, cfg.limit_reads, 128)["items_per_s"]
    budget = int(total * cfg.budget)
    # rate measured again after the SSD cells; the floor takes the faster of the two
    disk_rates = [disk]
    place_ssd = f"ssd@{round(cfg.budget * 100)}%" + ("-recssd" if variant == "recssd" else "")
    place_dram = "dram" + ("-recssd" if variant == "recssd" else "")
    log(f"{model} ({variant}): {total / 2**20:,.0f} MiB of tables, {len(info.tables)} tables; "
        f"disk {disk:,.0f} random reads/s")
    common = {"table_bytes": total, "disk_reads_per_s": disk, "variant": variant,
              "warm_samples": warm, "budget_bytes": budget}
    records: list[Record] = []
    offloadable = model in OFFLOADABLE
    inputs = {b: _inputs(tr, dense, warm, b) for b in batches}

    def add(batch: int, place: str, system: str, m: dict[str, Any], **extra: Any) -> None:
        r = _record(model, batch, place, system, m, lookups, common | extra)
        records.append(r)
        if cfg.progress_file:
            with open(cfg.progress_file, "a") as f:
                f.write(json.dumps(asdict(r)) + "\n")
        log(f"  {place:>12} B={batch:<4} {system:<15} {r.samples_per_s:>10,.0f} samples/s  "
            f"p50 {r.p50_us / 1e3:8.2f} ms")

    # DRAM: the ideal and nearrec, on one open store
    if "dram" in systems:
        store = nearrec.open(path, tier="dram")
        ideal = build(model, None, seed=cfg.seed, variant=variant,  # type: ignore[arg-type]
                      sparse=_TorchCollection(store))  # type: ignore[arg-type]
        ours = build(model, store, seed=cfg.seed, variant=variant)  # type: ignore[arg-type]
        off = offload(ours) if offloadable else None
        runs: list[tuple[str, Any, int]] = [("torch", ideal, 0), ("nearrec.serial", ours, 0),
                                            ("nearrec", ours, cfg.depth)]
        if off is not None:
            runs += [("offload.serial", off, 0), ("offload", off, cfg.depth)]
        for b in batches:
            # the systems in turn, `repeats` times; each keeps its median run
            got: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in runs}
            for _ in range(cfg.repeats):
                for name, runner, depth in runs:
                    got[name].append(_measure(runner, inputs[b], depth, cfg.seconds))
            for name, ms in got.items():
                ms.sort(key=lambda m: m["samples_per_s"])
                median = dict(ms[len(ms) // 2])
                median["rounds_samples_per_s"] = [m["samples_per_s"] for m in ms]
                add(b, place_dram, name, median)
        del store, ideal, ours, off

    if "ssd" not in systems:
        return records
    # SSD: a fresh, warmed store per cell
    plan = make_plan(info, nt.Trace({n: nt.TableTrace(
        n, t.rows, t.pooling, t.offsets[:warm + 1], t.indices[:t.offsets[warm]])
        for n, t in tr.tables.items()}), budget)
    warm_batches = [tr.batch(lo, min(warm, lo + 64)) for lo in range(0, warm, 64)]

    def cell(system: str, batch: int, depth: int) -> None:
        store = nearrec.open(path, tier="ssd", dram_budget=budget, plan=plan)
        for reqs in warm_batches:
            store.lookup_many(reqs)
        m = build(model, store, seed=cfg.seed, variant=variant)  # type: ignore[arg-type]
        runner = offload(m) if system.startswith("offload") else m
        before = store.stats()
        res = _measure(runner, inputs[batch], depth, cfg.seconds, prerun=False)
        after = store.stats()
        reads = float(after["device_reads"]) - float(before["device_reads"])
        per_batch = reads / max(1, res["batches"])
        add(batch, place_ssd, system, res, device_reads_per_batch=per_batch,
            dram_hit_ratio=1 - (float(after["lookups_ssd"]) - float(before["lookups_ssd"]))
            / max(1, res["samples"] * lookups))

    for b in batches:
        cell("nearrec", b, cfg.depth)
        if offloadable:
            cell("offload", b, cfg.depth)
        if b in cfg.serial_ssd_batches:
            cell("nearrec.serial", b, 0)
            if offloadable:
                cell("offload.serial", b, 0)
    drop_page_cache()
    disk_rates.append(_native.random_read(files, cfg.limit_reads, 128)["items_per_s"])
    log(f"  disk after: {disk_rates[-1]:,.0f} random reads/s")
    for r in records:
        if r.dist == place_ssd:
            r.extra["disk_reads_per_s"] = max(disk_rates)
            r.extra["disk_reads_per_s_runs"] = disk_rates
            r.extra["io_floor_us"] = 1e6 * r.extra["device_reads_per_batch"] / max(disk_rates)
    why_not = ssds_available()
    if why_not:
        log(f"  SSD-S skipped: {why_not}")
        return records
    dense_file = None
    if dense is not None:
        dense_file = cfg.scratch / f"{path.name}-dense.npy"
        np.save(dense_file, dense)
    try:
        res = _ssds(cfg, path, model, variant, budget, warm, dense_file, batches)
    except RuntimeError as e:
        log(f"  SSD-S failed, left out: {e}")
        return records
    for b in batches:
        add(b, place_ssd, "ssds", res["cells"][str(b)],
            warmed_samples=res["warmed_samples"][str(b)], cgroup_limit=res["limit"])
    return records


def run(cfg: E2EConfig, log: Callable[[str], None] = print) -> list[Record]:
    cfg.scratch.mkdir(parents=True, exist_ok=True)
    records: list[Record] = []
    for model in cfg.models:
        records += _model_run(cfg, model, "deeprecsys", cfg.batches, cfg.places, log)
    if cfg.recssd:
        for model in cfg.models:
            records += _model_run(cfg, model, "recssd", (cfg.recssd_batch,), cfg.places, log)
    summarise(records)
    return records


def summarise(records: list[Record]) -> None:
    """Adds the goals' numbers to the records: ratios to the ideal and between systems, and each
    SSD cell's time per batch against max(MLP time in DRAM, its I/O floor)."""
    by = _cells(records)
    for (model, batch, place), cell in by.items():
        dram_place = "dram" + ("-recssd" if place.endswith("-recssd") else "")
        dram = by.get((model, batch, dram_place), {})
        ideal = dram.get("torch")
        for name, r in cell.items():
            if ideal is not None and name != "torch":
                r.extra["ratio_vs_ideal"] = r.samples_per_s / ideal.samples_per_s
            if place.startswith("ssd") and name in dram:
                r.extra["ratio_vs_dram"] = r.samples_per_s / dram[name].samples_per_s
            if place.startswith("ssd") and ideal is not None and "io_floor_us" in r.extra:
                mlp = ideal.extra["dense_per_batch_us"]
                floor = max(mlp, r.extra["io_floor_us"])
                r.extra["mlp_per_batch_us"] = mlp
                r.extra["floor_us"] = floor
                r.extra["time_over_floor"] = (1e6 * batch / r.samples_per_s) / floor
        for a, b in (("offload", "nearrec"), ("nearrec", "nearrec.serial"),
                     ("offload", "offload.serial"), ("nearrec", "ssds"), ("offload", "ssds")):
            if a in cell and b in cell:
                cell[a].extra[f"ratio_vs_{b}"] = cell[a].samples_per_s / cell[b].samples_per_s


# ---- report -----------------------------------------------------------------------------------


def _fmt(x: float | None, pattern: str = "{:,.0f}") -> str:
    return "—" if x is None else pattern.format(x)


def _cells(records: list[Record]) -> dict[tuple[str, int, str], dict[str, Record]]:
    by: dict[tuple[str, int, str], dict[str, Record]] = {}
    for r in records:
        by.setdefault((r.model, r.batch, r.dist), {})[r.system] = r
    return by


def _sps(cell: dict[str, Record] | None, system: str) -> float | None:
    return cell[system].samples_per_s if cell and system in cell else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _vs(ca: dict[str, Record] | None, a: str, cb: dict[str, Record] | None, b: str) -> str:
    """System ``a`` of cell ``ca`` ÷ system ``b`` of cell ``cb``, or "unreliable" where either's
    runs spread too far (``report.ratio_text``)."""
    from .report import ratio_text

    ra, rb = (ca or {}).get(a), (cb or {}).get(b)
    if ra is None or rb is None:
        return "—"
    text = ratio_text(ra, rb)
    return f"{text}×" if text[0].isdigit() else text


def markdown(records: list[Record], command: str) -> str:
    from .report import SPREAD_LIMIT, _spread

    by = _cells(records)
    keys = sorted({(m, b, p) for m, b, p in by}, key=lambda k: (MODELS.index(k[0]), k[2], k[1]))
    x = "{:.2f}×"
    lines = [
        f"Command: `{command}`", "",
        "Samples/s per system, side by side on the same requests and dense features. Systems: "
        "`torch` — `nn.EmbeddingBag` in DRAM, one batch after another (the ideal); `ssds` — "
        "RM-SSD's SSD-S (mmap, page cache capped to the budget by a memory cgroup, PyTorch MLPs, "
        "pipelined); `nearrec` — nearrec's embeddings + PyTorch MLPs, two batches in flight; "
        "`offload` — the whole model in the engine, two batches in flight; `.serial` — the same "
        "with no overlap. SSD: tables 4× the DRAM budget (25 %), planned from the warm-up part, "
        "K = 1 trace, direct I/O, a fresh warmed store per cell, one run each (spread: over "
        "thirds of the run). DRAM: the median of three runs taken in turn (spread: over the "
        "runs). Floor: max(the ideal's MLP time per batch, the batch's device reads ÷ the disk's "
        "random-read rate measured in the same run). A ratio whose systems' runs spread beyond "
        f"±{100 * SPREAD_LIMIT:.0f} % is marked unreliable instead of given.", "",
        "| model | batch | torch (DRAM) | nearrec.serial ÷ torch | nearrec ÷ torch "
        "| offload ÷ nearrec (DRAM) | ssds | nearrec.serial | nearrec | offload.serial | offload "
        "| nearrec ÷ ssds | nearrec ÷ floor | offload ÷ floor | offload ÷ nearrec (SSD) "
        "| floor: MLP / I/O ms | spread (SSD nearrec) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for model, batch, place in keys:
        # one row per model and batch: a DRAM cell and its SSD twin, or either alone
        if not place.startswith("dram") and (model, batch, place.replace("ssd@25%", "dram")) in by:
            continue
        dram_place = place.replace("ssd@25%", "dram")
        dram = by.get((model, batch, dram_place))
        ssd = by.get((model, batch, dram_place.replace("dram", "ssd@25%")))
        ideal = _sps(dram, "torch")
        ours = ssd.get("nearrec") if ssd else None
        off = ssd.get("offload") if ssd else None
        e = ours.extra if ours else {}
        floor = "—" if "floor_us" not in e else \
            f"{e['mlp_per_batch_us'] / 1e3:.2f} / {e['io_floor_us'] / 1e3:.2f}"
        lines.append(" | ".join([
            f"| {model}{' (RecSSD)' if place.endswith('recssd') else ''}", str(batch),
            _fmt(ideal), _vs(dram, "nearrec.serial", dram, "torch"),
            _vs(dram, "nearrec", dram, "torch"), _vs(dram, "offload", dram, "nearrec"),
            *(_fmt(_sps(ssd, s)) for s in ("ssds", "nearrec.serial", "nearrec",
                                           "offload.serial", "offload")),
            _vs(ssd, "nearrec", ssd, "ssds"),
            _fmt(e.get("time_over_floor"), x),
            _fmt(off.extra.get("time_over_floor") if off else None, x),
            _vs(ssd, "offload", ssd, "nearrec"),
            floor, (_spread(ours) if ours else "—") + " |"]))
    lines += ["", "p50 / p99 batch latency (ms), SSD:", "",
              "| model | batch | ssds | nearrec.serial | nearrec | offload.serial | offload |",
              "|---|---:|---|---|---|---|---|"]
    for model, batch, place in keys:
        if place.startswith("ssd"):
            cell = by[(model, batch, place)]
            lines.append(f"| {model}{' (RecSSD)' if place.endswith('recssd') else ''} | {batch} | "
                         + " | ".join("—" if s not in cell else
                                      f"{cell[s].p50_us / 1e3:,.1f} / {cell[s].p99_us / 1e3:,.1f}"
                                      for s in ("ssds", "nearrec.serial", "nearrec",
                                                "offload.serial", "offload")) + " |")
    lines += ["", "Where the time goes at batch 64, per batch (µs; `engine.dense` and "
              "`engine.blocks` are thread times, overlapping the reads; `engine.route`, "
              "`engine.io_wait` and `engine.pool` split `engine.embeddings`):", ""]
    for model, batch, place in keys:
        if batch != 64:
            continue
        for system in ("torch", "nearrec.serial", "offload.serial"):
            r = by[(model, batch, place)].get(system)
            if r is not None:
                parts = ", ".join(f"{k} {v:,.0f}" for k, v in
                                  r.extra["breakdown_per_batch_us"].items())
                lines.append(f"- {model} {place} {system}: {parts}")
    return "\n".join(lines) + "\n"


#: ``nearrec bench e2e``
HARNESSES = {"e2e": Harness(E2EConfig, E2EConfig.quick,
                            {"--models": "models", "--table-bytes": "table_bytes",
                             "--batches": "batches", "--no-recssd": "recssd",
                             "--places": "places", "--scratch": "scratch"},
                            run, markdown, progress=True)}
