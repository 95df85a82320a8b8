"""The flags the verbs share: ``--json`` / ``--progress`` / ``--debug`` (:func:`common`),
``--config`` and the store settings that override it (:func:`store_flags`,
:func:`store_config`), size arguments (:func:`parse_bytes`), and the parser whose usage errors
are one line (:class:`Parser`)."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

import nearrec

from ..config import CachePolicy
from ..errors import InvalidRequest
from ..remote import DEFAULT_TIMEOUT, TOKEN_ENV
from ..units import parse_size


def parse_bytes(text: str) -> int:
    """A size argument (see :func:`nearrec.units.parse_size`)."""
    try:
        return parse_size(text)
    except InvalidRequest as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: the store settings every verb that opens a store takes as flags: overrides of --config
STORE_FLAGS = ("tier", "threads", "dram_budget", "cache_policy", "admission_probability",
               "io_queue_depth", "plan", "device", "scrub_rate", "unknown_keys")


def store_flags(p: argparse.ArgumentParser, config_flag: str = "--config") -> None:
    """``--config FILE`` (``config_flag``) and the flags that override its settings (unset
    flags leave the file's values, whose own defaults are ``nearrec.StoreConfig``'s: one copy,
    in Rust)."""
    g = p.add_argument_group(f"store settings (override {config_flag})")
    g.add_argument(config_flag, dest="store_config",
                   help="a store config file (TOML), as nearrec.StoreConfig and "
                   "nearrec::StoreConfig read it")
    d = nearrec.StoreConfig()  # the defaults, Rust's (shown; the flags themselves stay unset)
    g.add_argument("--tier", choices=["auto", "dram", "ssd"],
                   help="serve from DRAM, read rows from SSD per batch, or DRAM if the store "
                        f"fits --dram-budget (default: the config's, {d.tier})")
    g.add_argument("--threads", type=int,
                   help=f"pooling threads, 0: every core (default: {d.threads})")
    g.add_argument("--dram-budget", help="DRAM for the store's tiers, e.g. 4GiB (default: "
                   "half of memory for --tier auto, no DRAM tiers for --tier ssd)")
    g.add_argument("--cache-policy", choices=[policy.value for policy in CachePolicy],
                   help=f"the row cache's policy (default: {d.cache_policy})")
    g.add_argument("--admission-probability", type=float,
                   help="the chance a missed row enters the cache, for the probabilistic "
                        f"policies (default: {d.admission_probability})")
    g.add_argument("--io-queue-depth", type=int,
                   help=f"reads in flight on the SSD tier (default: {d.io_queue_depth})")
    g.add_argument("--plan", help="a plan file (nearrec plan) placing rows in DRAM")
    g.add_argument("--device", help="serve the SSD tier from a simulated drive (a preset or a "
                   "JSON parameter file)")
    g.add_argument("--unknown-keys", choices=["error", "zero", "init", "default"],
                   help="what a key a keyed table does not hold answers: an UnknownKey error "
                        "naming its position, a row of zeros, a row drawn from the key, or "
                        "the table's default row (row 0; a managed-collision table's default "
                        "slot) "
                        f"(default: {d.unknown_keys})")
    g.add_argument("--scrub-rate", help="scrub the store in the background: its table files "
                   "read at this many bytes a second, e.g. 16MiB, pass after pass, every sector "
                   "checked against its checksum (default: 0, no scrub)")


def store_config(args: argparse.Namespace) -> nearrec.StoreConfig:
    """The config ``--config`` names (or the defaults), with the flags given on top."""
    base = (nearrec.StoreConfig.from_file(args.store_config)
            if getattr(args, "store_config", None) else nearrec.StoreConfig())
    return base.replace(**{k: getattr(args, k) for k in STORE_FLAGS
                           if getattr(args, k, None) is not None})


def remote_flags(p: argparse.ArgumentParser, path_help: str) -> None:
    """A store here (``path``) or on a storage node (``--remote``), and how to reach the node:
    the verbs that work on either (``lookup``, ``update``)."""
    p.add_argument("path", nargs="?", help=path_help + " (with --remote: its name on the "
                                                       "node; default: the node's only store)")
    p.add_argument("--remote", metavar="HOST:PORT", help="a storage node (nearrec serve); several "
                   "serving the store: comma-separated, the first that answers")
    p.add_argument("--token-file", metavar="FILE",
                   help=f"with --remote: a file holding the bearer token (default: the "
                        f"{TOKEN_ENV} environment variable; --token works too, but shows the "
                        f"token to anyone who can list processes)")
    p.add_argument("--token", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                   help="with --remote: each call's deadline, s (default: %(default)s)")
    p.add_argument("--tls-ca", metavar="PEM",
                   help="with --remote: TLS, the node's certificate checked against this CA")


def open_store(args: argparse.Namespace, verb: str, *, writable: bool = False) -> nearrec.Store:
    """The store ``remote_flags`` named: connected (its token from ``--token-file``,
    ``--token`` or :data:`~nearrec.remote.TOKEN_ENV`), or opened here with the store flags."""
    if args.remote:
        return nearrec.connect(args.remote, args.path or "", token=args.token,
                               token_file=args.token_file, timeout=args.timeout,
                               tls_ca=args.tls_ca)
    if not args.path:
        raise InvalidRequest(f"nearrec {verb} needs a store: a PATH, or --remote HOST:PORT "
                             "(and the store's name on the node as PATH)")
    config = store_config(args)
    if writable:
        config = config.replace(writable=True, durability=args.durability)
    return nearrec.open(args.path, config, progress=args.progress)


def common(sp: argparse.ArgumentParser) -> None:
    """The flags every command takes (and every ``nearrec bench`` harness)."""
    sp.add_argument("--json", action="store_true", help="print JSON for machines")
    sp.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                    help="progress bars (default: when stderr is a terminal; --progress "
                         "draws them on a pipe too, a line a second)")
    sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                    help="show the traceback of a failure")


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Help that shows each flag's default (where it has one and the text does not already
    say it), and keeps a verb's examples as they are written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, argparse.SUPPRESS) \
                or not action.option_strings or isinstance(default, list) and not default:
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are one line too (the usage itself is in ``--help``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"nearrec: error: {message} (see: {self.prog} --help)\n")
