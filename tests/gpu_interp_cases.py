"""Kernel parity under Triton's interpreter. Run by ``tests/test_gpu.py`` in a subprocess with
``TRITON_INTERPRET=1`` (read when Triton is imported, so it cannot be set inside the main test
process); not collected on its own (its name has no ``test_`` prefix)."""

from __future__ import annotations

import os

import gpu_checks
import pytest

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs TRITON_INTERPRET=1 before triton is imported")


@pytest.mark.parametrize("policy", ["lfu", "lru_pa"])
@pytest.mark.parametrize("tags", [True, False])
def test_kernels_match_reference_interpreted(policy, tags):
    gpu_checks.check_kernels_match_reference("cpu", policy, seed=1, tags=tags)


@pytest.mark.parametrize("policy,near", [("lfu_pa", "on"), ("lru", "off")])
def test_tier_kernels_match_embedding_bag_interpreted(tmp_path, policy, near):
    store, arrays = gpu_checks.make_store(tmp_path)
    tier = gpu_checks.check_tier_matches_embedding_bag(store, arrays, "cpu", "triton", policy,
                                                       "async_copy", near, batches=3)
    assert all(ct.cache.backend == "triton" for ct in tier.tables.values())


def test_grouped_tables_interpreted(tmp_path):
    store, arrays = gpu_checks.make_store(tmp_path, 2, gpu_checks.SAME_WIDTH)
    tier = gpu_checks.check_tier_matches_embedding_bag(store, arrays, "cpu", "triton", "lfu_pa",
                                                       "async_copy", "off", batches=3)
    assert tier._shared is not None


def test_the_hit_path_harness_checks_every_way():
    # `nearrec bench gpu-hit` on a small table: every way (the tier's fused kernel per probe,
    # policy and shape; the harness's own pooling by slot; PyTorch's gathers) is checked against
    # F.embedding_bag before it is timed, and raises where one differs
    from nearrec_bench import gpu_hit

    cfg = gpu_hit.GpuHitConfig(rows=1000, dim=16, pooling=4, bags=(16,), rounds=1)
    records = gpu_hit.run(cfg, log=lambda line: None)
    cells = [r for r in records if r.batch == 16]
    assert len(cells) == len(gpu_hit.WAYS) + 2
    assert all(r.p50_us > 0 and r.extra["row_bytes_per_s"] > 0 for r in cells)
    assert "| 16 | probe_pool[tags,lfu,BLOCK_L=8,warps=1] |" in gpu_hit.markdown(records, "x")
