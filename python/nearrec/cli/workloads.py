"""The verbs that work from traces, models and simulated drives: ``trace`` (generate, import,
inspect, profile), ``plan`` and ``colocate`` (a store placed or laid out for a trace),
``infer`` (a model benchmark over a trace) and ``simulate`` (the flash device model). ``bench``
is the benchmark package's own (``nearrec_bench.cli.register``)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import humanize
import numpy as np

import nearrec

from ..errors import InvalidRequest
from ..specs import scaled_rows
from ..units import parse_size
from .flags import store_config
from .output import emit, human_time


def _trace_tables(args: argparse.Namespace) -> tuple[dict[str, int], int]:
    """Tables (name → rows) and pooling factor of ``trace gen --model``."""
    spec = nearrec.model_spec(args.model)
    rows = scaled_rows(spec, args.variant, rows=args.rows)
    return ({f"t{i}": r for i, r in enumerate(rows)},
            args.pooling or spec.pooling_factor(args.variant))


def cmd_trace(args: argparse.Namespace) -> int:
    from .. import trace as nt

    if args.action == "gen":
        if args.generator == "zipf":
            gen = nt.Generator.zipf(args.alpha)
        elif args.generator == "uniform":
            gen = nt.Generator.uniform()
        else:
            gen = nt.Generator.stack_distance(args.k, args.sd_variant, args.ids)
        t = time.perf_counter()
        if args.store:  # its tables (a keyed one's trace draws its keys)
            with nearrec.open(args.store, tier="ssd", progress=False) as store:
                tr = nt.generate(store, args.bags, args.pooling or 80, gen, seed=args.seed,
                                 batch_size=args.batch_size, path=args.path,
                                 overwrite=args.overwrite)
        else:
            tables, pooling = _trace_tables(args)
            tr = nt.generate(tables, args.bags, pooling, gen, seed=args.seed,
                             batch_size=args.batch_size, path=args.path,
                             overwrite=args.overwrite)
        s = time.perf_counter() - t
        lookups = sum(len(tt.indices) for tt in tr.tables.values())
        emit(args, {"path": str(tr.path), "tables": len(tr.tables), "bags": tr.bags,
                     "lookups": lookups, "generator": str(gen), "seconds": s},
              f"wrote {tr.path}: {len(tr.tables)} tables x {tr.bags:,} bags, {lookups:,} "
              f"lookups, {gen}, in {human_time(s)}")
        return 0
    if args.action == "import":
        from .. import datasets

        if args.format == "criteo":
            if args.keys and (args.dictionary or args.hash_rows):
                raise InvalidRequest("--keys keeps each category's value as its key: it takes "
                                     "neither --dictionary nor --hash-rows")
            rows: Any = "keys" if args.keys else None if args.dictionary else (
                args.hash_rows or datasets.CRITEO_KAGGLE_ROWS)
            tr = datasets.criteo(args.source, rows=rows, samples=args.samples,
                                 batch_size=args.batch_size).trace
        elif args.format == "fbgemm":
            tr = datasets.fbgemm_file(args.source, batch_size=args.batch_size)
        else:
            tr = datasets.movielens_100k(args.source, history=args.history,
                                         batch_size=args.batch_size)
        tr = tr.save(args.path, overwrite=args.overwrite)
        emit(args, {"path": str(tr.path), "tables": len(tr.tables), "bags": tr.bags},
              f"wrote {tr.path}: {len(tr.tables)} tables x {tr.bags:,} bags from {args.source}")
        return 0
    tr = nt.load(args.path)
    rows = []
    for name, tt in tr.tables.items():
        row: dict[str, Any] = {"table": name, "rows": tt.rows, "keys": tt.keys,
                               "pooling": tt.pooling,
                               "bags": tt.bags, "lookups": len(tt.indices),
                               "generator": str(tt.generator) if tt.generator else "imported",
                               "first_reference_share": tt.first_reference_share}
        if args.action == "profile":
            p = tt.profile()
            caps = [int(c * tt.rows) if c < 1 else int(c) for c in args.cache]
            row |= {"working_set": p.working_set,
                    "profiled_first_reference_share": p.first_reference_share,
                    "lru_hit_ratio": dict(zip(map(str, caps),
                                              map(float, p.lru_hit_ratio(caps)), strict=True))}
        rows.append(row)
    lines = [f"{tr.path}: {len(tr.tables)} tables x {tr.bags:,} bags, batch {tr.batch_size}, "
             f"seed {tr.seed}"]
    for r in rows:
        share = r["first_reference_share"]
        line = (f"  {r['table']:<12} {r['rows']:>11,} {'keys' if r['keys'] else 'rows'}  "
                f"L={r['pooling']:<4} "
                f"{r['lookups']:>12,} lookups  {r['generator']}"
                + (f"  first refs {100 * share:.1f} %" if share is not None else ""))
        if "working_set" in r:
            line += (f"\n    working set {r['working_set']:,} {'keys' if r['keys'] else 'rows'} "
                     f"({100 * r['working_set'] / max(1, r['rows']):.1f} %), first references "
                     f"{100 * r['profiled_first_reference_share']:.1f} %; LRU hit ratio "
                     + ", ".join(f"{int(c):,} rows {100 * h:.1f} %"
                                 for c, h in r["lru_hit_ratio"].items()))
        lines.append(line)
    emit(args, {"path": str(tr.path), "bags": tr.bags, "batch_size": tr.batch_size,
                 "seed": tr.seed, "tables": rows}, "\n".join(lines))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from ..plan import make_plan

    out = Path(args.out)
    if not args.overwrite and (out.exists() or out.with_name(out.name + ".hot.npz").exists()):
        raise InvalidRequest(f"a plan already exists at {out}; give --overwrite to replace it, "
                             "or --out another file")
    plan = make_plan(args.store, args.trace, args.budget)
    out = plan.save(out)
    png = plan.plot(args.plot) if args.plot else None
    data = {"plan": str(out), "plot": str(png) if png else None, "bytes": plan.bytes,
            "budget_bytes": plan.budget, "expected_hit_ratio": plan.expected_hit_ratio,
            "tables": [{"table": t.table, "type": t.kind, "resident": t.resident,
                        "hot_rows": len(t.hot_rows), "cache_bytes": t.cache_bytes,
                        "bytes": t.bytes, "expected_hit_ratio": t.expected_hit_ratio,
                        "working_set": t.working_set, "locality": t.locality}
                       for t in plan.tables.values()]}
    budget = humanize.naturalsize(args.budget, binary=True, format="%.4g").replace(" ", "")
    emit(args, data, plan.text() + f"\nwrote {out}" + (f" and {png}" if png else "")
          + f"\napply it: nearrec lookup {args.store} --plan {out} --dram-budget {budget} "
            f"(or serve / infer, or nearrec.open({str(args.store)!r}, plan={str(out)!r}, "
            f"dram_budget={args.budget}))")
    return 0


def cmd_infer(args: argparse.Namespace) -> int:
    import torch

    from .. import models
    from .. import trace as nt
    from ..torch import KeyedJaggedTensor

    def fresh() -> tuple[nearrec.Store, models._Model | models.Offloaded]:
        """The store opened anew, caches empty: each run starts from the same state; the model
        run whole by the engine with ``--offload``."""
        store = nearrec.open(args.store, store_config(args), progress=args.progress)
        model = models.build(args.model, store, seed=args.seed)
        return store, models.offload(model) if args.offload else model

    spec = nearrec.model_spec(args.model)
    tr = nt.load(args.trace)
    rng = np.random.default_rng(args.seed)
    batches = []
    for b in range(min(args.batches, tr.bags // args.batch)):
        lookups = tr.batch(b * args.batch, (b + 1) * args.batch)
        values = np.concatenate([np.asarray(r.indices) for r in lookups])
        lengths = np.concatenate([np.diff(np.append(np.asarray(r.offsets), len(r.indices)))
                                  for r in lookups])
        dense = torch.from_numpy(rng.standard_normal((args.batch, spec.dense_features),
                                                     dtype=np.float32)) \
            if spec.dense_features else None
        batches.append((dense, KeyedJaggedTensor([r.table for r in lookups],
                                                 torch.from_numpy(values),
                                                 torch.from_numpy(lengths))))
    runs: dict[str, dict[str, Any]] = {}
    tier = ""
    for depth in (0, args.depth):
        store, model = fresh()
        tier = store.tier
        res = models.infer(model, batches, depth, sub_batch=args.sub_batch if depth else None)
        name = "sequential" if depth == 0 else f"pipelined (depth {depth}" + (
            f", sub-batches of {args.sub_batch})" if args.sub_batch else ")")
        runs[name] = {
            "samples_per_s": res.samples_per_s, "seconds": res.seconds,
            "embedding_wait_s": res.embedding_wait, "dense_s": res.dense,
            "breakdown_s": res.breakdown}
        del model, store
    lines = [f"benchmark: {args.model}{' offloaded' if args.offload else ''} with random dense "
             f"weights and features on {tier}, {len(batches)} batches of {args.batch} from the "
             "trace, each run from a freshly opened store; nothing is saved (nearrec predict "
             "runs a model kept with its store on real inputs)"]
    for name, r in runs.items():
        lines.append(f"  {name:<22} {r['samples_per_s']:>10,.0f} samples/s, wall "
                     f"{human_time(r['seconds'])}: " + ", ".join(
                         f"{k.replace('_', ' ')} {human_time(v)}"
                         for k, v in r["breakdown_s"].items()))
    emit(args, {"model": args.model, "offload": args.offload, "tier": tier, "batch": args.batch,
                 "batches": len(batches), "runs": runs}, "\n".join(lines))
    return 0

def cmd_colocate(args: argparse.Namespace) -> int:
    from ..plan import colocate

    si = colocate(args.store, args.trace, args.out, how=args.how, tables=args.table,
                  overwrite=args.overwrite, progress=args.progress)
    moved = [t.name for t in si.tables if t.colocated]
    emit(args, {"path": str(si.path), "format_version": si.format_version, "how": args.how,
                 "colocated": moved},
          f"wrote {si.path} (format v{si.format_version}): {len(moved)} of {len(si.tables)} "
          f"tables co-located by {args.how}: {', '.join(moved)}")
    return 0


def _values(text: str | None, cast: Any) -> list[Any] | None:
    return None if text is None else [cast(v) for v in text.split(",")]


def cmd_simulate(args: argparse.Namespace) -> int:
    from .. import simulate as sim

    dev = sim.device(args.device)
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise InvalidRequest(f"--set takes key=value, not {item!r}")
        if value and value[-1].isalpha() and value[0].isdigit():
            value = str(parse_size(value))
        sim.set_field(dev, key, value)
    modes = list(sim.MODES) if args.mode == "all" else args.mode.split(",")
    over: dict[str, Iterable[Any]] = {}
    for key, cast in (("batch", int), ("k", float), ("pooling", int), ("dim", int),
                      ("dtype", str), ("tables", int), ("rows", int)):
        vals = _values(getattr(args, key), cast)
        if vals is not None:
            over[key] = vals
    fixed: dict[str, Any] = {"batches": args.batches, "warmup": args.warmup,
                             "placement": args.placement, "seed": args.seed}
    if args.uniform:
        over.pop("k", None)
        fixed["k"] = None
    if args.stride:
        fixed["stride"] = args.stride
    if args.sequential:
        fixed["sequential"] = True
    reports = sim.sweep(args.model.split(","), dev, modes, over=over, **fixed)
    if args.out_json:
        Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out_json).write_text(json.dumps({"device": dev, "reports": reports}, indent=1))
    if args.png:
        x = args.x or next(iter(over), "batch")
        sim.plot(reports, x, args.y, args.png, logy=args.logy)
    cols = ["model", "mode", *over, "latency_p50_ms", "latency_p99_ms", "throughput",
            "flash_reads", "link_bytes", "read_amplification"]
    if "ssd-s" in modes:
        cols.append("traffic_reduction")
    lines = ["  ".join(f"{c:>14}" for c in cols)]
    for r in reports:
        cells = []
        for c in cols:
            v = r[c]
            cells.append(f"{v:>14.4g}" if isinstance(v, float) else f"{v!s:>14}")
        lines.append("  ".join(cells))
    emit(args, reports, f"device {dev['name']} (simulated)\n" + "\n".join(lines))
    return 0
