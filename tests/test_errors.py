"""Every bad input gets a typed error naming the table and, where there is one, the position."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nearrec
from nearrec import IndexOutOfRange, InvalidRequest, NearrecError, UnknownTable

T = "f32_d32"  # 300 rows


def test_exception_tree():
    assert issubclass(InvalidRequest, ValueError) and issubclass(InvalidRequest, NearrecError)
    assert issubclass(IndexOutOfRange, IndexError) and issubclass(IndexOutOfRange, InvalidRequest)
    assert issubclass(UnknownTable, KeyError)
    assert issubclass(nearrec.StoreNotFound, FileNotFoundError)
    assert issubclass(nearrec.StoreIOError, OSError)
    assert issubclass(nearrec.UnsupportedVersion, nearrec.StoreCorrupted)



def test_every_error_kind_of_the_core_is_a_class_here():
    """The facade's ErrorKind names the class every surface raises (Python here, the storage
    node's ErrorInfo reason): each must exist in nearrec.errors, under NearrecError."""
    import nearrec.errors as errors
    kinds = nearrec._native.error_kinds()
    assert len(kinds) == len(set(kinds)) >= 17
    for name in kinds:
        cls = getattr(errors, name)
        assert issubclass(cls, NearrecError), name


def test_a_huge_batch_of_empty_bags_is_a_typed_error_not_an_abort(mixed_store):
    """A [2**40, 0] id array is 0 bytes but declares 2**40 bags: refused before anything is
    allocated (it was the allocator's abort, or the OOM killer)."""
    ids = np.lib.stride_tricks.as_strided(np.zeros(1, np.int64), shape=(1 << 40, 0),
                                          strides=(0, 8))
    with pytest.raises(nearrec.errors.InsufficientMemory):
        mixed_store.lookup(T, ids)

@pytest.mark.parametrize("bad", [300, -1, 2**40, -(2**40)])
@pytest.mark.parametrize("itype", [np.int64, np.int32])
def test_index_out_of_range_names_table_and_position(mixed_store, bad, itype):
    if itype == np.int32 and abs(bad) > 2**31:
        return
    idx = np.array([0, 5, bad, 7], dtype=itype)
    with pytest.raises(IndexOutOfRange) as e:
        mixed_store.lookup(T, idx, np.array([0, 2], dtype=itype))
    assert e.value.table == T and e.value.position == 2
    assert "position 2" in str(e.value) and "bag 1" in str(e.value)


def test_index_out_of_range_on_worker_threads(mixed_store):
    idx = np.zeros(20_000, np.int64)
    idx[17_001] = 300
    with pytest.raises(IndexOutOfRange) as e:
        mixed_store.lookup(T, idx, np.arange(0, 20_000, 10))
    assert e.value.position == 17_001


def test_padding_skips_but_does_not_excuse_out_of_range(mixed_store):
    with pytest.raises(IndexOutOfRange):
        mixed_store.lookup(T, np.array([1, 300]), np.array([0]), padding_idx=1)


@pytest.mark.parametrize("offsets,msg", [
    ([1, 2], r"offsets\[0\] must be 0"),
    ([0, 3, 1], "must not decrease"),
    ([0, 5], "past the end"),
])
def test_bad_offsets(mixed_store, offsets, msg):
    with pytest.raises(InvalidRequest, match=msg) as e:
        mixed_store.lookup(T, np.array([1, 2, 3, 4]), np.array(offsets))
    assert e.value.table == T


def test_include_last_offset_needs_an_offset(mixed_store):
    with pytest.raises(InvalidRequest, match="at least one offset"):
        mixed_store.lookup(T, np.array([1]), np.array([], np.int64), include_last_offset=True)


def test_lengths_must_add_up(mixed_store):
    with pytest.raises(InvalidRequest, match="add up to"):
        mixed_store.lookup(T, np.array([1, 2, 3]), lengths=np.array([1, 1]))
    with pytest.raises(InvalidRequest, match="negative"):
        mixed_store.lookup(T, np.array([1, 2, 3]), lengths=np.array([4, -1]))


def test_a_jagged_request_is_read_by_the_engine_rules():
    """``nearrec.request.jagged`` (the KJT reader of the torch modules) is the native one: the
    same rules and messages as a KJT pooled by the engine, negative lengths included."""
    from nearrec.request import jagged

    class KJT:  # KeyedJaggedTensor-shaped, unchecked (nearrec's own checks its shape itself)
        def __init__(self, keys, values, lengths):
            self.k, self.v, self.n = keys, values, lengths

        def keys(self):
            return self.k

        def values(self):
            return self.v

        def lengths(self):
            return self.n

    j = jagged(KJT(["a", "b"], np.array([5, 6, 7]), np.array([2, 0, 1, 0], np.int32)))
    assert (j.keys, j.batch, j.bounds.tolist(), j.weights) == (["a", "b"], 2, [0, 2, 2, 3, 3],
                                                                None)
    cases = [(np.array([4, -1]), r"lengths\[1\] = -1 is negative"),
             (np.array([1, 1]), "add up to 2 but there are 3 values"),
             (np.array([3]), "not a multiple of 2 keys")]
    for lengths, says in cases:
        with pytest.raises(InvalidRequest, match=says):
            jagged(KJT(["a", "b"], np.array([5, 6, 7]), lengths))
    with pytest.raises(InvalidRequest, match="values must be int32 or int64, got float64"):
        jagged(KJT(["a"], np.array([1.0]), np.array([1])))
    with pytest.raises(InvalidRequest, match="keys are str, not 3"):
        jagged(KJT([3], np.array([1]), np.array([1])))
    with pytest.raises(InvalidRequest, match="a KeyedJaggedTensor, not dict"):
        jagged({"a": [1]})


def test_weights(mixed_store):
    idx, off = np.array([1, 2, 3]), np.array([0])
    with pytest.raises(InvalidRequest, match="shape"):
        mixed_store.lookup(T, idx, off, per_sample_weights=np.ones(2, np.float32))
    for mode in ("mean", "max"):
        with pytest.raises(InvalidRequest, match="only supported with mode='sum'"):
            mixed_store.lookup(T, idx, off, per_sample_weights=np.ones(3, np.float32), mode=mode)
    with pytest.raises(InvalidRequest, match="float32"):
        mixed_store.lookup(T, idx, off, per_sample_weights=np.ones(3, np.float64))


@pytest.mark.parametrize("indices", [
    np.array([1.0, 2.0]), np.array([1, 2], np.uint8), np.array([[[1]]]), np.array(3),
])
def test_wrong_index_dtype_or_shape(mixed_store, indices):
    offsets = None if getattr(indices, "ndim", 1) != 1 else np.array([0])
    with pytest.raises(InvalidRequest) as e:
        mixed_store.lookup(T, indices, offsets)
    assert e.value.table == T


def test_2d_with_offsets_and_missing_offsets(mixed_store):
    with pytest.raises(InvalidRequest, match="2-D"):
        mixed_store.lookup(T, np.ones((2, 2), np.int64), np.array([0, 2]))
    with pytest.raises(InvalidRequest, match="need offsets"):
        mixed_store.lookup(T, np.array([1, 2]))


def test_bad_mode_and_padding(mixed_store):
    with pytest.raises(InvalidRequest, match="mode"):
        mixed_store.lookup(T, np.array([1]), np.array([0]), mode="median")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="padding_idx"):
        mixed_store.lookup(T, np.array([1]), np.array([0]), padding_idx=300)


def test_unknown_table(mixed_store):
    with pytest.raises(UnknownTable) as e:
        mixed_store.lookup("nope", np.array([1]), np.array([0]))
    assert e.value.table == "nope" and "f32_d32" in str(e.value)


def test_tables_must_agree_on_batch(mixed_store):
    reqs = [nearrec.TableLookup(T, np.array([1, 2]), np.array([0, 1])),
            nearrec.TableLookup("f32_d7", np.array([1]), np.array([0]))]
    with pytest.raises(InvalidRequest, match="bags"):
        mixed_store.lookup_many(reqs)


@settings(max_examples=150, deadline=None)
@given(
    idx=st.lists(st.integers(-5, 305), max_size=30),
    offsets=st.lists(st.integers(-3, 35), max_size=8),
    include_last=st.booleans(),
    mode=st.sampled_from(["sum", "mean", "max"]),
)
def test_malformed_requests_never_crash(mixed_store, idx, offsets, include_last, mode):
    """Random (often malformed) requests either pool to the right shape or raise InvalidRequest
    -- never another exception, a crash or a hang."""
    try:
        out = mixed_store.lookup(T, np.array(idx, np.int64), np.array(offsets, np.int64),
                                 include_last_offset=include_last, mode=mode)
    except InvalidRequest as e:
        assert e.table == T
        return
    n = len(offsets) - 1 if include_last else len(offsets)
    assert out.shape == (max(n, 0), 32)
    assert np.isfinite(out).all()


def test_sync_tables_arguments_are_refused_typed_by_the_binding(tmp_path):
    """`sync_table`'s values and tolerance are checked once, natively (Python restates none of
    it): a 1-D or integer array and a tolerance that is no number are `InvalidRequest`."""
    nearrec.from_numpy(tmp_path / "s", {"t": np.zeros((10, 4), np.float32)})
    store = nearrec.open(tmp_path / "s", writable=True)
    for values, tolerance, says in [(np.zeros(40, np.float32), 0.0, "must be 2-D"),
                                    (np.zeros((10, 4), np.int64), 0.0, "must be floats"),
                                    (np.zeros((10, 4)), True, "not True"),
                                    (np.zeros((10, 4)), "x", "not 'x'")]:
        with pytest.raises(InvalidRequest, match=says) as e:
            store.sync_table("t", values, tolerance=tolerance)
        assert store.version == 0, e.value
    assert store.sync_table("t", np.ones((10, 4)), tolerance=0).written == 10
