"""Sharded stores on Ray: Ray places, names and restarts the storage nodes; the lookups go
over nearrec's own gRPC, through the Rust router (``nearrec.distributed``).

- :meth:`ShardedStore.launch`: one storage node per shard replica, each a detached, named Ray
  actor (``NAME/shard-K/replica-R`` in the ``nearrec`` namespace) that runs ``nearrec serve``
  as its child; the replicas of a shard in a placement group of their own, spread over Ray's
  nodes (``spread="strict"``: never two on one node); restarted by Ray (``max_restarts``) when
  the node or its actor dies. Returns the one :class:`~nearrec.Store` over the router.
- :meth:`ShardedStore.connect`: the same store from another driver, by name.
- :meth:`ShardedStore.shutdown`: every actor and placement group of it gone.
- :func:`serve_model`: a model on Ray Serve over the sharded store — its dense part in Serve's
  replicas with requests batched together, or the whole model on the store's nodes — behind
  HTTP and gRPC ingress.

Discovery is Ray's: a node registers its address with the store's registry actor (named
``NAME``) each time it starts, and every store connected to it reads the registry twice a
second, moving a shard's reads to the new address of a restarted replica; a read of a shard
none of whose replicas answers waits for one within its deadline. A restarted replica that
missed writes serves nothing until it has caught up (:func:`nearrec.distributed.catch_up`,
which every connected store's router runs in the background, ``catch_up_every``). Nothing of
discovery or scheduling is nearrec's own. Which replicas are current is kept in etcd for a
writable store of several replicas (``docs/distributed.md``, "Membership in etcd"): the
cluster the launch is given (``etcd="host:port,..."``), or three members it starts as Ray
actors (``NAME/etcd-I``) on distinct Ray nodes where the cluster has them, each running Debian's
``etcd`` with its data under the shard directory, restarted by Ray as the nodes are.

A node binds to ``host`` (loopback by default: one machine). On several machines give each
node the address of its Ray node (``host="node"``) and secure it (``node_args=["--tls-cert",
...]``, or ``["--insecure"]`` on a trusted network): ``docs/distributed.md``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from . import distributed, remote
from .errors import InvalidRequest, StoreExists, StoreNotFound, Unavailable
from .store import Store

#: The Ray namespace of every actor nearrec starts.
NAMESPACE = "nearrec"
#: How often a connected store reads its registry for moved replicas (seconds).
WATCH_EVERY = 0.5


@ray.remote(num_cpus=0)
class _Registry:
    """A sharded store's registry: its plan, and each replica's address as it last started."""

    def __init__(self, plan: str, location: str, replicas: int, names: list[list[str]],
                 etcd: tuple[str, str, int] | None):
        shards = len(names)
        self.plan, self.location, self.names, self.etcd_kept = plan, location, names, etcd
        self.addresses: list[list[str | None]] = [[None] * replicas for _ in range(shards)]
        self.epoch = 0

    def register(self, shard: int, replica: int, address: str) -> None:
        self.addresses[shard][replica] = address
        self.epoch += 1

    def view(self) -> tuple[int, list[list[str | None]]]:
        return self.epoch, self.addresses

    def describe(self) -> tuple[str, str, list[list[str]]]:
        return self.plan, self.location, self.names

    def keep_etcd(self, etcd: tuple[str, str, int]) -> None:
        self.etcd_kept = etcd

    def etcd(self) -> tuple[str, str, int] | None:
        """Where the membership is kept: etcd's endpoints, the store's prefix there, and how
        many members the launch started (0: a cluster it was given); ``None``: not in etcd."""
        return self.etcd_kept


class _Node:
    """One replica of one shard: ``nearrec serve`` as this actor's child. The child dies with
    the actor (``PR_SET_PDEATHSIG``), and the actor with the child, so that Ray restarts the
    pair; each start registers the node's address."""

    def __init__(self, registry: str, shard: int, replica: int, path: str, args: list[str],
                 host: str, log_dir: str):
        if host == "node":
            host = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        log = open(Path(log_dir) / f"shard-{shard}-replica-{replica}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nearrec.cli", "serve", f"{path}=s", "--listen",
             f"{host}:0", "--metrics-listen", f"{host}:0", *args],
            stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=_die_with_parent)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"listening on (\S+) .*metrics on (\S+)", line)
        if not m:
            self.proc.kill()
            raise Unavailable(f"shard {shard} replica {replica}: the node did not start "
                              f"(its log: {log.name}): {line!r}")
        self.address, self.metrics = f"{m.group(1)}/s", m.group(2)
        threading.Thread(target=self._watch, daemon=True).start()
        registry_actor = ray.get_actor(registry, namespace=NAMESPACE)
        ray.get(registry_actor.register.remote(shard, replica, self.address))

    def _watch(self) -> None:
        # the node's stdout read to its end (nothing is left in a pipe), then its exit: this
        # actor goes with it, and Ray restarts both
        assert self.proc.stdout is not None
        for _ in self.proc.stdout:
            pass
        self.proc.wait()
        os._exit(1)

    def where(self) -> tuple[str, str, int, str]:
        """The node's address, its metrics URL, its process id and the Ray node it runs on."""
        return self.address, self.metrics, self.proc.pid, ray.get_runtime_context().get_node_id()

    def kill_node(self) -> None:
        """Kills the node (SIGKILL), as a crash would: the actor follows, Ray restarts both."""
        self.proc.kill()


def _die_with_parent() -> None:
    # PR_SET_PDEATHSIG: the node is killed when the actor's process goes
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


class _Etcd:
    """One member of the etcd cluster a launch starts for its store's membership: ``etcd`` as
    this actor's child, dying with it. Its ports and the cluster it joined are kept beside its
    data (under the shard directory): restarted by Ray, it starts again at once as the member
    it was (``--initial-cluster-state existing``); the first time, the launch starts it once
    every member has its ports (:meth:`start`)."""

    def __init__(self, name: str, data: str, host: str, log_dir: str):
        binary = shutil.which("etcd")
        here = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        if binary is None:
            raise Unavailable(f"etcd is not installed on Ray node {here}: `apt-get install "
                              f"etcd-server` on every node (Debian's package), or pass "
                              f"etcd='host:port,...' to launch")
        self.binary, self.name, self.data = binary, name, Path(data)
        self.host = here if host == "node" else host
        self.log = Path(log_dir) / f"etcd-{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        kept = self.data.with_suffix(".json")
        if kept.exists():
            self.urls = json.loads(kept.read_text())
            if (self.data / "member").exists():
                self._run("existing")
        else:
            self.urls = {"peer": f"http://{self.host}:{_free_port(self.host)}",
                         "client": f"http://{self.host}:{_free_port(self.host)}"}

    def urls_of(self) -> dict[str, str]:
        """Its peer and client URLs."""
        return dict(self.urls)

    def start(self, cluster: str) -> None:
        """Starts it as a member of ``cluster`` (``NAME=PEER_URL,...``), new."""
        self.urls["cluster"] = cluster
        self.data.parent.mkdir(parents=True, exist_ok=True)
        self.data.with_suffix(".json").write_text(json.dumps(self.urls))
        self._run("new")

    def _run(self, state: str) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        u = self.urls
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--name", self.name, "--data-dir", str(self.data),
                 "--listen-peer-urls", u["peer"], "--initial-advertise-peer-urls", u["peer"],
                 "--listen-client-urls", u["client"], "--advertise-client-urls", u["client"],
                 "--initial-cluster", u["cluster"], "--initial-cluster-state", state],
                stdout=log, stderr=log, preexec_fn=_die_with_parent)
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        assert self.proc is not None
        self.proc.wait()
        os._exit(1)  # the actor goes with its etcd, and Ray restarts both

    def where(self) -> tuple[str, int, str]:
        """Its client URL, its etcd's process id (0 before it starts) and its Ray node."""
        pid = self.proc.pid if self.proc is not None else 0
        return self.urls["client"], pid, ray.get_runtime_context().get_node_id()

    def kill_etcd(self) -> None:
        """Kills its etcd (SIGKILL), as a crash would: the actor follows, Ray restarts both."""
        if self.proc is not None:
            self.proc.kill()


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _start_etcd(name: str, root: Path, members: int, host: str, max_restarts: int,
                ready_timeout: float) -> str:
    """Starts ``members`` etcd members as actors ``NAME/etcd-I``, one a Ray node where the
    cluster has as many (else spread as it can), their data under ``root/etcd``: their client
    endpoints, comma-separated."""
    nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    alive = len([n for n in nodes if n.get("Alive")])
    pg = placement_group([{"CPU": 0.01}] * members,
                         strategy="STRICT_SPREAD" if alive >= members else "SPREAD",
                         name=f"{name}/etcd", lifetime="detached")
    try:
        ray.get(pg.ready(), timeout=ready_timeout)
    except ray.exceptions.GetTimeoutError:
        raise Unavailable(f"placement group {name}/etcd ({members} members) is still pending "
                          f"after {ready_timeout:g} s: the cluster has {_free()} free") from None
    actor = ray.remote(_Etcd)
    actors: list[Any] = [actor.options(
        name=f"{name}/etcd-{i}", namespace=NAMESPACE, lifetime="detached",
        max_restarts=max_restarts, max_task_retries=-1, num_cpus=0.01,
        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
    ).remote(f"e{i}", str(root / "etcd" / f"e{i}"), host, str(root / "logs"))
        for i in range(members)]
    urls = ray.get([a.urls_of.remote() for a in actors], timeout=ready_timeout)
    cluster = ",".join(f"e{i}={u['peer']}" for i, u in enumerate(urls))
    ray.get([a.start.remote(cluster) for a in actors], timeout=ready_timeout)
    return ",".join(u["client"].removeprefix("http://") for u in urls)


def _wait_held(name: str, plan: distributed.ShardPlan, timeout: float) -> None:
    """Waits until every replica of the store ``name`` is held by its shard's membership in
    etcd and serves (a read of one of its rows answers): its node holds it a quarter hold
    after the first router made the shard's record."""
    end = time.monotonic() + timeout
    _, addresses = ray.get(_registry(name).view.remote())
    for k, shard in enumerate(addresses):
        table = plan.shard_tables(k)[0][0].name
        for address in shard:
            while True:
                try:
                    at, _, store = address.rpartition("/")
                    replica = remote.connect(at, store, retries=0)
                    replica.read_rows(table, [0])
                    replica.close()
                    break
                except Unavailable as e:
                    if time.monotonic() > end:
                        raise Unavailable(f"shard {k}'s replica {address} is not held by its "
                                          f"membership in etcd {timeout:g} s after the "
                                          f"launch: {e}") from None
                    time.sleep(0.1)


def _node_args(tier: str, dram_budget: int | str | None, writable: bool,
               node_args: Sequence[str]) -> list[str]:
    args = ["--tier", tier]
    if dram_budget is not None:
        args += ["--dram-budget", str(dram_budget)]
    if writable:
        args.append("--writable")
    return args + [str(a) for a in node_args]


def _actor_name(name: str, shard: int, replica: int) -> str:
    return f"{name}/shard-{shard}/replica-{replica}"


def _registry(name: str) -> Any:
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        raise StoreNotFound(f"no sharded store named {name!r} runs on this Ray cluster "
                            f"(namespace {NAMESPACE!r}); launch it first") from None


class ShardedStore:
    """Sharded stores on a Ray cluster (``ray.init`` first): :meth:`launch`, :meth:`connect`,
    :meth:`shutdown`."""

    @staticmethod
    def launch(shard_dir: str | os.PathLike[str], *, name: str = "nearrec",
               replicas: int | None = None, tier: str = "auto",
               dram_budget: int | str | None = None, writable: bool = False,
               num_cpus: float = 1.0, memory: int | None = None,
               resources: dict[str, float] | None = None, spread: str = "soft",
               max_restarts: int = 3, host: str = "127.0.0.1",
               node_args: Sequence[str] = (), ready_timeout: float = 120.0,
               autoscaling: bool = False, etcd: str | Sequence[str] | bool | None = None,
               etcd_members: int = 3, **connect: Any) -> Store:
        """Starts the sharded store cut at ``shard_dir`` (``nearrec shard``) on Ray and
        returns it as a :class:`~nearrec.Store`: ``replicas`` nodes per shard (the plan's by
        default), each a detached actor named ``NAME/shard-K/replica-R`` declaring
        ``num_cpus``, ``memory`` and ``resources``, a shard's replicas spread over Ray's nodes
        by a placement group (``spread="strict"``: each on a node of its own, or the launch
        waits for the nodes), restarted up to ``max_restarts`` times. Each node serves its
        shard with ``tier`` and ``dram_budget`` (read-only unless ``writable``; a writable
        store's replicas beyond the first serve copies of the shard made beside it, one writer
        a store). ``connect`` goes to :meth:`connect` (``timeout``, ``hedge``, ``token``).

        What it needs is checked first: shards × replicas actors of ``num_cpus`` CPUs (and
        ``memory``, ``resources``) each, against what the cluster has free, and for ``strict``
        as many Ray nodes as replicas. A launch that cannot fit is refused at once
        (:class:`InvalidRequest` naming what it asked, what is free, and the ``num_cpus`` that
        would fit); with ``autoscaling`` (an autoscaler adds nodes) it waits instead, and a
        placement group still pending after ``ready_timeout`` is named (:class:`Unavailable`).

        The membership of a writable store of several replicas is kept in etcd
        (``docs/distributed.md``, "Membership in etcd"): ``etcd="host:port,..."`` (or a list)
        names a cluster to use, under the prefix ``/nearrec/NAME``; by default the launch
        starts ``etcd_members`` members as actors ``NAME/etcd-I``, one a Ray node where there
        are as many, with Debian's ``etcd`` (refused, naming the node, where it is missing) and
        their data under ``shard_dir/etcd``; ``etcd=False`` keeps the membership in the replicas
        alone (unsafe under partitions). A read-only store needs none."""
        plan = distributed.load_plan(shard_dir)
        root = Path(shard_dir).resolve()
        count = plan.replicas if replicas is None else replicas
        if not isinstance(count, int) or count < 1:
            raise InvalidRequest(f"replicas must be a count ≥ 1, not {replicas!r}")
        if spread not in ("soft", "strict"):
            raise InvalidRequest(f"spread is 'soft' or 'strict', not {spread!r}")
        with contextlib.suppress(ValueError):
            ray.get_actor(name, namespace=NAMESPACE)
            raise StoreExists(f"a sharded store named {name!r} already runs: connect to it, "
                              f"or shut it down first")
        _check_fits(f"the sharded store {name!r} ({plan.shards} shard(s) x {count} replica(s))",
                    plan.shards * count, num_cpus, memory, resources, autoscaling)
        if spread == "strict" and not autoscaling:
            nodes: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
            alive = len([n for n in nodes if n.get("Alive")])
            if alive < count:
                raise InvalidRequest(f"spread='strict' puts each of a shard's {count} replicas on "
                                     f"a Ray node of its own, and this cluster has {alive}: ask "
                                     f"fewer replicas, or spread='soft'")
        names = [[_actor_name(name, k, r) for r in range(count)] for k in range(plan.shards)]
        kept: tuple[str, str, int] | None = None
        if etcd is not None and etcd is not False and etcd is not True:
            given = etcd if isinstance(etcd, str) else ",".join(etcd)
            kept = (given, f"/nearrec/{name}", 0)
        elif writable and count > 1 and etcd is not False:
            kept = ("", f"/nearrec/{name}", etcd_members)
        registry = _Registry.options(  # type: ignore[attr-defined]
            name=name, namespace=NAMESPACE, lifetime="detached").remote(
            plan.to_json(), str(root), count, names, kept)
        args = _node_args(tier, dram_budget, writable, node_args)
        log_dir = str(root / "logs")
        node = ray.remote(_Node)
        actors: list[Any] = []
        # Ray warns, once per actor, that a restartable detached actor in a placement group
        # cannot be restarted once its group is removed: these groups are detached too and
        # removed only by shutdown(), which stops the actors anyway; restarts meanwhile are
        # Ray's as promised
        quiet = _Without("Scheduling a restartable detached actor with a placement group")
        logging.getLogger("ray.actor").addFilter(quiet)
        try:
            if kept is not None and kept[2]:
                endpoints = _start_etcd(name, root, etcd_members, host, max_restarts,
                                        ready_timeout)
                kept = (endpoints, kept[1], kept[2])
                ray.get(registry.keep_etcd.remote(kept))
            if kept is not None:
                args += ["--etcd", kept[0], "--etcd-prefix", kept[1]]
            for k in range(plan.shards):
                pg = placement_group([{"CPU": num_cpus}] * count,
                                     strategy="STRICT_SPREAD" if spread == "strict"
                                     else "SPREAD", name=f"{name}/shard-{k}",
                                     lifetime="detached")
                try:
                    ray.get(pg.ready(), timeout=ready_timeout)
                except ray.exceptions.GetTimeoutError:
                    raise Unavailable(
                        f"placement group {name}/shard-{k} ({count} bundle(s) of "
                        f"{num_cpus:g} CPU) is still pending after {ready_timeout:g} s: the "
                        f"cluster has {_free()} free; shards {k}..{plan.shards - 1} were not "
                        f"placed") from None
                for r in range(count):
                    path = root / f"shard-{k}"
                    if writable and r > 0:
                        path = _replica_copy(root, k, r)
                    actors.append(node.options(
                        name=names[k][r], namespace=NAMESPACE, lifetime="detached",
                        max_restarts=max_restarts, max_task_retries=-1, num_cpus=num_cpus,
                        memory=memory, resources=resources or {},
                        scheduling_strategy=PlacementGroupSchedulingStrategy(
                            pg, placement_group_bundle_index=r),
                    ).remote(name, k, r, str(path), args, host, log_dir))
            ray.get([a.where.remote() for a in actors], timeout=ready_timeout)
        except BaseException:
            ShardedStore.shutdown(name)
            raise
        finally:
            logging.getLogger("ray.actor").removeFilter(quiet)
        del registry
        store = ShardedStore.connect(name, **connect)
        if kept is not None:
            _wait_held(name, plan, ready_timeout)
        return store

    @staticmethod
    def connect(name: str = "nearrec", **connect: Any) -> Store:
        """The sharded store launched as ``name`` on this Ray cluster, from any driver: a
        :class:`~nearrec.Store` whose router follows the replicas' addresses as they register
        (a node Ray restarted is read from again within a second). ``connect`` goes to
        :func:`nearrec.distributed.connect` (``timeout``, ``hedge``, ``token``, TLS)."""
        registry = _registry(name)
        plan_json, location, _ = ray.get(registry.describe.remote())
        epoch, addresses = ray.get(registry.view.remote())
        missing = [(k, r) for k, shard in enumerate(addresses)
                   for r, a in enumerate(shard) if a is None]
        if missing:
            raise Unavailable(f"the sharded store {name!r} has replicas that never started: "
                              f"{missing} (shard, replica)")
        plan = distributed.ShardPlan._from_json(plan_json)
        kept = ray.get(registry.etcd.remote())
        if kept is not None:
            connect.setdefault("etcd", kept[0])
            connect.setdefault("etcd_prefix", kept[1])
        store = distributed.connect(plan, addresses, **connect)
        _Watcher(store, registry, epoch, addresses).start()
        return store

    @staticmethod
    def actors(name: str = "nearrec") -> list[list[Any]]:
        """The node actors of the sharded store ``name``: ``[shard][replica]``."""
        _, _, names = ray.get(_registry(name).describe.remote())
        return [[ray.get_actor(n, namespace=NAMESPACE) for n in shard] for shard in names]

    @staticmethod
    def etcd_actors(name: str = "nearrec") -> list[Any]:
        """The etcd members the launch of ``name`` started (none where it was given a cluster,
        or keeps no membership in etcd)."""
        kept = ray.get(_registry(name).etcd.remote())
        return [ray.get_actor(f"{name}/etcd-{i}", namespace=NAMESPACE)
                for i in range(kept[2] if kept is not None else 0)]

    @staticmethod
    def shutdown(name: str = "nearrec") -> None:
        """Stops the sharded store ``name``: its nodes, its registry, its placement groups."""
        try:
            registry = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return
        names: list[list[str]] = ray.get(registry.describe.remote())[2]
        for shard in names:
            for n in shard:
                with contextlib.suppress(ValueError):
                    ray.kill(ray.get_actor(n, namespace=NAMESPACE), no_restart=True)
        for k in range(len(names)):
            with contextlib.suppress(Exception):
                remove_placement_group(ray.util.get_placement_group(f"{name}/shard-{k}"))
        kept = ray.get(registry.etcd.remote())
        for i in range(kept[2] if kept is not None else 0):
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(f"{name}/etcd-{i}", namespace=NAMESPACE),
                         no_restart=True)
        if kept is not None and kept[2]:
            with contextlib.suppress(Exception):
                remove_placement_group(ray.util.get_placement_group(f"{name}/etcd"))
        ray.kill(registry, no_restart=True)


def serve_model(store: str | Callable[[], Store], model: Any = None, *,
                name: str = "nearrec-model",
                route_prefix: str = "/", offload: bool = False, num_replicas: int = 1,
                num_cpus: float = 1.0, max_batch_size: int = 64,
                batch_wait_timeout_s: float = 0.002, host: str = "127.0.0.1",
                http_port: int = 8000, grpc_port: int = 9000, ready_timeout: float = 120.0,
                autoscaling: bool = False) -> Any:
    """Serves ``model`` on Ray Serve over a sharded store: an application ``name`` whose
    ``num_replicas`` replicas each hold the store (the Rust router) and run the model's dense
    part, requests batched together (``@serve.batch``: up to ``max_batch_size`` samples'
    requests, waiting at most ``batch_wait_timeout_s``); with ``offload`` the model kept with
    the store (``nearrec.models.save`` before the cut) runs through ``Store.infer`` instead: on
    the nodes of the shard that holds every table of the model, else on the router over the
    vectors it pools. Returns Ray Serve's handle of the deployment.

    ``store`` is the name a store was launched as (:meth:`ShardedStore.launch`), or a function
    of no arguments each replica calls for its store (``functools.partial(
    nearrec.distributed.connect, plan, replicas)``). ``model`` is the model kept with the
    store (``None``, the default: read from it, ``nearrec.models.load``) or any model nearrec
    keeps (``nearrec.models.kept``), over a store of the same tables: one of nearrec's models
    (``nearrec.models.build`` / ``load``), or a captured one — a TorchRec DLRM after
    ``nearrec.torch.from_torchrec``, quantised or not, a model of your own, or their
    :class:`~nearrec.models.Offloaded` form. Its configuration and dense weights go to the
    replicas, which rebuild it over theirs; a request names the model's inputs (its tables, or
    a captured model's features).

    Ingress: HTTP on ``host:http_port`` at ``route_prefix`` — ``POST`` a JSON body ``{"dense":
    [[...]], "features": {INPUT: {"ids": [...], "lengths": [...]}}}``, get ``{"outputs":
    [[...]]}`` (a bad request: status 400 and ``{"error", "kind", "table"}``) — and gRPC on
    ``grpc_port`` (Ray Serve binds it on every interface): ``nearrec.serve.v1.Model/Predict``,
    ``nearrec/model_service.proto`` (``nearrec.ray.model_messages()`` for Python). Ray Serve
    takes its ports once, when it first starts in the cluster.

    Its replicas take ``num_replicas`` × ``num_cpus`` CPUs beside the store's nodes: checked
    first against what the cluster has free, and refused at once when they cannot fit (as
    :meth:`ShardedStore.launch`; ``autoscaling`` waits instead). A deployment not running
    within ``ready_timeout`` seconds is deleted and :class:`Unavailable` names its status."""
    from ray import serve
    from ray.serve.config import HTTPOptions, gRPCOptions

    from . import _serve
    from .models import kept, load

    connect = functools.partial(ShardedStore.connect, store) if isinstance(store, str) else store
    if model is None:
        over = connect()
        try:
            model = load(over)
        finally:
            over.close()
    config, weights, dense_width = kept(model)
    _check_fits(f"serve_model {name!r} ({num_replicas} replica(s))", num_replicas, num_cpus,
                None, None, autoscaling)
    serve.start(http_options=HTTPOptions(host=host, port=http_port),
                grpc_options=gRPCOptions(port=grpc_port,
                                         grpc_servicer_functions=[_serve.SERVICER]),
                proxy_location="HeadOnly")
    app = _serve.deployment(connect, config, weights, dense_width, offload, max_batch_size,
                            batch_wait_timeout_s, num_replicas, {"num_cpus": num_cpus})
    # serve.run waits for the application without end: it runs on a thread of its own, and a
    # deployment not running within the timeout is deleted and named
    done: dict[str, Any] = {}

    def deploy() -> None:
        try:
            done["handle"] = serve.run(app, name=name, route_prefix=route_prefix)
        except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
            done["error"] = e

    deploying = threading.Thread(target=deploy, daemon=True, name="nearrec-serve-run")
    deploying.start()
    deploying.join(ready_timeout)
    if deploying.is_alive():
        status = serve.status().applications.get(name)
        said = getattr(status, "message", "") or str(getattr(status, "status", "not deployed"))
        serve.delete(name)
        raise Unavailable(f"serve_model {name!r} was not running after {ready_timeout:g} s "
                          f"({said}); the cluster has {_free()} free")
    if "error" in done:
        raise done["error"]
    return done["handle"]


def model_messages() -> Any:
    """The message classes of :func:`serve_model`'s gRPC ingress (``PredictRequest``,
    ``Feature``, ``PredictResponse``; ``nearrec/model_service.proto``)."""
    from . import _serve

    return _serve.messages()


def shutdown_model(name: str = "nearrec-model") -> None:
    """Stops the application :func:`serve_model` started as ``name``."""
    from ray import serve

    serve.delete(name)


def _resources() -> tuple[dict[str, float], dict[str, float]]:
    """What the cluster has free now, and in all."""
    free: dict[str, float] = ray.available_resources()  # type: ignore[no-untyped-call]
    total: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    return free, total


class _Without(logging.Filter):
    """Drops the log records that start with ``prefix``."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def _free() -> str:
    """What the cluster has free now, for a refusal: ``2 of 4 CPU, ...``."""
    free, total = _resources()
    return ", ".join(f"{free.get(k, 0.0):g} of {total[k]:g} {k}" for k in ("CPU", "GPU", "memory")
                     if k in total)


def _check_fits(what: str, actors: int, num_cpus: float, memory: int | None,
                resources: dict[str, float] | None, autoscaling: bool) -> None:
    """Refuses ``what`` — ``actors`` actors of ``num_cpus`` CPUs (``memory`` bytes,
    ``resources``) each — at once when the cluster has not that much free (unless an
    autoscaler may add nodes): Ray would wait for them without end."""
    if autoscaling:
        return
    free, total = _resources()
    asked = {"CPU": actors * num_cpus} | ({"memory": actors * memory} if memory else {}) | {
        k: actors * v for k, v in (resources or {}).items()}
    short = {k: v for k, v in asked.items() if v > free.get(k, 0.0) + 1e-9}
    if not short:
        return
    said = "; ".join(f"{k}: {v:g} asked ({actors} x {v / actors:g}), {free.get(k, 0.0):g} free "
                     f"of {total.get(k, 0.0):g}" for k, v in short.items())
    fit = int(free.get("CPU", 0.0) / actors * 100) / 100
    hint = (f"; num_cpus={fit:g} would fit (or fewer replicas, or a bigger cluster)"
            if "CPU" in short and fit > 0 else "")
    raise InvalidRequest(f"{what} needs more than this Ray cluster has free: {said}{hint}. "
                         f"Where an autoscaler adds nodes, pass autoscaling=True to wait for "
                         f"them")


def _replica_copy(root: Path, shard: int, replica: int) -> Path:
    """A writable shard's copy for replica ``replica`` (made once, beside the shards)."""
    path = root / "replicas" / f"shard-{shard}-replica-{replica}"
    if not path.exists():
        tmp = path.with_name(path.name + ".copying")
        subprocess.run(["rm", "-rf", str(tmp)], check=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cp", "-r", str(root / f"shard-{shard}"), str(tmp)], check=True)
        # a copy is a replica of its own: not the membership (and id) of the one copied
        (tmp / "MEMBERSHIP").unlink(missing_ok=True)
        tmp.rename(path)
    return path


class _Watcher(threading.Thread):
    """Reads a sharded store's registry every :data:`WATCH_EVERY` seconds and gives the
    router each shard's replicas as they registered; ends with the store."""

    def __init__(self, store: Store, registry: Any, epoch: int,
                 addresses: list[list[str | None]]):
        super().__init__(daemon=True, name="nearrec-ray-watch")
        self.store = weakref.ref(store)
        self.registry, self.epoch, self.addresses = registry, epoch, addresses

    def run(self) -> None:
        while True:
            time.sleep(WATCH_EVERY)
            store = self.store()
            # (a call on an actor would start Ray again in a driver that shut it down)
            if store is None or not ray.is_initialized():
                return
            self._follow(store)
            del store  # not held while asleep: the store ends when its caller lets go

    def _follow(self, store: Store) -> None:
        """Gives the router the replicas' addresses, when the registry has new ones."""
        try:
            epoch, addresses = ray.get(self.registry.view.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - a registry away for a while is looked at again
            return
        if epoch == self.epoch:
            return
        done = True
        for k, new in enumerate(addresses):
            up = [a for a in new if a is not None]
            if new == self.addresses[k] or not up:
                continue
            try:
                store._native.set_shard_replicas(k, up)
                self.addresses[k] = new
            except Exception:  # noqa: BLE001 - a node not answering yet: next time
                done = False
        if done:
            self.epoch = epoch
