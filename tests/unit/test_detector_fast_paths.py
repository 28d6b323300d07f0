"""The detector's per-set hot paths (run for every set in every batch) against plain reference versions of the
same rules: written with loops and conditionals instead of max()/min() over generators, they must agree on every
input. Random inputs, a fixed seed."""

from __future__ import annotations

import random

from electra.state.liveness import BrokerLiveInfo
from electra.streaming import detector
from electra.streaming.detector import FORGET_FACTOR, FORGET_MIN_MS, RUN_FIELD, SetWatch, silence_ms, span_of


def _ref_span_of(heartbeats, disconnects=()):
    stamps = [ts for r in (*heartbeats, *disconnects) if (ts := r.get("ts"))]
    if not stamps:
        return None
    runs = [hb[RUN_FIELD] for hb in heartbeats if RUN_FIELD in hb]
    if runs:
        return min(r[0] for r in runs), max(r[1] for r in runs), max(stamps)
    stamps.sort()
    bound = silence_ms(min((hb["heartbeatTimeoutMillis"] for hb in heartbeats), default=detector.DEFAULT_TIMEOUT_MS))
    resumed = stamps[0]
    for prev, ts in zip(stamps, stamps[1:]):
        if ts - prev > bound:
            resumed = ts
    return stamps[0], resumed, stamps[-1]


def _ref_deadline(w: SetWatch):
    if w.master_id is None:
        return None
    mh = w.brokers.get(w.master_id)
    deadline = max(mh.last_update_ms if mh else 0, w.master_since_ms, w.resumed_ms) + w.master_timeout_ms()
    gone = w.gone.get(w.master_id)
    return min(deadline, gone[1] - 1) if gone is not None else deadline


def _ref_kept_after_forgetting(w: SetWatch, now_ms: int):
    return sorted(bid for bid, b in w.brokers.items() if bid == w.master_id
                  or not b.last_update_ms + max(FORGET_FACTOR * b.timeout_ms, FORGET_MIN_MS) < now_ms)


# Instants and timeouts drawn from values that sit on each other's boundaries (equal, one apart), where a `<`
# written for a `<=` would show.
TIMES = [0, 1, 2, 99, 100, 101, 3_000, 3_001, 6_000, 59_999, 60_000, 60_001, 60_100, 100_000, 120_000]
TIMEOUTS = [1, 100, 3_000, 6_000, 10_000]


def _t(rng: random.Random) -> int:
    return rng.choice(TIMES) + rng.choice([0, 0, 1, rng.choice(TIMEOUTS)])


def _watch(rng: random.Random) -> SetWatch:
    w = SetWatch("s", cluster="c", master_id=rng.choice([None, 1, 2, 3]), master_since_ms=_t(rng),
                 resumed_ms=rng.choice([0, _t(rng)]), data_ms=_t(rng))
    for bid in rng.sample([1, 2, 3, 4], rng.randrange(0, 5)):
        w.brokers[bid] = BrokerLiveInfo(bid, f"h{bid}:1", _t(rng), rng.choice(TIMEOUTS))
        if rng.random() < 0.3:
            at = _t(rng)
            w.gone[bid] = (at, at + rng.choice([0, 1, 100]))
    return w


def _records(rng: random.Random, folded: bool):
    hbs = []
    for bid in range(rng.randrange(0, 4)):
        hb = {"brokerId": bid + 1, "heartbeatTimeoutMillis": rng.choice(TIMEOUTS)}
        if rng.random() < 0.9:
            hb["ts"] = _t(rng)
        if folded and rng.random() < 0.8:
            first = _t(rng)
            hb[RUN_FIELD] = [first, first + rng.choice([0, 1, 3_000])]
        hbs.append(hb)
    dcs = [{"ts": _t(rng)} for _ in range(rng.randrange(0, 3))]
    return hbs, dcs


def test_span_of_agrees_with_the_reference():
    rng = random.Random(7)
    for _ in range(5_000):
        hbs, dcs = _records(rng, folded=rng.random() < 0.5)
        assert span_of(hbs, dcs) == _ref_span_of(hbs, dcs), (hbs, dcs)


def test_master_deadline_and_forgetting_agree_with_the_reference():
    rng = random.Random(11)
    for _ in range(5_000):
        w = _watch(rng)
        assert w.master_deadline_ms() == _ref_deadline(w)
        now = _t(rng) + rng.choice([0, 60_000, 100_000])
        kept = _ref_kept_after_forgetting(w, now)
        forgotten = set(w.brokers) - set(kept)
        w._forget_silent(now)
        assert sorted(w.brokers) == kept
        assert not forgotten & set(w.gone)  # a forgotten broker's disconnect goes with it


def test_the_state_form_round_trips_and_leaves_out_an_empty_gone():
    rng = random.Random(3)
    for _ in range(1_000):
        w = _watch(rng)
        d = w.to_dict()
        assert ("gone" in d) == bool(w.gone)
        assert SetWatch.from_json(w.to_json()) == w
