"""`nearrec bench flash-repro`'s records and report: every record names the paper's figure it
reproduces, and every figure has its section."""

from __future__ import annotations

import re

import numpy as np
import pytest

nt = pytest.importorskip("nearrec.trace")
flash = pytest.importorskip("nearrec_bench.flash")


@pytest.fixture(scope="module")
def records() -> list:
    cfg = flash.FlashReproConfig(table_bytes=256 << 20, batches=2, warmup=2)
    quiet = lambda *_: None  # noqa: E731
    cfg.kernel_reps = 1
    return (flash.rm_ssd(cfg, quiet) + flash.recssd(cfg, quiet) + flash.emb_ssd(cfg, quiet)
            + flash.emb_ssd_engine(cfg, quiet))


def test_every_record_names_its_figure(records: list) -> None:
    figures = {r.extra["figure"] for r in records}
    assert all(re.fullmatch(r"(rmssd|recssd|embssd)\.fig\d+[a-z]?", f) for f in figures), figures
    for want in ("rmssd.fig3", "rmssd.fig4", "rmssd.fig11", "rmssd.fig12", "rmssd.fig15",
                 "recssd.fig8", "recssd.fig9", "recssd.fig10", "recssd.fig10d",
                 "recssd.fig11a", "recssd.fig11b", "embssd.fig9", "embssd.fig9b",
                 "embssd.fig10"):
        assert want in figures


def test_the_report_has_a_section_per_figure(records: list) -> None:
    md = flash.markdown(records, "nearrec bench flash-repro")
    for title in ("RM-SSD Fig. 3", "RM-SSD Fig. 4", "RM-SSD Fig. 11", "RM-SSD Fig. 15",
                  "RM-SSD Table IV", "RecSSD Fig. 8", "RecSSD Fig. 9", "RecSSD Fig. 10(d–f)",
                  "RecSSD Fig. 11(a)", "RecSSD Fig. 11(b)", "EMB-SSD Fig. 9(a)",
                  "EMB-SSD Figs. 9(b) and 10"):
        assert f"## {title}" in md
    # Fig. 3: one cell per page-cache size, largest first, SSD-S never reading less per useful
    # byte as the cache shrinks (this run is too short to fill even the smallest)
    for model in ("rmc1", "rmc2", "rmc3"):
        cells = [r.extra for r in records if r.dist == "rmssd-fig3" and r.model == model]
        assert [c["dram_bytes"] for c in cells] == list(flash.FIG3_DRAM)
        amp = [c["read_amplification"] for c in cells]
        assert amp == sorted(amp) and amp[0] > 1, amp


def test_index_shares_count_what_fig_4_counts() -> None:
    got = flash.index_shares(np.array([1, 1, 2, 3, 3, 3, 4]), top=1)
    # ids 2 and 4 are met once (2 of 7 accesses); 4 distinct ids; the top id (3) takes 3 of 7
    assert got == {"accesses": 7, "once_share": 2 / 7, "distinct_share": 4 / 7,
                   "top_share": 3 / 7, "top": 1}


def test_trace_shares_tell_a_heavy_head_from_a_long_tail() -> None:
    rows, n = 1_000_000, 200_000
    near = flash.trace_shares(nt.Generator.stack_distance(k=0.0), rows, n)
    far = flash.trace_shares(nt.Generator.stack_distance(k=2.0), rows, n)
    zipf = flash.trace_shares(nt.Generator.zipf(1.05), rows, n)
    for s in (near, far, zipf):
        assert s["accesses"] == n
        assert 0 < s["once_share"] <= s["distinct_share"] <= 1
    # less locality: more ids met once; a Zipf head: most accesses on the top 10k ids
    assert far["once_share"] > 3 * near["once_share"]
    assert zipf["top_share"] > 0.5 > far["top_share"]
