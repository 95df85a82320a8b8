"""The Python surface under hypothesis (issue 40): KeyedJaggedTensors of random keys, lengths,
ids and weights through the EmbeddingBagCollection, against ``torch.nn.EmbeddingBag``; store
configs of random settings; plan files with random bytes changed. Each is answered right or
refused with a typed error naming what is wrong — never another exception, a crash or a hang."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nearrec
import nearrec.plan
import nearrec.torch
import nearrec.trace as nt
from nearrec.errors import InvalidRequest, NearrecError

TABLES = {"a": (50, 4), "b": (30, 8), "c": (70, 3)}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    rng = np.random.default_rng(11)
    arrays = {t: rng.standard_normal((rows, dim), dtype=np.float32)
              for t, (rows, dim) in TABLES.items()}
    path = tmp_path_factory.mktemp("surface") / "s"
    nearrec.from_numpy(path, arrays)
    return nearrec.open(path, tier="ssd", dram_budget="4KiB"), arrays


@st.composite
def kjts(draw):
    keys = draw(st.lists(st.sampled_from([*TABLES, "zz"]), min_size=1, max_size=4,
                         unique=True))
    batch = draw(st.integers(0, 6))
    lengths = draw(st.lists(st.integers(-1, 5), min_size=batch * len(keys),
                            max_size=batch * len(keys)))
    n = sum(max(x, 0) for x in lengths)
    values = draw(st.lists(st.integers(-2, 75), min_size=n, max_size=n))
    weighted = draw(st.booleans())
    weights = draw(st.lists(st.floats(-2, 2, width=32), min_size=n, max_size=n)) \
        if weighted else None
    return keys, batch, lengths, values, weights


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=kjts(), mode=st.sampled_from(["sum", "mean"]))
def test_random_kjts_pool_as_embedding_bags_or_are_refused_by_name(store, case, mode):
    s, arrays = store
    keys, batch, lengths, values, weights = case
    tables = [k for k in keys if k in TABLES]
    if not tables:
        return
    ebc = nearrec.torch.EmbeddingBagCollection(s, tables, pooling=mode)
    kjt = nearrec.torch.KeyedJaggedTensor(
        keys, torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int64),
        weights=None if weights is None else torch.tensor(weights, dtype=torch.float32))
    try:
        got = ebc(kjt).values()
    except InvalidRequest as e:
        # a negative length, an id out of a table's range, weights with mean: named by table
        assert e.table in keys or e.table is None, e
        bad_len = any(x < 0 for x in lengths)
        assert bad_len or (weights is not None and mode == "mean") or any(
            not 0 <= v < TABLES[k][0] for k, v in _by_key(keys, batch, lengths, values)
            if k in TABLES), e
        return
    assert not any(x < 0 for x in lengths)
    want = []
    for k in tables:
        i = keys.index(k)
        lens = torch.tensor(lengths[i * batch:(i + 1) * batch], dtype=torch.int64)
        start = sum(lengths[:i * batch])
        ids = torch.tensor(values[start:start + int(lens.sum())], dtype=torch.int64)
        w = None if weights is None else torch.tensor(
            weights[start:start + int(lens.sum())], dtype=torch.float32)
        bag = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(arrays[k]), mode=mode)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)[:-1]]) \
            if batch else torch.zeros(0, dtype=torch.int64)
        want.append(bag(ids, offsets, per_sample_weights=w))
    np.testing.assert_allclose(got.numpy(), torch.cat(want, 1).numpy(), rtol=1e-5, atol=1e-5)


def _by_key(keys, batch, lengths, values):
    at = 0
    for i, k in enumerate(keys):
        n = sum(max(x, 0) for x in lengths[i * batch:(i + 1) * batch])
        for v in values[at:at + n]:
            yield k, v
        at += n


SETTINGS = ["tier", "dram_budget", "threads", "io_queue_depth", "io_rings", "merge_gap_bytes",
            "cache_policy", "admission_probability", "cache_ways", "durability",
            "durability_window_ms", "delta_budget", "compaction_rate", "scrub_rate",
            "write_wait_ms", "follow_ms", "keep_last", "writable", "verify_reads", "evicted_log"]
VALUES = st.one_of(st.integers(-3, 1 << 40), st.floats(allow_nan=True), st.booleans(),
                   st.none(), st.sampled_from(["4GiB", "0", "1KB", "ssd", "dram", "auto", "lru",
                                               "lfu", "sync", "async", "bogus", "-1MiB", ""]),
                   st.lists(st.integers(0, 3), max_size=2))


@settings(max_examples=300, deadline=None)
@given(changes=st.dictionaries(st.sampled_from(SETTINGS), VALUES, max_size=4))
def test_random_settings_make_a_config_that_round_trips_or_are_refused(changes):
    try:
        c = nearrec.StoreConfig(**changes)
    except InvalidRequest as e:
        assert any(k in str(e) for k in changes), e
        return
    again = nearrec.StoreConfig.from_toml(c.to_toml())
    assert again.to_toml() == c.to_toml()


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory, store):
    s, _ = store
    root = tmp_path_factory.mktemp("plan")
    trace = nt.generate({t: rows for t, (rows, _) in TABLES.items()}, bags=200, pooling=4,
                        generator=nt.Generator.zipf(1.1), seed=3)
    trace.save(root / "t.nrtrace")
    plan = nearrec.plan.make_plan(s.path, root / "t.nrtrace", "2KiB")
    return plan.save(root / "p.toml")


@settings(max_examples=200, deadline=None, suppress_health_check=[
    HealthCheck.function_scoped_fixture])
@given(which=st.sampled_from(["toml", "npz"]), at=st.integers(0, 1 << 20),
       byte=st.integers(0, 255), cut=st.booleans())
def test_plan_files_with_a_byte_changed_load_or_are_refused(tmp_path, plan_file, store, which,
                                                            at, byte, cut):
    s, _ = store
    dst = tmp_path / "p.toml"
    for suffix in (".toml", ".hot.npz"):  # the plan and its hot rows beside it
        dst.with_suffix(suffix).write_bytes(plan_file.with_suffix(suffix).read_bytes())
    f = dst.with_suffix(".toml" if which == "toml" else ".hot.npz")
    data = bytearray(f.read_bytes())
    k = at % max(len(data), 1)
    if cut:
        del data[k:]
    elif data:
        data[k] = byte
    f.write_bytes(bytes(data))
    try:
        placement = nearrec.plan.load_plan(dst)
    except InvalidRequest:
        return
    for name, p in placement.items():
        assert isinstance(name, str)
        assert p["hot_rows"].ndim == 1 and p["hot_rows"].dtype == np.int64
    # what loads is applied as any plan is: served, or refused with a typed error
    try:
        opened = nearrec.open(s.path, tier="ssd", plan=dst)
    except NearrecError:
        return
    t = next(iter(TABLES))
    opened.lookup(t, np.arange(5), np.arange(5))
    opened.close()
