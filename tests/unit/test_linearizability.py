"""The checker must accept linearizable histories and reject the others."""

from __future__ import annotations

import math
import random

from electra.consensus.linearizability import History, Op, check


def op(kind, value, call, ret, output=None, key="x", status="ok", process=0):
    return Op(process, key, kind, value, call, ret, output, status)


def test_sequential_history_is_linearizable():
    h = [op("put", 1, 0, 1), op("get", None, 2, 3, 1), op("put", 2, 4, 5), op("get", None, 6, 7, 2)]
    assert check(h).ok


def test_concurrent_put_and_get_may_order_either_way():
    assert check([op("put", 1, 0, 10), op("get", None, 1, 2, 1)]).ok
    assert check([op("put", 1, 0, 10), op("get", None, 1, 2, None)]).ok


def test_stale_read_after_completed_write_is_rejected():
    h = [op("put", 1, 0, 1), op("put", 2, 2, 3), op("get", None, 4, 5, 1)]
    r = check(h)
    assert not r.ok and r.key == "x" and "get" in r.explanation


def test_read_of_a_value_never_written_is_rejected():
    assert not check([op("put", 1, 0, 1), op("get", None, 2, 3, 7)]).ok


def test_reads_observing_impossible_order_are_rejected():
    # Both writes overlap the reads, but once one read sees 2 a later read cannot see 1 again.
    h = [op("put", 1, 0, 10), op("put", 2, 0, 10), op("get", None, 1, 2, 2), op("get", None, 3, 4, 1),
         op("get", None, 5, 6, 2)]
    assert not check(h).ok


def test_cas_results_must_be_consistent():
    assert check([op("put", 1, 0, 1), op("cas", (1, 2), 2, 3, True), op("get", None, 4, 5, 2)]).ok
    assert not check([op("put", 1, 0, 1), op("cas", (1, 2), 2, 3, False)]).ok
    assert not check([op("put", 1, 0, 1), op("cas", (5, 2), 2, 3, True)]).ok


def test_unknown_write_may_or_may_not_take_effect():
    unknown = op("put", 9, 0, math.inf, status="unknown")
    assert check([unknown, op("get", None, 5, 6, 9)]).ok
    assert check([unknown, op("get", None, 5, 6, None)]).ok
    # ... but not both ways after it was observed.
    assert not check([unknown, op("get", None, 5, 6, 9), op("get", None, 7, 8, None)]).ok


def test_history_builder_drops_failures_and_marks_pending_unknown():
    h = History()
    h.invoke(1, 0, "x", "put", 1, 0)
    h.fail(1, 1)
    h.invoke(2, 0, "x", "put", 2, 2)
    h.ok(2, None, 3)
    h.invoke(3, 1, "x", "put", 3, 4)  # never answered
    h.invoke(4, 2, "x", "get", None, 5)
    h.ok(4, 2, 6)
    assert [o.status for o in h.ops()] == ["ok", "ok", "unknown"]
    assert check(h).ok
    h2 = History()
    h2.invoke(1, 0, "x", "put", 1, 0)
    h2.fail(1, 1)
    h2.invoke(2, 0, "x", "get", None, 2)
    h2.ok(2, 1, 3)  # reads a failed write: impossible
    assert not check(h2).ok


def test_violation_on_one_key_among_many_names_that_key():
    h = []
    for k in range(20):
        h += [op("put", k, 0, 1, key=f"k{k}"), op("get", None, 2, 3, k, key=f"k{k}")]
    h += [op("put", 1, 10, 11, key="k7"), op("get", None, 12, 13, 7, key="k7")]
    r = check(h)
    assert not r.ok and r.key == "k7"


def _random_history(rng: random.Random, n: int, clients: int = 6):
    """A real register executed sequentially at random instants, observed through random windows."""
    points = sorted(rng.uniform(0, 1000) for _ in range(n))
    state, ops = None, []
    for k, t in enumerate(points):
        if rng.random() < 0.5:
            state = k
            ops.append(op("put", k, t - rng.uniform(0, 30), t + rng.uniform(0, 30), process=k % clients))
        else:
            ops.append(op("get", None, t - rng.uniform(0, 30), t + rng.uniform(0, 30), state,
                          process=k % clients))
    return ops


def test_random_real_executions_pass_and_corrupted_ones_fail():
    for seed in range(30):
        rng = random.Random(seed)
        ops = _random_history(rng, 120)
        assert check(ops).ok, seed
        gets = [o for o in ops if o.kind == "get"]
        rng.choice(gets).output = -1  # a value no put ever wrote
        assert not check(ops).ok, seed


def test_search_gives_up_at_the_timeout_without_claiming_success():
    ops = [op("put", k, 0, 100) for k in range(18)] + [op("get", None, 0, 100, -1)]
    r = check(ops, timeout_s=0.0)
    assert not r.ok and r.timed_out
