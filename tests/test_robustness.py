"""The process survives what adversarial testing threw at it: stores larger than memory, huge
caches, truncated and corrupted trace files, panics, forks with lookups in flight, FIFOs where
files should be (issue 23, items 1-6, 8 and 11). Cases that could kill or hang the test process
run in a child process with a deadline."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import damage

import nearrec
import nearrec.plan
import nearrec.trace as nt
from nearrec.errors import (
    IndexOutOfRange,
    InsufficientMemory,
    InternalError,
    InvalidTrace,
    NearrecError,
    StoreCorrupted,
)

CGROUP_MEMORY = Path("/sys/fs/cgroup/memory")
CGROUP_PIDS = Path("/sys/fs/cgroup/pids")


def run_child(code: str, timeout: float = 60, cgroup: Path | None = None,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh Python (inside ``cgroup`` when given) and returns what it did;
    a hang past ``timeout`` fails the test."""
    prelude = ""
    if cgroup is not None:
        procs = str(cgroup / "cgroup.procs")
        prelude = f"open({procs!r}, 'w').write(str(__import__('os').getpid()))\n"
    try:
        return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "OPENBLAS_NUM_THREADS": "1", **(env or {})})
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child hung for {timeout} s")


def make_cgroup(root: Path, name: str, limits: dict[str, str]) -> Path:
    if os.geteuid() != 0:
        pytest.skip("cgroups need root")
    if not root.is_dir():
        pytest.skip(f"no cgroup v1 controller at {root}")
    cg = root / f"{name}-{os.getpid()}"
    cg.mkdir(exist_ok=True)
    for k, v in limits.items():
        (cg / k).write_text(v)
    return cg


def remove_cgroup(cg: Path) -> None:
    for _ in range(50):
        try:
            cg.rmdir()
            return
        except OSError:  # its last process is still exiting
            time.sleep(0.1)


# ---- item 1: a store larger than memory ----------------------------------------------------


def test_a_budget_above_memory_is_a_typed_error(tmp_path):
    path = tmp_path / "s"
    nearrec.from_numpy(path, {"t": np.ones((100, 8), np.float32)})
    with pytest.raises(InsufficientMemory, match="dram_budget") as e:
        nearrec.open(path, dram_budget="2TiB")
    assert isinstance(e.value, MemoryError)
    with pytest.raises(InsufficientMemory):
        nearrec.open(path, tier="ssd", dram_budget=2**62)


@pytest.fixture(scope="module")
def big_store(tmp_path_factory) -> Path:
    """192 MiB of tables, for children in a 128 MiB memory cgroup."""
    path = tmp_path_factory.mktemp("big") / "s"
    rng = np.random.default_rng(0)
    nearrec.from_numpy(path, {f"t{i}": rng.standard_normal((196_608, 32), dtype=np.float32)
                              for i in range(8)})
    return path


def test_loading_more_than_the_cgroup_allows_is_a_typed_error(big_store):
    cg = make_cgroup(CGROUP_MEMORY, "nearrec-test-mem", {"memory.limit_in_bytes": str(128 << 20)})
    try:
        # the child itself (Python, numpy, nearrec) takes ~40 MiB of the 128
        out = run_child(f"""
            import nearrec, numpy as np
            from nearrec.errors import InsufficientMemory
            p = {str(big_store)!r}
            for kw in (dict(tier="dram"), dict(tier="ssd", plan={{f"t{{i}}": {{"resident": True}}
                                                                for i in range(6)}})):
                try:
                    nearrec.open(p, **kw)
                    print("opened", kw)
                except InsufficientMemory as e:
                    print("refused:", e)
            s = nearrec.open(p)  # auto: does not fit, so it is served from SSD
            print("auto", s.tier, s.lookup("t0", np.array([1, 2]), np.array([0])).shape)
            """, cgroup=cg)
    finally:
        remove_cgroup(cg)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("refused:") == 2, out.stdout
    assert "is available now" in out.stdout
    assert "auto ssd (1, 32)" in out.stdout


# ---- item 2: caches larger than memory or than their table ---------------------------------


@pytest.mark.parametrize("cache_bytes", [2**44, 9223372036854775807, "1TiB"])
def test_a_cache_is_capped_at_its_table(tmp_path, cache_bytes):
    path = tmp_path / "s"
    rows = np.random.default_rng(0).standard_normal((300, 16), dtype=np.float32)
    nearrec.from_numpy(path, {"t": rows})
    store = nearrec.open(path, tier="ssd", plan={"t": {"cache_bytes": cache_bytes}})
    (report,) = store.tier_report()
    assert 300 <= report["cache_rows"] <= 2 * 300 + 16
    assert report["bytes"] < 1 << 20
    idx = np.arange(300)
    np.testing.assert_array_equal(store.lookup("t", idx, idx), rows)
    np.testing.assert_array_equal(store.lookup("t", idx, idx), rows)  # from the cache
    assert store.stats()["lookups_cache"] > 250  # (a few sets overflow: hashing is not perfect)


# ---- item 3: a trace truncated under a reader -----------------------------------------------


def test_truncating_a_loaded_trace_does_not_kill_the_reader(tmp_path):
    path = tmp_path / "t.nrtrace"
    nt.generate({"a": 1000}, bags=20_000, pooling=20, generator=nt.Generator.uniform()).save(path)
    out = run_child(f"""
        import os, nearrec.trace as nt
        t = nt.load({str(path)!r})
        os.truncate({str(path)!r}, 4096)  # another process shrinks the file
        print("sum", int(t["a"].indices.sum()) > 0)
        """)
    assert out.returncode == 0, f"rc {out.returncode}: {out.stderr}"
    assert "sum True" in out.stdout


def test_a_trace_can_still_be_mapped_on_request(tmp_path):
    path = tmp_path / "t.nrtrace"
    saved = nt.generate({"a": 1000}, bags=100, pooling=4,
                        generator=nt.Generator.uniform()).save(path)
    mapped = nt.load(path, mmap=True)
    assert isinstance(mapped["a"].indices, np.memmap)
    np.testing.assert_array_equal(mapped["a"].indices, saved["a"].indices)
    assert mapped.verified and saved.verified


# ---- item 4: no panic reaches Python; threads are shared ------------------------------------


def test_a_panic_arrives_as_a_typed_internal_error():
    with pytest.raises(InternalError, match="boom"):
        nearrec._native.panic_at_the_boundary("boom")


@pytest.mark.parametrize("tier", ["dram", "ssd"])
def test_a_table_with_no_rows_serves_empty_bags_and_refuses_indices(tmp_path, tier):
    path = tmp_path / "s"
    nearrec.from_numpy(path, {"empty": np.zeros((0, 8), np.float32),
                              "t": np.ones((4, 8), np.float32)})
    store = nearrec.open(path, tier=tier)
    out = store.lookup("empty", np.zeros(0, np.int64), np.array([0, 0, 0]))
    np.testing.assert_array_equal(out, np.zeros((3, 8), np.float32))
    with pytest.raises(IndexOutOfRange, match="position 0"):
        store.lookup("empty", np.array([0]), np.array([0]))
    assert nearrec.verify(path)[0].ok


def test_stores_share_their_threads(tmp_path):
    path = tmp_path / "s"
    nearrec.from_numpy(path, {"t": np.ones((1000, 8), np.float32)})
    idx = np.arange(100_000) % 1000
    off = np.arange(0, 100_000, 10)

    def threads() -> int:
        return len(os.listdir("/proc/self/task"))

    first = nearrec.open(path, threads=3)
    first.lookup("t", idx, off)  # starts the pool of 3
    before = threads()
    stores = [nearrec.open(path, threads=3) for _ in range(40)]
    for s in stores:
        s.lookup("t", idx, off)
    assert threads() - before <= 1


def test_running_out_of_threads_is_a_typed_error(tmp_path):
    path = tmp_path / "s"
    nearrec.from_numpy(path, {"t": np.ones((1000, 8), np.float32)})
    cg = make_cgroup(CGROUP_PIDS, "nearrec-test-pids", {})
    try:
        out = run_child(f"""
            import os, nearrec, numpy as np
            from nearrec.errors import ResourceExhausted
            # from here on, this process may have no more threads than it has now, plus 2
            open({str(cg / 'pids.max')!r}, 'w').write(str(len(os.listdir('/proc/self/task')) + 2))
            try:
                s = nearrec.open({str(path)!r}, threads=64)
                print("opened")
            except ResourceExhausted as e:
                print("refused:", e)
            """, cgroup=cg)
    finally:
        remove_cgroup(cg)
    assert out.returncode == 0, out.stderr
    assert "refused: cannot start a pool of 64 threads" in out.stdout, out.stdout


# ---- item 5: fork with lookups in flight ----------------------------------------------------


def fork_with_lookups_in_flight(store: nearrec.Store, table: str, rows: int,
                                forks: int = 25) -> None:
    """Keeps two threads looking up while the main thread forks; every child must finish a
    lookup of its own within the deadline."""
    rng = np.random.default_rng(0)
    idx = rng.integers(0, rows, 4_000)
    off = np.arange(0, 4_000, 8)
    want = store.lookup(table, idx, off)
    stop = threading.Event()
    errors: list[BaseException] = []

    def busy() -> None:
        try:
            while not stop.is_set():
                store.lookup(table, idx, off)
        except BaseException as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    workers = [threading.Thread(target=busy) for _ in range(2)]
    for w in workers:
        w.start()
    try:
        for _ in range(forks):
            time.sleep(0.005)
            pid = os.fork()
            if pid == 0:
                try:  # (the SSD tier sums rows in the order they land: compare to rounding)
                    ok = np.allclose(store.lookup(table, idx, off), want, rtol=1e-5, atol=1e-6)
                    os._exit(0 if ok else 1)
                finally:
                    os._exit(2)
            deadline = time.time() + 20
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    assert os.waitstatus_to_exitcode(status) == 0, "wrong rows in the child"
                    break
                if time.time() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    pytest.fail("a forked child deadlocked")
                time.sleep(0.002)
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert not errors, errors


@pytest.mark.parametrize("placement", ["dram", "ssd", "ssd-cache", "ssd-hot-cache", "auto-budget"])
def test_fork_with_lookups_in_flight_never_deadlocks(tmp_path, placement):
    path = tmp_path / "s"
    rows = 5_000
    nearrec.from_numpy(path, {"t": np.random.default_rng(1).standard_normal((rows, 16),
                                                                            dtype=np.float32)})
    options = {
        "dram": dict(tier="dram"),
        "ssd": dict(tier="ssd"),
        "ssd-cache": dict(tier="ssd", dram_budget="64KiB"),
        "ssd-hot-cache": dict(tier="ssd", plan={"t": {"hot_rows": list(range(0, rows, 7)),
                                                      "cache_bytes": "64KiB"}}),
        "auto-budget": dict(dram_budget="100KiB"),
    }[placement]
    fork_with_lookups_in_flight(nearrec.open(path, **options), "t", rows)


# ---- item 6: FIFOs where files should be ----------------------------------------------------


@pytest.mark.parametrize("which", ["MANIFEST", "table", "trace"])
def test_a_fifo_is_refused_without_blocking(tmp_path, which):
    path = tmp_path / "s"
    nearrec.from_numpy(path, {"t": np.ones((10, 4), np.float32)})
    trace = tmp_path / "t.nrtrace"
    target = {"MANIFEST": path / "MANIFEST", "table": path / nearrec.info(path).tables[0].file,
              "trace": trace}[which]
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    call = (f"nt.load({str(trace)!r})" if which == "trace"
            else f"nearrec.open({str(path)!r})")
    out = run_child(f"""
        import nearrec, nearrec.trace as nt
        from nearrec.errors import NearrecError
        try:
            {call}
        except NearrecError as e:
            print(type(e).__name__, e)
        """, timeout=30)
    assert out.returncode == 0, out.stderr
    expected = "InvalidTrace" if which == "trace" else "StoreCorrupted"
    assert out.stdout.startswith(expected) and "a FIFO, not a regular file" in out.stdout, \
        out.stdout


# ---- item 8: non-finite dense inputs --------------------------------------------------------


def test_offload_propagates_non_finite_dense_inputs_as_pytorch_does(tmp_path):
    import torch

    from nearrec.models import build, offload
    from nearrec.torch import KeyedJaggedTensor

    path = tmp_path / "rmc1"
    nearrec.build(path, "rmc1", rows=100, seed=1, progress=False)
    store = nearrec.open(path)
    model = build("rmc1", store, seed=3)
    off = offload(model)
    spec = nearrec.model_spec("rmc1")
    tables = list(store.tables)
    lengths = torch.full((4 * len(tables),), 2, dtype=torch.int64)
    kjt = KeyedJaggedTensor(tables, torch.arange(int(lengths.sum())) % 100, lengths)
    dense = torch.ones((4, spec.dense_features))
    dense[0, 0] = float("nan")
    dense[1, :] = float("inf")
    dense[2, :] = -float("inf")
    with torch.inference_mode():
        want = model(dense, kjt)
    got = off(dense, kjt)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=2e-6, equal_nan=True)
    assert torch.isnan(got[0]).all()


# ---- item 11: trace checksums ---------------------------------------------------------------


def test_a_flipped_bit_in_a_trace_is_refused(tmp_path):
    path = tmp_path / "t.nrtrace"
    t = nt.generate({"a": 1000, "b": 50}, bags=200, pooling=4,
                    generator=nt.Generator.uniform()).save(path)
    data = bytearray(path.read_bytes())
    header = json.loads(data[24:24 + struct.unpack_from("<I", data, 12)[0]])
    flips = [header["tables"][1]["indices_at"] + 8 * 3,  # index 3 of b: 0..49, stays in range
             header["tables"][0]["offsets_at"] + 8 * 7 + 1, 30]  # an offset; the header
    for at in flips:
        bad = bytearray(data)
        bad[at] ^= 0x01
        path.write_bytes(bad)
        with pytest.raises(InvalidTrace, match="checksum"):
            nt.load(path)
    assert t.verified


def test_a_version_1_trace_still_loads_unverified(tmp_path):
    offsets = np.array([0, 2, 3], np.int64)
    indices = np.array([5, 6, 7], np.int64)
    entry = {"name": "a", "rows": 10, "pooling": 2, "generator": None,
             "first_reference_share": None, "lookups": 3, "offsets_at": 0, "indices_at": 0}
    header = {"bags": 2, "batch_size": 2, "seed": 0, "tables": [entry]}
    entry["offsets_at"] = 256
    entry["indices_at"] = 320
    text = json.dumps(header).encode()
    assert 16 + len(text) <= 256
    blob = bytearray(384)
    blob[:16] = b"NRTRACE\0" + struct.pack("<II", 1, len(text))
    blob[16:16 + len(text)] = text
    blob[256:256 + 24] = offsets.tobytes()
    blob[320:320 + 24] = indices.tobytes()
    path = tmp_path / "v1.nrtrace"
    path.write_bytes(bytes(blob))
    t = nt.load(path)
    assert not t.verified
    np.testing.assert_array_equal(t["a"].indices, indices)


def test_a_trace_naming_a_table_twice_is_refused(tmp_path):
    a = nt.generate_table("a", 10, 2, 5, nt.Generator.uniform())
    with pytest.raises(NearrecError, match="twice"):
        nt.Trace({"a": a, "b": a}, 2).save(tmp_path / "t.nrtrace")


def test_errors_above_are_nearrec_errors():
    for cls in (InsufficientMemory, InternalError, StoreCorrupted, InvalidTrace):
        assert issubclass(cls, NearrecError)


# ---- item 7: integrity on the read path -----------------------------------------------------


def corrupt_store(root: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A store of every dtype; see `damage` for what is done to it."""
    rng = np.random.default_rng(7)
    arrays = {"f32": rng.standard_normal((600, 32), dtype=np.float32),
              "f16": rng.standard_normal((500, 16), dtype=np.float32),
              "i8": rng.standard_normal((700, 5), dtype=np.float32)}
    path = root / "s"
    nearrec.from_numpy(path, arrays, dtype={"f32": "fp32", "f16": "fp16", "i8": "int8"})
    return path, arrays


OPENINGS = {
    "ssd": dict(tier="ssd"),
    "auto-over-budget": dict(dram_budget="16KiB"),
    "ssd-cache": dict(tier="ssd", dram_budget="32KiB"),
    "no-load-checks": dict(tier="ssd", verify_checksums=False),
    "flash-model": dict(tier="ssd", device="rm-ssd"),
}


SWEEP = [("f32", "flip", 3 * 128 + 3), ("f32", "zero", 40 * 128), ("f16", "flip", 100 * 32 + 1),
         ("i8", "flip", 5 * 13 + 2), ("i8", "zero", 0)]


@pytest.mark.parametrize("opening", OPENINGS)
@pytest.mark.parametrize(("table", "how", "at"), SWEEP)
def test_damaged_rows_are_never_served(tmp_path, opening, table, how, at):
    path, arrays = corrupt_store(tmp_path)
    damage(path, table, how, at)
    store = nearrec.open(path, **OPENINGS[opening])
    assert store.tier == "ssd"
    rows = arrays[table].shape[0]
    idx = np.arange(rows)
    with pytest.raises(StoreCorrupted, match="corrupted on disk") as e:
        store.lookup(table, idx, np.arange(0, rows, 4))
    assert e.value.table == table
    assert store.stats()["corrupt_reads"] >= 1
    assert store.stats()["unprotected_tables"] == 0
    # the other tables still serve
    other = "f16" if table != "f16" else "f32"
    n = arrays[other].shape[0]
    store.lookup(other, np.arange(n), np.arange(n))


def scraped(metrics: str) -> dict[tuple[str, str], float]:
    """A node's ``/metrics`` read with Prometheus's own parser: (sample, store) → value."""
    from nearrec_bench.served import scrape

    return {(s.name, s.labels.get("store", "")): s.value
            for f in scrape(metrics) for s in f.samples}


@pytest.mark.parametrize(("table", "how", "at"), SWEEP)
def test_damaged_rows_are_never_served_by_a_node_and_its_scrub_finds_them(
        tmp_path, table, how, at):
    from nearrec_bench.served import node

    path, arrays = corrupt_store(tmp_path)
    damage(path, table, how, at)
    with node(path, "s", "--tier", "ssd", "--scrub-rate", "64MiB") as served:
        store = nearrec.connect(served.address, "s")
        rows = arrays[table].shape[0]
        with pytest.raises(StoreCorrupted, match="corrupted on disk") as e:
            store.lookup(table, np.arange(rows), np.arange(0, rows, 4))
        assert e.value.table == table
        other = "f16" if table != "f16" else "f32"
        n = arrays[other].shape[0]
        want = nearrec.open(path, tier="dram", verify_checksums=False).lookup(
            other, np.arange(n), np.arange(n))
        np.testing.assert_array_equal(store.lookup(other, np.arange(n), np.arange(n)), want)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = scraped(served.metrics)
            if m.get(("nearrec_scrub_passes_total", "s"), 0) >= 1:
                break
            time.sleep(0.1)
        assert m[("nearrec_corrupt_reads_total", "s")] >= 1
        assert m[("nearrec_scrub_damaged_total", "s")] >= 1
        assert m[("nearrec_scrub_last_damaged", "s")] == 1
        store.close()


def test_a_scrub_finds_damage_where_nobody_reads_and_stops_with_its_store(tmp_path):
    path, _ = corrupt_store(tmp_path)
    store = nearrec.open(path, tier="ssd", scrub_rate="16MiB")
    deadline = time.monotonic() + 30
    while store.live_stats()["scrub_passes"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = store.live_stats()
    data = sum(t.rows * t.dim for t in nearrec.info(path).tables)  # at least a byte a value
    assert stats["scrub_passes"] >= 1 and stats["scrub_bytes"] >= data, stats
    assert stats["scrub_damaged"] == 0 and stats["scrub_rate"] == 16 << 20
    # a row nobody reads is damaged under the serving store: the next pass finds it
    damage(path, "f16", "flip", 300 * 32 + 5)
    passes = stats["scrub_passes"]
    while store.live_stats()["scrub_passes"] < passes + 2 and time.monotonic() < deadline + 30:
        time.sleep(0.05)
    stats = store.live_stats()
    assert stats["scrub_damaged"] >= 1 and stats["scrub_last_damaged"] == 1, stats
    # and the store serves on: the other tables, and the damaged one's sound rows
    store.lookup("f32", np.arange(600), np.arange(600))
    store.lookup("f16", np.arange(10), np.arange(10))
    # one pass by hand, at a rate, names the sector; the command says BAD and exits 1
    checks = {c.table: c for c in nearrec.scrub(path, "64MiB")}
    assert checks["f32"].ok and not checks["f16"].ok
    assert f"sector {(300 * 32 + 5) // 512} " in checks["f16"].error, checks["f16"].error
    out = subprocess.run([sys.executable, "-m", "nearrec.cli", "scrub", str(path), "--rate",
                          "0"], capture_output=True, text=True)
    assert out.returncode == 1 and "BAD f16" in out.stdout, out.stdout + out.stderr
    # closed, the scrub stops
    store.close()
    time.sleep(0.3)
    stopped = store.live_stats()["scrub_bytes"]
    time.sleep(0.5)
    assert store.live_stats()["scrub_bytes"] == stopped


def test_a_damaged_hot_row_is_refused_at_open(tmp_path):
    path, _ = corrupt_store(tmp_path)
    damage(path, "f32", "flip", 10 * 128)
    with pytest.raises(StoreCorrupted, match="row 10"):
        nearrec.open(path, tier="ssd", plan={"f32": {"hot_rows": [1, 10, 20]}})


def test_verify_reads_off_is_an_explicit_choice(tmp_path):
    path, _ = corrupt_store(tmp_path)
    damage(path, "f32", "flip", 3 * 128 + 3)
    store = nearrec.open(path, tier="ssd", verify_reads=False)
    out = store.lookup("f32", np.array([3]), np.array([0]))  # served, as asked
    assert out.shape == (1, 32)
    assert store.stats()["unprotected_tables"] == 3
    # verify names the sector
    checks = {c.table: c for c in nearrec.verify(path)}
    assert not checks["f32"].ok and "sector 0" in checks["f32"].error


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_older_stores_open_and_say_they_are_unprotected(version):
    path = Path(__file__).parent / "fixtures" / version
    info = nearrec.info(path)
    assert not any(t.protected for t in info.tables)
    store = nearrec.open(path, tier="ssd")
    assert store.stats()["unprotected_tables"] == len(info.tables)
    t = info.tables[0]
    store.lookup(t.name, np.arange(t.rows), np.arange(t.rows))


def test_new_stores_are_protected(tmp_path):
    path, _ = corrupt_store(tmp_path)
    info = nearrec.info(path)
    assert info.format_version == 3 and all(t.protected for t in info.tables)


# ---- item 14: what killed writers leave ------------------------------------------------------


def killed_build(root: Path, name: str) -> None:
    """A child that starts building ``root / name`` and is killed (SIGKILL) half-way."""
    out = run_child(f"""
        import os, signal, numpy as np, nearrec._native as n
        w = n.NativeStoreWriter({str(root / name)!r})
        w.begin_table("t", 1000, 64)
        w.write_f32(np.ones((1000, 64), np.float32))
        os.kill(os.getpid(), signal.SIGKILL)
        """)
    assert out.returncode == -signal.SIGKILL, out.stderr


def temps(root: Path) -> list[Path]:
    return sorted(root.glob(".*.nrtmp-*"))


def test_a_build_sweeps_what_killed_builds_of_any_name_left(tmp_path):
    def left() -> list[str]:
        return [p.name.split(".nrtmp")[0] for p in temps(tmp_path)]

    killed_build(tmp_path, "a")
    assert left() == [".a"]
    killed_build(tmp_path, "b")  # its start swept a's
    assert left() == [".b"]
    nearrec.from_numpy(tmp_path / "other", {"t": np.ones((10, 4), np.float32)})
    assert left() == []


def test_gc_keeps_a_build_in_progress_and_an_interrupted_commit(tmp_path):
    live = nearrec._native.NativeStoreWriter(str(tmp_path / "live"))  # this process's, open
    # a finished store whose commit was cut between its renames (no target): the only copy
    nearrec.from_numpy(tmp_path / "done", {"t": np.ones((10, 4), np.float32)})
    (tmp_path / "done").rename(tmp_path / ".done.nrtmp-1-2")
    killed_build(tmp_path, "dead")  # (its own start swept nothing: the others are kept)
    assert len(temps(tmp_path)) == 3
    report = nearrec.gc(tmp_path)
    assert [x.path.name.split(".nrtmp")[0] for x in report.removed] == [".dead"]
    kept = {x.path.name.split(".nrtmp")[0]: x.reason for x in report.kept}
    assert "in progress" in kept[".live"] and "rename it" in kept[".done"]
    del live


def test_verify_reports_what_a_killed_attach_left_and_gc_removes_it(tmp_path):
    path = tmp_path / "s"
    nearrec.from_numpy(path, {"t": np.ones((10, 4), np.float32)})
    nearrec.attach(path, "model.json", b"{}")
    # what an attach killed after writing its blob, before the manifest named it, leaves
    (path / "attach-0007-dense.npz").write_bytes(b"x" * 4096)
    (path / ".MANIFEST.tmp-123").write_bytes(b"y" * 100)
    (path / "notes.txt").write_text("the user's own file")
    bad = [c for c in nearrec.verify(path) if not c.ok]
    assert sorted(Path(c.table.split()[-1]).name for c in bad) == [
        ".MANIFEST.tmp-123", "attach-0007-dense.npz"]
    report = nearrec.gc(path)
    assert sorted(x.path.name for x in report.removed) == [".MANIFEST.tmp-123",
                                                           "attach-0007-dense.npz"]
    assert [x.path.name for x in report.kept] == ["notes.txt"]
    assert report.removed_bytes == 4096 + 100
    assert all(c.ok for c in nearrec.verify(path))
    assert nearrec.read_attachment(path, "model.json") == b"{}"


def test_gc_from_the_cli(tmp_path):
    killed_build(tmp_path, "dead")
    out = subprocess.run([sys.executable, "-m", "nearrec.cli", "gc", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["removed"]) == 1 and temps(tmp_path) == []


# ---- item 15: a store's files are inside it -------------------------------------------------


@pytest.mark.parametrize("which", ["table", "MANIFEST", "sums", "attachment"])
def test_a_symlinked_store_file_is_refused(tmp_path, which):
    path = tmp_path / "s"
    nearrec.from_numpy(path, {"t": np.ones((10, 4), np.float32)})
    nearrec.attach(path, "model.json", b"{}")
    t = nearrec.info(path).tables[0]
    name = {"table": t.file, "MANIFEST": "MANIFEST", "sums": t.sums["file"],
            "attachment": next(p.name for p in path.glob("attach-*"))}[which]
    outside = tmp_path / "elsewhere"
    (path / name).rename(outside)  # the same bytes, now outside the store, linked back in
    (path / name).symlink_to(outside)
    with pytest.raises(StoreCorrupted, match="symbolic link|not a regular file"):
        nearrec.open(path, tier="ssd")


def test_the_store_directory_itself_may_be_a_link(tmp_path):
    path = tmp_path / "v1"
    nearrec.from_numpy(path, {"t": np.ones((10, 4), np.float32)})
    (tmp_path / "current").symlink_to(path)
    assert nearrec.open(tmp_path / "current").lookup("t", [1], [0]).shape == (1, 4)


@pytest.mark.parametrize("reader", ["from_numpy npy", "plan file", "keyed table", "criteo",
                                    "cli --indices", "calibrate"])
def test_python_readers_refuse_a_fifo_without_blocking(tmp_path, reader):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    call = {
        "from_numpy npy": f"nearrec.from_numpy({str(tmp_path / 's')!r}, {{'t': {str(fifo)!r}}})",
        "plan file": f"nearrec.plan.load_plan({str(fifo)!r})",
        "keyed table": f"nearrec.KeyedTable.load({str(fifo)!r})",
        "criteo": f"nearrec.datasets.criteo({str(fifo)!r})",
        "cli --indices": "nearrec.cli.main(['lookup', S, '--indices', F])",
        "calibrate": f"nearrec.simulate.calibrate([{str(fifo)!r}])",
    }[reader]
    store = tmp_path / "store"
    nearrec.from_numpy(store, {"t": np.ones((10, 4), np.float32)})
    out = run_child(f"""
        import nearrec, nearrec.plan, nearrec.datasets, nearrec.simulate, nearrec.cli
        from nearrec.errors import NearrecError
        S, F = {str(store)!r}, {str(fifo)!r}
        try:
            rc = {call}
            print("returned", rc)
        except NearrecError as e:
            print(type(e).__name__, e)
        """, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "a FIFO, not a regular file" in out.stdout + out.stderr, out.stdout + out.stderr


# ---- item 12: weights that overflow fp32 ------------------------------------------------------


@pytest.mark.parametrize("tier", ["dram", "ssd"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "fp8"])
def test_overflowing_weights_give_infinities_where_torch_does(tmp_path, tier, dtype):
    # (row-wise quantised rows sum as FBGEMM's TBE sums them, the weight folded into scale and
    # bias: held to FBGEMM, overflowing weights included, in test_quantized.py)
    import torch

    rng = np.random.default_rng(3)
    rows = rng.standard_normal((64, 8), dtype=np.float32) * 4
    path = tmp_path / "s"
    nearrec.from_numpy(path, {"t": rows}, dtype=dtype)
    store = nearrec.open(path, tier=tier)
    weight = torch.from_numpy(store.read_rows("t", np.arange(64)))  # the stored (decoded) rows
    bags, size = 400, 4
    idx = rng.integers(0, 64, bags * size)
    off = np.arange(0, bags * size, size)
    w = (rng.choice([-1.0, 1.0], bags * size) * 10.0 ** rng.uniform(36, 38.5, bags * size)
         ).astype(np.float32)
    got = store.lookup("t", idx, off, per_sample_weights=w)
    want = torch.nn.functional.embedding_bag(torch.from_numpy(idx), weight, torch.from_numpy(off),
                                             mode="sum", per_sample_weights=torch.from_numpy(w))
    want = want.numpy()
    assert np.isinf(want).any() and np.isnan(want).sum() < want.size  # the case is exercised
    # With the fused step no NaN comes from finite weights and rows, in any order (rounding
    # the product first gave -inf + inf = NaN).
    assert not np.isnan(got).any() and not np.isnan(want).any()
    if tier == "dram":  # rows added in index order, as torch adds them: the same infinities
        np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
        np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    # (The SSD tier adds rows in the order their reads land: where a bag's partial sums pass
    # f32::MAX, which of them overflow, and so the sign of the infinity, depends on that order.)
    both = np.isfinite(want) & np.isfinite(got)
    assert both.mean() > 0.3  # enough finite cells to compare
    # (terms of ~1e38 summed in another order round differently: a few ulps of the terms)
    np.testing.assert_allclose(got[both], want[both], rtol=1e-5, atol=1e33)


def corruption_sweep(root: Path, flips: int, seed: int) -> dict[str, int]:
    """Flips one random bit in a random place of a random table's data, sums or order file,
    ``flips`` times (each on a fresh copy of the store); every lookup of every row afterwards must
    raise StoreCorrupted or return the stored rows exactly: never a wrong row."""
    import shutil

    rng = np.random.default_rng(seed)
    base, arrays = corrupt_store(root)
    nearrec.from_numpy(root / "c_src", {"f32": arrays["f32"]})
    colocated = nearrec.plan.colocate(root / "c_src", nt.generate(
        {"f32": 600}, bags=200, pooling=4, generator=nt.Generator.zipf(1.1)), root / "c")
    outcomes = {"refused at open": 0, "refused at lookup": 0, "served exactly": 0}
    stores = [(base, {n: nearrec.open(base, tier="dram").read_rows(n, np.arange(a.shape[0]))
                      for n, a in arrays.items()}),
              (colocated.path, {"f32": nearrec.open(colocated.path, tier="dram").read_rows(
                  "f32", np.arange(600))})]
    for k in range(flips):
        src, want = stores[k % 2]
        path = root / f"flip{k}"
        shutil.copytree(src, path)
        t = nearrec.info(path).tables[int(rng.integers(len(want)))]
        targets = [(t.file, 4096), (t.sums["file"], 0)] + (
            [(t.order["file"], 0)] if t.order else [])
        name, start = targets[int(rng.integers(len(targets)))]
        f = path / name
        data = bytearray(f.read_bytes())
        at = int(rng.integers(start, len(data)))
        data[at] ^= 1 << int(rng.integers(8))
        f.write_bytes(bytes(data))
        try:
            store = nearrec.open(path, tier="ssd", **({"dram_budget": "8KiB"} if k % 3 else {}))
        except StoreCorrupted:
            outcomes["refused at open"] += 1
            continue
        try:
            for n, rows in want.items():
                got = store.lookup(n, np.arange(rows.shape[0]), np.arange(rows.shape[0]))
                np.testing.assert_array_equal(got, rows, err_msg=f"{name} byte {at}: wrong rows")
        except StoreCorrupted:
            outcomes["refused at lookup"] += 1
            continue
        outcomes["served exactly"] += 1  # the bit was padding, or in an unread sector's tail
        shutil.rmtree(path)
    return outcomes


def test_random_corruptions_are_never_served(tmp_path):
    outcomes = corruption_sweep(tmp_path, flips=200, seed=0)
    assert outcomes["refused at lookup"] > 0 and outcomes["refused at open"] > 0, outcomes


@pytest.mark.slow
def test_random_corruptions_are_never_served_sweep(tmp_path):
    outcomes = corruption_sweep(tmp_path, flips=5000, seed=1)
    assert sum(outcomes.values()) == 5000, outcomes


def test_a_keyed_table_larger_than_memory_is_a_typed_error():
    with pytest.raises(InsufficientMemory, match="keyed table"):
        nearrec.KeyedTable("k", 4096, 2**26)  # 1 TiB of rows


def test_a_trace_larger_than_memory_is_a_typed_error():
    with pytest.raises(InsufficientMemory, match="trace of"):
        nt.generate({"a": 100}, bags=10**12, pooling=80, generator=nt.Generator.uniform())


def test_a_cache_study_larger_than_its_trace_is_capped():
    ids = np.arange(1000, dtype=np.int64).repeat(2)
    hits, misses, *_ = nearrec._native.cache_simulate(ids, 2**40)  # 2^40 rows asked
    assert (hits, misses) == (1000, 1000)  # every row fits: its second read hits
