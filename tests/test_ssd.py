"""The SSD tier against the DRAM tier (itself held to torch.nn.EmbeddingBag by test_parity): the
same requests must give the same pooled output — bit for bit for max, within fp32 rounding where
rows arrive in another order — and the same typed errors, with the reads accounted."""

from __future__ import annotations

import itertools
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import TABLES, make_store

import nearrec


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[nearrec.Store, nearrec.Store]:
    path, _ = make_store(tmp_path_factory.mktemp("ssd"))
    return nearrec.open(path), nearrec.open(path, tier="ssd")


def same(got: np.ndarray, want: np.ndarray, mode: str) -> None:
    assert got.shape == want.shape and got.dtype == np.float32
    if mode == "max":
        np.testing.assert_array_equal(got, want)
    else:
        # the tiers may add a bag's rows in another order (the SSD tier pools rows as their
        # reads land): a float32 sum of up to 11 rows of magnitude ≤ 4 differs by up to ~3e-6
        # where the terms cancel (a CI run met 1.1e-6 at a sum of 0.011)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=5e-6)


@pytest.mark.parametrize("table", [t[0] for t in TABLES])
@pytest.mark.parametrize("mode,include_last,padding,weighted", [
    (m, ilo, p, w)
    for m, ilo, p, w in itertools.product(["sum", "mean", "max"], [False, True], [None, 3, -1],
                                          [False, True])
    if not (w and m != "sum")
])
def test_ssd_matches_dram(stores, table, mode, include_last, padding, weighted):
    dram, ssd = stores
    # a seed of the case's own (str hashes change from process to process: a failure would
    # not come back)
    case = repr((table, mode, include_last, padding, weighted)).encode()
    rng = np.random.default_rng(zlib.crc32(case))
    rows = dram.table(table).rows
    lengths = rng.integers(0, 12, 40)
    lengths[rng.random(40) < 0.2] = 0
    # repeats, within and across bags, so de-duplication has work
    idx = rng.integers(0, rows, int(lengths.sum())) // 3
    if padding is not None and idx.size:
        idx[rng.random(idx.size) < 0.3] = padding % rows
    offsets = np.cumsum(lengths) - lengths
    if include_last:
        offsets = np.append(offsets, idx.size)
    w = rng.random(idx.size).astype(np.float32) if weighted else None
    kw = dict(per_sample_weights=w, mode=mode, include_last_offset=include_last,
              padding_idx=padding)
    same(ssd.lookup(table, idx, offsets, **kw), dram.lookup(table, idx, offsets, **kw), mode)


def test_batched_tables_2d_and_empty(stores):
    dram, ssd = stores
    rng = np.random.default_rng(1)
    reqs = [nearrec.TableLookup(t, rng.integers(0, rows, (16, 5))) for t, rows, _, _ in TABLES]
    reqs.append(nearrec.TableLookup(TABLES[0][0], np.zeros((16, 0), np.int64)))
    got, want = ssd.lookup_many(reqs), dram.lookup_many(reqs)
    same(got.values, want.values, "sum")
    np.testing.assert_array_equal(got.values[:, -TABLES[0][2]:], 0)


def test_read_rows_and_single_row_bags_are_exact(stores):
    dram, ssd = stores
    for t, rows, _, _ in TABLES:
        ids = np.arange(rows)[::-1].copy()
        np.testing.assert_array_equal(ssd.read_rows(t, ids), dram.read_rows(t, ids))
        one = np.arange(rows).reshape(-1, 1)
        np.testing.assert_array_equal(ssd.lookup(t, one, mode="max"), dram.lookup(t, one))


def test_bad_index_is_typed_and_reads_nothing(stores):
    _, ssd = stores
    before = ssd.stats()["device_reads"]
    with pytest.raises(nearrec.IndexOutOfRange) as e:
        ssd.lookup("f32_d32", np.array([1, 2, 300, 4]), np.array([0, 2]))
    assert e.value.table == "f32_d32" and e.value.position == 2
    assert "bag 1" in str(e.value)
    with pytest.raises(nearrec.IndexOutOfRange):
        ssd.lookup("f32_d32", np.array([-1]), np.array([0]))
    assert ssd.stats()["device_reads"] == before


def test_stats_account_every_read(tmp_path):
    path, _ = make_store(tmp_path)
    ssd = nearrec.open(path, tier="ssd")
    dram = nearrec.open(path).stats()  # a DRAM-resident store: no SSD tier to account
    assert dram["device"] == "dram" and "device_reads" not in dram and dram["version"] == 0
    rows = ssd.table("f32_d32").rows
    # 100 bags of 8 lookups over 20 distinct rows: de-duplication saves 780 reads
    idx = np.tile(np.arange(0, 20) * 7 % rows, 40)
    ssd.lookup("f32_d32", idx, np.arange(0, 800, 8))
    s = ssd.stats()
    assert s["device"] in ("io_uring", "pread") and s["block_bytes"] >= 512
    assert s["lookups"] == 800 and s["unique_rows"] == 20
    assert s["reads_saved_dedup"] == 780
    assert s["device_reads"] + s["reads_saved_merge"] == 20
    assert s["useful_bytes"] == 20 * 128
    assert s["bytes_read"] >= s["useful_bytes"] and s["bytes_read"] % s["block_bytes"] == 0
    assert s["read_amplification"] == pytest.approx(s["bytes_read"] / s["useful_bytes"])
    assert s["batches"] == 1 and s["end_to_end_p50_us"] > 0
    for stage in ("route", "io_wait", "pool", "end_to_end"):
        assert {f"{stage}_{q}_us" for q in ("p50", "p95", "p99", "p999")} <= s.keys()


def test_merge_gap_merges_neighbouring_blocks(tmp_path):
    path, _ = make_store(tmp_path)
    rows = np.arange(0, 300, 40)  # f32_d32: 128 B rows, 32 to a 4 KiB block: 1.25 blocks apart
    plain = nearrec.open(path, tier="ssd")
    merged = nearrec.open(path, tier="ssd", merge_gap_bytes=8192)
    a = plain.lookup("f32_d32", rows, np.arange(rows.size))
    b = merged.lookup("f32_d32", rows, np.arange(rows.size))
    np.testing.assert_array_equal(a, b)
    assert merged.stats()["device_reads"] < plain.stats()["device_reads"] == rows.size


def test_ssd_tier_in_a_forked_child(stores):
    dram, ssd = stores
    idx, off = np.arange(50), np.arange(0, 50, 5)
    want = dram.lookup("f16_d16", idx, off)
    ssd.lookup("f16_d16", idx, off)  # the parent's rings / threads exist before the fork
    pid = os.fork()
    if pid == 0:
        ok = np.array_equal(ssd.lookup("f16_d16", idx, off), want)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_bad_tier_and_array_view(tmp_path):
    path, _ = make_store(tmp_path)
    with pytest.raises(nearrec.InvalidRequest, match="tier"):
        nearrec.open(path, tier="tape")  # type: ignore[arg-type]
    ssd = nearrec.open(path, tier="ssd")
    assert ssd.tier == "ssd"
    with pytest.raises(nearrec.InvalidRequest, match="SSD"):
        ssd.table_array("f32_d32")


def test_dedup_and_merge_can_be_turned_off_for_comparisons(tmp_path):
    path, _ = make_store(tmp_path)
    plain = nearrec.open(path, tier="ssd", dedup=False, merge=False)
    rng = np.random.default_rng(5)
    idx = rng.integers(0, 300, 400) // 10  # many repeats, many rows sharing blocks
    off = np.arange(0, 400, 4)
    want = nearrec.open(path).lookup("f32_d32", idx, off)
    same(plain.lookup("f32_d32", idx, off), want, "sum")
    s = plain.stats()
    assert s["device_reads"] == s["lookups"] == 400
    assert s["reads_saved_dedup"] == s["reads_saved_merge"] == 0


@pytest.mark.parametrize("form", ["offsets", "offsets+last", "lengths", "2d", "weighted"])
def test_sub_batches_and_submitted_batches_equal_one_call(stores, form):
    dram, ssd = stores
    rng = np.random.default_rng(11)
    lengths = rng.integers(0, 9, 100)
    idx = rng.integers(0, 150, int(lengths.sum()))
    off = np.cumsum(lengths) - lengths
    reqs = {
        "offsets": [nearrec.TableLookup("f32_d32", idx, off, mode="mean")],
        "offsets+last": [nearrec.TableLookup("f32_d32", np.append(idx, [1, 2]),
                                             np.append(off, idx.size), include_last_offset=True)],
        "lengths": [nearrec.TableLookup("f16_d16", idx, lengths=lengths, mode="max")],
        "2d": [nearrec.TableLookup("bf16_d64", rng.integers(0, 150, (100, 4))),
               nearrec.TableLookup("i8_d32", rng.integers(0, 150, (100, 4)))],
        "weighted": [nearrec.TableLookup("f32_d7", idx, off,
                                         per_sample_weights=rng.random(idx.size, np.float32))],
    }[form]
    mode = reqs[0].mode
    want = dram.lookup_many(reqs).values
    for store in (dram, ssd):
        same(store.lookup_many(reqs, sub_batch=7).values, want, mode)
        handles = [store.submit(reqs) for _ in range(3)]
        for h in handles:
            same(h.result(timeout=60).values, want, mode)
        got = list(store.lookup_stream([reqs, reqs, reqs], depth=2))
        assert len(got) == 3
        for g in got:
            same(g.values, want, mode)


def test_a_submitted_batch_raises_its_own_typed_error(stores):
    _, ssd = stores
    bad = ssd.submit([nearrec.TableLookup("f32_d32", np.array([1, 999]), np.array([0]))])
    good = ssd.submit([nearrec.TableLookup("f32_d32", np.array([1, 2]), np.array([0]))])
    with pytest.raises(nearrec.IndexOutOfRange):
        bad.result(timeout=60)
    assert good.result(timeout=60).values.shape == (1, 32)
    # malformed requests are not cut into sub-batches: the engine names the fault
    with pytest.raises(nearrec.InvalidRequest, match="offset"):
        ssd.lookup_many([nearrec.TableLookup("f32_d32", np.array([1, 2]), np.array([1]))],
                        sub_batch=1)


def test_one_handle_waited_on_from_many_threads(stores):
    """Every thread waiting on one Pending gets the same answer (or the same error), and a
    timeout gives the handle back for the next wait."""
    import threading

    _, ssd = stores
    req = [nearrec.TableLookup("f32_d32", np.arange(2000) % 150, np.arange(0, 2000, 20))]
    want = ssd.lookup_many(req).values
    for bad in (False, True):
        reqs = [nearrec.TableLookup("f32_d32", np.array([1, 999]), np.array([0]))] if bad \
            else req
        h = ssd.submit(reqs)
        got: list = []

        def wait(h=h, got=got) -> None:
            try:
                got.append(h.result(timeout=60).values)
            except nearrec.IndexOutOfRange as e:
                got.append(e)

        threads = [threading.Thread(target=wait) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert len(got) == 4 and h.done()
        for g in got:
            if bad:
                assert isinstance(g, nearrec.IndexOutOfRange) and g.position == 1
            else:
                np.testing.assert_array_equal(g, want)
    slow = ssd.submit([nearrec.TableLookup("f32_d32", np.arange(200_000) % 150,
                                           np.arange(0, 200_000, 20))])
    try:
        slow.result(timeout=0)
    except TimeoutError:
        pass  # not done yet: the handle is still good
    assert slow.result(timeout=60).values.shape == (10_000, 32)


def test_auto_tier_follows_the_dram_budget(tmp_path):
    path, _ = make_store(tmp_path)
    total = nearrec.info(path).total_bytes
    assert nearrec.open(path).tier == "dram"  # small store, default budget: half of memory
    assert nearrec.open(path, dram_budget=total).tier == "dram"
    assert nearrec.open(path, dram_budget=total - 1).tier == "ssd"
    assert nearrec.open(path, dram_budget="1KiB").tier == "ssd"
    assert nearrec.open(path, tier="dram", dram_budget=1).tier == "dram"  # explicit wins
    with pytest.raises(nearrec.InvalidRequest, match="not a size"):
        nearrec.open(path, dram_budget="lots")


def test_io_knobs_are_checked(tmp_path):
    path, _ = make_store(tmp_path)
    small = nearrec.open(path, tier="ssd", io_rings=1, io_queue_depth=4, pread_threads=2)
    want = nearrec.open(path).lookup("f32_d32", np.arange(100), np.arange(0, 100, 10))
    same(small.lookup("f32_d32", np.arange(100), np.arange(0, 100, 10)), want, "sum")
    for bad, msg in [({"io_rings": 0}, "io_rings"), ({"io_queue_depth": 0}, "io_queue_depth"),
                     ({"pread_threads": 0}, "pread_threads")]:
        with pytest.raises(nearrec.InvalidRequest, match=msg):
            nearrec.open(path, tier="ssd", **bad)


def _logical_sector(path: Path) -> int | None:
    """The logical sector size of the block device under ``path`` (from sysfs), or None where
    there is none (tmpfs, an overlay)."""
    st = os.stat(path)
    dev = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
    for queue in (dev / "queue", dev / ".." / "queue"):  # a partition's queue is its disk's
        if (queue / "logical_block_size").exists():
            return int((queue / "logical_block_size").read_text())
    return None


def test_a_row_costs_one_512_byte_sector_where_the_device_has_them(tmp_path):
    """Vector-grained reads: on a device with 512 B logical sectors, a 128 B row far from any
    other is one 512 B read (a 4 KiB page read, or a block size taken from anywhere but the
    device, fails here)."""
    sector = _logical_sector(tmp_path)
    if sector != 512:
        pytest.skip(f"needs a file system on a device with 512 B logical sectors, not {sector}")
    path, arrays = make_store(tmp_path)
    ssd = nearrec.open(path, tier="ssd", merge_gap_bytes=0)
    rows = np.arange(0, 300, 40)  # 128 B rows 5 KiB apart: no two share or neighbour a sector
    out = ssd.lookup("f32_d32", rows, np.arange(len(rows)))
    np.testing.assert_allclose(out, arrays["f32_d32"][rows], rtol=1e-6)
    s = ssd.stats()
    assert s["direct_io"] and s["block_bytes"] == 512, s
    assert s["device_reads"] == len(rows) and s["bytes_read"] == 512 * len(rows), s
