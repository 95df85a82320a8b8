"""`nearrec bench e2e`'s arithmetic: the ratios and each SSD cell's time against its floor, from
records whose numbers are known."""

from __future__ import annotations

import pytest

from nearrec_bench.e2e import markdown, summarise
from nearrec_bench.report import Record


def rec(place: str, system: str, sps: float, **extra: float) -> Record:
    return Record("e2e", "rmc3", 64, place, system, sps, sps * 200, 1000.0, 2000.0,
                  extra={"breakdown_per_batch_us": {"embedding_wait": 1.0}, **extra})


def test_ratios_and_floors():
    records = [
        rec("dram", "torch", 1000.0, dense_per_batch_us=5000.0),
        rec("dram", "nearrec", 900.0),
        rec("dram", "nearrec.serial", 950.0),
        rec("dram", "offload", 1200.0),
        # 64 samples at 500/s: 128 ms a batch; its I/O floor 100 ms beats the 5 ms MLP
        rec("ssd@25%", "nearrec", 500.0, io_floor_us=100_000.0, device_reads_per_batch=5000.0),
        rec("ssd@25%", "offload", 800.0, io_floor_us=100_000.0, device_reads_per_batch=5000.0),
        rec("ssd@25%", "ssds", 100.0),
    ]
    summarise(records)
    by = {(r.dist, r.system): r.extra for r in records}
    assert by[("dram", "nearrec")]["ratio_vs_ideal"] == pytest.approx(0.9)
    assert by[("dram", "offload")]["ratio_vs_nearrec"] == pytest.approx(1200 / 900)
    ssd = by[("ssd@25%", "nearrec")]
    assert ssd["floor_us"] == 100_000.0 and ssd["mlp_per_batch_us"] == 5000.0
    assert ssd["time_over_floor"] == pytest.approx(128_000 / 100_000)
    assert by[("ssd@25%", "offload")]["time_over_floor"] == pytest.approx(80_000 / 100_000)
    assert by[("ssd@25%", "offload")]["ratio_vs_nearrec"] == pytest.approx(1.6)
    assert by[("ssd@25%", "nearrec")]["ratio_vs_ssds"] == pytest.approx(5.0)
    assert by[("ssd@25%", "nearrec")]["ratio_vs_dram"] == pytest.approx(500 / 900)
    md = markdown(records, "nearrec bench e2e")
    row = next(line for line in md.splitlines() if line.startswith("| rmc3 | 64 |"))
    assert "1.28×" in row and "0.80×" in row and "5.00 / 100.00" in row
