"""The verbs that make and look after stores: ``build``, ``info``, ``verify``, ``gc``,
``update`` (a trainer's rows into a live store, here or on a node), ``compact``, and a
repository's versions: ``publish`` and ``swap`` (a version, or a rollback, here or on a
node)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import nearrec

from .. import feed
from ..errors import InvalidRequest, NearrecError
from .flags import open_store, store_config
from .output import emit, human_bytes, human_time


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
    errors = {t.name: asdict(t.quant_error) for t in info.tables if t.quant_error is not None}
    emit(args, {"path": str(info.path), "tables": len(info.tables), "bytes": info.total_bytes,
                 "seconds": s, "bytes_per_s": info.total_bytes / s, "quant_error": errors},
          "\n".join([f"built {info.path}: {len(info.tables)} tables, "
                     f"{human_bytes(info.total_bytes)} in {human_time(s)} "
                     f"({human_bytes(info.total_bytes / s)}/s)", *_quant_lines(info)]))
    return 0


def _quant_lines(info: nearrec.StoreInfo) -> list[str]:
    """One line per table stored lossily: its encoding error against the rows given."""
    return [f"  {t.name} ({t.dtype}): max |error| {e.max_abs:.3g}, mean {e.mean_abs:.3g}"
            for t in info.tables if (e := t.quant_error) is not None]


def cmd_info(args: argparse.Namespace) -> int:
    if args.remote or not args.path:
        return _served_info(args, open_store(args, "info"))
    versions = nearrec.versions(args.path)
    head: list[str] = []
    if versions is not None:  # a repository: its versions, then the served one's manifest
        head = [f"{args.path}: a repository of versions {list(versions.versions)}, serving "
                f"{versions.current}"
                + (f" (served before: {list(versions.history)})" if versions.history else "")]
    info = nearrec.info(args.path)
    data = {"path": str(info.path), "format_version": info.format_version,
            "created_by": info.created_by, "params": info.params,
            "total_bytes": info.total_bytes,
            "tables": [asdict(t) | {"padding_ratio": t.padding_ratio} for t in info.tables]}
    w = max([20, *(len(t.name) for t in info.tables)])  # long names keep the columns aligned
    lines = [f"{info.path}  (format v{info.format_version}, {info.created_by}, "
             f"{human_bytes(info.total_bytes)})", f"params: {json.dumps(info.params)}",
             f"{'table':<{w}} {'rows':>12} {'dim':>6} {'dtype':>6} {'row B':>6} {'pad %':>6}"
             "  rows"]
    for t in info.tables:
        lines.append(f"{t.name:<{w}} {t.rows:>12,} {t.dim:>6} {t.dtype:>6} {t.row_bytes:>6} "
                     f"{100 * t.padding_ratio:>6.2f}  {'co-located' if t.colocated else 'by id'}")
    if quant := _quant_lines(info):
        lines += ["encoding error against the rows built from:", *quant]
    if info.attachments:
        lines.append(f"attachments: {', '.join(info.attachments)}")
    if versions is not None:
        data["repository"] = asdict(versions)
    emit(args, data | {"attachments": list(info.attachments)}, "\n".join(head + lines))
    return 0


def _served_info(args: argparse.Namespace, store: nearrec.Store) -> int:
    """What a node serves as the store ``args`` named: its tables, version, tier, versions
    held, capabilities, and the node's other stores the caller may see."""
    with store:
        tables = list(store.tables.values())
        d = {"name": store.name, "node": args.remote, "version": store.version,
             "tier": store.tier, "writable": store.writable, "model": store.has_model,
             "path": store.served_path, "served_version": store.served_version,
             "versions": list(store.versions), "capabilities": sorted(store.capabilities),
             "stores": list(store.stores), "tables": [asdict(t) for t in tables]}
    w = max([20, *(len(t.name) for t in tables)])
    served = "" if d["served_version"] is None else \
        f", version {d['served_version']} of {d['versions']}"
    lines = [f"{d['name']} on {args.remote}: version {d['version']}, {d['tier']}, "
             f"{'writable' if d['writable'] else 'read-only'}"
             f"{', a model kept' if d['model'] else ''}",
             f"serves {d['path']}{served}",
             f"capabilities: {', '.join(d['capabilities']) or 'reads only'}",
             f"{'table':<{w}} {'rows':>12} {'dim':>6} {'dtype':>6} {'keys':>12}"]
    lines += [f"{t.name:<{w}} {t.rows:>12,} {t.dim:>6} {t.dtype:>6} "
              f"{'' if t.keys is None else f'{t.keys:,}':>12}" for t in tables]
    if len(d["stores"]) > 1:
        lines.append(f"stores on the node: {', '.join(d['stores'])}")
    emit(args, d, "\n".join(lines))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    return _checked(args, lambda: nearrec.verify(args.path, progress=args.progress))


def cmd_scrub(args: argparse.Namespace) -> int:
    if args.remote:
        return _checked(args, lambda: open_store(args, "scrub").scrub(args.rate))
    if not args.path:
        raise InvalidRequest("nearrec scrub needs a store: a PATH, or --remote HOST:PORT")
    return _checked(args, lambda: nearrec.scrub(args.path, args.rate, progress=args.progress))


def _checked(args: argparse.Namespace, check: Callable[[], list[nearrec.TableCheck]]) -> int:
    """A check's report: each table ok or what is wrong; exit 1 if any is."""
    try:
        checks = check()
    except NearrecError as e:
        if not args.json:
            raise
        # a store that does not open is still an answer a machine can read
        print(json.dumps({"ok": False, "path": str(args.path), "error": str(e),
                          "error_type": type(e).__name__, "tables": []}, indent=1))
        return 2 if isinstance(e, InvalidRequest) else 1
    bad = [c for c in checks if not c.ok]
    emit(args, {"ok": not bad, "tables": [asdict(c) for c in checks]},
          "\n".join(f"{'ok ' if c.ok else 'BAD'} {c.table}: {c.bytes:,} bytes"
                    + (f" — {c.error}" if c.error else "") for c in checks)
          + f"\n{len(checks) - len(bad)}/{len(checks)} tables ok")
    return 1 if bad else 0


def cmd_gc(args: argparse.Namespace) -> int:
    report = nearrec.gc(args.path)
    emit(args, {"removed": [asdict(x) for x in report.removed],
                 "kept": [asdict(x) for x in report.kept]},
          "\n".join([f"removed {x.path} ({x.bytes:,} bytes): {x.reason}" for x in report.removed]
                    + [f"kept    {x.path} ({x.bytes:,} bytes): {x.reason}" for x in report.kept]
                    + [f"{len(report.removed)} removed ({report.removed_bytes:,} bytes), "
                       f"{len(report.kept)} kept"]))
    return 0


def cmd_update(args: argparse.Namespace) -> int:
    # on a node, the node's writer: only the rows whose digests differ cross the wire
    store = open_store(args, "update", writable=True)
    tables = [t.strip() for t in args.tables.split(",")] if args.tables else None
    start = time.perf_counter()
    prefix = None if not args.prefix else {
        key: table for key, _, table in (p.partition("=") for p in args.prefix)}
    done = nearrec.update(store, args.source, tolerance=args.tolerance, tables=tables,
                          prefix=prefix, dense=args.dense)
    compacted = store.compact() if args.compact else None
    seconds = time.perf_counter() - start
    rows = sum(d.written for d in done.values())
    emit(args, {"version": store.version, "seconds": seconds,
                 "tables": {t: asdict(d) for t, d in done.items()},
                 "dense": list(done.dense),
                 "compaction": asdict(compacted) if compacted else None},
          "\n".join([f"{t}: {d.written:,} of {d.compared:,} rows written in {d.calls} call(s)"
                      for t, d in done.items()]
                     + ([f"dense: {len(done.dense)} weights of the kept model replaced"]
                        if done.dense else []))
          + f"\n{rows:,} rows in {human_time(seconds)}; the store is at version {store.version}"
          + (f", compacted ({human_bytes(compacted.bytes)} written)" if compacted else ""))
    return 0


def cmd_feed(args: argparse.Namespace) -> int:
    if sum(map(bool, (args.path, args.to, args.sharded))) > 1:
        raise InvalidRequest("nearrec feed: the store is one of PATH, --to and --sharded")
    if args.sharded:
        from ..distributed import open_dir

        store = open_dir(args.sharded)
    else:
        args.path = args.path or args.to
        store = open_store(args, "feed", writable=True)

    # a delta file's sequence, or a trainer's step (TorchEasyRec's dumps)
    unit = "step" if args.format == "tzrec" else "file"

    def said(a: feed.Applied) -> str:
        lag = "" if a.lag_seconds is None else f", {human_time(a.lag_seconds)} after it was written"
        state = "applied" if a.applied else "applied before"
        calls = "" if a.calls == 1 else f" in {a.calls} calls"
        return f"{unit} {a.sequence}: {a.rows:,} rows {state}{calls} (version {a.version}{lag})"

    tables = {}
    for t in args.table:
        embedding, eq, table = t.partition("=")
        if not (eq and embedding and table):
            raise InvalidRequest(f"nearrec feed: --table {t!r} is not EMBEDDING=TABLE")
        tables[embedding] = table
    source = {"format": args.format, "prefix": args.prefix, "tables": tables or None}
    if not args.watch:
        done = feed.apply(args.dir, store, name=args.name, start=args.start,
                          part_bytes=args.part_bytes, **source)
        cursor = store.feed_status().get(args.name)
        emit(args, {"applied": [asdict(a) for a in done],
                    "cursor": asdict(cursor) if cursor else None},
             "\n".join([said(a) for a in done]
                       + [f"feed {args.name!r}: {len(done)} file(s) applied; the store has "
                          + (f"applied {unit} {cursor.step if unit == 'step' else cursor.sequence}"
                             " last" if cursor else "none")]))
        return 0

    def each(a: feed.Applied) -> None:
        print(json.dumps(asdict(a)) if args.json else said(a), flush=True)

    def refused(e: Exception) -> None:
        print(f"nearrec feed: waiting: {e}", file=sys.stderr, flush=True)

    try:
        feed.watch(args.dir, store, name=args.name, start=args.start, poll=args.poll,
                   part_bytes=args.part_bytes, on_applied=each, on_refused=refused, **source)
    except KeyboardInterrupt:
        pass
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    store = nearrec.open(args.path, store_config(args).replace(writable=True, auto_compact=False),
                         progress=args.progress)
    before = store.live_stats()
    done = store.compact()
    emit(args, {"version": done.version, "compaction": asdict(done),
                 "log_bytes_before": before["log_bytes"],
                 "log_bytes_after": store.live_stats()["log_bytes"]},
          f"{done.rows:,} rows folded into {done.tables} table(s) ({human_bytes(done.bytes)} "
          f"written in {human_time(done.seconds)}); the tables hold version {done.version}")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    version = nearrec.publish(args.repository, args.store, move=args.move)
    repo = Path(args.repository)
    held = nearrec.versions(repo)
    if held is None or held.versions == (version,):
        step = f"a node started on {repo} serves it"
    else:
        # docs/serving.md, "Versions": a running node moves the pointer itself; one started
        # later serves what CURRENT names (without it, the newest version)
        pointed = (repo / "CURRENT").is_file()
        later = (f"a node started later serves version {held.current} (CURRENT): `nearrec "
                 f"swap {repo} --version {version}` moves the pointer" if pointed else
                 "a node started later serves it (the newest; no CURRENT pointer)")
        step = (f"to serve it on a running node: `nearrec swap --remote HOST:PORT {repo.name} "
                f"--version {version}`; {later}")
    emit(args, {"repository": str(repo), "version": version}, f"{args.store} is version "
         f"{version} of {repo}; {step}")
    return 0


def cmd_swap(args: argparse.Namespace) -> int:
    if args.remote:
        store = open_store(args, "swap")
    else:
        # here, a swap only moves the pointer a node reads when it starts: no tier to load
        if not args.path:
            raise InvalidRequest("nearrec swap needs a repository (REPO/NAME), or --remote")
        config = store_config(args).replace(tier="ssd", dram_budget=0, keep_last=None)
        store = nearrec.open(args.path, config)
    warm = args.warm if args.remote else False
    if args.rollback:
        store.rollback(warm=warm, force=args.force)
    else:
        store.swap(args.to, version=args.version, warm=warm, force=args.force)
    emit(args, {"store": store.name, "served_version": store.served_version,
                 "path": store.served_path, "versions": list(store.versions),
                 "version": store.version},
          f"{store.name} serves "
          + (f"version {store.served_version} ({store.served_path})"
             if store.served_version is not None else store.served_path))
    return 0

def cmd_shard(args: argparse.Namespace) -> int:
    from ..distributed import publish, shard

    if args.publish is not None:
        version = publish(args.store, args.publish)
        emit(args, {"published": str(args.publish), "version": version},
             f"published {args.store} as version {version} of every shard of {args.publish}; "
             f"serve it with store.swap(version={version}) on the sharded store")
        return 0
    if args.shards is None:
        raise InvalidRequest("nearrec shard --out needs --shards")
    plan = shard(args.store, args.out, args.shards, replicas=args.replicas, scheme=args.scheme,
                 trace=args.trace, replicate_hot=args.replicate_hot, overwrite=args.overwrite)
    sizes, loads = plan.shard_bytes(), plan.shard_load()
    data = {"out": str(args.out), "plan": plan.id, "store": plan.store, "scheme": plan.scheme,
            "shards": plan.shards, "replicas": plan.replicas,
            "shard_bytes": sizes, "shard_load": loads,
            "tables": [{"table": t.name, "parts": [dataclasses.asdict(p) for p in t.parts],
                        "hot_rows": len(t.hot), "load": t.load} for t in plan.tables]}
    def plural(n: int, what: str) -> str:
        return f"{n} {what}{'' if n == 1 else 's'}"

    lines = [f"{plan.store}: {plural(plan.shards, 'shard')} × "
             f"{plural(plan.replicas, 'replica')}, "
             f"{plan.scheme}-wise (plan {plan.id})"]
    for k in range(plan.shards):
        held = ", ".join(t.name if len(t.parts) == 1 else f"{t.name}[{p.first}:{p.first + p.rows}]"
                         for t, p in plan.shard_tables(k))
        lines.append(f"  shard-{k}: {human_bytes(sizes[k])}, {loads[k]:.1%} of the lookups: "
                     f"{held}")
    lines.append(f"wrote {args.out}/shards.json and {plan.shards} shard stores; serve each "
                 f"(nearrec serve {args.out}/shard-K) and connect them with "
                 f"nearrec.distributed.connect({str(args.out)!r}, [...]) or nearrec.ray")
    emit(args, data, "\n".join(lines))
    return 0
