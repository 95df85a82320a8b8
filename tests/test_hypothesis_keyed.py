"""A live keyed table under a random stream of calls, held to a dict model after every one
(hypothesis's `RuleBasedStateMachine`, issue 41): writes by key (new keys admitted at their
second sighting within a window, refused whole at the cap), removals, lookups of held and
unknown keys, the clock advanced, compactions that let go of keys past their TTL, the store
closed and opened again (its log recovered) — on the SSD tier behind DRAM tiers far smaller than
the table. The model predicts everything: which keys are held and their rows, which writes are
dropped before admission, which call is ``KeysFull`` at which position, which keys expire. A
second machine fills a table that evicts at its cap (the victims are sampled, so it holds the
store to what must be true: the cap, each held key's last write, every key a call gave a row
held after it)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import nearrec

DIM, BUILT, CAPACITY, CAP, TTL, WINDOW = 4, 12, 40, 24, 100, 50
#: the keys calls draw from: the built ones and others, negative ones too
UNIVERSE = [k * 7919 - 2**62 for k in range(36)]
LIMITS = {"ttl_s": TTL, "touch": "write", "admit_after": 2, "admit_window_s": WINDOW,
          "admit_slots": 4096, "cap": CAP, "evict": "off"}
CONFIG = {"tier": "ssd", "dram_budget": "18KiB", "writable": True, "auto_compact": False,
          "unknown_keys": "zero", "manual_clock": True, "key_limits": {"t": LIMITS}}

keys_ = st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=10)
values = st.floats(-4, 4, allow_nan=False, width=32)


class BuiltKeyedStore(RuleBasedStateMachine):
    """A keyed table `t` of the first BUILT keys with room for CAPACITY, opened as `config`
    says; closed and removed at the end."""

    def build_store(self, config: dict[str, object]) -> dict[int, np.ndarray]:
        """Builds and opens the store; each key built and its row."""
        import tempfile
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "store")
        rng = np.random.default_rng(0)
        rows = rng.standard_normal((BUILT, DIM), dtype=np.float32)
        built = np.asarray(UNIVERSE[:BUILT], np.int64)
        nearrec.from_numpy(self.path, {"t": rows}, keys={"t": built},
                           capacity={"t": CAPACITY})
        self.store = nearrec.open(self.path, **config)
        return {int(k): rows[i].copy() for i, k in enumerate(built)}

    def teardown(self) -> None:
        if hasattr(self, "store"):
            self.store.close()
            self.dir.cleanup()


class KeyedLiveStore(BuiltKeyedStore):
    @initialize()
    def build(self) -> None:
        #: key → its row; key → when it was last written (seconds since the clock started)
        self.held = self.build_store(CONFIG)
        self.touched = dict.fromkeys(self.held, 0)
        self.now = 0
        #: the admission window: when it started, and each new key's sightings in it
        self.window, self.seen = 0, dict[int, int]()
        self.version = self.store.version

    def sighting(self, key: int) -> bool:
        """A new key seen now: whether it is admitted (its second sighting in the window)."""
        if self.now >= self.window + WINDOW:
            self.window, self.seen = self.now, {}
        self.seen[key] = self.seen.get(key, 0) + 1
        return self.seen[key] >= 2

    @rule(keys=keys_, data=st.data())
    def write(self, keys: list[int], data: st.DataObject) -> None:
        new = np.asarray(data.draw(st.lists(values, min_size=len(keys) * DIM,
                                            max_size=len(keys) * DIM)), np.float32)
        new = new.reshape(len(keys), DIM)
        held, touched, refused = dict(self.held), dict(self.touched), None
        for position, (key, row) in enumerate(zip(keys, new, strict=True)):
            if key not in held:
                if not self.sighting(key):
                    continue  # dropped until admitted
                if len(held) >= CAP:
                    refused = position
                    break
            held[key], touched[key] = row, self.now
        if refused is not None:
            with pytest.raises(nearrec.KeysFull) as e:
                self.store.write("t", np.asarray(keys, np.int64), new)
            assert (e.value.table, e.value.position) == ("t", refused)
            assert self.store.version == self.version
            return
        version = self.store.write("t", np.asarray(keys, np.int64), new)
        assert version >= self.version
        self.version = version
        self.held, self.touched = held, touched

    @rule(keys=keys_)
    def remove(self, keys: list[int]) -> None:
        self.version = self.store.remove("t", np.asarray(keys, np.int64))
        for key in keys:
            self.held.pop(key, None)
            self.touched.pop(key, None)

    @rule(keys=keys_, data=st.data())
    def lookup(self, keys: list[int], data: st.DataObject) -> None:
        lengths = data.draw(st.lists(st.integers(0, 4), min_size=1, max_size=4))
        ids = [keys[i % len(keys)] for i in range(sum(lengths))]
        got = self.store.lookup("t", np.asarray(ids, np.int64), lengths=np.asarray(lengths))
        want, at = [], 0
        for n in lengths:
            bag = np.zeros(DIM, np.float32)
            for key in ids[at:at + n]:
                if key in self.held:
                    bag += self.held[key]
                else:
                    self.sighting(key)  # a lookup of a new key is a sighting too
            want.append(bag)
            at += n
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-5)

    @rule(seconds=st.sampled_from([1, 25, 49, 50, 99, 100]))
    def advance_clock(self, seconds: int) -> None:
        self.store.advance_clock(seconds)
        self.now += seconds

    @rule()
    def compact(self) -> None:
        expired = [k for k, t in self.touched.items() if t + TTL <= self.now]
        before = self.store.stats()["keys_expired"]
        self.store.compact()
        assert self.store.stats()["keys_expired"] - before == len(expired)
        for key in expired:
            del self.held[key], self.touched[key]
        self.version = self.store.version

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = nearrec.open(self.path, **CONFIG)
        assert self.store.version == self.version
        # touches and sightings are kept in memory: a new clock, every key touched at open
        self.now, self.window, self.seen = 0, 0, {}
        self.touched = dict.fromkeys(self.held, 0)

    @precondition(lambda self: hasattr(self, "store"))
    @invariant()
    def keys_and_rows_are_the_models(self) -> None:
        assert self.store.tables["t"].keys == len(self.held)
        if self.held:
            keys = np.asarray(sorted(self.held), np.int64)
            np.testing.assert_array_equal(self.store.read_rows("t", keys),
                                          np.asarray([self.held[int(k)] for k in keys]))


def runs(examples: int) -> settings:
    return settings(max_examples=examples, stateful_step_count=30, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


class TestALiveKeyedTableIsItsModel(KeyedLiveStore.TestCase):  # type: ignore[misc,valid-type]
    settings = runs(25)


@pytest.mark.slow
class TestALiveKeyedTableIsItsModelMany(KeyedLiveStore.TestCase):  # type: ignore[misc,valid-type]
    settings = runs(300)


#: a full table that evicts: which key goes is sampled, so the model holds what must be true
EVICT_CAP = 16
EVICT_CONFIG = {"tier": "ssd", "dram_budget": "18KiB", "writable": True, "auto_compact": False,
                "unknown_keys": "error", "key_limits": {"t": {"cap": EVICT_CAP, "evict": "lru"}}}


class EvictingKeyedStore(BuiltKeyedStore):
    """Writes of new keys past the cap evict, and the store must stay a consistent subset of
    what was written: at most the cap of keys, each held key reading its last write, every key
    a call gave a row held after it, a key evicted unknown (not a row of another key's)."""

    @initialize()
    def build(self) -> None:
        #: every key's last written row (held or evicted since)
        self.last = self.build_store(EVICT_CONFIG)
        self.must = set(self.last)  # keys that must be held now

    def held(self) -> set[int]:
        out = set()
        for key in self.last:
            try:
                self.store.read_rows("t", np.asarray([key], np.int64))
                out.add(key)
            except nearrec.UnknownKey:
                pass
        return out

    @rule(keys=keys_, data=st.data())
    def write(self, keys: list[int], data: st.DataObject) -> None:
        new = np.asarray(data.draw(st.lists(values, min_size=len(keys) * DIM,
                                            max_size=len(keys) * DIM)), np.float32)
        new = new.reshape(len(keys), DIM)
        before = self.held()
        self.store.write("t", np.asarray(keys, np.int64), new)
        for key, row in zip(keys, new, strict=True):
            self.last[key] = row
        # the keys the call gave rows are held; the rest of what was held may have gone
        self.must = {k for k in keys if k not in before} | (self.must & self.held())

    @rule(keys=keys_)
    def remove(self, keys: list[int]) -> None:
        self.store.remove("t", np.asarray(keys, np.int64))
        for key in keys:
            self.last.pop(key, None)
        self.must -= set(keys)

    @rule()
    def compact(self) -> None:
        self.store.compact()

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = nearrec.open(self.path, **EVICT_CONFIG)

    @precondition(lambda self: hasattr(self, "store"))
    @invariant()
    def a_consistent_subset_of_what_was_written(self) -> None:
        held = self.held()
        assert self.must <= held, self.must - held
        assert len(held) <= EVICT_CAP
        assert self.store.tables["t"].keys == len(held) == self.store.stats()["keyed_keys"]
        if held:
            keys = np.asarray(sorted(held), np.int64)
            np.testing.assert_array_equal(self.store.read_rows("t", keys),
                                          np.asarray([self.last[int(k)] for k in keys]))


class TestAnEvictingKeyedTableStaysConsistent(  # type: ignore[misc,valid-type]
        EvictingKeyedStore.TestCase):
    settings = runs(15)


@pytest.mark.slow
class TestAnEvictingKeyedTableStaysConsistentMany(  # type: ignore[misc,valid-type]
        EvictingKeyedStore.TestCase):
    settings = runs(200)
