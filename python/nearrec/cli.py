"""The ``nearrec`` command line: build, info, verify, gc, update, compact, serve, lookup,
predict, trace, infer, plan, colocate, simulate, bench.

Human-readable output by default, ``--json`` for machines; progress bars on long work when
stderr is a terminal (``--progress`` forces them). Errors print one line and exit with status 2
(bad input) or 1 (the store, the system, a missing extra); ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import humanize
import numpy as np

import nearrec

from .errors import InvalidRequest, NearrecError
from .remote import DEFAULT_TIMEOUT
from .request import count, regular_file
from .specs import scaled_rows
from .units import parse_size


def parse_bytes(text: str) -> int:
    """A size argument (see :func:`nearrec.units.parse_size`)."""
    try:
        return parse_size(text)
    except InvalidRequest as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: the store settings every verb that opens a store takes as flags: overrides of --config
_STORE_FLAGS = ("tier", "threads", "dram_budget", "cache_policy", "admission_probability",
                "io_queue_depth", "plan", "device")


def store_flags(p: argparse.ArgumentParser, config_flag: str = "--config") -> None:
    """``--config FILE`` (``config_flag``) and the flags that override its settings (unset
    flags leave the file's values, whose own defaults are ``nearrec.StoreConfig``'s: one copy,
    in Rust)."""
    g = p.add_argument_group(f"store settings (override {config_flag})")
    g.add_argument(config_flag, dest="store_config",
                   help="a store config file (TOML), as nearrec.StoreConfig and "
                   "nearrec::StoreConfig read it")
    g.add_argument("--tier", choices=["auto", "dram", "ssd"],
                   help="serve from DRAM, read rows from SSD per batch, or DRAM if the store "
                        "fits --dram-budget (default: the config's, auto)")
    g.add_argument("--threads", type=int, help="pooling threads (0: every core)")
    g.add_argument("--dram-budget", help="DRAM for the store, e.g. 4GiB")
    g.add_argument("--cache-policy", choices=["lru", "lfu", "lru_pa", "lfu_pa"])
    g.add_argument("--admission-probability", type=float)
    g.add_argument("--io-queue-depth", type=int)
    g.add_argument("--plan", help="a plan file (nearrec plan) placing rows in DRAM")
    g.add_argument("--device", help="serve the SSD tier from a simulated drive (a preset or a "
                   "JSON parameter file)")


def store_config(args: argparse.Namespace) -> nearrec.StoreConfig:
    """The config ``--config`` names (or the defaults), with the flags given on top."""
    base = (nearrec.StoreConfig.from_file(args.store_config)
            if getattr(args, "store_config", None) else nearrec.StoreConfig())
    return base.replace(**{k: getattr(args, k) for k in _STORE_FLAGS
                           if getattr(args, k, None) is not None})


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=1, default=str) if args.json else text)


def cmd_build(args: argparse.Namespace) -> int:
    t = time.perf_counter()
    if args.npy:
        arrays = {}
        for item in args.npy:
            name, _, file = item.partition("=")
            if not file:
                raise InvalidRequest(f"--npy takes NAME=FILE.npy, got {item!r}")
            arrays[name] = Path(file)
        info = nearrec.from_numpy(args.path, arrays, dtype=args.dtype, overwrite=args.overwrite,
                                  progress=args.progress)
    elif args.state_dict:
        info = nearrec.from_state_dict(args.path, Path(args.state_dict), dtype=args.dtype,
                                       overwrite=args.overwrite, progress=args.progress)
    else:
        info = nearrec.build(args.path, args.model, rows=args.rows, table_bytes=args.table_bytes,
                             seed=args.seed, dtype=args.dtype, variant=args.variant,
                             overwrite=args.overwrite, progress=args.progress)
    s = time.perf_counter() - t
    _emit(args, {"path": str(info.path), "tables": len(info.tables), "bytes": info.total_bytes,
                 "seconds": s, "bytes_per_s": info.total_bytes / s},
          f"built {info.path}: {len(info.tables)} tables, {human_bytes(info.total_bytes)} in "
          f"{human_time(s)} ({human_bytes(info.total_bytes / s)}/s)")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    info = nearrec.info(args.path)
    data = {"path": str(info.path), "format_version": info.format_version,
            "created_by": info.created_by, "params": info.params,
            "total_bytes": info.total_bytes,
            "tables": [asdict(t) | {"padding_ratio": t.padding_ratio} for t in info.tables]}
    lines = [f"{info.path}  (format v{info.format_version}, {info.created_by}, "
             f"{human_bytes(info.total_bytes)})", f"params: {json.dumps(info.params)}",
             f"{'table':<20} {'rows':>12} {'dim':>6} {'dtype':>6} {'row B':>6} {'pad %':>6}"
             "  rows"]
    for t in info.tables:
        lines.append(f"{t.name:<20} {t.rows:>12,} {t.dim:>6} {t.dtype:>6} {t.row_bytes:>6} "
                     f"{100 * t.padding_ratio:>6.2f}  {'co-located' if t.colocated else 'by id'}")
    if info.attachments:
        lines.append(f"attachments: {', '.join(info.attachments)}")
    _emit(args, data | {"attachments": list(info.attachments)}, "\n".join(lines))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    try:
        checks = nearrec.verify(args.path, progress=args.progress)
    except NearrecError as e:
        if not args.json:
            raise
        # a store that does not open is still an answer a machine can read
        print(json.dumps({"ok": False, "path": str(args.path), "error": str(e),
                          "error_type": type(e).__name__, "tables": []}, indent=1))
        return 2 if isinstance(e, InvalidRequest) else 1
    bad = [c for c in checks if not c.ok]
    _emit(args, {"ok": not bad, "tables": [asdict(c) for c in checks]},
          "\n".join(f"{'ok ' if c.ok else 'BAD'} {c.table}: {c.bytes:,} bytes"
                    + (f" — {c.error}" if c.error else "") for c in checks)
          + f"\n{len(checks) - len(bad)}/{len(checks)} tables ok")
    return 1 if bad else 0


def cmd_gc(args: argparse.Namespace) -> int:
    report = nearrec.gc(args.path)
    _emit(args, {"removed": [asdict(x) for x in report.removed],
                 "kept": [asdict(x) for x in report.kept]},
          "\n".join([f"removed {x.path} ({x.bytes:,} bytes): {x.reason}" for x in report.removed]
                    + [f"kept    {x.path} ({x.bytes:,} bytes): {x.reason}" for x in report.kept]
                    + [f"{len(report.removed)} removed ({report.removed_bytes:,} bytes), "
                       f"{len(report.kept)} kept"]))
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    config = store_config(args).replace(writable=True, durability=args.durability)
    store = nearrec.open(args.path, config, progress=args.progress)
    tables = [t.strip() for t in args.tables.split(",")] if args.tables else None
    start = time.perf_counter()
    done = nearrec.update(store, args.source, tolerance=args.tolerance, tables=tables)
    compacted = store.compact() if args.compact else None
    seconds = time.perf_counter() - start
    rows = sum(d.written for d in done.values())
    _emit(args, {"version": store.version, "seconds": seconds,
                 "tables": {t: asdict(d) for t, d in done.items()},
                 "compaction": asdict(compacted) if compacted else None},
          "\n".join(f"{t}: {d.written:,} of {d.compared:,} rows written in {d.calls} call(s)"
                     for t, d in done.items())
          + f"\n{rows:,} rows in {human_time(seconds)}; the store is at version {store.version}"
          + (f", compacted ({human_bytes(compacted.bytes)} written)" if compacted else ""))
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    store = nearrec.open(args.path, store_config(args).replace(writable=True, auto_compact=False),
                         progress=args.progress)
    before = store.live_stats()
    done = store.compact()
    _emit(args, {"version": done.version, "compaction": asdict(done),
                 "log_bytes_before": before["log_bytes"],
                 "log_bytes_after": store.live_stats()["log_bytes"]},
          f"{done.rows:,} rows folded into {done.tables} table(s) ({human_bytes(done.bytes)} "
          f"written in {human_time(done.seconds)}); the tables hold version {done.version}")
    return 0


def _load_npy(path: str, what: str) -> np.ndarray:
    """An ``.npy`` array named on the command line (a typed error for anything else)."""
    file = regular_file(path, what)
    try:
        a = np.load(file, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise InvalidRequest(f"{what}: {file!r} is not a readable .npy file: {e}") from None
    if not isinstance(a, np.ndarray):
        raise InvalidRequest(f"{what}: {file!r} is an .npz archive, not one .npy array")
    return a


def cmd_serve(args: argparse.Namespace) -> int:
    """The node ``--config`` describes (or the defaults), each flag given set on top: the
    stores named here replace the file's, ``--store-config`` its ``[store]``, the store flags
    (``--tier``, ...) that table's settings. Every check and default is the node's own
    (``nearrec_server::NodeConfig``)."""
    from . import _native
    overrides: list[tuple[str, Any]] = [
        (key, getattr(args, _flag_dest(name)))
        for name, key, *_ in _native.node_flags()
        if getattr(args, _flag_dest(name)) is not None]
    overrides += [(f"store.{k}", str(getattr(args, k)) if k == "plan" else getattr(args, k))
                  for k in _STORE_FLAGS if getattr(args, k, None) is not None]
    if args.stores:
        overrides.append(("stores", list(args.stores)))
    store = (nearrec.StoreConfig.from_file(args.store_config).native()
             if args.store_config else None)
    _native.serve(_native.NodeConfig(args.config, overrides, store))
    return 0


def _flag_dest(name: str) -> str:
    """The attribute argparse keeps flag ``--name``'s value in."""
    return "node_" + name.replace("-", "_")


def human_time(x: float) -> str:
    """A duration for people: ``214 µs``, ``26.0 ms``, ``1.18 s``."""
    return humanize.metric(x, "s").replace("μ", "µ")


def human_bytes(n: float) -> str:
    """Bytes for people: ``4.5 MiB``."""
    return str(humanize.naturalsize(n, binary=True))


def cmd_lookup(args: argparse.Namespace) -> int:
    store: Any
    if args.remote:
        store = nearrec.connect(args.remote, args.path or "", token=args.token,
                                timeout=args.timeout, tls_ca=args.tls_ca)
    elif args.path:
        store = nearrec.open(args.path, store_config(args), progress=args.progress)
    else:
        raise InvalidRequest("nearrec lookup needs a store: a PATH, or --remote HOST:PORT "
                             "(and the store's name on the node as PATH)")
    tables = args.table or list(store.tables)
    repeat = count(args.repeat, "--repeat")
    rng = np.random.default_rng(args.seed)

    def batch() -> list[nearrec.TableLookup]:
        """The given bags, or fresh uniform ones: each repeat draws its own, so that what the
        DRAM tiers serve and how fast is not one batch read again."""
        reqs = []
        for name in tables:
            rows = store.table(name).rows
            if args.indices:
                idx = _load_npy(args.indices, "--indices")
                off = _load_npy(args.offsets, "--offsets") if args.offsets else None
                if off is None and idx.ndim == 1:
                    off = np.arange(0, len(idx), args.pooling)
            else:
                idx = rng.integers(0, rows, args.batch * args.pooling)
                off = np.arange(0, len(idx), args.pooling)
            reqs.append(nearrec.TableLookup(name, idx, off, mode=args.mode))
        return reqs

    given = batch() if args.indices else None
    lat, lookups = [], 0
    for _ in range(repeat):
        reqs = given or batch()
        t = time.perf_counter()
        out = store.lookup_many(reqs)
        lat.append(time.perf_counter() - t)
        lookups += sum(len(np.asarray(r.indices).reshape(-1)) for r in reqs)
    b = out.values.shape[0]
    p50, p99 = np.percentile(np.array(lat), [50, 99])
    data = {"shape": list(out.values.shape), "batches": repeat,
            "fresh_batches": given is None, "p50_us": p50 * 1e6, "p99_us": p99 * 1e6,
            "samples_per_s": b * repeat / sum(lat), "lookups_per_s": lookups / sum(lat),
            "first_row": out.values[0, :8].tolist() if b else []}
    stats = store.stats()
    if stats and "batches" not in stats:
        stats = {}  # a DRAM-resident store on a node: nothing of the SSD tier to show
    if stats:
        data["stats"] = stats
    if args.output:
        np.save(args.output, out.values)
    what = (f"{repeat} batches of {b} bags x {len(tables)} tables, each drawn afresh (uniform "
            f"ids, seed {args.seed})" if given is None else
            f"the given batch ({b} bags x {len(tables)} tables) {repeat} times: after the first, "
            f"its rows may be in DRAM")
    text = (f"{what} -> {tuple(out.values.shape)}\n"
            f"per batch p50 {human_time(p50)}, p99 {human_time(p99)}; "
            f"{data['lookups_per_s'] / 1e6:.2f}M lookups/s\n"
            f"last batch's first row: "
            f"{np.array2string(out.values[0, :8], precision=4) if b else '-'}")
    if stats:
        text += "\n" + format_stats(stats)
    _emit(args, data, text)
    return 0


def format_stats(s: dict[str, float | str | bool]) -> str:
    """The SSD tier's accounting, a few lines for people. A node's stats (``RemoteStore``)
    carry the counters but not how the device reads (``direct_io``, ``block_bytes``): what is
    not there is left out, not guessed."""
    def n(k: str) -> float:
        return float(s[k])

    how = [] if "direct_io" not in s else ["direct" if s["direct_io"] else "buffered"]
    if "block_bytes" in s:
        how.append(f"{n('block_bytes'):.0f} B blocks")
    device = f"{s['device']} ({', '.join(how)})" if how else str(s["device"])
    lines = [f"ssd tier: {device}; {n('batches'):.0f} batches, "
             f"{n('lookups'):,.0f} lookups, {n('unique_rows'):,.0f} distinct rows, "
             f"{n('device_reads'):,.0f} reads ({n('reads_saved_dedup'):,.0f} saved by "
             f"de-duplication, {n('reads_saved_merge'):,.0f} by merging)",
             f"  read {human_bytes(n('bytes_read'))}, of which useful "
             f"{human_bytes(n('useful_bytes'))} "
             f"(amplification {n('read_amplification'):.2f}); most reads in one batch "
             f"{n('max_batch_reads'):,.0f}"]
    if n("dram_tier_bytes") > 0:
        lines.append(f"  dram tiers ({human_bytes(n('dram_tier_bytes'))}) served "
                     f"{100 * n('dram_hit_ratio'):.1f} % of lookups (whole tables "
                     f"{n('lookups_resident'):,.0f}, hot rows {n('lookups_hot'):,.0f}, row cache "
                     f"{n('lookups_cache'):,.0f}; ssd {n('lookups_ssd'):,.0f}); cache admitted "
                     f"{n('cache_admissions'):,.0f}, turned away {n('cache_rejections'):,.0f}, "
                     f"evicted {n('cache_evictions'):,.0f}")
    for stage in ("route", "io_wait", "pool", "end_to_end"):
        lines.append(f"  {stage:10} " + "  ".join(
            f"{q} {human_time(n(f'{stage}_{k}_us') / 1e6):>9}"
            for q, k in (("p50", "p50"), ("p95", "p95"), ("p99", "p99"), ("p99.9", "p999"))))
    return "\n".join(lines)


def _trace_tables(args: argparse.Namespace) -> tuple[dict[str, int], int]:
    """Tables (name → rows) and pooling factor of ``trace gen``: a store's, or a model's."""
    if args.store:
        tables = {t.name: t.rows for t in nearrec.info(args.store).tables}
        return tables, args.pooling or 80
    spec = nearrec.model_spec(args.model)
    rows = scaled_rows(spec, args.variant, rows=args.rows)
    return ({f"t{i}": r for i, r in enumerate(rows)},
            args.pooling or spec.pooling_factor(args.variant))


def cmd_trace(args: argparse.Namespace) -> int:
    from . import trace as nt

    if args.action == "gen":
        if args.generator == "zipf":
            gen = nt.Generator.zipf(args.alpha)
        elif args.generator == "uniform":
            gen = nt.Generator.uniform()
        else:
            gen = nt.Generator.stack_distance(args.k, args.sd_variant, args.ids)
        tables, pooling = _trace_tables(args)
        t = time.perf_counter()
        tr = nt.generate(tables, args.bags, pooling, gen, seed=args.seed,
                         batch_size=args.batch_size, path=args.path, overwrite=args.overwrite)
        s = time.perf_counter() - t
        lookups = sum(len(tt.indices) for tt in tr.tables.values())
        _emit(args, {"path": str(tr.path), "tables": len(tr.tables), "bags": tr.bags,
                     "lookups": lookups, "generator": str(gen), "seconds": s},
              f"wrote {tr.path}: {len(tr.tables)} tables x {tr.bags:,} bags, {lookups:,} "
              f"lookups, {gen}, in {human_time(s)}")
        return 0
    if args.action == "import":
        from . import datasets

        if args.format == "criteo":
            tr = datasets.criteo(args.source, rows=None if args.dictionary else
                                 (args.hash_rows or datasets.CRITEO_KAGGLE_ROWS),
                                 samples=args.samples, batch_size=args.batch_size).trace
        elif args.format == "fbgemm":
            tr = datasets.fbgemm_file(args.source, batch_size=args.batch_size)
        else:
            tr = datasets.movielens_100k(args.source, history=args.history,
                                         batch_size=args.batch_size)
        tr = tr.save(args.path, overwrite=args.overwrite)
        _emit(args, {"path": str(tr.path), "tables": len(tr.tables), "bags": tr.bags},
              f"wrote {tr.path}: {len(tr.tables)} tables x {tr.bags:,} bags from {args.source}")
        return 0
    tr = nt.load(args.path)
    rows = []
    for name, tt in tr.tables.items():
        row: dict[str, Any] = {"table": name, "rows": tt.rows, "pooling": tt.pooling,
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
        line = (f"  {r['table']:<12} {r['rows']:>11,} rows  L={r['pooling']:<4} "
                f"{r['lookups']:>12,} lookups  {r['generator']}"
                + (f"  first refs {100 * share:.1f} %" if share is not None else ""))
        if "working_set" in r:
            line += (f"\n    working set {r['working_set']:,} rows "
                     f"({100 * r['working_set'] / r['rows']:.1f} %), first references "
                     f"{100 * r['profiled_first_reference_share']:.1f} %; LRU hit ratio "
                     + ", ".join(f"{int(c):,} rows {100 * h:.1f} %"
                                 for c, h in r["lru_hit_ratio"].items()))
        lines.append(line)
    _emit(args, {"path": str(tr.path), "bags": tr.bags, "batch_size": tr.batch_size,
                 "seed": tr.seed, "tables": rows}, "\n".join(lines))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from .plan import make_plan

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
    _emit(args, data, plan.text() + f"\nwrote {out}" + (f" and {png}" if png else "")
          + f"\napply it: nearrec lookup {args.store} --plan {out} --dram-budget {budget} "
            f"(or serve / infer, or nearrec.open({str(args.store)!r}, plan={str(out)!r}, "
            f"dram_budget={args.budget}))")
    return 0


def cmd_infer(args: argparse.Namespace) -> int:
    import torch

    from . import models
    from . import trace as nt
    from .torch import KeyedJaggedTensor

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
    _emit(args, {"model": args.model, "offload": args.offload, "tier": tier, "batch": args.batch,
                 "batches": len(batches), "runs": runs}, "\n".join(lines))
    return 0


def _predict_inputs(path: str, inputs: list[str], rows: list[int]
                    ) -> tuple[np.ndarray | None, dict[str, tuple[np.ndarray, np.ndarray]], int]:
    """Dense features and per input ``(ids, lengths)`` from an ``.npz`` or Criteo TSV rows
    (hashed into ``rows``, each input's table's)."""
    src = Path(regular_file(path, "--inputs"))
    ids: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if src.suffix == ".npz":
        with np.load(src, allow_pickle=False) as f:
            files = set(f.files)
            dense = np.asarray(f["dense"], np.float32) if "dense" in files else None
            for name in inputs:
                if name not in files:
                    raise InvalidRequest(f"{path}: no array {name!r} (the model's inputs are "
                                         f"{inputs}; each NAME holds its ids, NAME.lengths the "
                                         "ids per sample, or NAME is [samples, ids])",
                                         table=name)
                x = np.asarray(f[name])
                if x.ndim == 2:
                    ids[name] = (x.reshape(-1), np.full(x.shape[0], x.shape[1], np.int64))
                elif f"{name}.lengths" in files:
                    ids[name] = (x, np.asarray(f[f"{name}.lengths"]))
                else:
                    raise InvalidRequest(f"{path}: {name!r} is 1-D but there is no "
                                         f"{name}.lengths", table=name)
    else:  # Criteo TSV: the 26 categorical columns are the model's inputs in order
        from .datasets import CRITEO_SPARSE, criteo

        if len(inputs) != CRITEO_SPARSE:
            raise InvalidRequest(f"Criteo rows have {CRITEO_SPARSE} categorical features; the "
                                 f"model takes {len(inputs)} inputs")
        log = criteo(src, rows=rows)
        dense = np.log1p(np.maximum(log.dense, 0)).astype(np.float32)
        ids = {name: (np.asarray(t.indices), np.diff(np.asarray(t.offsets)))
               for name, t in zip(inputs, log.trace.tables.values(), strict=True)}
    samples = {len(v[1]) for v in ids.values()} | ({len(dense)} if dense is not None else set())
    if len(samples) != 1:
        raise InvalidRequest(f"{path}: the inputs disagree on the number of samples "
                             f"({sorted(samples)})")
    return dense, ids, samples.pop()


def cmd_predict(args: argparse.Namespace) -> int:
    store = nearrec.open(args.store, store_config(args), progress=args.progress)
    # the model kept with the store as the engine reads it: its name, inputs and their tables
    name, inputs, tables = store._native.model_inputs()
    dense, ids, n = _predict_inputs(args.inputs, inputs, [store.table(t).rows for t in tables])
    batch = count(args.batch, "--batch")
    bounds = {k: np.concatenate([[0], np.cumsum(lengths)]) for k, (_, lengths) in ids.items()}
    out = []
    start = time.perf_counter()
    for lo in range(0, n, batch):
        hi = min(n, lo + batch)
        reqs = [nearrec.TableLookup(k, v[bounds[k][lo]:bounds[k][hi]], lengths=lengths[lo:hi])
                for k, (v, lengths) in ids.items()]
        out.append(store.infer(None if dense is None else dense[lo:hi], reqs))
    spent = time.perf_counter() - start
    preds = np.concatenate(out) if out else np.empty((0, 0), np.float32)
    dest = Path(args.out)
    if dest.suffix in (".csv", ".tsv"):
        np.savetxt(dest, preds, delimiter="," if dest.suffix == ".csv" else "\t", fmt="%.7g")
    else:
        np.save(dest, preds)
    _emit(args, {"model": name, "samples": n, "outputs": preds.shape[1] if preds.ndim == 2
                 else 0, "out": str(dest), "seconds": spent},
          f"{name} on {n:,} samples from {args.inputs} -> {dest} {tuple(preds.shape)} "
          f"in {human_time(spent)} ({n / spent if spent else 0:,.0f} samples/s, store on "
          f"{store.tier})")
    return 0


def cmd_colocate(args: argparse.Namespace) -> int:
    from .plan import colocate

    si = colocate(args.store, args.trace, args.out, how=args.how, tables=args.table,
                  overwrite=args.overwrite, progress=args.progress)
    moved = [t.name for t in si.tables if t.colocated]
    _emit(args, {"path": str(si.path), "format_version": si.format_version, "how": args.how,
                 "colocated": moved},
          f"wrote {si.path} (format v{si.format_version}): {len(moved)} of {len(si.tables)} "
          f"tables co-located by {args.how}: {', '.join(moved)}")
    return 0


def _values(text: str | None, cast: Any) -> list[Any] | None:
    return None if text is None else [cast(v) for v in text.split(",")]


def cmd_simulate(args: argparse.Namespace) -> int:
    from . import simulate as sim

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
    _emit(args, reports, f"device {dev['name']} (simulated)\n" + "\n".join(lines))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    # the harnesses are a separate distribution (bench/ in the repository), not in this wheel;
    # each declares its flags there, and WHAT's parser reads the rest of the command line
    try:
        import nearrec_bench._native  # noqa: F401  (built, not only on the path)
        from nearrec_bench.cli import parse, run
    except ImportError as e:
        if not (e.name or "").startswith("nearrec_bench"):
            raise
        print("nearrec: error: `nearrec bench` needs the benchmark package (nearrec-bench), which "
              "the nearrec wheel leaves out: in a checkout, run `make develop` or "
              "`pip install ./bench`", file=sys.stderr)
        return 2
    parse(args.what, args.flags, args, _Parser)  # --out's default too
    command = "nearrec " + " ".join(sys.argv[1:]) if sys.argv[0].endswith("nearrec") \
        else "nearrec bench " + " ".join(sys.argv[2:])
    js, mdp, md = run(args, command)
    _emit(args, {"json": str(js), "markdown": str(mdp)}, md + f"\nwrote {js} and {mdp}")
    return 0


def common(sp: argparse.ArgumentParser) -> None:
    """The flags every command takes (and every ``nearrec bench`` harness)."""
    sp.add_argument("--json", action="store_true", help="print JSON for machines")
    sp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bars (default: when stderr is a terminal; --progress "
                         "draws them on a pipe too, a line a second)")
    sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                    help="show the traceback of a failure")


class _Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are one line too (the usage itself is in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"nearrec: error: {message} (see: {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="nearrec", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"nearrec {nearrec.__version__}")
    p.add_argument("--debug", action="store_true", default=False,
                   help="show the traceback of a failure")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="create a store (model spec, .npy files or a state dict)")
    b.add_argument("path")
    b.add_argument("--model", default="rmc1", choices=sorted(nearrec.MODELS))
    b.add_argument("--variant", default="deeprecsys", choices=["deeprecsys", "recssd"])
    size = b.add_mutually_exclusive_group()
    size.add_argument("--rows", type=int, help="rows of every table")
    size.add_argument("--table-bytes", type=parse_bytes, help="total table bytes, e.g. 16GiB")
    b.add_argument("--npy", action="append", metavar="NAME=FILE.npy", help="a table from .npy")
    b.add_argument("--state-dict", metavar="FILE.pt", help="tables from a saved state dict")
    b.add_argument("--dtype", default="fp32", choices=["fp32", "fp16", "bf16", "int8"])
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--overwrite", action="store_true")
    common(b)
    b.set_defaults(func=cmd_build)

    i = sub.add_parser("info", help="show a store's manifest")
    i.add_argument("path")
    common(i)
    i.set_defaults(func=cmd_info)

    v = sub.add_parser("verify", help="check every data byte against its checksum")
    v.add_argument("path")
    common(v)
    v.set_defaults(func=cmd_verify)

    g = sub.add_parser("gc", help="remove what killed builds and attaches left (at a store, or "
                                  "in a directory of stores)")
    g.add_argument("path")
    common(g)
    g.set_defaults(func=cmd_gc)

    up = sub.add_parser("update", help="write a trainer's rows into a store while it serves "
                                       "(the rows that differ)")
    up.add_argument("path")
    up.add_argument("--from", dest="source", required=True, metavar="FILE",
                    help="an .npz of tables (NAME = the whole table, or NAME.ids + NAME.rows) "
                         "or a saved PyTorch / TorchRec state dict (.pt)")
    up.add_argument("--tolerance", type=float, default=0.0,
                    help="rows that differ by no more than this in every value are left")
    up.add_argument("--tables", help="comma-separated tables to update (default: all given)")
    up.add_argument("--durability", choices=["sync", "async"], default="sync")
    up.add_argument("--compact", action="store_true",
                    help="fold the written rows into the table files before exiting")
    store_flags(up)
    common(up)
    up.set_defaults(func=cmd_update)

    cp = sub.add_parser("compact", help="fold a live store's logged writes into its table files")
    cp.add_argument("path")
    store_flags(cp)
    common(cp)
    cp.set_defaults(func=cmd_compact)

    sv = sub.add_parser("serve", help="serve stores over gRPC: the storage node "
                                      "(nearrec.connect, grpcurl, grpc.health.v1)")
    sv.add_argument("stores", nargs="*", metavar="STORE[=NAME]",
                    help="a store directory, named on the node by NAME (default: the "
                         "directory's name); given, they replace --config's stores")
    sv.add_argument("--config", metavar="FILE",
                    help="the node's config (TOML: its settings, the stores' under [store]; "
                         "docs/serving.md); the flags below override it")
    # the node's own flags, as nearrec-server has them (one list, in Rust)
    types = {"int": int, "float": float, "text": str}
    for name, _key, kind, metavar, help_, default in nearrec._native.node_flags():
        shown = f"{help_} (default: {default})" if default else help_
        if kind == "switch":
            sv.add_argument(f"--{name}", dest=_flag_dest(name), action="store_const",
                            const=True, default=None, help=shown)
        else:
            sv.add_argument(f"--{name}", dest=_flag_dest(name), type=types[kind],
                            metavar=metavar, help=shown)
    store_flags(sv, config_flag="--store-config")
    sv.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                    help="show the traceback of a failure")
    sv.set_defaults(func=cmd_serve)

    lk = sub.add_parser("lookup", help="pool random (or given) bags and print the result")
    lk.add_argument("path", nargs="?",
                    help="the store (with --remote: its name on the node; default: the "
                         "node's only store)")
    lk.add_argument("--remote", metavar="HOST:PORT", help="a storage node (nearrec serve)")
    lk.add_argument("--token", help="with --remote: a bearer token")
    lk.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                    help="with --remote: each call's deadline, s (default: %(default)s)")
    lk.add_argument("--tls-ca", metavar="PEM",
                    help="with --remote: TLS, the node's certificate checked against this CA")
    lk.add_argument("--table", action="append", help="table(s) to query (default: all)")
    lk.add_argument("--batch", type=int, default=16)
    lk.add_argument("--pooling", type=int, default=20, help="lookups per bag")
    lk.add_argument("--mode", default="sum", choices=["sum", "mean", "max"])
    lk.add_argument("--indices", help=".npy of indices (1-D with --offsets, or 2-D)")
    lk.add_argument("--offsets", help=".npy of offsets")
    lk.add_argument("--output", help="save the pooled [batch, Σ dim] array to this .npy")
    lk.add_argument("--repeat", type=int, default=20,
                    help="batches to run: random ones are drawn afresh for each; given ones "
                         "(--indices) run again")
    lk.add_argument("--seed", type=int, default=0)
    store_flags(lk)
    common(lk)
    lk.set_defaults(func=cmd_lookup)

    tr = sub.add_parser("trace", help="generate, inspect and profile request traces")
    tsub = tr.add_subparsers(dest="action", required=True)
    tg = tsub.add_parser("gen", help="write a synthetic trace file")
    tg.add_argument("path")
    src = tg.add_mutually_exclusive_group()
    src.add_argument("--model", default="rmc1", choices=sorted(nearrec.MODELS),
                     help="tables and pooling factor of a benchmark model")
    src.add_argument("--store", help="the tables of this store")
    tg.add_argument("--variant", default="deeprecsys", choices=["deeprecsys", "recssd"],
                    help="the model's row counts")
    tg.add_argument("--rows", type=int, help="rows of every table (with --model)")
    tg.add_argument("--pooling", type=int, help="lookups per bag (default: the model's, or 80)")
    tg.add_argument("--bags", type=int, default=10_000, help="samples")
    tg.add_argument("--batch-size", type=int, default=64, help="the batch size hint stored")
    tg.add_argument("--generator", default="sd", choices=["sd", "zipf", "uniform"])
    tg.add_argument("--k", type=float, default=1.0, help="stack-distance locality (0: most)")
    tg.add_argument("--sd-variant", default="continuous", choices=["continuous", "per_bag"])
    tg.add_argument("--ids", default="full", choices=["full", "recssd"],
                    help="every row (full) or RecSSD's rows 0, 128, 256, ...")
    tg.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent")
    tg.add_argument("--seed", type=int, default=0)
    tg.add_argument("--overwrite", action="store_true")
    ti = tsub.add_parser("import", help="a trace file from real data (a local copy)")
    ti.add_argument("format", choices=["criteo", "fbgemm", "movielens"],
                    help="Criteo TSV (.gz ok), a dlrm_datasets (indices, offsets, lengths) .pt, "
                    "MovieLens-100K (u.data, ml-100k.inter or the recbole wheel)")
    ti.add_argument("source")
    ti.add_argument("path", help="the .nrtrace file to write")
    ti.add_argument("--samples", type=int, help="criteo: read at most this many lines")
    ti.add_argument("--hash-rows", type=int, help="criteo: one hash size for every table "
                    "(default: Kaggle's cardinalities)")
    ti.add_argument("--dictionary", action="store_true",
                    help="criteo: number categories by first appearance instead of hashing")
    ti.add_argument("--history", type=int, default=20, help="movielens: items in the history bag")
    ti.add_argument("--batch-size", type=int, default=64, help="the batch size hint stored")
    ti.add_argument("--overwrite", action="store_true")
    common(ti)
    for name, help_ in (("info", "show a trace file's tables"),
                        ("profile", "stack-distance profile and LRU hit ratios per table")):
        tp = tsub.add_parser(name, help=help_)
        tp.add_argument("path")
        if name == "profile":
            tp.add_argument("--cache", type=float, nargs="+", default=[0.01, 0.06, 0.25],
                            help="LRU sizes: rows, or fractions of the table (< 1)")
        common(tp)
    common(tg)
    tr.set_defaults(func=cmd_trace)

    pr = sub.add_parser("predict", help="run the model kept with a store on your inputs and "
                        "write its predictions (no torch needed)")
    pr.add_argument("store", help="a store keeping a model (nearrec.models.save)")
    pr.add_argument("--inputs", required=True,
                    help="an .npz (dense: [samples, features]; per model input NAME its ids "
                         "and NAME.lengths, or NAME as [samples, ids]) or Criteo TSV rows "
                         "(the 26 categorical columns hashed into the model's 26 inputs, the "
                         "13 integer ones as log(1 + x))")
    pr.add_argument("--out", required=True, help="predictions: .npy, or .csv / .tsv")
    pr.add_argument("--batch", type=int, default=4096, help="samples per engine call")
    store_flags(pr)
    common(pr)
    pr.set_defaults(func=cmd_predict)

    inf = sub.add_parser("infer", help="benchmark: a model of the spec with random dense "
                         "weights and features over a trace, embeddings of the next batches "
                         "overlapping the MLPs (and, for comparison, not); nothing is saved "
                         "(nearrec predict runs a model on real inputs)")
    inf.add_argument("store", help="a store built for the model (nearrec build --model ...)")
    inf.add_argument("trace", help="a .nrtrace file over the store's tables")
    inf.add_argument("--model", default="rmc1", choices=sorted(nearrec.MODELS))
    inf.add_argument("--batch", type=int, default=64)
    inf.add_argument("--batches", type=int, default=50)
    inf.add_argument("--depth", type=int, default=2, help="batches whose embeddings are in flight")
    inf.add_argument("--sub-batch", type=int, help="pipelined run: cut each batch into parts of "
                     "this many samples that flow through the pipeline")
    store_flags(inf)
    inf.add_argument("--offload", action="store_true", help="run the whole model in the engine "
                     "(RM-SSD's offload: rmc1-3, wnd, mtwnd, ncf)")
    inf.add_argument("--seed", type=int, default=0)
    common(inf)
    inf.set_defaults(func=cmd_infer)

    pl = sub.add_parser("plan", help="place a store's rows in a DRAM budget from a trace")
    pl.add_argument("store")
    pl.add_argument("trace", help="a .nrtrace file (nearrec trace gen)")
    pl.add_argument("--budget", type=parse_bytes, required=True, help="DRAM bytes, e.g. 4GiB")
    pl.add_argument("--out", default="plan.toml", help="the plan file to write")
    pl.add_argument("--plot", help="also save the hit-ratio curves here (PNG)")
    pl.add_argument("--overwrite", action="store_true", help="replace a plan file there")
    common(pl)
    pl.set_defaults(func=cmd_plan)

    co = sub.add_parser("colocate", help="copy a store with rows read together stored together")
    co.add_argument("store")
    co.add_argument("trace", help="a .nrtrace file whose reads the order follows")
    co.add_argument("out", help="where to write the co-located copy")
    co.add_argument("--how", choices=["frequency", "first_touch"], default="frequency",
                    help="most-read rows first, or in the order the trace first reads them")
    co.add_argument("--table", action="append", help="only this table (repeatable)")
    co.add_argument("--overwrite", action="store_true", help="replace a store at OUT")
    common(co)
    co.set_defaults(func=cmd_colocate)

    si = sub.add_parser("simulate", help="run designs on the flash device model (simulated "
                        "time): sweeps, JSON, PNG")
    si.add_argument("--model", default="rmc1", help="comma-separated models (default rmc1)")
    si.add_argument("--device", default="rm-ssd",
                    help="rm-ssd, cosmos-plus, this-disk, or a JSON parameter file")
    si.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override a device field, e.g. host.dram_bytes=2GiB (repeatable)")
    si.add_argument("--mode", default="all", help="comma-separated designs, or all: "
                    "ssd-s, emb-mmio, emb-pagesum, emb-vectorsum, recssd, rm-ssd, emb-ssd "
                    "(emb-ssd:base / :merge / :cache switch its techniques)")
    si.add_argument("--batch", default="1", help="batch sizes to sweep, e.g. 1,2,4,8")
    si.add_argument("--k", help="RecSSD's locality knob K to sweep (default 0.3)")
    si.add_argument("--uniform", action="store_true", help="uniform ids instead of K traces")
    si.add_argument("--stride", type=int, help="strided ids (RecSSD's STR pattern)")
    si.add_argument("--sequential", action="store_true",
                    help="consecutive ids (RecSSD's SEQ pattern)")
    si.add_argument("--pooling", help="lookups per table per sample to sweep")
    si.add_argument("--dim", help="embedding dimensions to sweep")
    si.add_argument("--dtype", help="row dtypes to sweep: fp32, fp16, bf16, int8 (a row's bytes)")
    si.add_argument("--tables", help="table counts to sweep")
    si.add_argument("--rows", help="rows per table to sweep")
    si.add_argument("--placement", default="packed", choices=["packed", "one-per-page"])
    si.add_argument("--batches", type=int, default=20, help="measured batches per point")
    si.add_argument("--warmup", type=int, default=20, help="warm-up batches per point")
    si.add_argument("--seed", type=int, default=0)
    si.add_argument("--out-json", help="write the device and every report here")
    si.add_argument("--png", help="plot Y over X here")
    si.add_argument("--x", help="the swept key on the x axis (default: the first swept)")
    si.add_argument("--y", default="throughput", help="a report field (default throughput)")
    si.add_argument("--logy", action="store_true")
    common(si)
    si.set_defaults(func=cmd_simulate)

    be = sub.add_parser("bench", help="benchmarks against peers; results under bench/results/")
    be.add_argument("what", choices=["sls", "ssd", "ssd-tuning", "ssd-verify", "ssd-cost", "cache",
                                     "colocate", "keyed", "e2e", "ebc", "build", "gpu",
                                     "flash-repro", "flash-check", "update", "serve",
                                     "torchrec"])
    # each harness declares its flags in the benchmark package, which reads them (cmd_bench)
    be.add_argument("flags", nargs=argparse.REMAINDER,
                    help="the harness's own flags, which `nearrec bench WHAT --help` lists")
    be.set_defaults(func=cmd_bench)
    return p


#: What the library's messages say in Python's words, as the command line says it.
_CLI_WORDS = (("pass overwrite=True to replace it", "give --overwrite to replace it"),
              ("open it with writable=True to change it", "serve it with --writable to change it"))

#: Optional dependencies by top-level module, and the extra that installs each.
_EXTRAS = {"torch": "torch", "torchrec": "torch", "fbgemm_gpu": "torch", "matplotlib": "plot",
           "nearrec_bench": "bench"}


def _failure(args: argparse.Namespace, e: BaseException) -> tuple[int, str]:
    """The exit status and the one line a failure prints."""
    if isinstance(e, InvalidRequest):
        code, line = 2, str(e)
    elif isinstance(e, NearrecError):
        code, line = 1, str(e)
    elif isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] in _EXTRAS:
        name = (e.name or "").split(".")[0]
        code, line = 1, (f"nearrec {args.command} needs {name}, which is not installed: "
                         f"pip install 'nearrec[{_EXTRAS[name]}]'")
    elif isinstance(e, OSError) and e.strerror:
        code, line = 1, f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    else:
        code, line = 1, (f"internal error: {type(e).__name__}: {e} (this is a bug; "
                         "--debug shows where)")
    for python, cli in _CLI_WORDS:
        line = line.replace(python, cli)
    # a message over several lines (a TOML error's excerpt of the file) as one: the excerpt's
    # source line quoted, its frame and caret left out
    parts = []
    for x in (x.strip() for x in line.splitlines()):
        source = re.match(r"^\d+\s*\|\s?(.*)$", x)
        if source:
            parts.append(f"in `{source.group(1).strip()}`")
        elif x and not re.match(r"^[|^]", x):
            parts.append(x)
    return code, ": ".join(parts) or type(e).__name__


def main(argv: list[str] | None = None) -> int:
    """Runs one command. Every failure is one line on stderr and a non-zero status: 2 for bad
    input (argparse's usage errors too), 1 otherwise, 130 on Ctrl-C; ``--debug`` lets the
    traceback through."""
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        if getattr(args, "debug", False):
            raise
        print("nearrec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `nearrec ... | head`: the reader left
        sys.stderr.close()
        return 0
    except Exception as e:
        if getattr(args, "debug", False):
            raise
        code, line = _failure(args, e)
        print(f"nearrec: error: {line}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
