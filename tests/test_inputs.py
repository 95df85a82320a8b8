"""Malformed input at every public entry point is a typed nearrec error naming what was wrong,
never a coercion and never a builtin exception (issue 23 items 9, 10, 12, 13, 15)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import nearrec
import nearrec.models as nm
import nearrec.plan as npl
import nearrec.trace as nt
from nearrec import IndexOutOfRange, InvalidRequest, TableLookup
from nearrec.errors import InvalidTrace, StoreCorrupted, TraceMismatch
from nearrec.keyed import KeyedTable
from nearrec.units import parse_size

ROWS = {"a": 50, "b": 30}
I = np.array([1, 2, 3])  # noqa: E741
O = np.array([0, 1])  # noqa: E741


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = tmp_path_factory.mktemp("inputs") / "s"
    rng = np.random.default_rng(0)
    nearrec.from_numpy(p, {n: rng.standard_normal((r, 8), dtype=np.float32)
                           for n, r in ROWS.items()})
    return p


@pytest.fixture(scope="module", params=["dram", "ssd"])
def store(request, path):
    return nearrec.open(path, tier=request.param)


#: one table's lookup arguments that every entry point must refuse, and the error
BAD_LOOKUPS = {
    "float offsets": (dict(offsets=np.array([0.0, 1.0])), InvalidRequest),
    "fractional offsets": (dict(offsets=np.array([0.0, 1.5])), InvalidRequest),
    "bool offsets": (dict(offsets=np.array([False, True])), InvalidRequest),
    "uint64 offsets": (dict(offsets=np.array([0, 1], np.uint64)), InvalidRequest),
    "uint64 2**64-1 offset": (dict(offsets=np.array([0, 2**64 - 1], np.uint64)), InvalidRequest),
    "0-d offsets": (dict(offsets=np.array(0)), InvalidRequest),
    "int offsets": (dict(offsets=0), InvalidRequest),
    "2-D offsets": (dict(offsets=np.array([[0, 1]])), InvalidRequest),
    "float lengths": (dict(offsets=None, lengths=np.array([1.0, 2.0])), InvalidRequest),
    "huge lengths": (dict(offsets=None, lengths=[2**64, 1]), InvalidRequest),
    "include_last_offset 'no'": (dict(include_last_offset="no"), InvalidRequest),
    "include_last_offset None": (dict(include_last_offset=None), InvalidRequest),
    "padding_idx True": (dict(padding_idx=True), InvalidRequest),
    "padding_idx 1.5": (dict(padding_idx=1.5), InvalidRequest),
    "padding_idx '1'": (dict(padding_idx="1"), InvalidRequest),
    "padding_idx 2**70": (dict(padding_idx=2**70), InvalidRequest),
    "indices None": (dict(indices=None), InvalidRequest),
    "indices str": (dict(indices="abc"), InvalidRequest),
    "indices 0-d": (dict(indices=np.array(3)), InvalidRequest),
    "ragged indices": (dict(indices=[[1], [1, 2]], offsets=None), InvalidRequest),
    "list index 2**63": (dict(indices=[2**63], offsets=[0]), IndexOutOfRange),
    "mixed list 2**63": (dict(indices=[1, 2**63, 3]), InvalidRequest),
    "weights str": (dict(per_sample_weights="x"), InvalidRequest),
    "weights float64": (dict(per_sample_weights=np.ones(3)), InvalidRequest),
    "mode None": (dict(mode=None), InvalidRequest),
    "table None": (dict(table=None), InvalidRequest),
}


def _request(**kw):
    args = dict(table="a", indices=I, offsets=O)
    args.update(kw)
    return TableLookup(**args)


ENTRY_POINTS = {
    "lookup": lambda s, r: s.lookup(r.table, r.indices, r.offsets, r.per_sample_weights, r.mode,
                                    r.include_last_offset, r.padding_idx, r.lengths),
    "lookup_many": lambda s, r: s.lookup_many([r]),
    "sub_batch": lambda s, r: s.lookup_many([r], sub_batch=1),
    "submit": lambda s, r: s.submit([r]).result(),
    "lookup_stream": lambda s, r: list(s.lookup_stream([[r]])),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize("case", list(BAD_LOOKUPS))
def test_every_entry_point_refuses_the_same_inputs(store, entry, case):
    """A TableLookup is native: it converts its arrays once, when it is made, so a bad input is
    refused there, the same way for every entry point (store.lookup makes one from its
    arguments), and no entry point sees an unconverted one."""
    kw, error = BAD_LOOKUPS[case]
    with pytest.raises(error) as made:
        _request(**kw)
    if entry == "lookup":
        args = dict(table="a", indices=I, offsets=O, lengths=None, per_sample_weights=None,
                    mode="sum", include_last_offset=False, padding_idx=None)
        args.update(kw)
        with pytest.raises(error) as e:
            store.lookup(**args)
        assert str(e.value) == str(made.value)
    else:  # anything that is not a TableLookup is refused by every entry point, by position
        with pytest.raises(InvalidRequest, match="TableLookup") as e:
            ENTRY_POINTS[entry](store, _NotALookup())
        assert e.value.position == 0
    if isinstance(kw.get("table", "a"), str):
        assert made.value.table == "a"


class _NotALookup:
    """Looks like a lookup to duck typing; is not one."""

    table, indices, offsets, lengths = "a", I, O, None
    per_sample_weights, mode, include_last_offset, padding_idx = None, "sum", False, None


def test_sub_batch_no_longer_truncates_float_offsets(store):
    """The sub_batch path cast offsets with astype(int64): 1.5 became 1 and the call ran."""
    with pytest.raises(InvalidRequest, match="offsets must be int32 or int64"):
        store.lookup_many([_request(indices=np.arange(6), offsets=np.array([0.0, 1.5, 4.0]))],
                          sub_batch=1)


@pytest.mark.parametrize("sub_batch", [0, -1, 1.5, "2", True])
def test_sub_batch_and_depth_must_be_positive_ints(store, sub_batch):
    with pytest.raises(InvalidRequest, match="sub_batch"):
        store.lookup_many([_request()], sub_batch=sub_batch)
    with pytest.raises(InvalidRequest, match="depth"):
        store.lookup_stream([[_request()]], depth=sub_batch)


@pytest.mark.parametrize("requests", [None, 3, "a", [3], {"a": (I, O, 1)}])
def test_malformed_batches(store, requests):
    with pytest.raises(InvalidRequest):
        store.lookup_many(requests)


def test_one_table_twice_is_not_ambiguous(store):
    """batch[name] returned only the last of two requests of one table; now it refuses, and
    block(i) gives each."""
    r1, r2 = _request(indices=np.array([1, 2]), offsets=O), _request(indices=np.array([3, 4]),
                                                                      offsets=O)
    batch = store.lookup_many([r1, r2])
    with pytest.raises(InvalidRequest, match="2 times") as e:
        batch["a"]
    assert e.value.table == "a"
    np.testing.assert_array_equal(batch.block(0), store.lookup("a", r1.indices, O))
    np.testing.assert_array_equal(batch.block(1), store.lookup("a", r2.indices, O))
    with pytest.raises(InvalidRequest):
        batch.to_dict()


@pytest.mark.parametrize("rows,error", [
    (np.array([1.5, 2.0]), InvalidRequest),  # was truncated to row 1
    (np.array([2**64 - 1], np.uint64), InvalidRequest),  # was row -1
    (np.array([True]), InvalidRequest),
    (np.zeros((2, 2), np.int64), InvalidRequest),
    (np.array(1), InvalidRequest),
    (None, InvalidRequest),
    (["x"], InvalidRequest),
    ([2**64], InvalidRequest),
    ([2**63], IndexOutOfRange),
    ([50], IndexOutOfRange),
])
def test_read_rows_refuses_what_it_coerced(store, rows, error):
    with pytest.raises(error) as e:
        store.read_rows("a", rows)
    assert e.value.table == "a"


@pytest.mark.parametrize("name", [None, 3, ["a"]])
def test_table_names_must_be_strings(store, name):
    with pytest.raises(InvalidRequest):
        store.table(name)
    with pytest.raises(InvalidRequest):
        store.read_rows(name, [1])


# --- open() settings and plans -------------------------------------------------------------

BAD_SETTINGS = [
    ("threads", -1), ("threads", "x"), ("threads", 2**70), ("threads", 1.5), ("tier", None),
    ("tier", "x"), ("dram_budget", -1), ("dram_budget", 1.5), ("dram_budget", True),
    ("dram_budget", "..."), ("io_queue_depth", -1), ("io_queue_depth", 2**40),
    ("merge_gap_bytes", -1), ("io_rings", -2), ("cache_policy", None),
    ("admission_probability", "x"), ("admission_probability", float("nan")),
    ("cache_ways", -1), ("direct_io", "no"), ("dedup", "no"), ("verify_checksums", "no"),
    ("progress", "no"), ("device", 3), ("plan", 3), ("plan", {"a": 3}),
    ("plan", {"a": {"resident": "no"}}), ("plan", {"a": {"resident": 1}}),
    ("plan", {"a": {"hot_rows": [1.5]}}), ("plan", {"a": {"hot_rows": [[1, 2]]}}),
    ("plan", {"a": {"cache_bytes": "x"}}), ("plan", {3: {}}),
]


@pytest.mark.parametrize("tier", ["ssd", "auto"])
@pytest.mark.parametrize("key,value", BAD_SETTINGS, ids=[f"{k}={v!r}" for k, v in BAD_SETTINGS])
def test_open_refuses_bad_settings(path, tier, key, value):
    with pytest.raises(InvalidRequest):
        nearrec.open(path, **{"tier": tier, key: value})


def test_a_plan_is_checked_even_where_auto_ignores_it(path):
    """tier='auto' put this small store in DRAM and never looked at the plan."""
    with pytest.raises(nearrec.UnknownTable) as e:
        nearrec.open(path, plan={"zz": {}})
    assert e.value.table == "zz"
    with pytest.raises(IndexOutOfRange) as e:
        nearrec.open(path, plan={"a": {"hot_rows": [3, 50]}})
    assert e.value.table == "a" and e.value.position == 1


def _npz(**arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


@pytest.fixture(scope="module")
def plan_file(path, tmp_path_factory):
    tr = nt.generate(ROWS, bags=100, pooling=3, generator=nt.Generator.uniform())
    return npl.make_plan(path, tr, "2KiB").save(tmp_path_factory.mktemp("plan") / "p.toml")


def _variant(plan_file, name, edit=lambda t: t, hot=None):
    text = edit(plan_file.read_text()).replace('"p.hot.npz"', f'"{name}.hot.npz"')
    (plan_file.parent / f"{name}.toml").write_text(text)
    (plan_file.parent / f"{name}.hot.npz").write_bytes(
        plan_file.with_suffix(".hot.npz").read_bytes() if hot is None else hot)
    return plan_file.parent / f"{name}.toml"


PLAN_FILES = {
    "resident 'no'": (lambda t: t.replace("resident = false", 'resident = "no"'), None),
    "resident 1": (lambda t: t.replace("resident = false", "resident = 1"), None),
    "negative cache": (lambda t: t.replace("cache_bytes = ", "cache_bytes = -"), None),
    "hot_rows_file 3": (lambda t: t.replace('hot_rows_file = "p.hot.npz"', "hot_rows_file = 3"),
                        None),
    "not toml": (lambda t: "[[[", None),
    "bad zip": (lambda t: t, b"PK\x03\x04garbage"),
    "empty npz": (lambda t: t, b""),
    "float hot rows": (lambda t: t, _npz(a=np.array([1.5, 2.5]))),
    "2-D hot rows": (lambda t: t, _npz(a=np.array([[1, 2]]))),
    "string hot rows": (lambda t: t, _npz(a=np.array(["x"]))),
}


@pytest.mark.parametrize("case", list(PLAN_FILES))
def test_corrupted_plan_files_are_invalid_requests(path, plan_file, case):
    edit, hot = PLAN_FILES[case]
    bad = _variant(plan_file, case.replace(" ", "_").replace("'", ""), edit, hot)
    with pytest.raises(InvalidRequest):
        npl.load_plan(bad)
    with pytest.raises(InvalidRequest):
        nearrec.open(path, tier="ssd", plan=bad)


def test_truncated_hot_rows_archive(path, plan_file):
    hot = plan_file.with_suffix(".hot.npz").read_bytes()
    bad = _variant(plan_file, "trunc", hot=hot[: len(hot) // 2])
    with pytest.raises(InvalidRequest, match="hot rows"):
        npl.load_plan(bad)


def test_make_plan_refuses_a_trace_for_another_store(path):
    """make_plan accepted these and only open() failed, later."""
    bigger = nt.generate({"a": 500, "b": 30}, bags=50, pooling=3, generator=nt.Generator.uniform())
    with pytest.raises(TraceMismatch, match="500 rows") as e:
        npl.make_plan(path, bigger, "1KiB")
    assert e.value.table == "a"
    assert isinstance(e.value, InvalidTrace) and isinstance(e.value, InvalidRequest)
    ids = np.array([1, 2, 3, 60])
    wrong_ids = nt.Trace({"a": nt.TableTrace("a", 50, 2, np.array([0, 2, 4]), ids)})
    with pytest.raises(TraceMismatch, match="position 3") as e:
        npl.make_plan(path, wrong_ids, "1KiB")
    assert e.value.table == "a" and e.value.position == 3
    other = nt.generate({"zz": 5}, bags=10, pooling=1, generator=nt.Generator.uniform())
    with pytest.raises(TraceMismatch) as e:
        npl.make_plan(path, other, "1KiB")
    assert e.value.table == "zz"


@pytest.mark.parametrize("steps", [0, -1, "x"])
def test_make_plan_steps(path, steps):
    tr = nt.generate(ROWS, bags=20, pooling=1, generator=nt.Generator.uniform())
    with pytest.raises(InvalidRequest, match="steps"):
        npl.make_plan(path, tr, "1KiB", steps=steps)


# --- paths, builders, sizes, keyed tables, models, CLI --------------------------------------

@pytest.mark.parametrize("call", [
    lambda: nearrec.open(None), lambda: nearrec.open(3), lambda: nearrec.info(None),
    lambda: nearrec.verify(None), lambda: nearrec.remove(None),
    lambda: nearrec.from_numpy(None, {"a": np.zeros((3, 3), np.float32)}),
    lambda: nearrec.read_attachment("x", None),
], ids=["open None", "open int", "info", "verify", "remove", "from_numpy", "attachment name"])
def test_paths_and_names_must_be_given(call):
    with pytest.raises(InvalidRequest):
        call()


@pytest.mark.parametrize("kw,arrays", [
    (dict(), None),
    (dict(dtype=3), {"a": np.zeros((3, 3), np.float32)}),
    (dict(block_bytes=-1), {"a": np.zeros((3, 3), np.float32)}),
    (dict(block_bytes="4k"), {"a": np.zeros((3, 3), np.float32)}),
    (dict(overwrite="no"), {"a": np.zeros((3, 3), np.float32)}),
    (dict(), {3: np.zeros((3, 3), np.float32)}),
    (dict(), {"a": None}),
], ids=["arrays None", "dtype int", "block -1", "block str", "overwrite str", "name int",
        "rows None"])
def test_from_numpy_arguments(tmp_path, kw, arrays):
    with pytest.raises(InvalidRequest):
        nearrec.from_numpy(tmp_path / "s", arrays, **kw)


def test_unreadable_sources(tmp_path):
    (tmp_path / "bad.npy").write_bytes(b"garbage")
    with pytest.raises(InvalidRequest) as e:
        nearrec.from_numpy(tmp_path / "s", {"a": tmp_path / "bad.npy"})
    assert e.value.table == "a"
    with pytest.raises(nearrec.StoreNotFound):
        nearrec.from_numpy(tmp_path / "s", {"a": tmp_path / "nope.npy"})
    (tmp_path / "bad.pt").write_bytes(b"garbage")
    with pytest.raises(InvalidRequest):
        nearrec.from_state_dict(tmp_path / "s", tmp_path / "bad.pt")
    with pytest.raises(InvalidRequest):
        nearrec.from_state_dict(tmp_path / "s", [1, 2])


@pytest.mark.parametrize("kw", [dict(model=None), dict(rows=1.5), dict(rows=2**70),
                                dict(seed=-1), dict(seed=2**70), dict(table_bytes=-1),
                                dict(variant="x")], ids=str)
def test_build_arguments(tmp_path, kw):
    args = dict(model="rmc1", rows=10) | kw
    if "table_bytes" in kw:
        args.pop("rows")
    with pytest.raises(InvalidRequest):
        nearrec.build(tmp_path / "s", **args)


@pytest.mark.parametrize("size", [True, 1.5, None, -1, "...", "1e3", [1], 2**63, "9EiB",
                                  "99999999999999999999TiB"])
def test_parse_size_refuses(size):
    with pytest.raises(InvalidRequest):
        parse_size(size)


def test_parse_size_accepts():
    assert parse_size("1.5KiB") == 1536 and parse_size(np.int64(7)) == 7 and parse_size(".5k") \
        == 500


@pytest.fixture(scope="module")
def keyed():
    return KeyedTable.from_arrays("k", np.arange(10), np.ones((10, 4), np.float32))


@pytest.mark.parametrize("call", [
    lambda k: KeyedTable("x", -1, 10), lambda k: KeyedTable("x", 4, 2**70),
    lambda k: KeyedTable("x", "4", 10), lambda k: KeyedTable(None, 4, 10),
    lambda k: KeyedTable("x", 4, 10, seed=-1), lambda k: KeyedTable("x", 4, 10, init_scale="x"),
    lambda k: KeyedTable.from_arrays("x", [1], "x"), lambda k: k.assign([1], "x"),
    lambda k: k.lookup([1, 2], offsets=[0.5]), lambda k: k.lookup([1, 2], offsets="x"),
    lambda k: k.lookup([1, 2], lengths=[2**64]), lambda k: k.lookup([1, 2], mode=None),
    lambda k: k.lookup([1, 2], per_sample_weights="x"),
    lambda k: k.lookup([1], per_sample_weights=np.array([1e39])),  # was cast to inf
    lambda k: k.lookup([1, 2], offsets=[0, 2], include_last_offset="no"),
    lambda k: k.read_rows([1.5]), lambda k: k.read_rows(None), lambda k: k.save(None),
    lambda k: KeyedTable.bytes_for(-1, 4),
], ids=lambda c: "")
def test_keyed_arguments(keyed, call):
    with pytest.raises(InvalidRequest):
        call(keyed)


@pytest.mark.parametrize("data", [b"PK\x03\x04xx", b"", b"garbage"])
def test_keyed_load_of_a_corrupted_file(tmp_path, data):
    (tmp_path / "k.npz").write_bytes(data)
    with pytest.raises(StoreCorrupted):
        KeyedTable.load(tmp_path / "k.npz")
    with pytest.raises(nearrec.StoreNotFound):
        KeyedTable.load(tmp_path / "nope.npz")


@pytest.fixture(scope="module")
def rmc1(tmp_path_factory):
    p = tmp_path_factory.mktemp("rmc1") / "s"
    nearrec.build(p, "rmc1", rows=100)
    store = nearrec.open(p)
    model = nm.build("rmc1", store)
    kjt = nearrec.torch.KeyedJaggedTensor([f"t{i}" for i in range(8)],
                                          torch.arange(48) % 100,
                                          torch.full((24,), 2, dtype=torch.int64))
    return p, store, model, kjt


def test_infer_matches_lookups_by_table_name(rmc1):
    """A reversed list of lookups ran and gave other outputs."""
    _, store, model, kjt = rmc1
    dense = torch.rand(3, 128)
    off = nm.offload(model)
    lookups = off.sparse.lookups(kjt)
    want = store.infer(dense, lookups, model=off)
    np.testing.assert_array_equal(store.infer(dense, lookups[::-1], model=off), want)
    np.testing.assert_array_equal(store.infer(dense, kjt, model=off), want)
    with pytest.raises(InvalidRequest, match="missing") as e:
        store.infer(dense, lookups[:7], model=off)
    assert e.value.table == "t7"
    with pytest.raises(InvalidRequest, match="twice") as e:
        store.infer(dense, lookups + [lookups[0]], model=off)
    assert e.value.table == "t0"
    extra = TableLookup("zz", np.array([1]), np.array([0]))
    with pytest.raises(InvalidRequest, match="not inputs"):
        store.infer(dense, lookups[:7] + [extra], model=off)
    with pytest.raises(InvalidRequest, match="dense"):
        store.infer("x", kjt, model=off)


@pytest.mark.parametrize("size", [0, -1, "x"])
def test_model_sub_batches(rmc1, size):
    _, _, model, kjt = rmc1
    with pytest.raises(InvalidRequest):
        nm.split(torch.rand(3, 128), kjt, size)
    with pytest.raises(InvalidRequest):
        nm.infer(model, [(torch.rand(3, 128), kjt)], sub_batch=size)


@pytest.mark.parametrize("name,data", [
    (nm.WEIGHTS_ATTACHMENT, b"garbage"), (nm.WEIGHTS_ATTACHMENT, b""),
    (nm.WEIGHTS_ATTACHMENT, b"PK\x03\x04zz"), (nm.CONFIG_ATTACHMENT, b"{"),
    (nm.CONFIG_ATTACHMENT, b"[]"), (nm.CONFIG_ATTACHMENT, b"{}"),
])
def test_model_load_of_corrupted_attachments(rmc1, tmp_path, name, data):
    p, _, model, _ = rmc1
    nm.save(model, p)
    nearrec.attach(p, name, data)
    with pytest.raises(StoreCorrupted, match=name):
        nm.load(nearrec.open(p))


@pytest.mark.parametrize("call", [lambda m, s: nm.offload(None), lambda m, s: nm.save(None, s),
                                  lambda m, s: nm.save(m, None), lambda m, s: nm.load(None),
                                  lambda m, s: nm.build(None, s),
                                  lambda m, s: nm.build("rmc1", "path")], ids=str)
def test_model_argument_types(rmc1, call):
    _, store, model, _ = rmc1
    with pytest.raises(InvalidRequest):
        call(model, store)


def test_verify_json_when_the_store_does_not_open(tmp_path):
    out = subprocess.run([sys.executable, "-m", "nearrec.cli", "verify", "--json",
                          str(tmp_path / "nope")], capture_output=True, text=True, check=False)
    doc = json.loads(out.stdout)
    assert out.returncode == 1 and doc["ok"] is False and doc["error_type"] == "StoreNotFound"
    assert "nope" in doc["error"]

