"""Faults under the SSD tier and the builder: typed errors, no hang, nothing half-done visible,
and the store usable again once the fault is gone. (Injected device faults — EIO and short
reads mid-batch — are tested in Rust: crates/nearrec-engine/tests/ssd_faults.rs.)"""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest
from conftest import make_store

import nearrec


def test_table_truncated_under_an_open_store_then_restored(tmp_path):
    path, _ = make_store(tmp_path)
    dram = nearrec.open(path)
    ssd = nearrec.open(path, tier="ssd")
    info = next(t for t in ssd.info.tables if t.name == "f32_d32")
    table_file = path / info.file
    original = table_file.read_bytes()
    idx, off = np.arange(200, 300), np.arange(0, 100, 10)
    want = dram.lookup("f32_d32", idx, off)
    with open(table_file, "r+b") as f:  # same inode, as a failing disk or a careless cp would
        f.truncate(4096 + 100 * info.row_bytes)
    with pytest.raises(nearrec.StoreIOError) as e:
        ssd.lookup("f32_d32", idx, off)
    assert isinstance(e.value, OSError) and info.file in str(e.value)
    # the other tables are untouched, and rows before the cut still read
    np.testing.assert_array_equal(ssd.lookup("f16_d16", idx[:50] - 200, off[:5]),
                                  dram.lookup("f16_d16", idx[:50] - 200, off[:5]))
    with open(table_file, "r+b") as f:
        f.write(original)
    np.testing.assert_allclose(ssd.lookup("f32_d32", idx, off), want, rtol=1e-6)


def test_table_replaced_under_an_open_store_keeps_serving_the_opened_file(tmp_path):
    path, _ = make_store(tmp_path)
    ssd = nearrec.open(path, tier="ssd")
    idx, off = np.arange(0, 40), np.arange(0, 40, 4)
    want = ssd.lookup("f32_d32", idx, off)
    table_file = path / next(t.file for t in ssd.info.tables if t.name == "f32_d32")
    fresh = table_file.with_suffix(".new")
    fresh.write_bytes(b"\0" * table_file.stat().st_size)
    os.replace(fresh, table_file)  # a new inode at the old name
    np.testing.assert_array_equal(ssd.lookup("f32_d32", idx, off), want)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("mount") is None, reason="needs root")
def test_disk_full_while_building_leaves_nothing(tmp_path):
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tiny)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        with pytest.raises(nearrec.StoreIOError) as e:
            nearrec.build(tiny / "store", "rmc1", rows=20_000, progress=False)
        assert "No space left" in str(e.value)
        assert list(tiny.iterdir()) == []  # no store, no temporary directory
        nearrec.build(tiny / "small", "rmc1", rows=500, progress=False)  # space again: works
        assert nearrec.open(tiny / "small").table("t0").rows == 500
    finally:
        subprocess.run(["umount", str(tiny)], check=False)
