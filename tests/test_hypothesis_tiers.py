"""Random tables, dtypes, bags, weights, modes and padding: pooled results equal
``torch.nn.EmbeddingBag`` on the DRAM tier, the SSD tier, and the SSD tier behind a plan that pins
some rows hot and caches others (issue 23 item 16). The default run is short; the ``slow``
variant (``make test-slow``) runs many more examples."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import TABLES, make_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nearrec

TIERS = ("dram", "ssd", "ssd+plan")


@pytest.fixture(scope="module")
def tiers(tmp_path_factory):
    path, _ = make_store(tmp_path_factory.mktemp("tiers"), seed=3)
    # every other table: a few rows pinned hot and a row cache too small for the rest, so one
    # batch is served partly by the hot partition, partly by the cache and partly by the disk
    plan = {name: {"hot_rows": np.arange(0, rows, 7), "cache_bytes": "8KiB"}
            for name, rows, _, _ in TABLES[::2]}
    stores = {"dram": nearrec.open(path, tier="dram"), "ssd": nearrec.open(path, tier="ssd"),
              "ssd+plan": nearrec.open(path, tier="ssd", plan=plan)}
    rows = {name: torch.from_numpy(stores["dram"].read_rows(name, np.arange(n)))
            for name, n, _, _ in TABLES}
    return stores, rows


@st.composite
def requests(draw):
    t = draw(st.integers(0, len(TABLES) - 1))
    name, rows, _, _ = TABLES[t]
    sizes = draw(st.lists(st.integers(0, 6), min_size=0, max_size=8))
    n = sum(sizes)
    idx = draw(st.lists(st.integers(0, rows - 1), min_size=n, max_size=n))
    mode = draw(st.sampled_from(["sum", "mean", "max"]))
    weights = None
    if mode == "sum" and draw(st.booleans()):
        weights = draw(st.lists(st.floats(-2, 2, width=32), min_size=n, max_size=n))
    padding = draw(st.none() | st.sampled_from([0, 1, rows - 1, -1]))
    last = draw(st.booleans())
    itype = draw(st.sampled_from([np.int32, np.int64]))
    return name, sizes, idx, mode, weights, padding, last, itype


def check(tiers, req):
    stores, table_rows = tiers
    name, sizes, idx, mode, weights, padding, last, itype = req
    indices = np.array(idx, dtype=itype)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    offsets = (starts if last else starts[:-1]).astype(itype)
    w = None if weights is None else np.array(weights, np.float32)
    want = torch.nn.functional.embedding_bag(
        torch.from_numpy(indices.astype(np.int64)), table_rows[name],
        torch.from_numpy(offsets.astype(np.int64)), mode=mode,
        per_sample_weights=None if w is None else torch.from_numpy(w),
        include_last_offset=last, padding_idx=padding).numpy()
    for tier in TIERS:
        got = stores[tier].lookup(name, indices, offsets, per_sample_weights=w, mode=mode,
                                  include_last_offset=last, padding_idx=padding)
        assert got.shape == want.shape, tier
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"{tier} {name}")


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(req=requests())
def test_tiers_pool_like_embedding_bag(tiers, req):
    check(tiers, req)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(req=requests())
def test_tiers_pool_like_embedding_bag_many(tiers, req):
    check(tiers, req)


def test_the_plan_puts_rows_in_every_tier(tiers):
    """The third store really serves lookups from the hot partition, the cache and the disk."""
    stores, _ = tiers
    s = stores["ssd+plan"]
    name, rows, _, _ = TABLES[0]
    ids = np.tile(np.arange(rows), 3)
    for _ in range(2):  # the first batch fills the cache (whatever the tests before left in it)
        s.lookup(name, ids, np.arange(0, len(ids), 10))
    report = {r["table"]: r for r in s.tier_report()}[name]
    assert report["lookups_hot"] > 0 and report["lookups_cache"] > 0 and report["lookups_ssd"] > 0
