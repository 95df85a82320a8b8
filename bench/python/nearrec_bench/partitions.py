"""``nearrec bench partitions``: a sharded store under a nemesis, Jepsen-style, each process in
a network namespace of its own; then the history checked.

Per schedule, on a network of namespaces joined by veth pairs to a bridge (in a namespace of
its own, so that nothing of the host's network is touched):

- three etcd members (``e0`` .. ``e2``, Debian's ``etcd``), unless run without etcd;
- a store of one table cut row-wise into 2 shards × 2 writable replicas, each replica a
  ``nearrec serve`` (``n00``, ``n01``, ``n10``, ``n11``) holding its replica in etcd;
- two routers (``r0``, ``r1``), each a process of :func:`worker` driving single-row writes,
  writes of a row on each shard in one call (cross-shard), single-row reads and reads of both
  rows of a pair, each recorded with the times it was invoked and answered and its outcome;
- a nemesis (:data:`FAULTS`) on a seeded schedule: namespaces cut from each other by nft drops
  (this kernel's nf_tables, checked at start), routers split so that each reaches a different
  replica of a shard, etcd members cut or killed (a quorum lost, too), replicas killed and
  restarted, processes paused (SIGSTOP);
- then everything healed, the routers stopped, and a last router in the control namespace
  (``ctl``) catches every replica up, reads every row and asks every replica its rows' digests.

The checks: no two replicas of a shard differ (their rows' digests, counts of writes); every
row's last value is one the history allows (the final reads are part of it); no read of a pair
saw one row of a cross-shard write and not the other; no router's read went back to a value
older than one it read before; and the history of writes and reads, every row a register, is
linearizable (:mod:`.linearizable`; a write that failed was applied nowhere unless its error
says it is in doubt or committed — then it may have taken effect, or never). Run without etcd
the same harness must find the split-brain ``docs/distributed.md`` describes.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .harness import Harness
from .partition_checks import DIM, PAIRS, ROWS, SINGLES, costs, judge, phases
from .report import Record

#: the network: a /24 of private addresses inside the namespaces alone
NET = "10.77.0"
PREFIX = "nrp"
ETCD = {"e0": 11, "e1": 12, "e2": 13}
NODES = {"n00": 21, "n01": 22, "n10": 23, "n11": 24}
ROUTERS = {"r0": 31, "r1": 32}
CTL = {"ctl": 2}
HOSTS = {**CTL, **ETCD, **NODES, **ROUTERS}


#: what the nemesis does
FAULTS = ("partition-replica", "partition-router", "split-routers", "partition-etcd",
          "etcd-quorum-lost", "kill-replica", "kill-etcd", "pause-replica", "pause-router")


@dataclass
class PartitionsConfig:
    #: schedules run, each on a fresh store and etcd
    schedules: int = 100
    #: seconds of workload per schedule
    seconds: float = 12.0
    #: membership kept in etcd (False: the replicas' own, which must show split-brain)
    etcd: bool = True
    seed: int = 1
    #: worker threads per router (a call to a replica cut off waits out its deadline: the
    #: others go on)
    threads: int = 4
    #: a replica's hold, seconds
    hold: float = 1.0
    #: each router call's deadline, seconds
    timeout: float = 1.5
    faults: tuple[str, ...] = FAULTS
    #: where each schedule's files go
    scratch: Path = Path("bench/scratch")
    #: keep every schedule's files (those with anomalies are kept always); with etcd off, the
    #: schedules are the documented split alone
    keep_files: bool = False
    #: stop at the first schedule with an anomaly (a test that needs one found, not a count:
    #: each such schedule waits out the heal's minute)
    until_found: bool = False
    progress_file: Path | None = None


def quick() -> PartitionsConfig:
    return PartitionsConfig(schedules=3, seconds=8.0)


# --- the network ---------------------------------------------------------------------------


def _run(*argv: str, check_: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if check_ and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done


def ns(host: str) -> str:
    return f"{PREFIX}-{host}"


def ip(host: str) -> str:
    return f"{NET}.{HOSTS[host]}"


def inside(host: str) -> list[str]:
    return ["ip", "netns", "exec", ns(host)]


class Net:
    """The namespaces, each joined by a veth pair to a bridge in namespace ``PREFIX-sw``, with
    an nft table of its own that the nemesis fills with drops."""

    def up(self) -> None:
        self.down()
        sw = f"{PREFIX}-sw"
        _run("ip", "netns", "add", sw)
        _run("ip", "netns", "exec", sw, "ip", "link", "add", "br0", "type", "bridge")
        _run("ip", "netns", "exec", sw, "ip", "link", "set", "br0", "up")
        for i, host in enumerate(HOSTS):
            a, b = f"{PREFIX}{i}a", f"{PREFIX}{i}b"
            _run("ip", "netns", "add", ns(host))
            _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            _run("ip", "link", "set", a, "netns", ns(host))
            _run("ip", "link", "set", b, "netns", sw)
            _run("ip", "netns", "exec", sw, "ip", "link", "set", b, "master", "br0")
            _run("ip", "netns", "exec", sw, "ip", "link", "set", b, "up")
            _run(*inside(host), "ip", "addr", "add", f"{ip(host)}/24", "dev", a)
            _run(*inside(host), "ip", "link", "set", a, "up")
            _run(*inside(host), "ip", "link", "set", "lo", "up")
            nft = "add table inet nemesis; " \
                  "add chain inet nemesis in { type filter hook input priority 0; }; " \
                  "add chain inet nemesis out { type filter hook output priority 0; }"
            _run(*inside(host), "nft", nft)

    def down(self) -> None:
        for host in HOSTS:
            _run("ip", "netns", "del", ns(host), check_=False)
        _run("ip", "netns", "del", f"{PREFIX}-sw", check_=False)

    def cut(self, a: str, b: str) -> None:
        """``a`` and ``b`` no longer reach each other (packets dropped both ways)."""
        for x, y in ((a, b), (b, a)):
            _run(*inside(x), "nft", f"add rule inet nemesis in ip saddr {ip(y)} drop; "
                                    f"add rule inet nemesis out ip daddr {ip(y)} drop")

    def isolate(self, a: str) -> None:
        for b in HOSTS:
            if b not in (a, "ctl"):
                self.cut(a, b)

    def heal(self) -> None:
        for host in HOSTS:
            _run(*inside(host), "nft", "flush table inet nemesis")


def nft_works() -> str | None:
    """Why nft drops cannot partition namespaces here (``None``: they can)."""
    if shutil.which("nft") is None:
        return "nft is not installed (Debian's nftables)"
    probe = f"{PREFIX}-probe"
    _run("ip", "netns", "add", probe, check_=False)
    try:
        done = _run("ip", "netns", "exec", probe, "nft",
                    "add table inet t; add chain inet t c { type filter hook input priority 0; };"
                    " add rule inet t c ip saddr 10.9.9.9 drop", check_=False)
        return None if done.returncode == 0 else f"nft in a namespace: {done.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe, check_=False)


# --- the processes ---------------------------------------------------------------------------


class Proc:
    """A process in a host's namespace, restartable, its output in a log file."""

    def __init__(self, host: str, argv: list[str], log: Path,
                 ready: Callable[[Proc], None] | None = None) -> None:
        self.host, self.argv, self.log, self.ready = host, argv, log, ready
        self.popen: subprocess.Popen[str] | None = None

    def start(self) -> None:
        with open(self.log, "a") as log:
            log.write(f"--- start {time.monotonic():.3f}\n")
            log.flush()
            self.popen = subprocess.Popen([*inside(self.host), *self.argv], stdout=subprocess.PIPE,
                                          stderr=log, text=True)
        if self.ready is not None:
            self.ready(self)

    def signal(self, sig: int) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(sig)

    def kill(self) -> None:
        if self.popen is not None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            self.popen.wait()
            self.popen = None

    def stop(self, timeout: float = 20.0) -> None:
        if self.popen is None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        self.popen = None


def _node_ready(p: Proc) -> None:
    assert p.popen is not None and p.popen.stdout is not None
    line = p.popen.stdout.readline()
    if "listening on " not in line:
        raise RuntimeError(f"nearrec serve in {p.host} did not start: {line!r}; see {p.log}")


@dataclass
class Layout:
    """One schedule's files and processes."""

    root: Path
    cut: Path
    etcd: list[Proc]
    nodes: dict[str, Proc]
    endpoints: str


def etcd_proc(name: str, root: Path) -> Proc:
    peers = ",".join(f"{e}=http://{ip(e)}:2380" for e in ETCD)
    return Proc(name, ["etcd", "--name", name, "--data-dir", str(root / f"etcd-{name}"),
                       "--listen-client-urls", f"http://{ip(name)}:2379",
                       "--advertise-client-urls", f"http://{ip(name)}:2379",
                       "--listen-peer-urls", f"http://{ip(name)}:2380",
                       "--initial-advertise-peer-urls", f"http://{ip(name)}:2380",
                       "--initial-cluster", peers, "--initial-cluster-token", "nearrec-partitions",
                       "--initial-cluster-state", "new"],
                root / f"{name}.log")


def layout(cfg: PartitionsConfig, root: Path) -> Layout:
    """The store built and cut, each replica's copy made; the processes not started."""
    import numpy as np

    import nearrec
    from nearrec import distributed

    source = root / "source"
    nearrec.from_numpy(source, {"t0": np.zeros((ROWS, DIM), np.float32)})
    cut = root / "cut"
    distributed.shard(source, cut, 2, replicas=2, scheme="row")
    endpoints = ",".join(f"{ip(e)}:2379" for e in ETCD)
    nodes = {}
    for name in NODES:
        shard = int(name[1])
        copy = root / f"replica-{name}"
        shutil.copytree(cut / f"shard-{shard}", copy)
        etcd = ["--etcd", endpoints] if cfg.etcd else []
        nodes[name] = Proc(name, [sys.executable, "-m", "nearrec.cli", "serve", f"{copy}=s",
                                  "--listen", f"{ip(name)}:7070", "--writable", "--tier", "dram",
                                  "--insecure", *etcd],
                           root / f"{name}.log", _node_ready)
    etcds = [etcd_proc(e, root) for e in ETCD] if cfg.etcd else []
    return Layout(root, cut, etcds, nodes, endpoints)


def _tool(host: str, command: str, cfg: dict[str, Any], timeout: float) -> Any:
    """``python -m nearrec_bench.partitions COMMAND`` in ``host``'s namespace, given ``cfg``;
    what it printed last, as JSON."""
    done = subprocess.run([*inside(host), sys.executable, "-m", "nearrec_bench.partitions",
                           command, json.dumps(cfg)], capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{command} in {host} failed: {done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the workload (a router, in its namespace) -------------------------------------------


def _connect(w: dict[str, Any]) -> Any:
    from nearrec import distributed

    replicas = [[f"{ip(n)}:7070/s" for n in NODES if int(n[1]) == k] for k in (0, 1)]
    return distributed.connect(w["cut"], replicas, timeout=w["timeout"], hedge=None,
                               catch_up_every=1.0,
                               etcd=w["endpoints"] if w["etcd"] else None,
                               etcd_hold=w["hold"])


def _write(store: Any, ids: list[int], value: int) -> None:
    import numpy as np

    rows = np.full((len(ids), DIM), float(value), np.float32)
    store.write("t0", np.asarray(ids, np.int64), rows)


def _read(store: Any, ids: list[int]) -> list[int]:
    import numpy as np

    from nearrec import TableLookup

    got = store.lookup_many([TableLookup("t0", np.asarray(ids, np.int64),
                                         lengths=np.ones(len(ids), np.int64))])
    return [int(round(float(v))) for v in np.asarray(got)[:, 0]]


def worker(w: dict[str, Any]) -> None:
    """A router driving the workload until ``w["until"]`` (monotonic seconds), each call one
    line of ``w["history"]``: its kind, rows, values, invoke and complete times (monotonic
    nanoseconds, one clock for every namespace) and outcome."""
    store = _connect(w)
    print("ready", flush=True)
    out = open(w["history"], "a", buffering=1)
    lock = threading.Lock()
    base = w["router"] * 10_000_000

    def run(thread: int) -> None:
        rng = random.Random(w["seed"] * 1000 + thread)
        n = 0
        while time.monotonic() < w["until"]:
            r = rng.random()
            if r < 0.35:
                kind, ids = "read", [rng.choice(SINGLES)]
            elif r < 0.65:
                kind, ids = "write", [rng.choice(SINGLES)]
            elif r < 0.8:
                kind, ids = "write", list(rng.choice(PAIRS))
            else:
                kind, ids = "read", list(rng.choice(PAIRS))
            n += 1
            value = base + thread * 1_000_000 + n
            t0 = time.monotonic_ns()
            try:
                if kind == "write":
                    _write(store, ids, value)
                    values = [value] * len(ids)
                else:
                    values = _read(store, ids)
                outcome, error = "ok", None
            except Exception as e:  # noqa: BLE001 - every failure is recorded as it came
                outcome, error = "fail", f"{type(e).__name__}: {e}"[:300]
                values = [value] * len(ids) if kind == "write" else []
            t1 = time.monotonic_ns()
            line = {"router": w["router"], "thread": thread, "kind": kind, "ids": ids,
                    "values": values, "invoke": t0, "complete": t1, "outcome": outcome,
                    "error": error}
            with lock:
                out.write(json.dumps(line) + "\n")
            time.sleep(rng.uniform(0.002, 0.01))

    threads = [threading.Thread(target=run, args=(t,)) for t in range(w["threads"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.close()
    store.close()
    print(json.dumps({"done": True}), flush=True)


def final(w: dict[str, Any]) -> None:
    """After the heal: every replica caught up (its shard's members all, within a minute), then
    every row read through a router (recorded as history) and from each replica alone, with
    each replica's digests and count of writes."""
    import numpy as np

    import nearrec
    from nearrec import distributed

    store = _connect(w)
    deadline = time.monotonic() + 60
    stale = None
    while time.monotonic() < deadline:
        try:
            distributed.catch_up(store)
            stale = store.stats().get("cluster_stale_replicas", 0)
            if not stale:
                break
        except Exception:  # noqa: BLE001 - etcd or a replica still coming back
            pass
        time.sleep(0.5)
    reads = []
    for i in SINGLES + [i for p in PAIRS for i in p]:
        t0 = time.monotonic_ns()
        try:
            values, outcome, error = _read(store, [i]), "ok", None
        except Exception as e:  # noqa: BLE001 - a row no replica serves after the heal
            values, outcome, error = [], "fail", f"{type(e).__name__}: {e}"[:300]
        reads.append({"router": -1, "thread": 0, "kind": "read", "ids": [i], "values": values,
                      "invoke": t0, "complete": time.monotonic_ns(), "outcome": outcome,
                      "error": error})
    replicas: dict[str, Any] = {}
    for name in NODES:
        shard = int(name[1])
        rows = ROWS // 2
        while True:
            try:
                r = nearrec.connect(f"{ip(name)}:7070", "s", timeout=5.0)
                local = np.asarray(r.read_rows("t0", np.arange(rows, dtype=np.int64)))
                replicas[name] = {"version": r.version,
                                  "digests": hashlib.sha256(local.tobytes()).hexdigest(),
                                  "rows": {str(shard * rows + i): int(round(float(local[i, 0])))
                                           for i in range(rows)}}
                r.close()
                break
            except Exception as e:  # noqa: BLE001 - a replica that does not serve after the heal
                replicas[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
                # one readmitted by the catch-up serves once its node's next hold round reads
                # etcd's record (a quarter hold): within the minute, asked again
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.25)
    store.close()
    print(json.dumps({"stale": stale, "reads": reads, "replicas": replicas}), flush=True)


# --- the nemesis ---------------------------------------------------------------------------


@dataclass
class Fault:
    what: str
    at: float
    lasts: float
    target: list[str]


def schedule(cfg: PartitionsConfig, rng: random.Random) -> list[Fault]:
    """Faults over the run, one or two at a time, each for 1.5 – 4 s, with heals between."""
    faults, t = [], 1.0
    while t < cfg.seconds - 2.5:
        what = rng.choice(cfg.faults)
        lasts = rng.uniform(1.5, 4.0)
        lasts = min(lasts, cfg.seconds - 1.0 - t)
        if what in ("partition-replica", "kill-replica", "pause-replica"):
            target = [rng.choice(list(NODES))]
        elif what in ("partition-router", "pause-router"):
            target = [rng.choice(list(ROUTERS))]
        elif what == "split-routers":
            k = rng.choice("01")
            a, b = f"n{k}0", f"n{k}1"
            target = [a, b] if rng.random() < 0.5 else [b, a]
        elif what in ("partition-etcd", "kill-etcd"):
            target = [rng.choice(list(ETCD))]
        else:  # etcd-quorum-lost
            target = rng.sample(list(ETCD), 2)
        if not cfg.etcd and "etcd" in what:
            continue
        faults.append(Fault(what, t, lasts, target))
        t += lasts + rng.uniform(0.5, 2.0)
    return faults


class Nemesis:
    def __init__(self, net: Net, lay: Layout, routers: dict[str, Proc]) -> None:
        self.net, self.lay, self.routers = net, lay, routers

    def _proc(self, host: str) -> Proc:
        if host in NODES:
            return self.lay.nodes[host]
        if host in ROUTERS:
            return self.routers[host]
        return self.lay.etcd[list(ETCD).index(host)]

    def begin(self, f: Fault) -> None:
        if f.what.startswith("partition") or f.what == "etcd-quorum-lost":
            for host in f.target:
                self.net.isolate(host)
        elif f.what == "split-routers":
            # each router reaches a different replica of the shard, and not the other
            self.net.cut("r0", f.target[1])
            self.net.cut("r1", f.target[0])
        elif f.what.startswith("kill"):
            self._proc(f.target[0]).kill()
        elif f.what.startswith("pause"):
            self._proc(f.target[0]).signal(signal.SIGSTOP)

    def end(self, f: Fault) -> None:
        if f.what.startswith("kill"):
            self._proc(f.target[0]).start()
        elif f.what.startswith("pause"):
            self._proc(f.target[0]).signal(signal.SIGCONT)
        else:
            self.net.heal()


# --- one schedule ----------------------------------------------------------------------------


def run_schedule(cfg: PartitionsConfig, net: Net, index: int, root: Path,
                 log: Callable[[str], None]) -> dict[str, Any]:
    rng = random.Random(cfg.seed * 100_003 + index)
    faults = schedule(cfg, rng)
    if not cfg.etcd:
        # the documented split first: each router reaches a different replica of shard 0
        faults = [Fault("split-routers", 1.0, cfg.seconds - 3.0, ["n00", "n01"])]
    lay = layout(cfg, root)
    net.heal()
    routers: dict[str, Proc] = {}
    try:
        return _schedule(cfg, net, index, root, lay, routers, faults)
    finally:
        for p in [*routers.values(), *lay.nodes.values(), *lay.etcd]:
            p.kill()


def _schedule(cfg: PartitionsConfig, net: Net, index: int, root: Path, lay: Layout,
              routers: dict[str, Proc], faults: list[Fault]) -> dict[str, Any]:
    for p in lay.etcd:
        p.start()
    for p in lay.nodes.values():
        p.start()
    until = time.monotonic() + 3.0 + cfg.seconds
    for k, name in enumerate(ROUTERS):
        w = {"cut": str(lay.cut), "timeout": cfg.timeout, "endpoints": lay.endpoints,
             "etcd": cfg.etcd, "hold": cfg.hold, "router": k, "seed": cfg.seed * 7 + index,
             "threads": cfg.threads, "until": until, "history": str(root / f"{name}.jsonl")}
        routers[name] = Proc(name, [sys.executable, "-m", "nearrec_bench.partitions", "worker",
                                    json.dumps(w)], root / f"{name}.log", _worker_ready)
        routers[name].start()
    nemesis = Nemesis(net, lay, routers)
    start = until - cfg.seconds
    timeline = []
    for f in faults:
        _sleep_until(start + f.at)
        nemesis.begin(f)
        timeline.append({"what": f.what, "target": f.target, "at": round(f.at, 2),
                         "lasts": round(f.lasts, 2)})
        _sleep_until(start + f.at + f.lasts)
        nemesis.end(f)
    net.heal()
    for p in routers.values():
        p.signal(signal.SIGCONT)
        assert p.popen is not None
        try:
            p.popen.wait(cfg.timeout * 4 + 30)
        except subprocess.TimeoutExpired:
            p.kill()
    w = {"cut": str(lay.cut), "timeout": 5.0, "endpoints": lay.endpoints, "etcd": cfg.etcd,
         "hold": cfg.hold}
    try:
        last = _tool("ctl", "final", w, timeout=180)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        last = {"stale": None, "reads": [], "replicas": {}, "failed": str(e)[-2000:]}
    for p in [*lay.nodes.values(), *lay.etcd]:
        p.stop()
    history = [json.loads(line) for name in ROUTERS
               for line in open(root / f"{name}.jsonl")]
    history += last["reads"]
    found = judge(history, last)
    if "failed" in last:
        found.insert(0, f"the last check could not run: {last['failed']}")
    ops: defaultdict[str, int] = defaultdict(int)
    for h in history:
        ops[f"{h['kind']}.{h['outcome']}"] += 1
    windows = [(f.what, (start + f.at) * 1e9, (start + f.at + f.lasts) * 1e9) for f in faults]
    return {"schedule": index, "faults": timeline, "ops": dict(ops), "stale_after": last["stale"],
            "anomalies": found, "root": str(root),
            "phases": phases([h for h in history if h["router"] >= 0], windows)}


def _worker_ready(p: Proc) -> None:
    assert p.popen is not None and p.popen.stdout is not None
    line = p.popen.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(f"router {p.host} did not start: {line!r}; see {p.log}")


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.monotonic()))


# --- the run ---------------------------------------------------------------------------------


def run(cfg: PartitionsConfig, log: Callable[[str], None] = print) -> list[Record]:
    why = nft_works()
    if why is not None:
        raise RuntimeError(f"cannot partition namespaces: {why}")
    if cfg.etcd and shutil.which("etcd") is None:
        raise RuntimeError("etcd is not installed (Debian's etcd-server)")
    net = Net()
    net.up()
    results = []
    base = Path(cfg.scratch) / "partitions"
    base.mkdir(parents=True, exist_ok=True)
    try:
        for i in range(cfg.schedules):
            root = Path(tempfile.mkdtemp(prefix=f"s{i:03d}-", dir=base))
            t0 = time.monotonic()
            result = run_schedule(cfg, net, i, root, log)
            result["seconds"] = round(time.monotonic() - t0, 1)
            results.append(result)
            faults = ", ".join(f"{f['what']}({'/'.join(f['target'])})" for f in result["faults"])
            log(f"schedule {i}: {len(result['anomalies'])} anomalies; {faults}; ops "
                f"{result['ops']}" + "".join(f"\n  {a}" for a in result["anomalies"]))
            if cfg.progress_file is not None:
                with open(cfg.progress_file, "a") as f:
                    f.write(json.dumps(result) + "\n")
            if not cfg.keep_files and not result["anomalies"]:
                shutil.rmtree(root, ignore_errors=True)
            if cfg.until_found and result["anomalies"]:
                break
    finally:
        net.down()
    cost = costs(results)
    for r in results:
        r.pop("phases", None)
    anomalies = sum(len(r["anomalies"]) for r in results)
    with_any = sum(1 for r in results if r["anomalies"])
    ok = sum(r["ops"].get("write.ok", 0) + r["ops"].get("read.ok", 0) for r in results)
    failed = sum(r["ops"].get("write.fail", 0) + r["ops"].get("read.fail", 0) for r in results)
    system = "etcd" if cfg.etcd else "no-etcd"
    return [Record("partitions", "2x2", 0, "nemesis", system, 0.0, 0.0,
                   extra={"schedules": len(results), "anomalies": anomalies,
                          "schedules_with_anomalies": with_any, "ops_ok": ok,
                          "ops_failed": failed, "costs": cost,
                          "config": {k: str(v) for k, v in
                                                           asdict(cfg).items()},
                          "results": results})]


def markdown(records: list[Record], command: str) -> str:
    lines = [f"`{command}`", "",
             "| membership | schedules | with anomalies | anomalies | calls answered | "
             "calls failed |", "|---|---|---|---|---|---|"]
    for r in records:
        e = r.extra
        lines.append(f"| {r.system} | {e['schedules']} | {e['schedules_with_anomalies']} | "
                     f"{e['anomalies']} | {e['ops_ok']} | {e['ops_failed']} |")
    for r in records:
        for s in r.extra["results"]:
            for a in s["anomalies"][:3]:
                lines.append(f"- {r.system} schedule {s['schedule']}: {a[:300]}")
    for r in records:
        lines += ["", f"What each fault costs the routers' calls ({r.system}; a call counts for "
                  "the fault under way when it began, or still running when it began):", "",
                  "| during | kind | calls | failed | p50 ms | p99 ms |",
                  "|---|---|---|---|---|---|"]
        for phase, kinds in r.extra["costs"].items():
            for kind, c in kinds.items():
                lines.append(f"| {phase} | {kind} | {c['calls']} | {100 * c['error_rate']:.1f} % "
                             f"| {c['p50_ms']:.1f} | {c['p99_ms']:.1f} |")
    return "\n".join(lines) + "\n"


HARNESSES = {"partitions": Harness(PartitionsConfig, quick, {"--schedules": "schedules",
                                                             "--no-etcd": "etcd",
                                                             "--seed": "seed"},
                                   run, markdown, progress=True)}


def _main(argv: list[str]) -> None:
    command, w = argv[0], json.loads(argv[1])
    {"worker": worker, "final": final}[command](w)


if __name__ == "__main__":
    _main(sys.argv[1:])
