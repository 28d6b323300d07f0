"""The Spark adapter of `detector.py`: a StatefulProcessor for `transformWithStateInPandas`.

Keyed by a *bucket* of broker sets (`parsing.bucket_of`), not by set. Spark's costs per
key are high in Python: a pandas frame per key, and every state or timer call is a socket
round trip to the JVM. Keyed by set, that measured about 12 ms per set per batch on this
project's 2-core machine (300 sets: 3.6 s of a 4 s batch), which caps a job at a few
hundred sets. Keyed by bucket, those costs are paid per bucket and what grows with the
fleet is plain Python over `SetWatch` objects.

A bucket's state is one value: its `SetWatch`es as one JSON object, and the timer it has
armed. The bucket keeps one processing-time timer at the earliest deadline among its sets
(armed once; a timer that fires early re-arms). Sets whose timers are due are evaluated
both when their bucket has data and when its timer fires. The reserved bucket "" carries
dead letters through unchanged (no state), so the job needs one Kafka read.

A bucket's input arrives as bundle rows from the Python source (`parsing.parse_bundles`: all
its records in one row) or one row per record after Spark's own connector; both are read the
same way. A batch's work runs with the cyclic collector paused (`collector.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from itertools import chain
from operator import itemgetter
from typing import Any

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from electra.streaming import detector, records
from electra.streaming.collector import collector_paused
from electra.streaming.parsing import BUNDLE, DISCONNECTED, DLQ_GROUP, EVENT, HEARTBEAT

log = logging.getLogger("electra.streaming.processor")

OUTPUT_SCHEMA = "kind string, brokerName string, payload string"
BUCKET_SCHEMA = "watches string, armed long"  # armed: the registered timer, -1 for none
OUTPUT_COLUMNS = ["kind", "brokerName", "payload"]


# msgspec's JSON (records.loads/dumps): the operator decodes every heartbeat it is handed and encodes each
# bucket's state every batch; measured offline at 1,000 sets, the standard library's json was ~60% of its Python.
_decode = records.loads
_encode = records.dumps


def _frame(rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=OUTPUT_COLUMNS)


# Per Python worker: the value each bucket was last stored with here, and its watches as objects.
# Spark reuses its Python workers across batches, and a bucket's value read back equal to the one
# this worker stored needs no decoding (json.loads + SetWatch.from_dict of every set was a good part
# of the operator's Python per batch). Taken out on load and put back on store, so a batch that
# fails in between (Spark re-runs it from the previous state version) decodes again.
_DECODED: dict[str, tuple[str, dict[str, detector.SetWatch]]] = {}


def _bucket_of_key(key: Any) -> str:
    return str(key[0])


def _one_per_broker(heartbeats: list[dict]) -> list[dict]:
    """The set's heartbeats folded to one per broker; the Python source already hands on one per broker
    (`parsing.parse_bundles`), so the fold runs only when a broker appears twice (Spark's Kafka source)."""
    if len({hb["brokerId"] for hb in heartbeats}) == len(heartbeats):
        return heartbeats
    return detector.collapse_heartbeats(heartbeats)


def _may_propose(watch: detector.SetWatch | None, events: list, disconnects: list, heartbeats: list,
                 judge_ms: int) -> bool:
    """Whether this batch may fail the set's master over: a new watch, an event or a lost connection, a master
    whose timer or deadline is due or whose timer was left unarmed (waiting for a live replica, or silent), or a
    heartbeat that brings a broker or a timeout the watch does not hold (a shorter timeout moves the deadline
    earlier). Otherwise heartbeats only move the master's deadline later. A set misjudged here is still processed
    in the same batch, only after the others."""
    if watch is None or events or disconnects:
        return True
    if watch.master_id is None:
        return False
    if watch.timer_ms is None or watch.timer_ms <= judge_ms:
        return True
    deadline = watch.master_deadline_ms()  # a timer re-armed while nothing was judged can be later than it
    if deadline is not None and deadline < judge_ms:
        return True
    brokers = watch.brokers
    for _, hb in heartbeats:
        b = brokers.get(hb["brokerId"])
        if b is None or b.timeout_ms != hb["heartbeatTimeoutMillis"]:
            return True
    return False


class MasterWatchProcessor(StatefulProcessor):
    """`detector.SetWatch`es of one bucket of broker sets, one timer per bucket."""

    def __init__(self, max_retries: int = 3, retry_factor: int = 2, disconnect_grace_ms: int = 0,
                 proposer=None) -> None:
        self.max_retries = max_retries
        self.retry_factor = retry_factor
        self.disconnect_grace_ms = disconnect_grace_ms
        self.proposer = proposer  # sink.OperatorProposer: proposals go out as they are decided (None: at batch end)

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        # The newest heartbeat ingest time seen in this partition's batch so far. Spark calls
        # handleInputRows for every key with data before any expired timer, on this instance,
        # so timers are judged against the data the batch actually holds (detector.judge_at).
        self._horizon: int | None = None
        self.bucket_state = handle.getValueState("bucket", BUCKET_SCHEMA)

    # ------------------------------------------------------------------ state helpers
    def _load(self, bucket: str) -> tuple[dict[str, detector.SetWatch], int | None]:
        row = self.bucket_state.get()  # None when the bucket has no state yet (one round trip)
        cached = _DECODED.pop(bucket, None)
        if row is None:
            return {}, None
        if cached is not None and cached[0] == row[0]:
            watches = cached[1]
        else:
            watches = {name: detector.SetWatch.from_dict(d) for name, d in _decode(row[0]).items()}
        return watches, (row[1] if row[1] is not None and row[1] >= 0 else None)

    def _store(self, bucket: str, watches: dict[str, detector.SetWatch], armed: int | None) -> None:
        """Save the bucket; register its timer only when none is armed or the earliest deadline is earlier.

        A timer later than needed is never moved forward (two more state calls per batch while
        masters keep heartbeating): it fires early, the due sets are checked, the next is armed.
        """
        for name in [n for n, w in watches.items() if w.idle()]:
            del watches[name]
        want = min((w.timer_ms for w in watches.values() if w.timer_ms is not None), default=None)
        if want is not None and (armed is None or want < armed):
            if armed is not None:
                self.handle.deleteTimer(armed)
            self.handle.registerTimer(want)
            armed = want
        body = _encode({n: w.to_dict() for n, w in watches.items()})
        self.bucket_state.update((body, -1 if armed is None else armed))
        _DECODED[bucket] = (body, watches)

    def _due(self, watches: dict[str, detector.SetWatch], skip: set[str], now: int) -> list[detector.Output]:
        judge = detector.judge_at(now, self._horizon)
        out: list[detector.Output] = []
        for name, w in watches.items():
            if name not in skip and w.timer_ms is not None and w.timer_ms <= now:
                out += detector.on_timer(w, now, self.max_retries, self.retry_factor, judge_ms=judge)
        return out

    def _propose(self, outputs: list[detector.Output]) -> None:
        """Send the proposals now (each marked with its outcome); the driver sends what this did not settle."""
        if self.proposer is not None:
            self.proposer.send([o.payload for o in outputs if o.kind == detector.PROPOSAL])

    # ------------------------------------------------------------------ callbacks
    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:
        with collector_paused():
            frames = self._on_rows(key, rows, timerValues)
        yield from frames

    def handleExpiredTimer(self, key: Any, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        with collector_paused():
            frames = self._on_timer(key, timerValues, expiredTimerInfo)
        yield from frames

    def close(self) -> None:
        self._horizon = None

    # ------------------------------------------------------------------ a batch's work (the collector paused)
    def _on_rows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues) -> list[pd.DataFrame]:
        by_set: dict[str, tuple[list, list, list]] = {}  # name -> (events, [(order, heartbeat)], disconnects)
        dead: list[str] = []

        def add(group: str, kind: str, order: tuple[int, int], rec: dict) -> None:
            lists = by_set.get(group)
            if lists is None:  # (not setdefault: that builds three lists for every record)
                lists = by_set[group] = ([], [], [])
            evs, hbs, dcs = lists
            if kind == EVENT:
                evs.append(rec)
            elif kind == HEARTBEAT:
                hbs.append((order, rec))
            elif kind == DISCONNECTED:
                dcs.append(rec)

        for df in rows:
            for group, kind, part, off, payload in zip(df["group"].tolist(), df["kind"].tolist(),
                                                       df["partition"].tolist(), df["offset"].tolist(),
                                                       df["payload"].tolist()):
                if kind == BUNDLE:  # the Python source's rows: many records of this bucket (parsing.parse_bundles)
                    for g, k, p, o, rec in _decode(payload):
                        add(g, k, (p, o), rec)
                elif group == DLQ_GROUP:
                    dead.append(payload)
                elif kind in (EVENT, HEARTBEAT, DISCONNECTED):
                    add(group, kind, (part, off), _decode(payload))
        frames = [_frame([(detector.DEAD_LETTER, "", p) for p in dead])] if dead else []  # dead letters pass through
        if not by_set:
            return frames
        now = timerValues.getCurrentProcessingTimeInMs()
        # Disconnected records are stamped by the ingest clock too: they move the data horizon. (A fold keeps a
        # broker's newest stamp, so the newest of the records is the newest of what `_one_per_broker` keeps.)
        newest = max((r["ts"] for _, hbs, dcs in by_set.values() for r in chain((h for _, h in hbs), dcs)
                      if r.get("ts")), default=None)
        if newest is not None:
            self._horizon = max(self._horizon or 0, newest)
        judge = detector.judge_at(now, self._horizon)
        bucket = _bucket_of_key(key)
        watches, armed = self._load(bucket)
        # The sets this batch may fail over go first, and their proposals leave before the bucket's other sets
        # are processed and its state is stored: at 10,000 sets that is most of a bucket's time.
        urgent = {name for name, (events, hbs, dcs) in by_set.items()
                  if judge is not None and _may_propose(watches.get(name), events, dcs, hbs, judge)}
        outputs = self._apply(watches, [(n, v) for n, v in by_set.items() if n in urgent], now, judge)
        outputs += self._due(watches, set(by_set), now)
        self._propose(outputs)
        later = self._apply(watches, [(n, v) for n, v in by_set.items() if n not in urgent], now, judge)
        self._store(bucket, watches, armed)
        self._propose(later)
        outputs += later
        return frames + [_frame([o.row() for o in outputs])] if outputs else frames

    def _apply(self, watches: dict[str, detector.SetWatch], sets: list[tuple[str, tuple[list, list, list]]],
               now: int, judge: int | None) -> list[detector.Output]:
        """`detector.process` of each set's records: events, heartbeats in read order, `disconnected` records."""
        outputs: list[detector.Output] = []
        for name, (events, hbs, dcs) in sets:
            ordered = [hb for _, hb in sorted(hbs, key=itemgetter(0))]
            # Before the fold: a silence of the whole set is seen in the stamps of all its records.
            span = detector.span_of(ordered, dcs)
            watches[name], out = detector.process(watches.get(name), name, _one_per_broker(ordered), events, now,
                                                  self.max_retries, self.retry_factor, judge_ms=judge,
                                                  disconnects=dcs, grace_ms=self.disconnect_grace_ms, span=span)
            outputs += out
        return outputs

    def _on_timer(self, key: Any, timerValues, expiredTimerInfo) -> list[pd.DataFrame]:
        bucket = _bucket_of_key(key)
        watches, armed = self._load(bucket)
        if armed == expiredTimerInfo.getExpiryTimeInMs():
            armed = None  # Spark removed the fired timer
        if not watches:
            return []
        outputs = self._due(watches, set(), timerValues.getCurrentProcessingTimeInMs())
        self._store(bucket, watches, armed)
        self._propose(outputs)
        return [_frame([o.row() for o in outputs])] if outputs else []
