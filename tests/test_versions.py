"""Versions of one served name, as an operator meets them: a repository published into,
served by a node that keeps serving the current version across restarts, swapped and rolled
back from a client and from the command line, reported by ``Info``, ``/metrics`` (read with
Prometheus's parser) and the node's JSON log, and pruned to ``keep_last``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import Node

import nearrec
from nearrec import InvalidRequest

ROWS, DIM = 50, 4


def built(root: Path, k: int) -> Path:
    """A store whose every value is ``k``."""
    path = root / f"built-{k}"
    nearrec.from_numpy(path, {"t": np.full((ROWS, DIM), k, np.float32)})
    return path


def served(store: nearrec.Store) -> float:
    return float(store.lookup("t", np.array([1]), np.array([0]))[0, 0])


def cli(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "nearrec.cli", *args, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_publishing_numbers_versions_and_an_open_serves_the_pointer(tmp_path):
    repo = tmp_path / "repo" / "dlrm"
    assert nearrec.versions(repo) is None
    assert [nearrec.publish(repo, built(tmp_path, k)) for k in (1, 2)] == [1, 2]
    assert cli("publish", str(repo), str(built(tmp_path, 3)))["version"] == 3
    assert nearrec.versions(repo) == nearrec.Versions((1, 2, 3), 3, ())
    store = nearrec.open(repo)
    assert (store.name, store.served_version, store.versions) == ("dlrm", 3, (1, 2, 3))
    assert served(store) == 3.0
    store.swap(version=1, warm=False)
    assert served(store) == 1.0 and nearrec.versions(repo).history == (3,)
    with pytest.raises(InvalidRequest, match="one of them"):
        store.swap("x", version=2)
    with pytest.raises(InvalidRequest):
        store.swap(version=0)
    with pytest.raises(nearrec.StoreNotFound, match="no version 9"):
        store.swap(version=9)
    store.close()
    # a plain store has no versions
    plain = nearrec.open(built(tmp_path, 5))
    assert plain.served_version is None and plain.versions == ()
    with pytest.raises(InvalidRequest, match="not served from a repository"):
        plain.rollback()
    # the command line reads a repository: its versions, then the served one's tables
    info = cli("info", str(repo))
    assert info["repository"] == {"versions": [1, 2, 3], "current": 1, "history": [3]}
    assert info["tables"][0]["name"] == "t"


def test_what_a_new_user_meets_around_versions(tmp_path):
    """Issue 62, items 17, 20 and 21: `publish` printed a step that fails for version 1 and led
    with the offline swap a running node does not follow; `trace gen --store REPO` refused a
    repository; `info` listed pruned versions as served before; a swap by version returned the
    count of writes."""
    repo = tmp_path / "dlrm"

    def publish(k: int) -> str:
        out = subprocess.run([sys.executable, "-m", "nearrec.cli", "publish", str(repo),
                              str(built(tmp_path, k))], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    first = publish(1)
    assert "a node started on" in first and "swap" not in first, first
    second = publish(2)
    assert "nearrec swap --remote HOST:PORT dlrm --version 2" in second, second
    assert "newest" in second and f"nearrec swap {repo}" not in second, second
    nearrec.open(repo).swap(version=1, warm=False)  # CURRENT names 1
    third = publish(3)
    assert third.index("--remote") < third.index(f"nearrec swap {repo} --version 3"), third
    trace = tmp_path / "t.nrtrace"
    out = subprocess.run([sys.executable, "-m", "nearrec.cli", "trace", "gen", str(trace),
                          "--store", str(repo), "--bags", "20"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and trace.is_file(), out.stderr
    assert nearrec.info(repo).path == repo / "1"
    store = nearrec.open(repo)
    assert store.swap(version=2, warm=False) == 2
    assert store.swap(version=3, warm=False) == 3 and store.rollback(warm=False) == 2
    store.close()
    assert 1 in nearrec.versions(repo).history
    import shutil
    shutil.rmtree(repo / "1")  # pruned, as keep_last does
    history = nearrec.versions(repo).history
    assert history and 1 not in history, history
    assert cli("info", str(repo))["repository"]["history"] == list(history)


def test_a_node_serves_the_current_version_across_restarts_and_rolls_back(tmp_path):
    repo = tmp_path / "repo" / "dlrm"
    for k in (1, 2, 3, 4):
        nearrec.publish(repo, built(tmp_path, k), move=True)
    config = tmp_path / "store.toml"
    config.write_text("keep_last = 3\n")
    start = ("--log-format", "json", "--store-config", str(config), "--slow-request-ms", "1")
    node = Node(str(repo), *start)
    try:
        remote = nearrec.connect(node.address, "dlrm")
        assert (remote.served_version, served(remote)) == (4, 4.0)
        assert remote.served_path.endswith("dlrm/4")
        assert remote.swap(version=2) == 2
        assert (remote.served_version, served(remote)) == (2, 2.0)
        metrics = node.metrics()
        assert ({"store": "dlrm"}, 2.0) in metrics["nearrec_store_served_version"]
        (labels, one), = metrics["nearrec_store_info"]
        assert one == 1.0 and labels["path"].endswith("dlrm/2")
    finally:
        assert node.stop() == 0
    events = [json.loads(line) for line in node.proc.stderr.read().splitlines() if line.strip()]
    by_message = {e["fields"].get("message"): e["fields"] for e in events}
    assert by_message["store loaded"]["served_version"] == 4
    assert by_message["swap"]["from"].startswith("version 4") and \
        by_message["swap"]["to"].startswith("version 2")
    # a swap takes as long as its warm-up: never a slow request (issue 62, item 21)
    slow = [e["fields"].get("call") for e in events
            if e["fields"].get("message") == "slow request"]
    assert "Swap" not in slow, slow
    # versions beyond the newest three went once the swap let go of version 4: not 2, served
    assert nearrec.versions(repo).versions == (2, 3, 4)

    # a restart serves version 2, the pointer's; a rollback from the command line goes to 4
    node = Node(str(repo), *start)
    try:
        remote = nearrec.connect(node.address)
        assert (remote.served_version, served(remote)) == (2, 2.0)
        done = cli("swap", "--remote", node.address, "dlrm", "--rollback")
        assert done["served_version"] == 4 and done["path"].endswith("dlrm/4")
        assert served(remote) == 4.0
        # nothing served before 4 is left: a typed refusal, the node serving on
        with pytest.raises(InvalidRequest, match="nothing to roll back to"):
            remote.rollback()
        assert served(remote) == 4.0
    finally:
        assert node.stop() == 0
    node = Node(str(repo), *start)
    try:
        assert nearrec.connect(node.address).served_version == 4
    finally:
        assert node.stop() == 0


def test_an_offline_swap_moves_the_pointer_a_node_starts_from(tmp_path):
    repo = tmp_path / "dlrm"
    for k in (1, 2):
        nearrec.publish(repo, built(tmp_path, k))
    assert cli("swap", str(repo), "--version", "1")["served_version"] == 1
    # a store that cannot answer what the served one answers is refused, the pointer kept
    other = tmp_path / "other"
    nearrec.from_numpy(other, {"z": np.zeros((5, DIM), np.float32)})
    nearrec.publish(repo, other)
    out = subprocess.run([sys.executable, "-m", "nearrec.cli", "swap", str(repo), "--version",
                          "3"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no table" in out.stderr, out.stderr
    assert nearrec.versions(repo).current == 1
    node = Node(str(repo))
    try:
        deadline = time.monotonic() + 10
        remote = nearrec.connect(node.address)
        while remote.served_version != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (remote.served_version, served(remote)) == (1, 1.0)
    finally:
        assert node.stop() == 0
