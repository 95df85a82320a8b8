"""A live store under a random stream of calls, held to a numpy model after every one
(hypothesis's `RuleBasedStateMachine`, issue 40): writes of one or two tables at once, removals,
bad writes refused whole, compactions, a table created and dropped, the store closed and opened
again (its log recovered), and lookups pooled in every mode — on the SSD tier behind DRAM tiers
far smaller than the tables, so that rows come from the row cache, the delta and the disk in
one batch. The default run is short; the `slow` one (`make test-slow`) runs many more."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import nearrec

#: table → (rows, dim, dtype)
TABLES = {"f": (300, 8, "fp32"), "h": (120, 4, "fp16")}
SCRATCH = ("s", 40, 4)
CONFIG = {"tier": "ssd", "dram_budget": "4KiB", "writable": True}


def stored(dtype: str, values: np.ndarray) -> np.ndarray:
    """What a table of ``dtype`` stores of float32 ``values``."""
    return values.astype(np.float16).astype(np.float32) if dtype == "fp16" else values


def rows_of(table: str) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, TABLES[table][0] - 1), min_size=1, max_size=24, unique=True)


values = st.floats(-4, 4, allow_nan=False, width=32)


class LiveStore(RuleBasedStateMachine):
    @initialize()
    def build(self) -> None:
        import tempfile
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "store")
        rng = np.random.default_rng(0)
        arrays = {t: rng.standard_normal((r, d), dtype=np.float32)
                  for t, (r, d, _) in TABLES.items()}
        nearrec.from_numpy(self.path, arrays, dtype={t: d for t, (_, _, d) in TABLES.items()})
        self.store = nearrec.open(self.path, **CONFIG)
        self.model = {t: stored(TABLES[t][2], a) for t, a in arrays.items()}
        self.scratch = False
        self.version = self.store.version

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()
            self.dir.cleanup()

    def newer(self, version: int) -> None:
        assert version > self.version, (version, self.version)
        self.version = version

    @rule(table=st.sampled_from(sorted(TABLES)), data=st.data())
    def write(self, table: str, data: st.DataObject) -> None:
        ids = data.draw(rows_of(table))
        dim = TABLES[table][1]
        new = np.asarray(data.draw(st.lists(values, min_size=len(ids) * dim,
                                            max_size=len(ids) * dim)), np.float32)
        new = new.reshape(len(ids), dim)
        self.newer(self.store.write(table, np.asarray(ids), new))
        self.model[table][ids] = stored(TABLES[table][2], new)

    @rule(data=st.data())
    def write_both(self, data: st.DataObject) -> None:
        writes = {}
        for t, (_, dim, _) in TABLES.items():
            ids = data.draw(rows_of(t))
            writes[t] = (np.asarray(ids), np.full((len(ids), dim),
                                                  data.draw(values), np.float32))
        self.newer(self.store.write_many(writes))
        for t, (ids, new) in writes.items():
            self.model[t][ids] = stored(TABLES[t][2], new)

    @rule(table=st.sampled_from(sorted(TABLES)), data=st.data())
    def remove(self, table: str, data: st.DataObject) -> None:
        ids = data.draw(rows_of(table))
        self.newer(self.store.remove(table, np.asarray(ids)))
        self.model[table][ids] = 0.0

    @rule(data=st.data())
    def a_bad_write_changes_nothing(self, data: st.DataObject) -> None:
        # one good table and one bad: an id past the table, or a NaN; refused whole
        rows, dim, _ = TABLES["f"]
        bad_id = data.draw(st.booleans())
        ids = np.array([1, rows if bad_id else 2])
        new = np.ones((2, dim), np.float32)
        if not bad_id:
            new[1, 0] = np.nan
        h = TABLES["h"]
        with pytest.raises((nearrec.IndexOutOfRange, nearrec.InvalidRequest)) as e:
            self.store.write_many({"h": (np.array([0]), np.ones((1, h[1]), np.float32)),
                                   "f": (ids, new)})
        assert (e.value.table, e.value.position) == ("f", 1)
        assert self.store.version == self.version

    @rule()
    def compact(self) -> None:
        self.store.compact()

    @rule()
    def scratch_table(self) -> None:
        if self.scratch:
            self.newer(self.store.drop_table(SCRATCH[0]))
        else:
            self.newer(self.store.create_table(*SCRATCH, init="zeros"))
        self.scratch = not self.scratch

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = nearrec.open(self.path, **CONFIG)
        assert self.store.version == self.version

    @precondition(lambda self: hasattr(self, "store"))
    @rule(table=st.sampled_from(sorted(TABLES)), data=st.data(),
          mode=st.sampled_from(["sum", "mean", "max"]))
    def lookup(self, table: str, data: st.DataObject, mode: str) -> None:
        rows = TABLES[table][0]
        lengths = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=6))
        ids = np.asarray(data.draw(st.lists(st.integers(0, rows - 1), min_size=sum(lengths),
                                            max_size=sum(lengths))), np.int64)
        got = self.store.lookup(table, ids, lengths=np.asarray(lengths), mode=mode)
        want, at = [], 0
        for n in lengths:
            bag = self.model[table][ids[at:at + n]]
            at += n
            if n == 0:
                want.append(np.zeros(TABLES[table][1], np.float32))
            else:
                want.append({"sum": bag.sum(0), "mean": bag.mean(0), "max": bag.max(0)}[mode])
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-5)

    @invariant()
    def rows_are_the_models(self) -> None:
        if not hasattr(self, "store"):
            return
        for t, (rows, _, _) in TABLES.items():
            np.testing.assert_array_equal(self.store.read_rows(t, np.arange(rows)),
                                          self.model[t])
        assert (SCRATCH[0] in self.store.tables) == self.scratch


def runs(examples: int) -> settings:
    return settings(max_examples=examples, stateful_step_count=25, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


class TestALiveStoreIsItsModel(LiveStore.TestCase):  # type: ignore[misc,valid-type]
    settings = runs(12)


@pytest.mark.slow
class TestALiveStoreIsItsModelMany(LiveStore.TestCase):  # type: ignore[misc,valid-type]
    settings = runs(300)
