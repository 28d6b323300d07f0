"""Inactive-master detection for one broker set, as pure Python (no Spark).

RocketMQ's controller runs one thread that scans every broker every 5 s. The
streaming job replaces it with one `SetWatch` per broker set, kept in Spark's
state store and driven by two inputs:

* heartbeat records of the set's brokers: the last heartbeat of each broker,
  with RocketMQ's update rule (epoch and max offset only move forward);
* controller event records (`electra.events`): the set's cluster, master and
  master epoch, applied in Raft index order; a record whose index is not above
  the last applied one is a duplicate and is ignored.

A timer is kept for the master at `max(master's last heartbeat, when the job
learned the master) + master's heartbeatTimeoutMillis`. When it expires and the
master is still stale while at least one other broker is alive, the watch emits
an ElectMaster proposal fenced by the master epoch it saw. That epoch is then
not proposed again, except for a bounded number of retries (one every
`retry_factor` x timeout) while no event moved the set on; the controller fences
duplicates by epoch (code 2000).

A third input makes crash failover fast (docs/failover-signal.md): a `disconnected`
record, published when a broker's session connection ends. A disconnected broker
is inactive from that instant (plus `grace_ms` when the connection was lost rather
than closed after a goodbye) until a heartbeat ingested after the disconnect says it
is back: a disconnected master's deadline moves to that instant, and a disconnected
replica is neither counted as alive nor put in a proposal's snapshot, so the
controller elects only among replicas that are alive and connected.

A set's records can stop as a whole without its brokers stopping: an ingest worker, Kafka
or the network path was down, or the load generator froze. When they resume, brokers come
back one by one, and a master whose first heartbeat lands a batch after its replicas' would
look stale by the length of the outage. So the set's clocks restart (RocketMQ's controller
restarts them on a leader change): after a silence of the whole set longer than
`silence_ms` (half the heartbeat timeout), every broker gets a full timeout from the instant
the records resumed (`resumed_ms`) before its master can be judged stale, and while the set
is silent it is judged no later than its newest record + `silence_ms` (`data_ms`).

Every set that received heartbeats also yields one liveness record per batch.
The Spark adapter (`streaming.processor`) stores a watch as one JSON value and
calls `process()` / `on_timer()`; everything here is unit-testable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from electra.state.liveness import DEFAULT_TIMEOUT_MS, BrokerLiveInfo
from electra.streaming import records

PROPOSAL = "proposal"
LIVENESS = "liveness"
DEAD_LETTER = "dlq"

RUN_FIELD = "runMs"        # on a heartbeat folded by the source: [first, resumed] of its set's records in the read
MAX_SNAPSHOT = 64          # ProposedElection.live accepts at most 64 brokers
FORGET_FACTOR = 10         # a non-master broker silent for 10x its timeout (and >= 60 s) is dropped
FORGET_MIN_MS = 60_000


@dataclass
class Output:
    """One row out of the stateful operator: kind (proposal|liveness|dlq), broker set, JSON payload."""

    kind: str
    broker_name: str
    payload: dict

    def row(self) -> tuple[str, str, str]:
        return (self.kind, self.broker_name, records.dumps(self.payload))


@dataclass
class SetWatch:
    """The streaming job's state for one broker set."""

    name: str
    cluster: str | None = None
    master_id: int | None = None
    master_epoch: int = -1
    master_since_ms: int = 0          # processing time at which the job learned the current master
    last_index: int = -1              # Raft index of the last applied event
    brokers: dict[int, BrokerLiveInfo] = field(default_factory=dict)
    proposed_epoch: int = -1          # master epoch of the last proposal
    proposed_at_ms: int = 0
    retries: int = 0                  # retries sent for proposed_epoch
    timer_ms: int | None = None       # when the adapter must call on_timer() next (None: no timer)
    armed_ms: int | None = None       # the adapter's registered timer (may be earlier than timer_ms)
    # broker id -> (instant its session ended, instant from which it counts as inactive)
    gone: dict[int, tuple[int, int]] = field(default_factory=dict)
    data_ms: int = 0                  # ingest time of the set's newest record (0: none seen yet)
    resumed_ms: int = 0               # when its records last resumed after a silence (clocks restart there)

    # ------------------------------------------------------------------ serialization
    def to_dict(self) -> dict:
        """The state's JSON form for `records.dumps`: brokers stay `BrokerLiveInfo` structs, which msgspec
        writes as their wire maps without a dict copy each (the operator stores every set of a bucket in
        every batch: at 10,000 sets the copies were a quarter of its Python)."""
        d = self.__dict__.copy()  # (a C copy; then the two fields written their own way)
        d["brokers"] = list(self.brokers.values())
        if self.gone:
            d["gone"] = [[bid, at, inactive] for bid, (at, inactive) in self.gone.items()]
        else:  # absent when empty: states written before the connection signal read back unchanged
            del d["gone"]
        return d

    @staticmethod
    def from_dict(d: dict) -> SetWatch:
        d = dict(d)
        brokers = {b["broker_id"]: BrokerLiveInfo.from_wire(b) for b in d.pop("brokers", [])}
        gone = {bid: (at, inactive) for bid, at, inactive in d.pop("gone", [])}
        return SetWatch(brokers=brokers, gone=gone, **d)

    def to_json(self) -> str:
        return records.dumps(self.to_dict())

    @staticmethod
    def from_json(raw: str) -> SetWatch:
        return SetWatch.from_dict(records.loads(raw))

    def idle(self) -> bool:
        """Nothing left to watch: no master and no broker (a removed set, or one never seen again)."""
        return self.master_id is None and not self.brokers

    # ------------------------------------------------------------------ inputs
    def apply_heartbeat(self, hb: dict, now_ms: int) -> None:
        """A validated heartbeat (`records.validate_heartbeat`); `ts` is the ingest time (default: now).

        One naming another cluster than the set's is ignored: a set belongs to one cluster (the
        controllers refuse requests naming another, `ControllerService.other_cluster`), and a
        credential scoped to cluster c1 must not keep a master of c2's set alive."""
        if self.cluster is not None and hb["clusterName"] != self.cluster:
            return
        bid = hb["brokerId"]
        ts = hb.get("ts") or now_ms
        epoch, max_offset, confirm = hb["epoch"], hb["maxOffset"], hb["confirmOffset"]
        prev = self.brokers.get(bid)
        if prev is not None:
            # RocketMQ: offsets only move forward in (epoch, max offset) order.
            if not (epoch > prev.epoch or (epoch == prev.epoch and max_offset > prev.max_offset)):
                epoch, max_offset, confirm = prev.epoch, prev.max_offset, prev.confirm_offset
            if prev.last_update_ms > ts:  # heartbeats via two ingest nodes may arrive out of order
                ts = prev.last_update_ms
        self.brokers[bid] = BrokerLiveInfo(bid, hb["brokerAddr"], ts, hb["heartbeatTimeoutMillis"], epoch,
                                           max_offset, confirm, hb["electionPriority"])
        gone = self.gone.get(bid)
        if gone is not None and ts > gone[0]:
            del self.gone[bid]  # a heartbeat ingested after the disconnect: the broker is back
        if self.cluster is None:
            self.cluster = hb["clusterName"]

    def apply_disconnected(self, dc: dict, grace_ms: int = 0) -> None:
        """A validated `disconnected` record: the broker counts as inactive from its instant.

        `grace_ms` applies only to a lost connection (a network blip may heal before it ends);
        a broker that said goodbye is gone at once. Ignored when a heartbeat ingested after
        the disconnect is already known (the broker reconnected) or the broker is unknown.
        """
        if self.cluster is not None and dc["clusterName"] != self.cluster:
            return  # another cluster's (see `apply_heartbeat`): it must not fail this set's master over
        bid, at = dc["brokerId"], dc["ts"]
        b = self.brokers.get(bid)
        if b is None or b.last_update_ms > at:
            return
        prev = self.gone.get(bid)
        if prev is not None and prev[0] >= at:
            return
        grace = 0 if dc.get("reason") == records.SHUTDOWN else max(0, grace_ms)
        self.gone[bid] = (at, at + grace)

    def apply_span(self, span: tuple[int, int, int] | None) -> None:
        """The set's records of one batch, `(first, resumed, newest)` ingest times (`span_of`).

        A silence of the whole set longer than `silence_ms` (since the newest record of an earlier
        batch, or inside this batch) restarts the clocks at the instant the records resumed.
        """
        if span is None:
            return
        first, resumed, newest = span
        if resumed > first or (self.data_ms and first - self.data_ms > silence_ms(self.master_timeout_ms())):
            self.resumed_ms = max(self.resumed_ms, resumed)
        self.data_ms = max(self.data_ms, newest)

    def alive(self, b: BrokerLiveInfo, now_ms: int) -> bool:
        """Heartbeat within its timeout and not disconnected as of `now_ms`."""
        gone = self.gone.get(b.broker_id)
        return b.alive_at(now_ms) and (gone is None or now_ms < gone[1])

    def apply_event(self, ev: dict, now_ms: int) -> bool:
        """One events-topic record; False if it was a duplicate (index <= last applied index)."""
        index = ev["index"]
        if index <= self.last_index:
            return False
        self.last_index = index
        st = ev.get("state")
        if st is None:  # the set was removed
            self.cluster = ev.get("clusterName") or self.cluster
            self.master_id, self.master_epoch, self.master_since_ms = None, -1, now_ms
            self.proposed_epoch, self.retries = -1, 0
            return True
        self.cluster = st.get("clusterName") or ev.get("clusterName") or self.cluster
        master = st.get("masterBrokerId")
        master = master if isinstance(master, int) and master > 0 else None
        epoch = st.get("masterEpoch")
        epoch = epoch if isinstance(epoch, int) else -1
        if (master, epoch) != (self.master_id, self.master_epoch):
            self.master_id, self.master_epoch, self.master_since_ms = master, epoch, now_ms
            self.retries = 0
        return True

    # ------------------------------------------------------------------ decisions
    def master_timeout_ms(self) -> int:
        mh = self.brokers.get(self.master_id) if self.master_id is not None else None
        if mh is not None:
            return mh.timeout_ms
        return max((b.timeout_ms for b in self.brokers.values()), default=DEFAULT_TIMEOUT_MS)

    def master_deadline_ms(self) -> int | None:
        """The last instant at which the master still counts as alive (None: no master)."""
        master = self.master_id
        if master is None:
            return None
        mh = self.brokers.get(master)
        # the latest of its heartbeat, when it became master, when the set's records resumed (no max(): this runs
        # for every set in every batch)
        base = mh.last_update_ms if mh is not None else 0
        if self.master_since_ms > base:
            base = self.master_since_ms
        if self.resumed_ms > base:
            base = self.resumed_ms
        deadline = base + (mh.timeout_ms if mh is not None else self.master_timeout_ms())
        if self.gone:
            gone = self.gone.get(master)
            if gone is not None and gone[1] - 1 < deadline:
                deadline = gone[1] - 1  # inactive from the disconnect (+ grace) on
        return deadline

    def live_others(self, now_ms: int) -> list[BrokerLiveInfo]:
        return [b for b in self.brokers.values() if b.broker_id != self.master_id and self.alive(b, now_ms)]

    def snapshot(self, now_ms: int | None = None) -> list[dict]:
        """The heartbeat snapshot of the set (BrokerLiveInfo wire dicts, by broker id).

        With `now_ms`, brokers disconnected as of then are left out: the controller judges
        liveness from the snapshot alone, and a crashed broker's last heartbeat is recent.
        """
        return [b.to_wire() for b in self._by_id(now_ms)]

    def _by_id(self, now_ms: int | None = None) -> list[BrokerLiveInfo]:
        """The set's brokers by id (at most MAX_SNAPSHOT), without those disconnected as of `now_ms`."""
        ids = sorted(i for i in self.brokers
                     if now_ms is None or i not in self.gone or now_ms < self.gone[i][1])
        return [self.brokers[i] for i in ids[:MAX_SNAPSHOT]]

    def _forget_silent(self, now_ms: int) -> None:
        silent = [bid for bid, b in self.brokers.items()
                  if bid != self.master_id and b.last_update_ms + FORGET_MIN_MS < now_ms
                  and b.last_update_ms + FORGET_FACTOR * b.timeout_ms < now_ms]
        for bid in silent:
            del self.brokers[bid]
            self.gone.pop(bid, None)

    def evaluate(self, now_ms: int, max_retries: int = 3, retry_factor: int = 2) -> list[Output]:
        """Check the master at `now_ms`; returns 0 or 1 proposal and sets `timer_ms`.

        A silent set is judged no later than its newest record + `silence_ms`: whether its
        brokers are gone or only their path is, is known once its records resume, and until
        then it needs no timer (its next record brings it back here).
        """
        silent_since = self.data_ms + silence_ms(self.master_timeout_ms()) if self.data_ms else None
        if silent_since is not None and now_ms > silent_since:
            out = self._evaluate(silent_since, max_retries, retry_factor)
            self.timer_ms = None
            return out
        return self._evaluate(now_ms, max_retries, retry_factor)

    def _evaluate(self, now_ms: int, max_retries: int, retry_factor: int) -> list[Output]:
        self._forget_silent(now_ms)
        self.timer_ms = None
        deadline = self.master_deadline_ms()
        if deadline is None:
            return []
        if now_ms <= deadline:
            self.timer_ms = deadline + 1
            return []
        retry_every = retry_factor * self.master_timeout_ms()
        if self.proposed_epoch == self.master_epoch:
            if self.retries >= max_retries:
                return []  # wait for an event (a new master epoch) or a fresh master heartbeat
            retry_at = self.proposed_at_ms + retry_every
            if now_ms < retry_at:
                self.timer_ms = retry_at
                return []
            if not self.live_others(now_ms):
                return []  # re-evaluated when another broker's heartbeat arrives
            self.retries += 1
        else:
            if not self.live_others(now_ms):
                return []
            self.retries = 0
        self.proposed_epoch, self.proposed_at_ms = self.master_epoch, now_ms
        if self.retries < max_retries:
            self.timer_ms = now_ms + retry_every
        return [Output(PROPOSAL, self.name, self.proposal(now_ms))]

    def proposal(self, now_ms: int) -> dict:
        mh = self.brokers.get(self.master_id) if self.master_id is not None else None
        return {"brokerName": self.name, "clusterName": self.cluster, "expectedMasterEpoch": self.master_epoch,
                "live": self.snapshot(now_ms), "proposedAtMs": now_ms, "masterBrokerId": self.master_id,
                "masterLastHeartbeatMs": mh.last_update_ms if mh else None, "retry": self.retries}

    def liveness(self, now_ms: int) -> dict:
        """The set's liveness-topic value (for `records.dumps`; brokers as structs, as in `to_dict`)."""
        return {"clusterName": self.cluster, "brokerName": self.name, "ts": now_ms,
                "brokers": self._by_id()}


RECHECK_MS = 1000  # with no data horizon yet, look again this much later


def silence_ms(timeout_ms: int) -> int:
    """A set with no record for longer than this was cut off, not quiet: its clocks restart when they resume.

    Half the heartbeat timeout: brokers heartbeat several times per timeout (RocketMQ: every 1 s
    for 10 s), so a set of live brokers is never this quiet; and a shorter silence leaves a
    broker that resumes within a heartbeat interval of the others inside its timeout.
    """
    return max(1, timeout_ms // 2)


def span_of(heartbeats: list[dict], disconnects: list[dict] = ()) -> tuple[int, int, int] | None:
    """`(first, resumed, newest)`: ingest times of one set's records in a batch: the earliest, the first
    after the last silence longer than `silence_ms` inside the batch (`first` if none), the newest.

    Heartbeats the source folded (one per broker) carry their read's `(first, resumed)` in
    RUN_FIELD, computed by this function over every record before the fold; otherwise the
    records at hand are all there were. None: no record with an ingest time.
    """
    newest = first = resumed = None
    for r in heartbeats:
        ts = r.get("ts")
        if ts and (newest is None or ts > newest):
            newest = ts
        run = r.get(RUN_FIELD)
        if run is not None:
            if first is None or run[0] < first:
                first = run[0]
            if resumed is None or run[1] > resumed:
                resumed = run[1]
    for r in disconnects:
        ts = r.get("ts")
        if ts and (newest is None or ts > newest):
            newest = ts
    if newest is None:
        return None
    if first is not None:  # the usual case (the Python source folds): no sort
        return first, resumed, newest
    stamps = sorted(ts for r in (*heartbeats, *disconnects) if (ts := r.get("ts")))
    bound = silence_ms(min((hb["heartbeatTimeoutMillis"] for hb in heartbeats), default=DEFAULT_TIMEOUT_MS))
    resumed = stamps[0]
    for prev, ts in zip(stamps, stamps[1:]):
        if ts - prev > bound:
            resumed = ts
    return stamps[0], resumed, stamps[-1]


_NOW = object()


def judge_at(now_ms: int, horizon_ms: int | None) -> int | None:
    """The instant at which liveness may be judged: never later than the data horizon.

    `horizon_ms` is the newest ingest time (`ts`) among the heartbeats the job has read in
    this batch. Heartbeats are stamped when an ingest node accepts them, so everything
    ingested before the horizon is (about) in the batch, and nothing after it is. Judging at
    the wall clock instead would turn any processing lag (a slow batch, a restart, a
    backlog) into "every master is stale": false elections. Judging at the horizon also
    means a fleet-wide silence (ingest or Kafka down) stops detection instead of failing
    every master over. None: no horizon known, do not judge.
    """
    if horizon_ms is None:
        return None
    return min(now_ms, horizon_ms)


def process(watch: SetWatch | None, name: str, heartbeats: list[dict], events: list[dict], now_ms: int,
            max_retries: int = 3, retry_factor: int = 2, judge_ms=_NOW, disconnects: list[dict] = (),
            grace_ms: int = 0, span=_NOW) -> tuple[SetWatch, list[Output]]:
    """Apply one batch of a set's records (events first, in index order; then heartbeats in order;
    then `disconnected` records, whose effect does not depend on their order with heartbeats).
    `span`: the set's records' `span_of` (default: of the records given; an adapter that folded
    them first passes the span of all of them).

    Liveness is judged at `judge_ms` (see `judge_at`; default `now_ms`; None: not judged
    now, the timer looks again after RECHECK_MS). Returns the new watch and its outputs: a
    liveness record if any heartbeat arrived, and at most one proposal.
    """
    w = watch if watch is not None else SetWatch(name)
    if events:
        for ev in sorted(events, key=lambda e: e["index"]):
            w.apply_event(ev, now_ms if judge_ms is _NOW or judge_ms is None else judge_ms)
    for hb in heartbeats:
        w.apply_heartbeat(hb, now_ms)
    for dc in disconnects:
        w.apply_disconnected(dc, grace_ms)
    w.apply_span(span_of(heartbeats, disconnects) if span is _NOW else span)
    if judge_ms is None:
        out: list[Output] = []
        w.timer_ms = now_ms + RECHECK_MS if w.master_id is not None else None
    else:
        out = w.evaluate(now_ms if judge_ms is _NOW else judge_ms, max_retries, retry_factor)
    if heartbeats:
        out.append(Output(LIVENESS, name, w.liveness(now_ms)))
    return w, out


def on_timer(watch: SetWatch, now_ms: int, max_retries: int = 3, retry_factor: int = 2,
             judge_ms=_NOW) -> list[Output]:
    """The watch's timer fired: the same check as after input rows, judged at `judge_ms` (see `process`)."""
    if judge_ms is None:
        watch.timer_ms = now_ms + RECHECK_MS
        return []
    return watch.evaluate(now_ms if judge_ms is _NOW else judge_ms, max_retries, retry_factor)


def collapse_heartbeats(heartbeats: list[dict]) -> list[dict]:
    """Fold a batch's heartbeats to one per broker with the RocketMQ rule, keeping arrival order of the last ones.

    Equivalent to applying them one by one; lets an adapter touch state once per broker.
    """
    tmps: dict[str, SetWatch] = {}  # by cluster: a heartbeat naming another cluster is not folded into the set's
    last: dict[tuple[str, int], dict] = {}
    for hb in heartbeats:
        tmp = tmps.get(hb["clusterName"])
        if tmp is None:
            tmp = tmps[hb["clusterName"]] = SetWatch("")
        tmp.apply_heartbeat(hb, hb.get("ts") or 0)
        last[(hb["clusterName"], hb["brokerId"])] = hb
    out = []
    for (cluster, bid), hb in last.items():
        b = tmps[cluster].brokers[bid]
        out.append({**hb, "epoch": b.epoch, "maxOffset": b.max_offset, "confirmOffset": b.confirm_offset,
                    "ts": b.last_update_ms or hb.get("ts")})
    return out


def parse_event(d: Any) -> dict:
    """Check the fields the detector uses of an events-topic value; ValueError names the field."""
    if not isinstance(d, dict):
        raise ValueError("event: a JSON object is required")
    if type(d.get("index")) is not int or d["index"] < 0:
        raise ValueError("index: a non-negative integer is required")
    name = d.get("brokerName")
    if not isinstance(name, str) or not name:
        raise ValueError("brokerName: a non-empty string is required")
    st = d.get("state")
    if st is not None and not isinstance(st, dict):
        raise ValueError("state: an object or null is required")
    return d
