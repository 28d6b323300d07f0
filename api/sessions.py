"""Broker sessions on an ingest worker: the connection-loss signal of fast crash failover.

RocketMQ's controller starts an election as soon as a crashed master's channel closes
(reference §3.3 b); only a hung master waits for the heartbeat timeout. Here a broker
opens a *session* on its kept-alive connection to an ingest worker (`POST /v1/session`
with a heartbeat as body, then its heartbeats on the same connection). The worker
remembers which broker the connection speaks for, and when it ends:

* after `POST /v1/session/goodbye` (a clean shutdown): a `disconnected` record with
  reason `shutdown` was already published by the goodbye; the close adds nothing;
* without a goodbye (the broker crashed, its host closed the socket): a `disconnected`
  record with reason `connection_lost`, stamped with this worker's clock;
* because this worker is itself stopping: nothing. The broker is not known to be gone;
  it reconnects elsewhere and its heartbeats keep it alive (no false failover).

While a session is open the worker also watches its heartbeats: when the broker has sent none for
its whole heartbeat timeout (it hung; its connection is still open), a `silent` record goes to the
liveness topic, once per silence (`SessionRegistry.sweep`). The controllers' lane elects from it
once the streaming job has given the nodes a view at all (api/connection_loss.py).

Records go to the heartbeats topic in their broker set's partition, like the broker's
heartbeats (a `disconnected` record goes at once, in one group with the heartbeats before
it), so the streaming job sees them in order after that broker's heartbeats through this
worker. If Kafka is unavailable the record is lost and failover falls back to the
heartbeat timeout. docs/failover-signal.md has the design and its trade-offs.
"""

from __future__ import annotations

import bisect
import json
import logging
import time
from collections.abc import Callable

from electra.streaming import records

from .ingest import HeartbeatProducer, KafkaUnavailable, parse_heartbeat
from .invalid import invalid_body_field, invalid_request

log = logging.getLogger("electra.api.sessions")


def _answer(status: int, payload: dict) -> tuple[int, bytes]:
    return status, json.dumps(payload).encode()


def _broker(hb: dict) -> tuple:
    return hb["clusterName"], hb["brokerName"], hb["brokerId"]


STALL_S = 1.0  # sweeps further apart than this: the worker itself stalled (paused, starved), see `sweep`
QUORUM = 0.5  # a silence is reported only if this share of the worker's other sessions spoke since (`sweep`)
MIN_OTHERS = 2  # ... and only on a worker with at least this many other sessions
STALL_LOG_S = 60.0  # at most one warning about stalled sweeps this often


class Session:
    """One open session: the heartbeat it was opened with, and its broker's last heartbeat on it (the worker's
    wall clock for the record, its monotonic clock to judge the silence: a clock step is no silence)."""

    __slots__ = ("hb", "heard_ms", "heard_mono", "timeout_ms", "silent")

    def __init__(self, hb: dict, mono: float) -> None:
        self.hb = hb
        self.heard_ms: int = hb["ts"]
        self.heard_mono = mono
        self.timeout_ms: int = hb["heartbeatTimeoutMillis"]
        self.silent = False  # a `silent` record went out for the current silence


class SessionRegistry:
    """The sessions one ingest worker holds: connection → the heartbeat its session was opened with."""

    def __init__(self, producer: HeartbeatProducer, mono: Callable[[], float] = time.monotonic) -> None:
        self.producer = producer
        self.stopping = False
        self._mono = mono
        self._by_conn: dict[object, Session] = {}
        # broker -> the connection holding its session here: a broker that opens a new session (it
        # reconnected) supersedes the old one, whose end then says nothing (its close came after the
        # new session's heartbeats: a `connection_lost` then would fail over a live broker)
        self._by_broker: dict[tuple, object] = {}
        self.stats = {"opened": 0, "goodbyes": 0, "lost": 0, "not_published": 0, "closed_by_stop": 0,
                      "closed_by_worker": 0, "superseded": 0, "silent": 0, "silent_unreported": 0,
                      "stalled_sweeps": 0, "unvouched": 0}
        now = mono()
        self._awake_since = now  # the end of this worker's last stall: silences are counted from no earlier
        self._last_sweep: float | None = None
        self._stall_logged = float("-inf")
        # No session can fall silent before this instant (monotonic): a lower bound of their deadlines, kept by the
        # full sweeps, new sessions and heartbeats that bring a deadline earlier (a shorter timeout, the end of a
        # silence). Sweeps before it look at no session: at 1,000 sessions, ten full sweeps a second were 3% of a
        # worker's CPU in `bench failover`, where the earliest deadline is a second or two away.
        self._next_due = float("inf")

    def __len__(self) -> int:
        return len(self._by_conn)

    def broker_of(self, conn: object) -> dict | None:
        s = self._by_conn.get(conn)
        return None if s is None else s.hb

    def heard(self, conn: object, cluster: str, name: str, broker_id: int, timeout_ms: int, now_ms: int) -> bool:
        """A heartbeat was accepted on `conn`: if it is its session's broker's, the session is not silent.
        True when it changed the session's heartbeat timeout (the connection's idle limit follows it)."""
        s = self._by_conn.get(conn)
        if s is None:
            return False
        hb = s.hb
        if hb["brokerId"] != broker_id or hb["brokerName"] != name or hb["clusterName"] != cluster:
            return False
        was_silent, s.silent = s.silent, False
        s.heard_ms = max(s.heard_ms, now_ms)  # (a wall clock stepped back: never before the session's opening)
        s.heard_mono = self._mono()
        changed = timeout_ms != s.timeout_ms
        s.timeout_ms = timeout_ms
        if was_silent or changed:  # a deadline the sweeps do not know of (any other only moved later)
            self._next_due = min(self._next_due, s.heard_mono + timeout_ms / 1000)
        return changed

    def sweep(self, now_ms: int) -> int:
        """Publish a `silent` record for each session whose broker has sent no heartbeat on it for its heartbeat
        timeout (once per silence); returns how many. Called every fraction of a second; `now_ms`: the wall clock
        (for the record; silences are judged on the monotonic clock).

        * A sweep more than STALL_S after the previous one means this worker stalled (SIGSTOP, starved of CPU):
          the heartbeats of that time may still wait unread in its sockets, so every session is given a whole
          timeout again, counted from now (`stalled_sweeps`).
        * A silence is reported only if at least QUORUM of the worker's other sessions (and at least MIN_OTHERS
          of them) were heard after its middle (the session's last heartbeat plus half its timeout). When the
          sessions here fall silent together, even staggered over a few heartbeats, the cause is this worker's
          path or the brokers' side as a whole (a partition without resets, a stalled load generator), not each
          broker: the streaming job, whose data horizon then stops, judges them (`silent_unreported`), so a
          fleet-wide silence fails nothing over. Such a silence is not reported later either.
        """
        mono = self._mono()
        last, self._last_sweep = self._last_sweep, mono
        if last is not None and mono - last > STALL_S:
            self._awake_since = mono
            self.stats["stalled_sweeps"] += 1
            if mono - self._stall_logged >= STALL_LOG_S:
                self._stall_logged = mono
                log.warning("ingest worker: sweeps for silent sessions %.1f s apart (the worker stalled or is "
                            "starved of CPU): silences are counted again from now", mono - last)
            return 0
        if self.stopping or mono < self._next_due:
            return 0
        found = 0
        awake = self._awake_since
        next_due = float("inf")
        heard: list[float] | None = None  # every session's last heartbeat, sorted: only when a silence is found
        for s in self._by_conn.values():
            if s.silent:
                continue
            due = max(s.heard_mono, awake) + s.timeout_ms / 1000
            if due > mono:
                next_due = min(next_due, due)
            else:
                s.silent = True
                if heard is None:
                    heard = sorted(x.heard_mono for x in self._by_conn.values())
                others = len(heard) - 1
                spoke = len(heard) - bisect.bisect_left(heard, s.heard_mono + s.timeout_ms / 2000)
                if others < MIN_OTHERS or spoke < QUORUM * others:
                    self.stats["silent_unreported"] += 1
                    # not a hang this worker can tell, but the session no longer shows its broker alive either
                    self._unvouch(s.hb, records.SILENCE_UNREPORTED, now_ms)
                    continue
                found += 1
                # (a wall clock stepped back since the heartbeat must not date the judging before it)
                self.producer.to_liveness(records.silent_record(s.hb, s.heard_ms, s.timeout_ms,
                                                                max(now_ms, s.heard_ms + s.timeout_ms)))
                log.info("session of %s/%s/%d silent: no heartbeat on it for %.1f s (opened %.1f s ago)",
                         s.hb["clusterName"], s.hb["brokerName"], s.hb["brokerId"], mono - s.heard_mono,
                         (now_ms - s.hb["ts"]) / 1000)
        self._next_due = next_due
        self.stats["silent"] += found
        return found

    def idle_limit_s(self, conn: object, default_s: float) -> float:
        """How long the worker lets a connection sit idle: a session's broker heartbeats at its own pace,
        so its connection may idle up to its heartbeat timeout (by then the timeout has judged it)."""
        s = self._by_conn.get(conn)
        return default_s if s is None else max(default_s, s.timeout_ms / 1000 + 1)

    def closed_by_worker(self, conn: object) -> None:
        """The worker itself closed the connection (idle past the limit, an oversized request): no signal.

        Only a connection the broker's side ended says anything about the broker; one this worker
        cut says nothing (as with a stopping worker), and the heartbeat timeout stays the judge. It only tells the
        nodes the session no longer speaks for its broker (`unvouched`): they stop taking it for the broker's word."""
        hb = self._forget(conn)
        if hb is not None:
            self.stats["closed_by_worker"] += 1
            if not self.stopping:
                self._unvouch(hb, records.CLOSED_BY_WORKER, int(time.time() * 1000))

    def _unvouch(self, hb: dict, reason: str, now_ms: int) -> None:
        """An `unvouched` record to the liveness topic (best effort, as every session record there): the nodes'
        lane elects past a stale view of the job only among replicas whose sessions speak for them, and a session
        this worker stopped speaking for without a `disconnected` or `silent` record would still seem to."""
        self.stats["unvouched"] += 1
        self.producer.to_liveness(records.unvouched_record(hb, reason, max(now_ms, hb["ts"])))

    def open(self, conn: object, raw: bytes, now_ms: int) -> tuple[int, bytes]:
        """`POST /v1/session`: the body is a heartbeat; it is produced as one and names the session's broker."""
        try:
            hb = parse_heartbeat(raw)
        except records.InvalidHeartbeat as exc:
            return _answer(422, invalid_request([invalid_body_field(str(exc))]))
        held = self.broker_of(conn)
        key = _broker(hb)
        # A broker is its (cluster, set, id), the key of `_by_broker`; a connection speaks for one. The same set and
        # id in another cluster is another broker (it was taken: its session replaced this one's and left
        # `_by_broker` sending the old broker here, so that broker's next session elsewhere dropped the new one).
        if held is not None and _broker(held) != key:
            return _answer(409, {"code": 2005, "remark": "this connection already holds the session of "
                                 f"{held['clusterName']}/{held['brokerName']}/{held['brokerId']}"})
        hb["ts"] = now_ms
        try:
            self.producer.submit(hb)
        except KafkaUnavailable as exc:
            return _answer(503, {"code": 1, "remark": f"session not opened: Kafka unavailable ({exc})"})
        self.producer.to_liveness(records.connected_record(hb))  # a reconnect is seen as soon as the loss
        if held is None:
            self.stats["opened"] += 1
        older = self._by_broker.get(key)
        if older is not None and older is not conn and self._by_conn.pop(older, None) is not None:
            self.stats["superseded"] += 1
        session = self._by_conn[conn] = Session(hb, self._mono())
        self._by_broker[key] = conn
        self._next_due = min(self._next_due, session.heard_mono + session.timeout_ms / 1000)
        return _answer(200, {"code": 0, "remark": "session open"})

    def goodbye(self, conn: object, now_ms: int) -> tuple[int, bytes]:
        """`POST /v1/session/goodbye`: the broker shuts down cleanly; say so at once.

        Answered 200 only once the `shutdown` record is produced: while Kafka is unavailable it is a 503
        (Retry-After) and the session stays, so the broker can say goodbye again."""
        hb = self.broker_of(conn)
        if hb is None:
            return _answer(409, {"code": 2005, "remark": "no session on this connection"})
        gone = records.disconnected_record(hb, records.SHUTDOWN, now_ms)
        try:
            self.producer.submit(gone)
        except KafkaUnavailable as exc:
            return _answer(503, {"code": 1, "remark": f"goodbye not recorded: Kafka unavailable ({exc}); "
                                                      "send it again"})
        self.producer.to_liveness(gone)
        self._forget(conn)
        self.stats["goodbyes"] += 1
        return _answer(200, {"code": 0, "remark": "goodbye"})

    def _forget(self, conn: object) -> dict | None:
        """Drop the session `conn` holds (None if it holds none, or was superseded)."""
        s = self._by_conn.pop(conn, None)
        if s is None:
            return None
        if self._by_broker.get(_broker(s.hb)) is conn:
            del self._by_broker[_broker(s.hb)]
        return s.hb

    def lost(self, conn: object, now_ms: int) -> None:
        """The connection ended: a `connection_lost` record unless this worker is stopping, there was a goodbye,
        or the broker's newer session superseded this one."""
        hb = self._forget(conn)
        if hb is None:
            return
        if self.stopping:
            self.stats["closed_by_stop"] += 1
            return
        self.stats["lost"] += 1
        self._publish(hb, records.CONNECTION_LOST, now_ms)

    def stop(self) -> list[object]:
        """This worker is stopping: from now on closed sessions publish nothing. Returns the open connections."""
        self.stopping = True
        return list(self._by_conn)

    def _publish(self, hb: dict, reason: str, now_ms: int) -> None:
        gone = records.disconnected_record(hb, reason, now_ms)
        try:
            self.producer.submit(gone)
            self.producer.to_liveness(gone)
        except KafkaUnavailable as exc:
            self.stats["not_published"] += 1
            log.warning("session of %s/%s ended (%s) but Kafka is unavailable (%s): failover falls back to the "
                        "heartbeat timeout", hb["brokerName"], hb["brokerId"], reason, exc)
