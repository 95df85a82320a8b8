"""``nearrec bench WHAT``: the registry of harnesses (WHAT → the module whose ``HARNESSES``
declares it), the flags they take, and the one path every harness runs: its parser, its config
from the flags, the run, and its records (JSON + Markdown) under ``--out``. This package adds the
``bench`` command to the product's CLI (:func:`register`, its entry point in the
``nearrec.cli`` group, ``bench/pyproject.toml``); the product never imports it."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nearrec.cli import common, parse_bytes
from nearrec.cli.output import emit

from . import _native as _native  # built, not only on the path
from . import report
from .harness import Harness

#: WHAT → the module that serves it
MODULES = {"sls": "sls", "sls-dtypes": "sls", "ssd": "ssd", "ssd-dtypes": "ssd_dtypes",
           "ssd-tuning": "ssd",
           "ssd-verify": "ssd", "ssd-cost": "ssd", "cache": "cache", "colocate": "colocate",
           "keyed": "keyed",
           "e2e": "e2e", "ebc": "ebc", "build": "build", "gpu": "gpu",
           "gpu-hit": "gpu_hit", "flash-repro": "flash",
           "flash-check": "flash", "update": "update", "serve": "serve",
           "serve-pinned": "serve", "serve-dtypes": "wire_dtypes", "torchrec": "torchrec",
           "torchrec-quant": "torchrec",
           "restart": "restart", "cluster": "cluster", "cluster-hedge": "hedge",
           "cluster-ingress": "ingress", "cluster-write": "writes", "cluster-load": "cluster",
           "cluster-catch-up": "catch_up",
           "cluster-projection": "projection", "cluster-swap": "swap",
           "torture": "torture", "soak": "soak", "abuse": "abuse", "triton": "triton_serving",
           "feed-kills": "feed", "feed": "feed_rate", "partitions": "partitions"}


def _split(item: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    return lambda text: tuple(item(x) for x in text.split(","))


@dataclass(frozen=True)
class Flag:
    help: str
    #: add_argument's other settings (type, action, default)
    options: Mapping[str, Any] = field(default_factory=dict)
    #: the config field's value, from what argparse gives (a flag not given sets nothing)
    value: Callable[[Any], Any] = lambda given: given


#: Every flag of ``nearrec bench``, in the order ``--help`` lists them: ``COMMON``, which every
#: harness takes, and those a harness names in its ``Harness.flags``.
FLAGS = {
    "--quick": Flag("a short run (under two minutes)", {"action": "store_true"}),
    "--models": Flag("comma-separated models (sls, cache: default rmc1,rmc2,rmc3; e2e: all "
                     "eight)", value=_split(str)),
    "--rows": Flag("rows per table (sls, keyed, torchrec)", {"type": int}),
    "--budgets": Flag("cache, colocate: DRAM budgets as shares of the tables, e.g. 0.25,0.06 "
                      "(colocate: 0 = no DRAM tier)", value=_split(float)),
    "--traces": Flag("cache, colocate: traces, e.g. k1,zipf1.05 (k<K>[-recssd], zipf<a>)",
                     value=_split(str)),
    "--batches": Flag("cache, e2e, triton: batch sizes, e.g. 1,64", value=_split(int)),
    "--places": Flag("e2e: where the models run, dram,ssd (default both)", value=_split(str)),
    "--no-recssd": Flag("e2e: skip the pass at RecSSD's row counts", {"action": "store_true"},
                        lambda given: False),
    "--table-bytes": Flag("bytes to write (build) / table bytes of the store (ssd, cache, e2e; "
                          "update: per table)", {"type": parse_bytes}),
    "--out": Flag("where the records go (default: bench/results; with --quick the ignored "
                  "bench/scratch/quick, so that quick runs leave the recorded results alone)",
                  value=Path),
    "--scratch": Flag("where stores are built", {"default": "bench/scratch"}, Path),
    "--scale-keys": Flag("keyed: also build and look up a keyed table of this many keys",
                         {"type": int}),
    "--minutes": Flag("soak: how long the load runs", {"type": float}),
    "--clients": Flag("soak, triton: clients, each its own connection and schedule",
                      {"type": int}),
    "--schedules": Flag("partitions: nemesis schedules to run", {"type": int}),
    "--no-etcd": Flag("partitions: membership kept by the replicas alone (the run must find "
                      "split-brain)", {"action": "store_true"}, lambda given: False),
    "--seed": Flag("partitions: the schedules' seed", {"type": int}),
}
#: besides these, every harness takes the flags of every ``nearrec`` command (``--json``,
#: ``--progress``, ``--debug``: ``nearrec.cli.common``)
COMMON = ("--quick", "--out", "--scratch")


def harness(what: str) -> Harness[Any]:
    h: Harness[Any] = importlib.import_module(f".{MODULES[what]}", __package__).HARNESSES[what]
    return h


def parser(what: str, cls: type[argparse.ArgumentParser] = argparse.ArgumentParser
           ) -> argparse.ArgumentParser:
    """WHAT's parser: the common flags and its own."""
    h = harness(what)
    p = cls(prog=f"nearrec bench {what}")
    for flag, f in FLAGS.items():
        if flag in COMMON or flag in h.flags:
            p.add_argument(flag, help=f.help, **f.options)
    common(p)
    return p


def parse(what: str, argv: list[str], namespace: argparse.Namespace | None = None,
          cls: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> argparse.Namespace:
    """``argv``, the command line after ``nearrec bench WHAT``, read by WHAT's parser (into
    ``namespace`` if given); a usage error exits with status 2."""
    args = parser(what, cls).parse_args(argv, namespace)
    args.what = what
    if args.out is None:
        args.out = "bench/scratch/quick" if args.quick else "bench/results"
    return args


def configure(h: Harness[Any], args: argparse.Namespace) -> Any:
    """The harness's config, ``--quick``'s or the full one, with the flags given on top."""
    cfg = h.quick() if args.quick else h.config()
    for flag, name in h.flags.items():
        # (getattr: a namespace from an older nearrec CLI may lack a newer flag; bench/ab.py)
        given = getattr(args, flag[2:].replace("-", "_"), None)
        if given:
            setattr(cfg, name, FLAGS[flag].value(given))
    if h.progress:
        cfg.progress_file = Path(args.out) / f"{args.what}-progress.jsonl"
        cfg.progress_file.parent.mkdir(parents=True, exist_ok=True)
        cfg.progress_file.unlink(missing_ok=True)
    return cfg


def run(args: argparse.Namespace, command: str) -> tuple[Path, Path, str]:
    """Runs the harness ``args.what`` with ``args``' settings (as ``parse`` gives them); returns
    the JSON and Markdown files written and the Markdown. ``command`` is the command line
    recorded with the results."""
    h = harness(args.what)
    out = Path(args.out)
    records = h.run(configure(h, args), lambda m: print(m, file=sys.stderr, flush=True))
    name = args.what + ("-quick" if args.quick else "")
    md = h.markdown(records, command)
    if h.figure is not None:
        out.mkdir(parents=True, exist_ok=True)
        if h.figure(records, out / f"{name}.png"):
            md += f"\n![the figures](./{name}.png)\n"
    js, mdp = report.write(records, out, name, command, md)
    return js, mdp, md


def register(sub: Any, cls: type[argparse.ArgumentParser]) -> None:
    """Adds ``bench WHAT [FLAGS]`` to the product's CLI (``sub``, its subparsers): WHAT's own
    parser (``cls``) reads the flags when it runs."""
    be = sub.add_parser("bench", help="benchmarks against peers; results under bench/results/")
    be.add_argument("what", choices=sorted(MODULES),
                    help="the harness (docs/results.md says what each measures)")
    be.add_argument("flags", nargs=argparse.REMAINDER,
                    help="the harness's own flags, which `nearrec bench WHAT --help` lists")
    be.set_defaults(func=lambda args: command(args, cls))


def command(args: argparse.Namespace, cls: type[argparse.ArgumentParser]) -> int:
    """``nearrec bench WHAT FLAGS``: the harness run, its records written and shown."""
    parse(args.what, args.flags, args, cls)  # --out's default too
    line = "nearrec " + " ".join(sys.argv[1:]) if sys.argv[0].endswith("nearrec") \
        else "nearrec bench " + " ".join(sys.argv[2:])
    js, mdp, md = run(args, line)
    emit(args, {"json": str(js), "markdown": str(mdp)}, md + f"\nwrote {js} and {mdp}")
    return 0
