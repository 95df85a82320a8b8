"""The partition harness's linearizability checker (``nearrec_bench.linearizable``) on
hand-made histories that are and are not linearizable, and on histories drawn from a real
register with concurrent clients (linearizable by construction) and the same with one read's
answer changed (not, where no order explains it: checked by brute force on small ones)."""

from __future__ import annotations

import itertools
import random

import pytest

from nearrec_bench.linearizable import Op, check


def w(key: str, value: int, invoke: float, complete: float | None, ok: bool = True) -> Op:
    return Op("write", key, value, invoke, complete, ok)


def r(key: str, value: int | None, invoke: float, complete: float | None) -> Op:
    return Op("read", key, value, invoke, complete)


@pytest.mark.parametrize("history", [
    # one after the other
    [w("a", 1, 0, 1), r("a", 1, 2, 3)],
    # a read overlapping a write may see either value
    [w("a", 1, 0, 5), r("a", None, 1, 2), r("a", 1, 3, 4)],
    [w("a", 1, 0, 5), r("a", 1, 1, 2)],
    # two concurrent writes, read in the one order both reads agree on
    [w("a", 1, 0, 5), w("a", 2, 0, 5), r("a", 1, 6, 7), r("a", 1, 8, 9)],
    # a write with no answer may take effect late, or never
    [w("a", 3, 0, None), r("a", None, 1, 2), r("a", 3, 5, 6)],
    [w("a", 3, 0, None), r("a", None, 1, 2), r("a", None, 5, 6)],
    # a read with no answer says nothing; a failed write took no effect
    [w("a", 1, 0, 1), r("a", 7, 2, None), w("a", 9, 3, 4, ok=False), r("a", 1, 5, 6)],
    # touching intervals are concurrent
    [w("a", 1, 0, 2), r("a", None, 2, 3)],
    # keys are separate registers
    [w("a", 1, 0, 1), w("b", 2, 0, 1), r("a", 1, 2, 3), r("b", 2, 2, 3)],
])
def test_histories_that_are_linearizable(history: list[Op]) -> None:
    verdict = check(history)
    assert verdict, verdict


@pytest.mark.parametrize("history", [
    # a stale read after the write completed
    [w("a", 1, 0, 1), r("a", None, 2, 3)],
    # the value flips back: writes 1 and 2 concurrent, then 2, then 1
    [w("a", 1, 0, 5), w("a", 2, 0, 5), r("a", 2, 6, 7), r("a", 1, 8, 9)],
    # a read of a value nobody wrote
    [w("a", 1, 0, 1), r("a", 5, 2, 3)],
    # a failed write seen
    [w("a", 9, 0, 1, ok=False), r("a", 9, 2, 3)],
    # a late write with no answer seen, then the older value again
    [w("a", 1, 0, 1), w("a", 3, 2, None), r("a", 3, 5, 6), r("a", 1, 7, 8)],
    # two readers disagree on the order of two writes, each read after both were done
    [w("a", 1, 0, 3), w("a", 2, 0, 3), r("a", 1, 4, 10), r("a", 2, 4, 5), r("a", 1, 6, 7)],
])
def test_histories_that_are_not(history: list[Op]) -> None:
    verdict = check(history)
    assert not verdict
    assert verdict.key == "a" and verdict.stuck is not None
    assert "not linearizable" in str(verdict)


def test_the_bad_key_is_named_among_good_ones() -> None:
    history = [w(k, i, 0, 1) for i, k in enumerate("abcde")] + [
        r(k, i, 2, 3) for i, k in enumerate("abcde")]
    assert check(history).ok and check(history).keys == 5
    history.append(r("d", 0, 4, 5))
    assert check(history).key == "d"


def register_history(seed: int, clients: int = 3, calls: int = 8) -> list[Op]:
    """Clients calling a real register: each call takes effect at one random instant inside
    its interval, so the history is linearizable by construction."""
    rng = random.Random(seed)
    spans = []
    for c in range(clients):
        t = rng.random()
        for _ in range(calls):
            start = t + rng.random()
            end = start + rng.random() * 2
            spans.append((c, start, end, rng.uniform(start, end), rng.random() < 0.5))
            t = end
    value, history = 0, []
    for c, start, end, _at, write in sorted(spans, key=lambda s: s[3]):
        if write:
            value = len(history) + 1
            history.append(Op("write", "k", value, start, end, client=c))
        else:
            history.append(Op("read", "k", value, start, end, client=c))
    return history


def brute_force(history: list[Op], initial: int = 0) -> bool:
    """Some order of the operations respects real time and reads what the writes left."""
    for order in itertools.permutations(history):
        if any(b.complete is not None and b.complete < a.invoke
               for i, a in enumerate(order) for b in order[i + 1:]):
            continue
        value = initial
        for op in order:
            if op.kind == "write":
                value = op.value
            elif op.value != value:
                break
        else:
            return True
    return False


@pytest.mark.parametrize("seed", range(30))
def test_a_real_registers_history_is_linearizable(seed: int) -> None:
    assert check(register_history(seed), initial=0)


@pytest.mark.parametrize("seed", range(30))
def test_a_changed_read_is_found_where_no_order_explains_it(seed: int) -> None:
    history = register_history(seed, clients=2, calls=3)
    reads = [i for i, op in enumerate(history) if op.kind == "read"]
    if not reads:
        pytest.skip("no read drawn")
    rng = random.Random(seed)
    i = rng.choice(reads)
    changed = list(history)
    changed[i] = Op("read", "k", history[i].value + rng.choice([1, 2, 3]), history[i].invoke,
                    history[i].complete)
    assert bool(check(changed, initial=0)) == brute_force(changed)


def test_many_writes_without_answers_that_no_read_saw_are_decided_at_once() -> None:
    # 60 writes that never answered, none read, among a real register's calls: left out, so the
    # search stays within a small budget; a changed read among them is still found
    history = register_history(3, clients=3, calls=20)
    lost = [w("k", 1000 + i, float(i) / 10, None) for i in range(60)]
    assert check(history + lost, initial=0, budget=200_000)
    reads = [i for i, op in enumerate(history) if op.kind == "read" and op.complete is not None]
    bad = list(history)
    bad[reads[-1]] = Op("read", "k", 999, bad[reads[-1]].invoke, bad[reads[-1]].complete)
    assert not check(bad + lost, initial=0, budget=200_000)


def test_a_search_past_its_budget_is_undecided_not_passed() -> None:
    history = register_history(4, clients=3, calls=30)
    verdict = check(history, initial=0, budget=10)
    assert not verdict and verdict.undecided, verdict
    assert "undecided" in str(verdict)
    assert check(history, initial=0)
