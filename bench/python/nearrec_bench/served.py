"""The processes a harness serves from, on loopback or in network namespaces it makes: a storage
node (``nearrec serve``, its metrics read with Prometheus's own parser), Debian's
``redis-server``, Triton Inference Server (the ``tritonserver`` of the nvidia-pytriton wheel,
which ``make`` unpacks under ``.venv/triton``), a namespace joined by a veth pair limited by
tc."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    """A running node: its gRPC address, its metrics address and its process."""

    address: str
    metrics: str
    pid: int


@contextmanager
def node(path: Path, name: str, *flags: str, netns: str | None = None,
         host: str = "127.0.0.1", cpus: set[int] | None = None,
         extra: Sequence[str] = ()) -> Iterator[Served]:
    """``nearrec serve`` on a free port of ``host`` (in network namespace ``netns``, on
    ``cpus``), with its metrics, serving ``extra`` stores (``PATH=NAME``) beside ``path``;
    drained with SIGTERM after."""
    inside = ["ip", "netns", "exec", netns] if netns else []
    insecure = [] if host == "127.0.0.1" else ["--insecure"]  # a namespace's private address
    # its log goes to a file: a pipe nobody reads would fill under a saturation test
    logs = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([*inside, sys.executable, "-m", "nearrec.cli", "serve",
                             f"{path}={name}", *extra, "--listen", f"{host}:0",
                             "--metrics-listen", f"{host}:0", *insecure, *flags],
                            stdout=subprocess.PIPE, stderr=logs, text=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on " not in line:
        proc.kill()
        proc.wait()
        logs.seek(0)
        raise RuntimeError(f"nearrec serve did not start: {line!r} {logs.read()}")
    try:
        yield Served(line.split("listening on ")[1].split()[0],
                     line.split("metrics on http://")[1].split("/")[0], proc.pid)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        logs.close()


def scrape(metrics: str) -> list[Any]:
    """The node's ``/metrics`` at ``metrics`` now, read with Prometheus's own parser: its metric
    families."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as r:
        text = r.read().decode()
    return list(text_string_to_metric_families(text))


def stage_seconds(metrics: str) -> dict[tuple[str, str], tuple[float, float]]:
    """The node's ``nearrec_request_seconds`` now: (call, stage) → (sum s, count)."""
    out: dict[tuple[str, str], list[float]] = {}
    for family in scrape(metrics):
        if family.name != "nearrec_request_seconds":
            continue
        for sample in family.samples:
            key = (sample.labels["call"], sample.labels["stage"])
            if sample.name.endswith("_sum"):
                out.setdefault(key, [0.0, 0.0])[0] = sample.value
            elif sample.name.endswith("_count"):
                out.setdefault(key, [0.0, 0.0])[1] = sample.value
    return {k: (v[0], v[1]) for k, v in out.items()}


@contextmanager
def namespace(rate: str | None = None, index: int = 0) -> Iterator[tuple[str, str]]:
    """Network namespace ``index`` (several may stand at once) joined to this one by a veth
    pair, each end limited to ``rate`` by tc's token bucket (``None``: the veth as it is);
    (its name, its address)."""
    ns, outer, inner = f"nearrec-bench-{index}", f"nrb{index}o", f"nrb{index}i"
    here, there = f"10.231.{7 + index}.1", f"10.231.{7 + index}.2"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "link", "del", outer], capture_output=True)
    steps = [["ip", "netns", "add", ns],
             ["ip", "link", "add", outer, "type", "veth", "peer", "name", inner],
             ["ip", "link", "set", inner, "netns", ns],
             ["ip", "addr", "add", f"{here}/24", "dev", outer],
             ["ip", "link", "set", outer, "up"],
             ["ip", "netns", "exec", ns, "ip", "addr", "add", f"{there}/24", "dev", inner],
             ["ip", "netns", "exec", ns, "ip", "link", "set", inner, "up"],
             ["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"]]
    if rate is not None:
        steps += [["tc", "qdisc", "add", "dev", outer, "root", "tbf", "rate", rate, "burst",
                   "256kb", "latency", "20ms"],
                  ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", inner, "root", "tbf",
                   "rate", rate, "burst", "256kb", "latency", "20ms"]]
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        yield ns, there
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", outer], capture_output=True)


def can_make_namespaces() -> bool:
    probe = "nearrec-bench-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return made and shutil.which("tc") is not None


@contextmanager
def redis_server(netns: str | None = None, host: str = "127.0.0.1") -> Iterator[str]:
    """Debian's ``redis-server`` on a free port of ``host`` (in network namespace ``netns``),
    no persistence; its address."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    inside = ["ip", "netns", "exec", netns] if netns else []
    proc = subprocess.Popen([*inside, exe, "--port", str(port), "--bind", host, "--save", "",
                             "--appendonly", "no", "--protected-mode", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection((host, port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError("redis-server did not start")
        yield f"{host}:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


#: Where ``make`` unpacks Triton Inference Server's binary and Python backend (with numpy < 2,
#: which its stub needs, in ``numpy1``).
TRITON = Path(sys.prefix) / "triton"


@dataclass
class Triton:
    """A running ``tritonserver``: its gRPC and HTTP addresses, and its log."""

    grpc: str
    http: str
    log: Path


@contextmanager
def tritonserver(repo: Path, work: Path, ready_s: float = 120.0) -> Iterator[Triton]:
    """``tritonserver`` on the model repository ``repo``, on loopback ports, its Python backend
    with this Python's stub (linked under ``work``); stopped (SIGTERM) after. Raises with the
    server's log if it does not come up."""
    import tritonclient.grpc as grpcclient

    server = TRITON / "pytriton" / "tritonserver"
    backends = Path(tempfile.mkdtemp(prefix="backends-", dir=work))
    python = backends / "python"
    python.mkdir()
    for f in ("libtriton_python.so", "triton_python_backend_utils.py"):
        (python / f).symlink_to(server / "backends" / "python" / f)
    stub = server / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}"
    (python / "triton_python_backend_stub").symlink_to(stub / "triton_python_backend_stub")
    http, grpc, metrics = free_port(), free_port(), free_port()
    env = dict(os.environ, LD_LIBRARY_PATH=str(TRITON / "nvidia_pytriton.libs"))
    log = backends / "triton.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(server / "bin" / "tritonserver"), "--model-repository", str(repo),
             "--backend-directory", str(backends), "--http-address", "127.0.0.1",
             "--grpc-address", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc),
             "--metrics-port", str(metrics), "--allow-metrics", "false"],
            env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        deadline = time.monotonic() + ready_s
        while True:
            try:
                if client.is_server_ready():
                    break
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tritonserver did not come up: {log.read_text()[-3000:]}")
            time.sleep(0.3)
        client.close()
        yield Triton(f"127.0.0.1:{grpc}", f"127.0.0.1:{http}", log)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
