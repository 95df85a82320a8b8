"""``nearrec bench WHAT``: runs one harness as the command line's arguments ask and writes its
records (JSON + Markdown) under ``--out``. The product's CLI (``nearrec.cli``) parses the arguments
and imports this module only when ``nearrec bench`` runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import report


def run(args: argparse.Namespace, command: str) -> tuple[Path, Path, str]:
    """Runs the harness ``args.what`` with ``args``' settings; returns the JSON and Markdown files
    written and the Markdown. ``command`` is the command line recorded with the results."""
    out = Path(args.out)
    if args.what == "sls":
        from . import sls

        cfg = sls.SlsConfig.quick() if args.quick else sls.SlsConfig()
        if args.models:
            cfg.models = tuple(args.models.split(","))
        if args.rows:
            cfg.rows = args.rows
        cfg.scratch = Path(args.scratch)
        records = sls.run(cfg, log=lambda m: print(m, file=sys.stderr, flush=True))
        name = "sls-quick" if args.quick else "sls"
        md = report.sls_markdown(records, command)
    elif args.what == "cache":
        from . import cache

        ccfg = cache.CacheBenchConfig.quick() if args.quick else cache.CacheBenchConfig()
        if args.models:
            ccfg.models = tuple(args.models.split(","))
        if args.table_bytes:
            ccfg.table_bytes = args.table_bytes
        if args.budgets:
            ccfg.budgets = tuple(float(b) for b in args.budgets.split(","))
        if args.traces:
            ccfg.traces = tuple(args.traces.split(","))
        if args.batches:
            ccfg.batches = tuple(int(b) for b in args.batches.split(","))
        ccfg.scratch = Path(args.scratch)
        ccfg.progress_file = Path(args.out) / "cache-progress.jsonl"
        ccfg.progress_file.parent.mkdir(parents=True, exist_ok=True)
        ccfg.progress_file.unlink(missing_ok=True)
        records = cache.run(ccfg, log=lambda m: print(m, file=sys.stderr, flush=True))
        name = "cache-quick" if args.quick else "cache"
        md = cache.markdown(records, command)
    elif args.what == "keyed":
        from . import keyed

        kbcfg = keyed.KeyedBenchConfig.quick() if args.quick else keyed.KeyedBenchConfig()
        if args.rows:
            kbcfg.rows = args.rows
        kbcfg.scratch = Path(args.scratch)
        records = keyed.run(kbcfg, log=lambda m: print(m, file=sys.stderr, flush=True))
        name = "keyed-quick" if args.quick else "keyed"
        md = keyed.markdown(records, command)
    elif args.what == "colocate":
        from . import colocate

        kcfg = colocate.ColocateBenchConfig.quick() if args.quick \
            else colocate.ColocateBenchConfig()
        if args.table_bytes:
            kcfg.table_bytes = args.table_bytes
        if args.traces:
            kcfg.traces = tuple(args.traces.split(","))
        if args.budgets:
            kcfg.drams = tuple(float(b) for b in args.budgets.split(","))
        kcfg.scratch = Path(args.scratch)
        records = colocate.run(kcfg, log=lambda m: print(m, file=sys.stderr, flush=True))
        name = "colocate-quick" if args.quick else "colocate"
        md = colocate.markdown(records, command)
    elif args.what == "e2e":
        from . import e2e

        ecfg = e2e.E2EConfig.quick() if args.quick else e2e.E2EConfig()
        if args.models:
            ecfg.models = tuple(args.models.split(","))
        if args.table_bytes:
            ecfg.table_bytes = args.table_bytes
        if args.batches:
            ecfg.batches = tuple(int(b) for b in args.batches.split(","))
        if args.no_recssd:
            ecfg.recssd = False
        if getattr(args, "places", None):  # absent from an older nearrec CLI (bench/ab.py)
            ecfg.places = tuple(args.places.split(","))
        ecfg.scratch = Path(args.scratch)
        ecfg.progress_file = Path(args.out) / "e2e-progress.jsonl"
        ecfg.progress_file.parent.mkdir(parents=True, exist_ok=True)
        ecfg.progress_file.unlink(missing_ok=True)
        records = e2e.run(ecfg, log=lambda m: print(m, file=sys.stderr, flush=True))
        name = "e2e-quick" if args.quick else "e2e"
        md = e2e.markdown(records, command)
    elif args.what in ("ssd", "ssd-tuning", "ssd-verify", "ssd-cost"):
        from . import ssd

        scfg = ssd.SsdConfig.quick() if args.quick else ssd.SsdConfig()
        if args.table_bytes:
            scfg.table_bytes = args.table_bytes
        scfg.scratch = Path(args.scratch)
        log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        if args.what == "ssd":
            records = ssd.run(scfg, log=log)
            md = ssd.markdown(records, command)
        elif args.what == "ssd-verify":
            records = ssd.run_verify(scfg, log=log)
            md = ssd.verify_markdown(records, command)
        elif args.what == "ssd-cost":
            if not args.table_bytes:
                # the memory device holds the tables in DRAM: 1 GiB, whatever the ssd default
                scfg.table_bytes = 1 << 30
            records = ssd.run_cost(scfg, log=log, rounds=2 if args.quick else 3,
                                   seconds=0.5 if args.quick else 1.5)
            md = ssd.cost_markdown(records, command)
        else:
            records = ssd.run_tuning(scfg, log=log)
            md = ssd.tuning_markdown(records, command)
        name = args.what + ("-quick" if args.quick else "")
    elif args.what == "flash-repro":
        from . import flash

        fcfg = flash.FlashReproConfig.quick() if args.quick else flash.FlashReproConfig()
        if args.table_bytes:
            fcfg.table_bytes = args.table_bytes
        fcfg.out = out
        records = flash.run(fcfg, log=lambda m: print(m, file=sys.stderr, flush=True))
        name = "flash-repro-quick" if args.quick else "flash-repro"
        md = flash.markdown(records, command)
    elif args.what == "flash-check":
        from . import flash

        kccfg = flash.FlashCheckConfig.quick() if args.quick else flash.FlashCheckConfig()
        if args.table_bytes:
            kccfg.table_bytes = args.table_bytes
        if args.batches:
            kccfg.batches = tuple(int(b) for b in args.batches.split(","))
        kccfg.scratch = Path(args.scratch)
        records = flash.check(kccfg, log=lambda m: print(m, file=sys.stderr, flush=True))
        name = "flash-check-quick" if args.quick else "flash-check"
        md = flash.check_markdown(records, command)
    elif args.what == "ebc":
        from . import ebc

        bcfg = ebc.EbcConfig.quick() if args.quick else ebc.EbcConfig()
        if args.models:
            bcfg.models = tuple(args.models.split(","))
        if args.rows:
            bcfg.rows = args.rows
        bcfg.scratch = Path(args.scratch)
        records = ebc.run(bcfg, log=lambda m: print(m, file=sys.stderr, flush=True))
        name = "ebc-quick" if args.quick else "ebc"
        md = ebc.markdown(records, command)
    elif args.what == "torchrec":
        from . import torchrec

        tcfg = torchrec.TorchRecConfig.quick() if args.quick else torchrec.TorchRecConfig()
        if args.rows:
            tcfg.rows = args.rows
        if args.batches:
            tcfg.batches = tuple(int(b) for b in args.batches.split(","))
        tcfg.scratch = Path(args.scratch)
        records = torchrec.run(tcfg, log=lambda m: print(m, file=sys.stderr, flush=True))
        name = "torchrec-quick" if args.quick else "torchrec"
        md = torchrec.markdown(records, command)
    elif args.what == "update":
        from . import update

        ucfg = update.UpdateConfig.quick() if args.quick else update.UpdateConfig()
        if args.table_bytes:
            ucfg.table_bytes = args.table_bytes
        ucfg.scratch = Path(args.scratch)
        records = update.run(ucfg, log=lambda m: print(m, file=sys.stderr, flush=True))
        name = "update-quick" if args.quick else "update"
        md = update.markdown(records, command)
    elif args.what == "serve":
        from . import serve

        vcfg = serve.ServeConfig.quick() if args.quick else serve.ServeConfig()
        if args.rows:
            vcfg.rows = args.rows
        vcfg.scratch = Path(args.scratch)
        records = serve.run(vcfg, log=lambda m: print(m, file=sys.stderr, flush=True))
        name = "serve-quick" if args.quick else "serve"
        md = serve.markdown(records, command)
        out.mkdir(parents=True, exist_ok=True)
        if serve.plot(records, out / f"{name}.png"):
            md += f"\n![the figures](./{name}.png)\n"
    elif args.what == "gpu":
        from . import gpu

        gcfg = gpu.GpuBenchConfig.quick() if args.quick else gpu.GpuBenchConfig()
        if args.rows:
            gcfg.rows = args.rows
        gcfg.scratch = Path(args.scratch)
        records = gpu.run(gcfg, log=lambda m: print(m, file=sys.stderr, flush=True))
        name = "gpu-quick" if args.quick else "gpu"
        md = gpu.markdown(records, command)
    else:
        from . import build

        size = args.table_bytes or (1 << 30 if args.quick else 4 << 30)
        records = build.run(Path(args.scratch), size,
                            log=lambda m: print(m, file=sys.stderr, flush=True))
        name = "build-quick" if args.quick else "build"
        md = build.markdown(records, command)
    js, mdp = report.write(records, out, name, command, md)
    return js, mdp, md
