"""The deployment files in ``deploy/`` as an operator uses them: the node config loads and
validates as the node reads it, the ACL is one the node serves with, the systemd unit passes
``systemd-analyze verify`` and drains inside its stop timeout, and the Dockerfile builds a
non-root image from the wheel whose health check asks the node's ``/readyz``; the Triton model
repository is what ``nearrec triton export`` writes, by Triton's own config schema; the KServe
runtime and service are read strictly by the kserve SDK's models and run ``nearrec serve`` as
its parser takes it. (The image is built only where a Docker daemon runs; this project's
machines have none, and the test says so when it skips that part.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Node

import nearrec
from nearrec import _native

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def node_toml() -> dict:
    return tomllib.loads((DEPLOY / "node.toml").read_text())


def test_the_node_config_is_one_the_node_reads():
    config = _native.NodeConfig(str(DEPLOY / "node.toml"))
    again = tomllib.loads(config.to_toml())
    mine = node_toml()
    for key in ("stores", "listen", "metrics_listen", "acl", "swap_root", "drain_timeout"):
        assert again[key] == mine[key], key
    assert again["store"]["tier"] == "ssd"
    # reachable from other hosts: only with an ACL and TLS
    assert not mine["listen"].startswith("127.") and mine["acl"] and mine["tls"]


def test_the_acl_is_one_the_node_serves_with(tmp_path):
    store = tmp_path / "rmc1"
    nearrec.from_numpy(store, {"t": np.zeros((4, 4), np.float32)})
    acl = tomllib.loads((DEPLOY / "acl.toml").read_text())
    assert set(acl["principal"]) == {"ranker", "trainer"}
    node = Node(f"{store}=rmc1", "--acl", str(DEPLOY / "acl.toml"))
    try:
        with pytest.raises(nearrec.Unauthenticated):
            nearrec.connect(node.address, "rmc1")
        # the probes the Dockerfile's health check and a load balancer ask
        import urllib.request
        base = node.metrics_url.rsplit("/", 1)[0]
        for probe, says in (("/healthz", "ok"), ("/readyz", "ready")):
            with urllib.request.urlopen(base + probe, timeout=10) as r:
                assert r.status == 200 and r.read().decode().strip() == says
    finally:
        assert node.stop() == 0


def test_the_systemd_unit_verifies_and_outlasts_the_drain(tmp_path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is a test dependency (make system-deps installs it)"
    unit = (DEPLOY / "nearrec.service").read_text()
    keys = dict(re.findall(r"^(\w+)=(.*)$", unit, re.M))
    assert keys["Type"] == "notify" and keys["KillSignal"] == "SIGTERM"
    assert keys["StateDirectory"] == "nearrec" and \
        node_toml()["store"]["hot_set_dir"] == "/var/lib/nearrec"
    assert keys["ExecStart"].split()[1:] == ["serve", "--config", "/etc/nearrec/node.toml"]
    assert keys["User"] not in ("root", "0")
    assert float(keys["TimeoutStopSec"]) > node_toml()["drain_timeout"]
    # the node's own filter shows the lines docs/operations.md tells operators to look for; a
    # unit's RUST_LOG would replace it (it hid the warm-up and hot-set lines)
    assert "RUST_LOG" not in keys.get("Environment", ""), keys.get("Environment")
    # verified as written, but for the paths and the user that exist on this machine
    here = Path(sys.executable).parent / "nearrec"
    me = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    local = (unit.replace("/opt/nearrec/bin/nearrec", str(here))
             .replace("User=nearrec", f"User={me}").replace("Group=nearrec", f"Group={me}"))
    (tmp_path / "nearrec.service").write_text(local)
    done = subprocess.run([analyze, "verify", str(tmp_path / "nearrec.service")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    # and a misspelt key is caught by the same check
    (tmp_path / "bad.service").write_text(local.replace("Type=notify", "Typ=notify"))
    bad = subprocess.run([analyze, "verify", str(tmp_path / "bad.service")],
                         capture_output=True, text=True, timeout=60)
    assert "Unknown key 'Typ'" in bad.stderr


def dockerfile() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, continuation lines joined: ``(INSTRUCTION, arguments)``."""
    text = re.sub(r"\\\n", " ", (DEPLOY / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_dockerfile_builds_in_one_stage_and_runs_the_wheel_as_a_user_in_another():
    steps = dockerfile()
    stages = [i for i, (w, _) in enumerate(steps) if w == "FROM"]
    assert len(stages) == 2 and steps[stages[0]][1].endswith(" AS build")
    final = steps[stages[1]:]
    kinds = {w: a for w, a in final}
    runs = " && ".join(a for w, a in final if w == "RUN")
    assert "--from=build /wheels" in kinds["COPY"] and "cargo" not in runs
    assert kinds["USER"] not in ("root", "0") and "useradd --system --uid 10001 " in runs
    assert json.loads(kinds["VOLUME"]) == ["/stores", node_toml()["store"]["hot_set_dir"]]
    assert json.loads(kinds["ENTRYPOINT"]) == ["nearrec", "serve"]
    assert json.loads(kinds["CMD"]) == ["--config", "/etc/nearrec/node.toml"]
    # it exposes the ports the config listens on, and its health check asks /readyz there
    config = node_toml()
    ports = {config["listen"].rsplit(":", 1)[1], config["metrics_listen"].rsplit(":", 1)[1]}
    assert set(kinds["EXPOSE"].split()) == ports
    metrics_port = config["metrics_listen"].rsplit(":", 1)[1]
    assert f"127.0.0.1:{metrics_port}/readyz" in kinds["HEALTHCHECK"]
    # the stores stay on their volume, the environments and build outputs out of the context
    ignored = (DEPLOY.parent / ".dockerignore").read_text().split()
    assert {"target/", ".venv*/", "dist/"} <= set(ignored)


def test_the_image_builds_where_a_docker_daemon_runs():
    docker = shutil.which("docker")
    up = docker and subprocess.run([docker, "info"], capture_output=True,
                                   timeout=30).returncode == 0
    if not up or os.environ.get("NEARREC_DOCKER_BUILD") != "1":
        pytest.skip("no Docker daemon here (or NEARREC_DOCKER_BUILD unset): the image build "
                    "is checked by the Dockerfile's test above, not run")
    done = subprocess.run([docker, "build", "-f", str(DEPLOY / "Dockerfile"), "-t",
                           "nearrec-test", str(DEPLOY.parent)], capture_output=True, text=True,
                          timeout=3600)
    assert done.returncode == 0, done.stderr[-2000:]


def test_logs_are_json_lines_for_a_shipper_and_plain_text_off_a_terminal(tmp_path):
    """`--log-format json`: every line on stderr one JSON object, the drain among the events;
    the default text off a terminal (a file, a pipe, a journal) carries no colour codes."""
    store = tmp_path / "s"
    nearrec.from_numpy(store, {"t": np.zeros((4, 4), np.float32)})
    node = Node(str(store), "--log-format", "json")
    nearrec.connect(node.address).lookup("t", np.array([1]), np.array([0]))
    assert node.stop() == 0
    lines = [line for line in node.proc.stderr.read().splitlines() if line.strip()]
    events = [json.loads(line) for line in lines]
    assert events and all({"timestamp", "level", "fields"} <= e.keys() for e in events)
    assert any("draining" in e["fields"].get("message", "") for e in events), events
    text = Node(str(store))
    assert text.stop() == 0
    err = text.proc.stderr.read()
    assert "draining" in err and "\x1b[" not in err
    with pytest.raises(AssertionError, match="log_format"):
        Node(str(store), "--log-format", "xml")


def test_a_restarted_node_is_ready_only_once_warmed_from_its_kept_hot_set(tmp_path):
    """A node whose drain keeps its stores' hot sets (`--hot-set-dir`) starts the next time with
    its DRAM tiers full: the log says so before it is ready, and the first lookups are served
    from the row cache; per-table lookups and rows are counted."""
    store = tmp_path / "rmc1"
    rng = np.random.default_rng(3)
    nearrec.from_numpy(store, {"a": rng.standard_normal((4000, 16), dtype=np.float32),
                               "b": rng.standard_normal((100, 8), dtype=np.float32)})
    kept = tmp_path / "hot"
    kept.mkdir()
    config = tmp_path / "node.toml"
    config.write_text(f'stores = ["{store}"]\n[store]\ntier = "ssd"\nhot_set_dir = "{kept}"\n'
                      '[store.plan.tables.a]\ncache_bytes = 65536\n')
    ids = (np.arange(200) * 17 + 3) % 4000

    def served(node: Node) -> tuple[np.ndarray, dict[str, float]]:
        got = nearrec.connect(node.address).lookup("a", ids, offsets=np.arange(len(ids)))
        m = node.metrics()
        by_tier = {s["tier"]: v for s, v in m["nearrec_lookups"]}
        assert ({"store": "rmc1", "table": "a"}, 1.0) in m["nearrec_table_lookups"]
        assert ({"store": "rmc1", "table": "a"}, float(len(ids))) in m["nearrec_table_rows"]
        return got, by_tier

    node = Node("--config", str(config), "--log-format", "json")
    try:
        first, tiers = served(node)
        assert tiers["ssd"] == len(ids) and tiers["cache"] == 0, tiers
    finally:
        assert node.stop() == 0
    assert (kept / "rmc1.hotset").is_file()
    node = Node("--config", str(config), "--log-format", "json")
    try:
        again, tiers = served(node)
        np.testing.assert_array_equal(again, first)
        assert tiers["cache"] == len(ids) and tiers["ssd"] == 0, tiers
    finally:
        assert node.stop() == 0
    events = [json.loads(line) for line in node.proc.stderr.read().splitlines() if line.strip()]
    said = [e["fields"].get("message") for e in events]
    assert said.index("warm-up done") < said.index("ready"), said
    done = next(e["fields"] for e in events if e["fields"].get("message") == "warm-up done")
    assert done["rows"] == len(ids)
    assert "hot set kept" in said


def test_the_node_tells_systemd_it_is_ready_and_that_it_drains(tmp_path, monkeypatch):
    """Type=notify: READY=1 on $NOTIFY_SOCKET once the node serves (its stores loaded and
    warmed), STOPPING=1 when SIGTERM starts the drain, read from a socket as systemd's."""
    import socket
    store = tmp_path / "rmc1"
    nearrec.from_numpy(store, {"t": np.zeros((4, 4), np.float32)})
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(60)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    node = Node(str(store))
    try:
        ready = sock.recv(4096).decode()
        assert "READY=1" in ready and "STATUS=serving 1 store(s)" in ready, ready
        # it already answers
        assert nearrec.connect(node.address).name == "rmc1"
    finally:
        assert node.stop() == 0
    assert "STOPPING=1" in sock.recv(4096).decode()
    sock.close()


def test_the_shipped_config_takes_the_trainers_feed(tmp_path):
    """docs/operations.md §3-4 against deploy/node.toml and deploy/acl.toml as shipped (paths,
    addresses and tokens made this machine's; TLS left out on loopback): the trainer's
    `nearrec update --remote` is applied, the ranker's write refused."""
    import hashlib
    store = tmp_path / "stores" / "rmc1"
    rng = np.random.default_rng(7)
    table = rng.standard_normal((64, 8), dtype=np.float32)
    nearrec.from_numpy(store, {"t": table})
    tokens = {"ranker": "ranker-token", "trainer": "trainer-token"}
    acl = (DEPLOY / "acl.toml").read_text()
    for who, zeros in (("ranker", "0" * 64), ("trainer", "1" * 64)):
        acl = acl.replace(zeros, hashlib.sha256(tokens[who].encode()).hexdigest())
    (tmp_path / "acl.toml").write_text(acl)
    text = (DEPLOY / "node.toml").read_text().split("\n[tls]")[0]
    for key, value in (("stores", f'["{store}=rmc1"]'), ("acl", f'"{tmp_path / "acl.toml"}"'),
                       ("swap_root", f'"{tmp_path / "stores"}"'),
                       ("hot_set_dir", f'"{tmp_path}"')):
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
        assert n == 1, key
    (tmp_path / "node.toml").write_text(text)
    node = Node("--config", str(tmp_path / "node.toml"))
    try:
        trainer = nearrec.connect(node.address, "rmc1", token=tokens["trainer"])
        table[3] += 1.0
        np.savez(tmp_path / "ckpt.npz", t=table)
        (tmp_path / "token").write_text(tokens["trainer"])
        done = subprocess.run(
            [sys.executable, "-m", "nearrec.cli", "update", "--remote", node.address, "rmc1",
             "--from", str(tmp_path / "ckpt.npz"), "--token-file", str(tmp_path / "token"),
             "--json"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["tables"]["t"]["written"] == 1
        np.testing.assert_array_equal(trainer.read_rows("t", np.array([3])), table[[3]])
        ranker = nearrec.connect(node.address, "rmc1", token=tokens["ranker"])
        with pytest.raises(nearrec.PermissionDenied):
            ranker.write("t", np.array([1]), np.zeros((1, 8), np.float32))
    finally:
        assert node.stop() == 0


def test_the_triton_example_is_what_the_export_writes(tmp_path):
    """`deploy/triton/`: parsed by Triton's own `ModelConfig` schema, and equal to what
    `nearrec triton export` writes for the model it says (a TorchRec DLRM), but for the store's
    place and the instances."""
    import ast

    from dlrm_requests import torchrec_dlrm
    from google.protobuf import text_format

    config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2",
                                     reason="tritonclient is not installed")
    from nearrec.triton import export

    def parsed(path: Path) -> Any:
        return text_format.Parse(path.read_text(), config_pb2.ModelConfig())

    example = parsed(DEPLOY / "triton" / "dlrm" / "config.pbtxt")
    torchrec_dlrm(tmp_path / "dlrm")
    written = parsed(export(tmp_path / "dlrm", tmp_path / "repo", name="dlrm") / "config.pbtxt")
    assert json.loads(example.parameters["nearrec_location"].string_value) == {
        "path": "/stores/dlrm"}
    assert example.instance_group[0].kind == config_pb2.ModelInstanceGroup.KIND_CPU
    for config in (example, written):
        config.parameters["nearrec_location"].string_value = ""
        config.instance_group[0].count = 1
    assert example == written
    # its model.py puts paths first, then takes the model from nearrec.triton, as the export's
    for model in (DEPLOY / "triton" / "dlrm" / "1" / "model.py",
                  tmp_path / "repo" / "dlrm" / "1" / "model.py"):
        tree = ast.parse(model.read_text())
        imports = [n for n in tree.body if isinstance(n, ast.ImportFrom)]
        assert [(i.module, [a.name for a in i.names]) for i in imports][-1] == (
            "nearrec.triton", ["TritonPythonModel"])
        assert "sys.path[:0] = [" in model.read_text()


#: The kserve SDK's models reading YAML documents strictly, in a process of its own (its
#: protobuf module and tritonclient's both register the `inference` package): every key one the
#: model has, every value of its type. Reads `[(document, model name)]` as JSON on stdin.
KSERVE_STRICT = """
import json, re, sys
import kserve.models, kubernetes.client.models as k8s

def strict(data, klass, at):
    if m := re.fullmatch(r"[lL]ist\\[(.+)\\]", klass):
        assert isinstance(data, list), (at, klass, data)
        return [strict(d, m.group(1), f"{at}[{i}]") for i, d in enumerate(data)]
    if m := re.fullmatch(r"dict\\(str, (.+)\\)|Dict\\[str, (.+)\\]", klass):
        assert isinstance(data, dict), (at, klass, data)
        return {k: strict(v, m.group(1) or m.group(2), f"{at}.{k}") for k, v in data.items()}
    simple = {"str": str, "int": int, "bool": bool, "float": (int, float)}
    if klass in simple:
        assert isinstance(data, simple[klass]), (at, klass, data)
        return data
    if klass == "object":
        return data
    model = getattr(kserve.models, klass, None) or getattr(k8s, klass)
    assert isinstance(data, dict), (at, klass, data)
    by_key = {key: attr for attr, key in model.attribute_map.items()}
    unknown = sorted(set(data) - set(by_key))
    assert not unknown, f"{at}: {klass} has no field {unknown}"
    return model(**{by_key[k]: strict(v, model.openapi_types[by_key[k]], f"{at}.{k}")
                    for k, v in data.items()})

for doc, klass in json.load(sys.stdin):
    strict(doc, klass, klass)
print("ok")
"""


def _kserve_reads(docs: list[tuple[Any, str]]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", KSERVE_STRICT], input=json.dumps(docs),
                          capture_output=True, text=True, timeout=120)


def test_the_kserve_runtime_and_service_are_ones_kserve_takes():
    """`deploy/kserve/`: the ServingRuntime and the InferenceService read strictly by the kserve
    SDK's models; the service names the runtime and a format it supports over the protocol it
    speaks; the container's arguments are ones `nearrec serve` takes, listening on the port the
    runtime declares, its probes on the node's metrics port."""
    import importlib.util

    yaml = pytest.importorskip("yaml")
    if importlib.util.find_spec("kserve") is None:
        pytest.skip("KServe's SDK is not installed")
    from nearrec.cli import parser

    runtime = yaml.safe_load((DEPLOY / "kserve" / "servingruntime.yaml").read_text())
    service = yaml.safe_load((DEPLOY / "kserve" / "inferenceservice.yaml").read_text())
    done = _kserve_reads([(runtime, "V1alpha1ServingRuntime"),
                          (service, "V1beta1InferenceService")])
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    # the check can fail: a misspelt field
    typo = json.loads(json.dumps(service))
    typo["spec"]["predictor"]["model"]["storageURI"] = typo["spec"]["predictor"]["model"].pop(
        "storageUri")
    bad = _kserve_reads([(typo, "V1beta1InferenceService")])
    assert bad.returncode != 0 and "has no field ['storageURI']" in bad.stderr, bad.stderr
    assert (runtime["kind"], service["kind"]) == ("ServingRuntime", "InferenceService")
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    spec = runtime["spec"]
    assert model["modelFormat"]["name"] in [f["name"] for f in spec["supportedModelFormats"]]
    assert model["protocolVersion"] in spec["protocolVersions"] == ["grpc-v2"]
    container = spec["containers"][0]
    args = parser().parse_args(["serve", *[a.replace("{{.Name}}", service["metadata"]["name"])
                                           for a in container["args"]]])
    assert args.stores == ["/mnt/models=dlrm"] and args.node_acl == "/etc/nearrec/acl.toml"
    assert args.node_listen.rsplit(":", 1)[1] == str(container["ports"][0]["containerPort"])
    metrics = args.node_metrics_listen.rsplit(":", 1)[1]
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert container[probe]["httpGet"] == {"path": path, "port": int(metrics)}
