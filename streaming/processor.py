"""The Spark adapter of `detector.py`: a StatefulProcessor for `transformWithStateInPandas`.

Keyed by broker set name. The whole `SetWatch` is one JSON string in one ValueState,
so a batch costs one state read, one state write and at most two timer calls per set
(every state call is a socket round trip to the JVM). Heartbeats are collapsed per
broker before they touch the watch. The reserved group "" carries dead letters
through the operator unchanged (no state), so the job needs only one Kafka read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

from electra.streaming import detector
from electra.streaming.parsing import DLQ_GROUP, EVENT, HEARTBEAT

log = logging.getLogger("electra.streaming.processor")

OUTPUT_SCHEMA = "kind string, brokerName string, payload string"
OUTPUT_COLUMNS = ["kind", "brokerName", "payload"]


def _frame(rows: list[tuple[str, str, str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=OUTPUT_COLUMNS)


class MasterWatchProcessor(StatefulProcessor):
    """One `detector.SetWatch` per broker set, one processing-time timer per watch."""

    def __init__(self, max_retries: int = 3, retry_factor: int = 2) -> None:
        self.max_retries = max_retries
        self.retry_factor = retry_factor

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        # The newest heartbeat ingest time seen in this partition's batch so far. Spark calls
        # handleInputRows for every set with data before any expired timer, on this instance,
        # so timers are judged against the data the batch actually holds (detector.judge_at).
        self._horizon: int | None = None
        self.watch_state = handle.getValueState("watch", "json string")

    # ------------------------------------------------------------------ state helpers
    def _load(self) -> detector.SetWatch | None:
        row = self.watch_state.get()  # None when the set has no state yet (one round trip)
        return detector.SetWatch.from_json(row[0]) if row is not None else None

    def _store(self, watch: detector.SetWatch) -> None:
        """Save the watch; register its timer only when none is armed or the new one is earlier.

        A timer that is later than needed is never moved forward (that would cost two state
        calls per set and batch while the master keeps heartbeating): it fires early,
        `on_timer` finds the master alive and the next timer is armed then.
        """
        want, armed = watch.timer_ms, watch.armed_ms
        if want is not None and (armed is None or want < armed):
            if armed is not None:
                self.handle.deleteTimer(armed)
            self.handle.registerTimer(want)
            watch.armed_ms = want
        self.watch_state.update((watch.to_json(),))

    # ------------------------------------------------------------------ callbacks
    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:
        name = key[0]
        kinds: list[str] = []
        payloads: list[str] = []
        order: list[tuple[int, int]] = []
        for df in rows:
            kinds += df["kind"].tolist()
            payloads += df["payload"].tolist()
            order += list(zip(df["partition"].tolist(), df["offset"].tolist()))
        if name == DLQ_GROUP:  # dead letters pass through
            if payloads:
                yield _frame([(detector.DEAD_LETTER, "", p) for p in payloads])
            return
        events = [json.loads(p) for k, p in zip(kinds, payloads) if k == EVENT]
        hbs = sorted((o, p) for k, o, p in zip(kinds, order, payloads) if k == HEARTBEAT)
        heartbeats = detector.collapse_heartbeats([json.loads(p) for _, p in hbs])
        now = timerValues.getCurrentProcessingTimeInMs()
        newest = max((hb["ts"] for hb in heartbeats if hb.get("ts")), default=None)
        if newest is not None:
            self._horizon = max(self._horizon or 0, newest)
        watch, outputs = detector.process(self._load(), name, heartbeats, events, now, self.max_retries,
                                          self.retry_factor, judge_ms=detector.judge_at(now, self._horizon))
        self._store(watch)
        if outputs:
            yield _frame([o.row() for o in outputs])

    def handleExpiredTimer(self, key: Any, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        watch = self._load()
        if watch is None:
            return
        if watch.armed_ms == expiredTimerInfo.getExpiryTimeInMs():
            watch.armed_ms = None  # Spark removed the fired timer
        now = timerValues.getCurrentProcessingTimeInMs()
        outputs = detector.on_timer(watch, now, self.max_retries, self.retry_factor,
                                    judge_ms=detector.judge_at(now, self._horizon))
        self._store(watch)
        if outputs:
            yield _frame([o.row() for o in outputs])

    def close(self) -> None:
        self._horizon = None
