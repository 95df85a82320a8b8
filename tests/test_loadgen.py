"""The storage node's open-loop load generator (`nearrec_bench._native.load_run`, crate
`nearrec-loadgen`): every mode — pooled on the node, raw rows pooled by the client with and
without a client cache, embedded — answers the same batch with the same vectors, and a run
sends what its rate and length ask, each answered request timed."""

from __future__ import annotations

import numpy as np
import pytest
from test_remote import Node, build

import nearrec

bench_native = pytest.importorskip("nearrec_bench._native")


def batches(n: int, bags: int = 8) -> list[list[tuple[str, np.ndarray, np.ndarray]]]:
    rng = np.random.default_rng(4)
    out = []
    for _ in range(n):
        b = []
        for t, rows in (("a", 500), ("b", 300)):
            lengths = rng.integers(0, 5, bags).astype(np.int64)
            b.append((t, rng.integers(0, rows, int(lengths.sum())).astype(np.int64), lengths))
        out.append(b)
    return out


def test_every_mode_answers_the_same_vectors(tmp_path):
    path = build(tmp_path)
    local = nearrec.open(path)
    work = batches(4)
    want = local.lookup_many([nearrec.TableLookup(t, ids, lengths=lengths)
                              for t, ids, lengths in work[0]]).values.reshape(-1)
    held = np.arange(0, 500, 2, dtype=np.int64)
    cache = {"a": (held, local.read_rows("a", held))}
    node = Node(str(path))
    try:
        embedded = bench_native.EmbeddedStore(str(path), 'tier = "ssd"')
        for mode in ("pooled", "raw", "raw_cached", "embedded"):
            out = bench_native.load_run(mode, work, rate=200.0, seconds=0.5, target=node.address,
                                        store="store", connections=2, cache=cache,
                                        embedded=embedded)
            assert out["failed"] == 0 and out["dropped"] == 0, (mode, out)
            assert out["sent"] == 100 and len(out["latencies_us"]) == 100, mode
            assert (out["latencies_us"] > 0).all()
            assert out["samples"] == 100 * 8
            np.testing.assert_allclose(out["first"], want, rtol=1e-5, atol=1e-6, err_msg=mode)
            assert (out["wire_bytes"] > 0) == (mode != "embedded")
    finally:
        assert node.stop() == 0
    # a real redis-server holding the rows answers the same (the benchmark's HPS-like peer)
    from nearrec_bench.served import redis_server
    with redis_server() as redis:
        bench_native.redis_load(redis, {t: local.read_rows(t, np.arange(n))
                                        for t, n in (("a", 500), ("b", 300))})
        out = bench_native.load_run("redis", work, rate=200.0, seconds=0.5, target=redis,
                                    connections=2, dims={"a": 16, "b": 8})
        assert out["failed"] == 0 and out["sent"] == 100
        np.testing.assert_allclose(out["first"], want, rtol=1e-5, atol=1e-6)


def test_the_embedded_store_runs_on_the_cpus_it_was_opened_on(tmp_path):
    """`bench serve-pinned` gives the embedded store a core of its own by opening it there and
    generating load from another: every thread that runs its calls must sit on the opening
    thread's CPUs, not on the load generator's (they once ran on the load generator's core)."""
    import os
    import threading

    path = build(tmp_path)
    everywhere = os.sched_getaffinity(0)
    mine = {min(everywhere)}
    seen: dict[int, set[int]] = {}
    done = threading.Event()

    def watch() -> None:
        # the store's threads, by name, and the CPUs each may run on, while the load runs
        while not done.is_set():
            for tid in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{tid}/comm") as f:
                        if f.read().strip() == "embedded-store":
                            seen[int(tid)] = os.sched_getaffinity(int(tid))
                except (FileNotFoundError, ProcessLookupError):
                    pass
            done.wait(0.01)

    os.sched_setaffinity(0, mine)
    try:
        embedded = bench_native.EmbeddedStore(str(path), 'tier = "dram"')
    finally:
        os.sched_setaffinity(0, everywhere)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        out = bench_native.load_run("embedded", batches(4), rate=400.0, seconds=0.5,
                                    connections=2, embedded=embedded)
    finally:
        done.set()
        watcher.join()
    assert out["failed"] == 0 and len(out["latencies_us"]) == out["sent"] > 0
    assert seen, "no thread of the embedded store was seen running its calls"
    assert all(cpus == mine for cpus in seen.values()), seen
