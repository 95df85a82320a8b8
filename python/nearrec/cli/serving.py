"""The verbs that answer requests from a store: ``serve`` (the storage node), ``lookup`` (a
store here or on a node, ``--remote``) and ``predict`` (the model kept with a store, on a
user's inputs)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

import nearrec

from .. import keyed
from ..errors import InvalidRequest
from ..request import count, regular_file
from .flags import STORE_FLAGS, open_store, store_config
from .output import emit, format_stats, human_time


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
    from .. import _native
    overrides: list[tuple[str, Any]] = [
        (key, getattr(args, flag_dest(name)))
        for name, key, *_ in _native.node_flags()
        if getattr(args, flag_dest(name)) is not None]
    overrides += [(f"store.{k}", str(getattr(args, k)) if k == "plan" else getattr(args, k))
                  for k in STORE_FLAGS if getattr(args, k, None) is not None]
    if args.stores:
        overrides.append(("stores", list(args.stores)))
    store = (nearrec.StoreConfig.from_file(args.store_config).native()
             if args.store_config else None)
    _native.serve(_native.NodeConfig(args.config, overrides, store))
    return 0


def flag_dest(name: str) -> str:
    """The attribute argparse keeps flag ``--name``'s value in."""
    return "node_" + name.replace("-", "_")

def cmd_lookup(args: argparse.Namespace) -> int:
    store = open_store(args, "lookup")
    tables = args.table or list(store.tables)
    repeat = count(args.repeat, "--repeat")
    rng = np.random.default_rng(args.seed)

    # a keyed table's ids are its keys: drawn from those it holds, where its files can be read
    keys = {name: keyed.keys_of(store.path, name) for name in tables
            if store.table(name).keyed and not args.indices and not args.remote}

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
                held = keys.get(name)
                idx = (rng.integers(0, rows, args.batch * args.pooling) if held is None
                       else held[rng.integers(0, len(held), args.batch * args.pooling)])
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
    if stats and "batches" not in stats and not any(k.startswith("cluster_") for k in stats):
        stats = {}  # a DRAM-resident store: no SSD tier, no router to show
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
    said = format_stats(stats) if stats else ""
    if said:
        text += "\n" + said
    emit(args, data, text)
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
        from ..datasets import CRITEO_SPARSE, criteo

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
    emit(args, {"model": name, "samples": n, "outputs": preds.shape[1] if preds.ndim == 2
                 else 0, "out": str(dest), "seconds": spent},
          f"{name} on {n:,} samples from {args.inputs} -> {dest} {tuple(preds.shape)} "
          f"in {human_time(spent)} ({n / spent if spent else 0:,.0f} samples/s, store on "
          f"{store.tier})")
    return 0


def cmd_triton(args: argparse.Namespace) -> int:
    from ..triton import export

    where = export(args.store, args.repo, name=args.name, remote=args.remote,
                   sharded=args.sharded, max_batch_size=args.max_batch_size,
                   queue_delay_us=args.queue_delay_us, instances=args.instances,
                   python_path=args.python_path)
    print(f"wrote {where} (config.pbtxt, 1/model.py): tritonserver --model-repository "
          f"{where.parent}")
    return 0
