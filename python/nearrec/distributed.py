"""A store cut into shards, each served by one or more storage nodes, used as one
:class:`~nearrec.Store`.

- :func:`plan_shards`: which shard serves which rows of which table — TorchRec's table-wise,
  row-wise and table-row-wise schemes (``scheme="table" | "row" | "table-row" | "auto"``),
  balanced half by bytes and half by a trace's lookups, optionally the hottest rows of each
  split table kept on every shard of it (``replicate_hot``), so that a bag's hot ids go with
  its other ids instead of to one more shard. A :class:`ShardPlan`.
- :func:`shard`: the store cut by a plan under a directory: ``shard-K`` (each a repository
  of versions, the cut its version 1) and ``shards.json``, the plan, written last (``nearrec
  shard`` on the command line); :func:`publish`: the next model cut by the same plan, one new
  version of every shard, for the sharded store to swap to (``Store.swap(version=V)``: every
  replica stages it, then switches; each batch is read at one version, never two).
- :func:`load_plan`: the plan of a sharded store's directory, checked.
- :func:`connect`: the sharded store through the nodes serving its shards — a
  :class:`~nearrec.Store` whose lookups are split by shard, sent to every shard at once and
  merged exactly (the router is Rust: ``crates/nearrec-cluster``), reads hedged to a second
  replica after the shard's observed p95 and moved to another replica when one fails. A shard
  no replica of which answers fails the call with :class:`~nearrec.errors.Unavailable` naming
  the shard, never a partial answer. A write goes to every replica of the shard its rows are
  on; a call whose rows span shards commits on all of them or none (two-phase commit, the
  router coordinating), and a lookup through the same store never sees part of it.
  ``nearrec.ray`` starts the nodes as Ray actors and returns this. :func:`open_dir`: the same,
  its nodes and options as its directory's ``replicas.toml`` names them (what ``nearrec serve
  --shards`` reads).
- :func:`catch_up`: the replicas that missed writes (a node that was down, restarted behind)
  brought back: the rows that differ copied from a member of their shard, the members fenced
  for the last pass, then admitted again (``nearrec.ray`` does it by itself every few
  seconds). Until then a replica that missed a write serves no reads and takes no writes.

The plan and the cut are Rust (``nearrec::shard``, ``nearrec_plan::shards``); this module
only translates.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import _native
from ._native import NativeStore, table_layout
from .errors import InvalidRequest
from .remote import DEFAULT_TIMEOUT, TOKEN_ENV, _credentials
from .request import count, text
from .store import Store

_PathLike = str | os.PathLike[str]

#: The schemes :func:`plan_shards` takes.
SCHEMES = ("table", "row", "table-row", "auto")


@dataclass(frozen=True)
class Part:
    """Rows ``first .. first + rows`` of a table, on shard ``shard``."""

    shard: int
    first: int
    rows: int


@dataclass(frozen=True)
class ShardedTable:
    """A table of a sharded store: its row ranges, each on a shard of its own, and the rows
    kept on every one of them as well (``hot``, ascending)."""

    name: str
    rows: int
    dim: int
    dtype: str
    #: its share of the trace's lookups (of the tables' count without a trace)
    load: float
    parts: tuple[Part, ...]
    hot: tuple[int, ...]


@dataclass(frozen=True)
class ShardPlan:
    """A sharded store's plan, as its ``shards.json`` holds it (:meth:`to_json`)."""

    #: a digest of the content: every shard carries the id of the plan it was cut by
    id: str
    #: the name the sharded store is served as
    store: str
    #: the scheme that made it (``auto`` resolved)
    scheme: str
    shards: int
    replicas: int
    tables: tuple[ShardedTable, ...]
    _json: str = dataclasses.field(repr=False, compare=False)

    @classmethod
    def _from_json(cls, text_: str) -> ShardPlan:
        raw = json.loads(text_)
        tables = tuple(
            ShardedTable(t["name"], t["rows"], t["dim"], t["dtype"], t["load"],
                         tuple(Part(p["shard"], p["first"], p["rows"]) for p in t["parts"]),
                         tuple(t.get("hot", ())))
            for t in raw["tables"])
        return cls(raw["id"], raw["store"], raw["scheme"], raw["shards"], raw["replicas"],
                   tables, text_)

    def to_json(self) -> str:
        """The plan as ``shards.json`` holds it."""
        return self._json

    def shard_tables(self, shard: int) -> list[tuple[ShardedTable, Part]]:
        """The tables shard ``shard`` holds, each with its part there."""
        return [(t, p) for t in self.tables for p in t.parts if p.shard == shard]

    def shard_bytes(self) -> list[int]:
        """Each shard's bytes of rows (its parts' and its hot rows')."""
        out = [0] * self.shards
        for t in self.tables:
            row = table_layout(1, t.dim, t.dtype)[0]
            for p in t.parts:
                out[p.shard] += (p.rows + len(t.hot)) * row
        return out

    def shard_load(self) -> list[float]:
        """Each shard's expected share of the lookups (a table's load split over its parts by
        their rows: the plan's cuts by a trace make that an estimate)."""
        out = [0.0] * self.shards
        for t in self.tables:
            for p in t.parts:
                out[p.shard] += t.load * p.rows / t.rows
        return out


def _options(shards: int, replicas: int, scheme: str, replicate_hot: int
             ) -> tuple[int, int, str, int]:
    """A plan's arguments, checked, in the order the binding takes them."""
    if scheme not in SCHEMES:
        raise InvalidRequest(f"scheme must be one of {', '.join(SCHEMES)}, not {scheme!r}")
    return (count(shards, "shards"), count(replicas, "replicas"), scheme,
            count(replicate_hot, "replicate_hot", minimum=0))


def plan_shards(store: _PathLike, shards: int, *, replicas: int = 1, scheme: str = "auto",
                trace: _PathLike | None = None, replicate_hot: int = 0) -> ShardPlan:
    """The plan that cuts the store at ``store`` into ``shards`` shards of ``replicas``
    replicas each by ``scheme``, balanced by ``trace`` (a ``.nrtrace`` file) where one is
    given; ``replicate_hot`` (needs a trace): that many of the hottest rows of each table cut
    into several parts are kept on each of its shards too."""
    return ShardPlan._from_json(_native.shard_plan(
        os.fspath(store), *_options(shards, replicas, scheme, replicate_hot),
        None if trace is None else os.fspath(trace)))


def shard(store: _PathLike, out: _PathLike, shards: int | ShardPlan, *, replicas: int = 1,
          scheme: str = "auto", trace: _PathLike | None = None, replicate_hot: int = 0,
          overwrite: bool = False) -> ShardPlan:
    """Cuts the store at ``store`` into shards under ``out`` — by a :class:`ShardPlan`, or by
    the plan :func:`plan_shards` makes of the other arguments — and returns the plan. Each
    shard is an ordinary store holding its parts' rows as the source stores them, version 1 of
    the shard's repository ``out/shard-K`` (:func:`publish` adds versions); the plan
    (``out/shards.json``) is written last, so a cut that fails leaves no sharded store. A store
    with writes not yet compacted is refused (compact it first)."""
    if isinstance(shards, ShardPlan):
        _native.shard_write(os.fspath(store), shards.to_json(), os.fspath(out), bool(overwrite))
        return shards
    return ShardPlan._from_json(_native.shard_store(
        os.fspath(store), os.fspath(out), bool(overwrite),
        *_options(shards, replicas, scheme, replicate_hot),
        None if trace is None else os.fspath(trace)))


def publish(store: _PathLike, directory: _PathLike) -> int:
    """Cuts the store at ``store`` (the next model: the same tables) by the plan of the sharded
    store at ``directory`` and publishes its shards as one new version of every shard's
    repository; returns the version. Nothing is served until the sharded store swaps to it
    (``Store.swap(version=V)``: every shard staged, then switched, no batch reading two)."""
    return _native.shard_publish(os.fspath(store), os.fspath(directory))


def load_plan(directory: _PathLike) -> ShardPlan:
    """The plan of the sharded store at ``directory`` (its ``shards.json``), checked whole: a
    plan whose parts do not cover its tables' rows, or that was edited, raises
    :class:`~nearrec.errors.InvalidRequest` naming the table."""
    return ShardPlan._from_json(_native.shard_plan_read(os.fspath(directory)))


def connect(plan: ShardPlan | _PathLike, replicas: Sequence[Sequence[str] | str], *,
            token: str | None = None, token_file: _PathLike | None = None,
            timeout: float | None = DEFAULT_TIMEOUT, hedge: float | str | None = "p95",
            tls_ca: _PathLike | None = None, tls_cert: _PathLike | None = None,
            tls_key: _PathLike | None = None, tls_domain: str | None = None,
            catch_up_every: float | None = 2.0, etcd: str | Sequence[str] | None = None,
            etcd_prefix: str | None = None, etcd_hold: float = 2.0) -> Store:
    """The sharded store of ``plan`` (a :class:`ShardPlan`, or the directory holding its
    ``shards.json``), shard ``k`` served by the nodes ``replicas[k]`` (``host:port`` or
    ``host:port/store``; one string is one replica). Every replica is checked against the
    plan first: one whose tables do not fit it raises
    :class:`~nearrec.errors.InvalidRequest` naming the shard and table.

    ``hedge``: when a read goes to a second replica of its shard too, the first answer
    winning and the other call cancelled — ``"p95"`` (the default: after the shard's observed
    95th percentile; any ``"pNN"``), a delay in seconds, or ``None`` (never). ``timeout`` is
    each call's deadline, carried to the nodes; token and TLS as :func:`nearrec.connect`.

    ``catch_up_every``: seconds between the router's background passes that catch up the
    replicas that missed writes (:func:`catch_up`, on a thread of its own that ends with the
    store); ``None``: only when :func:`catch_up` is called. Meanwhile
    ``stats()["cluster_stale_replicas"]`` counts the replicas left out.

    ``etcd``: the endpoints (``"host:port,..."`` or a list) of the etcd cluster the shards'
    membership is kept in — the nodes serving the replicas given the same (``nearrec serve
    --etcd``) — under ``etcd_prefix`` (default ``/nearrec/<plan id>``); ``etcd_hold``: seconds a
    replica is held per renewal of its node's lease, for a shard whose record this router makes.
    Without it, membership is the replicas' own, unsafe under partitions
    (``docs/distributed.md``, "Membership in etcd")."""
    location = None
    if not isinstance(plan, ShardPlan):
        location = os.fspath(plan)
        plan = load_plan(location)
    shards = [[text(r, "a replica's address")] if isinstance(r, str)
              else [text(a, "a replica's address") for a in r] for r in replicas]
    token, timeout, tls = _credentials(token, token_file, timeout, tls_ca, tls_cert, tls_key,
                                       tls_domain)
    kept = None
    if etcd is not None:
        endpoints = [e for e in (etcd.split(",") if isinstance(etcd, str) else etcd) if e]
        kept = ([text(e, "an etcd endpoint") for e in endpoints], etcd_prefix, float(etcd_hold))
    native = NativeStore.connect_sharded(plan.to_json(), location, shards,
                                         "off" if hedge is None else hedge,
                                         token, timeout, tls, catch_up_every, kept)
    how = (plan, shards, token is not None, timeout, hedge, catch_up_every, kept)
    return Store._over(native, ";".join(",".join(s) for s in shards),
                       lambda s: (_reconnect, how))


def open_dir(directory: _PathLike) -> Store:
    """The sharded store in ``directory`` (``nearrec shard``'s), through the nodes its
    ``replicas.toml`` names, with the timeout, hedge, token file, CA and catch-up period it
    gives (``docs/distributed.md``) — as a front node (``nearrec serve --shards``) opens it."""
    where = os.fspath(directory)
    native = NativeStore.open_sharded(where)
    label = ";".join(",".join(s) for s in native.shard_replicas())
    return Store._over(native, label, lambda s: (open_dir, (where,)))


@dataclass(frozen=True)
class CaughtUp:
    """One replica's catch-up (:func:`catch_up`): done, with what it copied, or why not."""

    shard: int
    replica: str
    #: Rows copied while writes went on, and under the members' fence.
    rows_before_fence: int = 0
    rows_fenced: int = 0
    #: The count of writes the replica and its shard's members hold after.
    version: int = 0
    #: The shard's membership epoch that admitted it.
    epoch: int = 0
    #: How long the members were fenced (their writes waited): from the fence to the admission.
    fenced_seconds: float = 0.0
    #: Why it is not caught up (``None``: it is); it is tried again at the next call.
    error: str | None = None


def catch_up(store: Store, *, lease: float = 10.0) -> list[CaughtUp]:
    """Catches up every replica of the sharded ``store`` that missed writes and answers (a
    node that was down, restarted behind its shard's others): the rows that differ from a
    member of its shard, compared by digest where the rows are, copied to it while writes go
    on; then the members fenced — their writes wait, at most ``lease`` seconds — for a last
    pass and one count of writes everywhere; then admitted at the shard's next membership
    epoch, which every router learns at its next write (``docs/distributed.md``, "A replica
    catching up"). One :class:`CaughtUp` per replica tried; none when every replica is a
    member."""
    done = store._native.catch_up(float(lease))
    out = []
    for shard, replica, did, error in done:
        if did is None:
            out.append(CaughtUp(shard, replica, error=error))
        else:
            out.append(CaughtUp(shard, replica, *did))
    return out


def _reconnect(plan: ShardPlan, replicas: list[list[str]], token: bool,
               timeout: float | None, hedge: Any, catch_up_every: float | None,
               kept: tuple[list[str], str | None, float] | None = None) -> Store:
    """A pickled sharded store connected again, its token from :data:`TOKEN_ENV`."""
    etcd, prefix, hold = kept if kept is not None else (None, None, 2.0)
    return connect(plan, replicas, token=os.environ.get(TOKEN_ENV) if token else None,
                   timeout=timeout, hedge=hedge, catch_up_every=catch_up_every, etcd=etcd,
                   etcd_prefix=prefix, etcd_hold=hold)
