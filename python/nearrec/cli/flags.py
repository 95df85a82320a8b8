"""The flags the verbs share: ``--json`` / ``--progress`` / ``--debug`` (:func:`common`),
``--config`` and the store settings that override it (:func:`store_flags`,
:func:`store_config`), size arguments (:func:`parse_bytes`), and the parser whose usage errors
are one line (:class:`Parser`)."""

from __future__ import annotations

import argparse
from typing import NoReturn

import nearrec

from ..config import CachePolicy
from ..errors import InvalidRequest
from ..units import parse_size


def parse_bytes(text: str) -> int:
    """A size argument (see :func:`nearrec.units.parse_size`)."""
    try:
        return parse_size(text)
    except InvalidRequest as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: the store settings every verb that opens a store takes as flags: overrides of --config
STORE_FLAGS = ("tier", "threads", "dram_budget", "cache_policy", "admission_probability",
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
    g.add_argument("--cache-policy", choices=[policy.value for policy in CachePolicy])
    g.add_argument("--admission-probability", type=float)
    g.add_argument("--io-queue-depth", type=int)
    g.add_argument("--plan", help="a plan file (nearrec plan) placing rows in DRAM")
    g.add_argument("--device", help="serve the SSD tier from a simulated drive (a preset or a "
                   "JSON parameter file)")


def store_config(args: argparse.Namespace) -> nearrec.StoreConfig:
    """The config ``--config`` names (or the defaults), with the flags given on top."""
    base = (nearrec.StoreConfig.from_file(args.store_config)
            if getattr(args, "store_config", None) else nearrec.StoreConfig())
    return base.replace(**{k: getattr(args, k) for k in STORE_FLAGS
                           if getattr(args, k, None) is not None})


def common(sp: argparse.ArgumentParser) -> None:
    """The flags every command takes (and every ``nearrec bench`` harness)."""
    sp.add_argument("--json", action="store_true", help="print JSON for machines")
    sp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bars (default: when stderr is a terminal; --progress "
                         "draws them on a pipe too, a line a second)")
    sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                    help="show the traceback of a failure")


class Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are one line too (the usage itself is in ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"nearrec: error: {message} (see: {self.prog} --help)\n")
