"""The ``nearrec`` command line: build, info, verify, gc, update, feed, compact, publish, swap,
shard, serve, lookup, predict, trace, infer, plan, colocate, simulate, bench.

Human-readable output by default, ``--json`` for machines; progress bars on long work when
stderr is a terminal (``--progress`` forces them). Errors print one line and exit with status 2
(bad input) or 1 (the store, the system, a missing extra); ``--debug`` shows the traceback.

The verbs live by what they touch: :mod:`.stores` (build, info, verify, gc, update, feed,
compact, publish, swap, shard),
:mod:`.serving` (serve, lookup, predict), :mod:`.workloads` (trace, plan, colocate, infer,
simulate, bench); the flags they share are in :mod:`.flags`, what they print in :mod:`.output`.
This module holds the command tree (:func:`parser`) and :func:`main`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import Any

import nearrec

from ..build import DTYPES
from ..errors import InvalidRequest, NearrecError
from .flags import Parser, common, parse_bytes, remote_flags, store_config, store_flags
from .output import format_stats, human_bytes, human_time
from .serving import cmd_lookup, cmd_predict, cmd_serve, cmd_triton, flag_dest
from .stores import (
    cmd_build,
    cmd_compact,
    cmd_feed,
    cmd_gc,
    cmd_info,
    cmd_publish,
    cmd_scrub,
    cmd_shard,
    cmd_swap,
    cmd_update,
    cmd_verify,
)
from .workloads import cmd_colocate, cmd_infer, cmd_plan, cmd_simulate, cmd_trace

#: Entry points by which other distributions add a command (``register(subparsers, Parser)``):
#: the benchmark package (``bench/``, nearrec-bench) adds ``bench``.
COMMANDS_GROUP = "nearrec.cli"


def commands_of_others(sub: Any) -> None:
    """The commands other installed distributions add (:data:`COMMANDS_GROUP`). ``bench``
    without the benchmark package says how to get it."""
    from importlib.metadata import entry_points

    added = set()
    for ep in entry_points(group=COMMANDS_GROUP):
        try:
            register = ep.load()
        except ImportError as e:  # installed, but not built (or not importable here)
            if not (e.name or "").startswith(ep.value.split(".")[0]):
                raise
            continue
        register(sub, Parser)
        added.add(ep.name)
    if "bench" not in added:
        be = sub.add_parser("bench", help="benchmarks against peers (the nearrec-bench package)")
        be.add_argument("what", nargs="?")
        be.add_argument("flags", nargs=argparse.REMAINDER)
        be.set_defaults(func=_no_bench)


def _no_bench(args: argparse.Namespace) -> int:
    print("nearrec: error: `nearrec bench` needs the benchmark package (nearrec-bench), which "
          "the nearrec wheel leaves out: in a checkout, run `make develop` or "
          "`pip install ./bench`", file=sys.stderr)
    return 2


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="nearrec", description=__doc__.split("\n\n")[0])
    p.add_argument("--version", action="version", version=f"nearrec {nearrec.__version__}")
    p.add_argument("--debug", action="store_true", default=False,
                   help="show the traceback of a failure")
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="create a store (model spec, .npy files or a state dict)")
    b.add_argument("path", help="the store directory to create")
    b.add_argument("--model", default="rmc1", choices=sorted(nearrec.MODELS),
                   help="a benchmark model's tables, random rows")
    b.add_argument("--variant", default="deeprecsys", choices=["deeprecsys", "recssd"],
                   help="the model's table sizes: DeepRecSys's or RecSSD's")
    size = b.add_mutually_exclusive_group()
    size.add_argument("--rows", type=int, help="rows of every table")
    size.add_argument("--table-bytes", type=parse_bytes, help="total table bytes, e.g. 16GiB")
    b.add_argument("--npy", action="append", metavar="NAME=FILE.npy", help="a table from .npy")
    b.add_argument("--state-dict", metavar="FILE.pt", help="tables from a saved state dict")
    b.add_argument("--dtype", default="fp32", choices=DTYPES,
                   help="how the rows are stored (int4 / int2 / fp8: FBGEMM's quantised rows)")
    b.add_argument("--seed", type=int, default=0, help="the random rows' seed")
    b.add_argument("--overwrite", action="store_true", help="replace a store at PATH")
    common(b)
    b.set_defaults(func=cmd_build)

    i = sub.add_parser("info", help="show a store's manifest (a repository's: its versions "
                                    "and the served one's), or what a node serves (--remote)")
    remote_flags(i, "a store directory, or a repository of versions")
    common(i)
    i.set_defaults(func=cmd_info)

    v = sub.add_parser("verify", help="check every data byte against its checksum")
    v.add_argument("path", help="a store directory")
    common(v)
    v.set_defaults(func=cmd_verify)

    sc = sub.add_parser("scrub", help="check a store another process may be serving, at a "
                                      "bounded rate, reading every sector from the device")
    remote_flags(sc, "a store directory (with --remote: the node scrubs its own disk; "
                     "raise --timeout for a large store)")
    sc.add_argument("--rate", default="64MiB", help="bytes a second at most (default: "
                    "%(default)s; 0: as fast as the disk goes)")
    common(sc)
    sc.set_defaults(func=cmd_scrub)

    g = sub.add_parser("gc", help="remove what killed builds and attaches left (at a store, or "
                                  "in a directory of stores)")
    g.add_argument("path", help="a store, or a directory of stores")
    common(g)
    g.set_defaults(func=cmd_gc)

    up = sub.add_parser("update", help="write a trainer's rows into a store while it serves "
                                       "(the rows that differ), here or on a node")
    remote_flags(up, "the store")
    up.add_argument("--from", dest="source", required=True, metavar="FILE",
                    help="an .npz of tables (NAME = the whole table, or NAME.ids + NAME.rows) "
                         "or a saved PyTorch / TorchRec state dict (.pt)")
    up.add_argument("--tolerance", type=float, default=0.0,
                    help="rows that differ by no more than this in every value are left")
    up.add_argument("--tables", help="comma-separated tables to update (default: all given)")
    up.add_argument("--prefix", action="append", metavar="KEY[=TABLE]",
                    help="state dict keys under KEY are tables, named TABLE + the rest of the "
                         "key (repeatable; default: TorchRec's embedding_bags.NAME.weight at "
                         "any depth)")
    up.add_argument("--dense", choices=["update", "skip", "error"], default="update",
                    help="a checkpoint's dense weights: replace the weights of the model kept "
                         "with the store, by name (default; before any table is written), "
                         "skip them and update the tables alone, or refuse the update")
    up.add_argument("--durability", choices=["sync", "async"], default="sync",
                    help="a store opened here: whether each write call waits for the disk "
                         "(default: %(default)s; a node's store writes as the node says)")
    up.add_argument("--compact", action="store_true",
                    help="fold the written rows into the table files before exiting")
    store_flags(up)
    common(up)
    up.set_defaults(func=cmd_update)

    fe = sub.add_parser("feed", help="apply a trainer's delta files to a store as they come, "
                                     "each once (here or on a node)")
    fe.add_argument("dir", help="a directory of delta files (<sequence>.arrow / .parquet, "
                                "docs/format.md §17), or of another format's (--format)")
    fe.add_argument("--format", choices=["nearrec", "tzrec"], default="nearrec",
                    help="what the directory holds: nearrec's delta files, or TorchEasyRec's "
                         "delta embedding dumps (its delta_embedding_dump_config's output_dir; "
                         "each step one delta, the cursor its global step) (default: "
                         "%(default)s)")
    fe.add_argument("--prefix", metavar="P",
                    help="--format tzrec: the dumps' file_prefix (default: delta_embedding)")
    fe.add_argument("--table", action="append", default=[], metavar="EMBEDDING=TABLE",
                    help="--format tzrec: the store's table an embedding_name's rows go to "
                         "(default: the table of that name); repeatable")
    remote_flags(fe, "the store")
    fe.add_argument("--to", metavar="STORE", help="the store (as PATH)")
    fe.add_argument("--sharded", metavar="DIR",
                    help="a sharded store (nearrec shard's directory), through the nodes its "
                         "replicas.toml names: each file on every shard in one transaction")
    fe.add_argument("--name", default="default",
                    help="the feed's name: its cursor's in the store (default: %(default)s)")
    fe.add_argument("--from", dest="start", type=int, metavar="SEQ",
                    help="the first sequence (--format tzrec: the first step; a store built "
                         "from step S's checkpoint takes S+1), when the store has never seen "
                         "the feed")
    fe.add_argument("--watch", action="store_true",
                    help="follow the directory until interrupted, printing each file applied")
    fe.add_argument("--poll", type=float, default=0.2, metavar="S",
                    help="with --watch: how often the directory is listed (default: %(default)s)")
    fe.add_argument("--part-bytes", type=parse_bytes, metavar="BYTES",
                    help="the most ids and rows one call carries (default 32MiB): a larger "
                         "file is applied in calls of this, its cursor moved by the last")
    fe.add_argument("--durability", choices=["sync", "async"], default="sync",
                    help="a store opened here: whether each file's call waits for the disk "
                         "(default: %(default)s)")
    store_flags(fe)
    common(fe)
    fe.set_defaults(func=cmd_feed)

    cp = sub.add_parser("compact", help="fold a live store's logged writes into its table files")
    cp.add_argument("path", help="a store directory (no other writer may hold it)")
    store_flags(cp)
    common(cp)
    cp.set_defaults(func=cmd_compact)

    pb = sub.add_parser("publish", help="add a store built offline to a repository of "
                                        "versions as its next version")
    pb.add_argument("repository", help="the repository, REPO/NAME (made if missing); serve it "
                                       "as one store: nearrec serve REPO/NAME")
    pb.add_argument("store", help="the closed store to add (nearrec build, from_state_dict)")
    pb.add_argument("--move", action="store_true",
                    help="rename the store in instead of copying it (same file system)")
    common(pb)
    pb.set_defaults(func=cmd_publish)

    sw = sub.add_parser("swap", help="serve another version of a repository, or roll back, "
                                     "on a node or in the repository's pointer")
    remote_flags(sw, "the repository REPO/NAME")
    to = sw.add_mutually_exclusive_group(required=True)
    to.add_argument("--version", type=int, help="the version to serve")
    to.add_argument("--rollback", action="store_true",
                    help="the version served before the current one")
    to.add_argument("--to", metavar="DIR",
                    help="with --remote: a store directory on the node (a version of the store's "
                         "repository, or under its swap root)")
    sw.add_argument("--warm", action=argparse.BooleanOptionalAction, default=True,
                    help="with --remote: fill the new version's DRAM tiers before the switch")
    sw.add_argument("--force", action="store_true",
                    help="serve it even if it cannot answer what the served one answers")
    store_flags(sw)
    common(sw)
    sw.set_defaults(func=cmd_swap)

    sv = sub.add_parser("serve", help="serve stores over gRPC: the storage node "
                                      "(nearrec.connect, grpcurl, grpc.health.v1)")
    sv.add_argument("stores", nargs="*", metavar="STORE[=NAME]",
                    help="a store directory, named on the node by NAME (default: the "
                         "directory's name); given, they replace --config's stores")
    sv.add_argument("--config", metavar="FILE",
                    help="the node's config (TOML: its settings, the stores' under [store]; "
                         "docs/serving.md); the flags below override it")
    # the node's own flags, as nearrec-server has them (one list, in Rust)
    types: dict[str, Callable[[str], Any]] = {
        "int": int, "float": float, "text": str, "list": lambda s: [v for v in s.split(",") if v]}
    for name, _key, kind, metavar, help_, default in nearrec._native.node_flags():
        shown = f"{help_} (default: {default})" if default else help_
        if kind == "switch":
            sv.add_argument(f"--{name}", dest=flag_dest(name), action="store_const",
                            const=True, default=None, help=shown)
        else:
            sv.add_argument(f"--{name}", dest=flag_dest(name), type=types[kind],
                            metavar=metavar, help=shown)
    store_flags(sv, config_flag="--store-config")
    sv.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                    help="show the traceback of a failure")
    sv.set_defaults(func=cmd_serve)

    lk = sub.add_parser("lookup", help="pool random (or given) bags and print the result")
    remote_flags(lk, "the store")
    lk.add_argument("--table", action="append", help="table(s) to query (default: all)")
    lk.add_argument("--batch", type=int, default=16, help="bags per table per batch")
    lk.add_argument("--pooling", type=int, default=20, help="lookups per bag")
    lk.add_argument("--mode", default="sum", choices=["sum", "mean", "max"],
                    help="how each bag pools")
    lk.add_argument("--indices", help=".npy of indices (1-D with --offsets, or 2-D)")
    lk.add_argument("--offsets", help=".npy of offsets")
    lk.add_argument("--output", help="save the pooled [batch, Σ dim] array to this .npy")
    lk.add_argument("--repeat", type=int, default=20,
                    help="batches to run: random ones are drawn afresh for each; given ones "
                         "(--indices) run again")
    lk.add_argument("--seed", type=int, default=0, help="the random bags' seed")
    store_flags(lk)
    common(lk)
    lk.set_defaults(func=cmd_lookup)

    tr = sub.add_parser("trace", help="generate, inspect and profile request traces")
    tsub = tr.add_subparsers(dest="action", required=True, help="what to do with traces")
    tg = tsub.add_parser("gen", help="write a synthetic trace file")
    tg.add_argument("path", help="the .nrtrace file to write")
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
    tg.add_argument("--generator", default="sd", choices=["sd", "zipf", "uniform"],
                    help="stack distances (RecSSD's K), Zipf, or uniform ids")
    tg.add_argument("--k", type=float, default=1.0, help="stack-distance locality (0: most)")
    tg.add_argument("--sd-variant", default="continuous", choices=["continuous", "per_bag"],
                    help="stack distances over the whole trace, or within each bag")
    tg.add_argument("--ids", default="full", choices=["full", "recssd"],
                    help="every row (full) or RecSSD's rows 0, 128, 256, ...")
    tg.add_argument("--alpha", type=float, default=1.05, help="Zipf exponent")
    tg.add_argument("--seed", type=int, default=0, help="the generator's seed")
    tg.add_argument("--overwrite", action="store_true", help="replace a file at PATH")
    ti = tsub.add_parser("import", help="a trace file from real data (a local copy)")
    ti.add_argument("format", choices=["criteo", "fbgemm", "movielens"],
                    help="Criteo TSV (.gz ok), a dlrm_datasets (indices, offsets, lengths) .pt, "
                    "MovieLens-100K (u.data, ml-100k.inter or the recbole wheel)")
    ti.add_argument("source", help="the data file (or directory) to read")
    ti.add_argument("path", help="the .nrtrace file to write")
    ti.add_argument("--samples", type=int, help="criteo: read at most this many lines")
    ti.add_argument("--hash-rows", type=int, help="criteo: one hash size for every table "
                    "(default: Kaggle's cardinalities)")
    ti.add_argument("--dictionary", action="store_true",
                    help="criteo: number categories by first appearance instead of hashing")
    ti.add_argument("--keys", action="store_true",
                    help="criteo: keyed tables, each category's 32-bit value its key (a missing "
                         "one an empty bag)")
    ti.add_argument("--history", type=int, default=20, help="movielens: items in the history bag")
    ti.add_argument("--batch-size", type=int, default=64, help="the batch size hint stored")
    ti.add_argument("--overwrite", action="store_true", help="replace a file at PATH")
    common(ti)
    for name, help_ in (("info", "show a trace file's tables"),
                        ("profile", "stack-distance profile and LRU hit ratios per table")):
        tp = tsub.add_parser(name, help=help_)
        tp.add_argument("path", help="a .nrtrace file")
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
    inf.add_argument("--model", default="rmc1", choices=sorted(nearrec.MODELS),
                     help="the benchmark model whose spec the dense part follows")
    inf.add_argument("--batch", type=int, default=64, help="samples per batch")
    inf.add_argument("--batches", type=int, default=50, help="batches to run")
    inf.add_argument("--depth", type=int, default=2, help="batches whose embeddings are in flight")
    inf.add_argument("--sub-batch", type=int, help="pipelined run: cut each batch into parts of "
                     "this many samples that flow through the pipeline")
    store_flags(inf)
    inf.add_argument("--offload", action="store_true", help="run the whole model in the engine "
                     "(RM-SSD's offload: rmc1-3, wnd, mtwnd, ncf)")
    inf.add_argument("--seed", type=int, default=0, help="the dense weights' and features' seed")
    common(inf)
    inf.set_defaults(func=cmd_infer)

    tn = sub.add_parser("triton", help="serve a store on Triton Inference Server")
    tnsub = tn.add_subparsers(dest="triton_cmd", required=True, help="what to do")
    te = tnsub.add_parser("export", help="write a Triton model repository that serves the "
                          "store's kept model (or its pooled lookups) with its Python backend")
    te.add_argument("store", help="the store's directory (with --remote: its name on the node; "
                    "with --sharded: the sharded store's directory)")
    te.add_argument("repo", help="the model repository to write into")
    te.add_argument("--name", default="nearrec", help="the Triton model's name")
    where = te.add_mutually_exclusive_group()
    where.add_argument("--remote", help="HOST:PORT: serve the store through that node")
    where.add_argument("--sharded", action="store_true",
                       help="STORE is a sharded store (nearrec shard): serve it through the "
                            "nodes its replicas.toml names")
    te.add_argument("--max-batch-size", type=int, default=64, help="Triton's max_batch_size")
    te.add_argument("--queue-delay-us", type=int, default=500,
                    help="the dynamic batcher's longest wait for more requests")
    te.add_argument("--instances", type=int, default=1, help="model instances (CPU)")
    te.add_argument("--python-path", action="append", default=[],
                    help="a directory put first on the Python backend's path (numpy < 2 for "
                         "its stub); repeat for more")
    tn.set_defaults(func=cmd_triton)

    pl = sub.add_parser("plan", help="place a store's rows in a DRAM budget from a trace")
    pl.add_argument("store", help="the store to place")
    pl.add_argument("trace", help="a .nrtrace file (nearrec trace gen)")
    pl.add_argument("--budget", type=parse_bytes, required=True, help="DRAM bytes, e.g. 4GiB")
    pl.add_argument("--out", default="plan.toml", help="the plan file to write")
    pl.add_argument("--plot", help="also save the hit-ratio curves here (PNG)")
    pl.add_argument("--overwrite", action="store_true", help="replace a plan file there")
    common(pl)
    pl.set_defaults(func=cmd_plan)

    sh = sub.add_parser("shard", help="cut a store into shards for several nodes (table-, row- or "
                        "table-row-wise), balanced by bytes and a trace's load")
    sh.add_argument("store", help="the store to cut")
    sh.add_argument("--shards", type=int, help="how many shards (with --out)")
    sh.add_argument("--replicas", type=int, default=1, help="nodes serving each shard")
    sh.add_argument("--scheme", choices=["table", "row", "table-row", "auto"], default="auto",
                    help="whole tables, every table over every shard, or each table over as "
                         "many shards as its cost asks (auto: table when that balances)")
    sh.add_argument("--trace", help="a .nrtrace file to balance the load by")
    sh.add_argument("--replicate-hot", type=int, default=0, metavar="ROWS",
                    help="keep this many of each split table's hottest rows on each of its "
                         "shards (needs --trace)")
    where = sh.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", help="the directory of the shards and shards.json")
    where.add_argument("--publish", metavar="DIR",
                       help="cut the store by the plan of the sharded store at DIR and publish "
                            "it as the next version of every shard (swap to it to serve it)")
    sh.add_argument("--overwrite", action="store_true", help="replace a sharded store at OUT")
    common(sh)
    sh.set_defaults(func=cmd_shard)

    co = sub.add_parser("colocate", help="copy a store with rows read together stored together")
    co.add_argument("store", help="the store to copy")
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
    si.add_argument("--dtype", help=f"row dtypes to sweep: {', '.join(DTYPES)} (a row's bytes)")
    si.add_argument("--tables", help="table counts to sweep")
    si.add_argument("--rows", help="rows per table to sweep")
    si.add_argument("--placement", default="packed", choices=["packed", "one-per-page"],
                    help="rows packed into flash pages, or one row per page")
    si.add_argument("--batches", type=int, default=20, help="measured batches per point")
    si.add_argument("--warmup", type=int, default=20, help="warm-up batches per point")
    si.add_argument("--seed", type=int, default=0, help="the ids' seed")
    si.add_argument("--out-json", help="write the device and every report here")
    si.add_argument("--png", help="plot Y over X here")
    si.add_argument("--x", help="the swept key on the x axis (default: the first swept)")
    si.add_argument("--y", default="throughput", help="a report field (default throughput)")
    si.add_argument("--logy", action="store_true", help="a log-scale y axis")
    common(si)
    si.set_defaults(func=cmd_simulate)

    commands_of_others(sub)
    for verb, example in EXAMPLES.items():
        sub.choices[verb].epilog = "example:\n  " + example
    return p


#: One example per verb, shown under its --help.
EXAMPLES = {
    "build": "nearrec build /data/rmc1 --model rmc1 --rows 1000000 --dtype fp16",
    "info": "nearrec info /data/rmc1 --json",
    "verify": "nearrec verify /data/rmc1",
    "scrub": "nearrec scrub /data/rmc1 --rate 32MiB",
    "gc": "nearrec gc /data",
    "update": "nearrec update --remote 10.0.0.5:50051 rmc1 --from ckpt.pt "
              "--token-file ~/.nearrec/token",
    "compact": "nearrec compact /data/rmc1",
    "feed": "nearrec feed /deltas/dlrm dlrm --remote 10.0.0.5:50051 --watch --token-file "
            "~/.nearrec/token",
    "publish": "nearrec publish /models/dlrm /scratch/dlrm-retrained",
    "shard": "nearrec shard /data/rmc1 --shards 4 --scheme auto --trace rmc1.nrtrace "
             "--replicate-hot 10000 --out /data/rmc1-4",
    "swap": "nearrec swap --remote 10.0.0.5:50051 dlrm --version 7 --token-file "
            "~/.nearrec/token",
    "serve": "nearrec serve /data/rmc1=rmc1 --tier ssd --dram-budget 8GiB --listen "
             "0.0.0.0:50051 --acl acl.toml --tls-cert node.pem --tls-key node.key",
    "lookup": "nearrec lookup /data/rmc1 --batch 64 --pooling 80 --tier ssd --dram-budget 1GiB",
    "trace": "nearrec trace gen rmc1.nrtrace --model rmc1 --generator zipf --alpha 1.1",
    "predict": "nearrec predict /data/dlrm --inputs day_0.tsv --out ctr.csv",
    "triton": "nearrec triton export /data/dlrm /models --name dlrm --python-path "
              "/opt/numpy1",
    "infer": "nearrec infer /data/rmc1 rmc1.nrtrace --model rmc1 --offload",
    "plan": "nearrec plan /data/rmc1 rmc1.nrtrace --budget 4GiB --out plan.toml",
    "colocate": "nearrec colocate /data/rmc1 rmc1.nrtrace /data/rmc1-colocated",
    "simulate": "nearrec simulate --model rmc1 --mode rm-ssd,recssd --batch 1,8,64 --png out.png",
    "bench": "nearrec bench ebc --quick",
}


#: What the library's messages say in Python's words, as the command line says it.
_CLI_WORDS = (("pass overwrite=True to replace it", "give --overwrite to replace it"),
              ("open it with writable=True to change it", "serve it with --writable to change it"))

#: Optional dependencies by top-level module, and the extra that installs each.
_EXTRAS = {"torch": "torch", "torchrec": "torch", "fbgemm_gpu": "torch", "matplotlib": "plot",
           "nearrec_bench": "bench", "ray": "ray"}


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


__all__ = [
    "cmd_build", "cmd_colocate", "cmd_compact", "cmd_gc", "cmd_infer", "cmd_info",
    "cmd_lookup", "cmd_plan", "cmd_predict", "cmd_publish", "cmd_scrub", "cmd_serve",
    "cmd_simulate",
    "cmd_swap", "cmd_trace", "cmd_update", "cmd_verify", "common", "format_stats", "human_bytes",
    "human_time", "main", "parse_bytes", "parser", "store_config", "store_flags",
]
