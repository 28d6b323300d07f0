"""The transformWithStateInPandas adapter with a stand-in handle: one state value and one timer per bucket of sets."""

from __future__ import annotations

import json

import pandas as pd

from electra.streaming.parsing import DLQ_GROUP, EVENT, HEARTBEAT, PARSED_COLUMNS
from electra.streaming.processor import BUCKET_SCHEMA, OUTPUT_COLUMNS, MasterWatchProcessor

T0 = 1_700_000_000_000


class FakeValue:
    def __init__(self) -> None:
        self.value = None
        self.calls = 0

    def get(self):
        self.calls += 1
        return self.value

    def update(self, v) -> None:
        self.calls += 1
        self.value = v


class FakeHandle:
    def __init__(self) -> None:
        self.state = FakeValue()
        self.timers: set[int] = set()

    def getValueState(self, name, schema):
        assert name == "bucket" and schema == BUCKET_SCHEMA
        return self.state

    def registerTimer(self, ms: int) -> None:
        self.timers.add(ms)

    def deleteTimer(self, ms: int) -> None:
        self.timers.discard(ms)


class TV:
    def __init__(self, now: int) -> None:
        self.now = now

    def getCurrentProcessingTimeInMs(self) -> int:
        return self.now


class Expired:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def getExpiryTimeInMs(self) -> int:
        return self.ms


BUCKET = "7"  # the operator key: several sets share it


def hb(bid: int, ts: int, off: int, name: str = "bs") -> tuple:
    d = {"clusterName": "c1", "brokerName": name, "brokerAddr": f"a{bid}", "brokerId": bid, "epoch": 1,
         "maxOffset": 10, "confirmOffset": 10, "heartbeatTimeoutMillis": 2000, "electionPriority": bid, "ts": ts}
    return (BUCKET, name, HEARTBEAT, "electra.heartbeats", 0, off, json.dumps(d))


def ev(index: int, master: int, epoch: int, name: str = "bs") -> tuple:
    d = {"index": index, "brokerName": name, "clusterName": "c1",
         "state": {"clusterName": "c1", "masterBrokerId": master, "masterEpoch": epoch}}
    return (BUCKET, name, EVENT, "electra.events", 0, index, json.dumps(d))


def run(proc, rows, now):
    frames = [pd.DataFrame(rows, columns=PARSED_COLUMNS)]
    out = list(proc.handleInputRows((BUCKET,), iter(frames), TV(now)))
    return pd.concat(out) if out else pd.DataFrame(columns=OUTPUT_COLUMNS)


def fire(proc, h, ms, horizon=None):
    """A later batch in which the timer at `ms` fires; other sets of the partition brought heartbeats
    up to `horizon` (default: `ms`), the data horizon the timer is judged at."""
    proc.close()
    proc.init(h)  # Spark calls init for every batch's task
    proc._horizon = ms if horizon is None else horizon
    h.timers.discard(ms)  # Spark removes a timer when it fires
    out = list(proc.handleExpiredTimer((BUCKET,), TV(ms), Expired(ms)))
    return [json.loads(x) for df in out for k, x in zip(df["kind"], df["payload"]) if k == "proposal"]


def test_timer_is_armed_once_fires_early_and_then_proposes():
    h = FakeHandle()
    p = MasterWatchProcessor()
    p.init(h)
    out = run(p, [ev(1, 1, 1), hb(1, T0, 1), hb(2, T0, 2), hb(3, T0, 3), hb(1, T0 - 50, 4)], T0)
    assert list(out["kind"]) == ["liveness"]
    assert h.timers == {T0 + 2001} and h.state.calls == 2  # one read, one write per batch
    # The master keeps heartbeating: the armed timer is not moved (no extra state calls).
    run(p, [hb(1, T0 + 1000, 5), hb(2, T0 + 1000, 6), hb(3, T0 + 1000, 7)], T0 + 1000)
    assert h.timers == {T0 + 2001} and h.state.calls == 4
    # It fires early, finds the master alive and arms the real deadline.
    assert fire(p, h, T0 + 2001) == []
    assert h.timers == {T0 + 3001}
    run(p, [hb(2, T0 + 2000, 8), hb(3, T0 + 2000, 9), hb(2, T0 + 2500, 10), hb(3, T0 + 2500, 11)], T0 + 2500)
    assert h.timers == {T0 + 3001}
    # The master stayed silent: one proposal, then a retry timer.
    [payload] = fire(p, h, T0 + 3001)
    assert payload["expectedMasterEpoch"] == 1 and payload["brokerName"] == "bs"
    assert h.timers == {T0 + 3001 + 4000}
    # The election event arrives: the new master's deadline is earlier than the retry, so it replaces it.
    run(p, [ev(2, 2, 2), hb(2, T0 + 3500, 12)], T0 + 3500)
    assert h.timers == {T0 + 3500 + 2001}


def test_dead_letters_pass_through_without_state():
    h = FakeHandle()
    p = MasterWatchProcessor()
    p.init(h)
    rows = [(DLQ_GROUP, DLQ_GROUP, "dlq", "electra.heartbeats", 1, 5, json.dumps({"error": "x"}))]
    out = list(p.handleInputRows((DLQ_GROUP,), iter([pd.DataFrame(rows, columns=PARSED_COLUMNS)]), TV(T0)))
    assert list(out[0]["kind"]) == ["dlq"] and h.state.calls == 0 and not h.timers


def test_a_lagging_batch_judges_at_its_data_horizon_not_the_wall_clock():
    """A batch that runs late holds only old heartbeats: the master must not look stale."""
    h = FakeHandle()
    p = MasterWatchProcessor()
    p.init(h)
    run(p, [ev(1, 1, 1), hb(1, T0, 1), hb(2, T0, 2), hb(3, T0, 3)], T0)
    assert h.timers == {T0 + 2001}
    p.close()
    p.init(h)
    # The next batch runs at T0 + 2600 but holds heartbeats only up to T0 + 1000 (the master's next one
    # is still in Kafka). At the wall clock the master (deadline T0 + 2000) would look dead while 2 and 3
    # look alive: a false election. At the data horizon it is not stale.
    out = run(p, [hb(2, T0 + 1000, 5), hb(3, T0 + 1000, 6)], T0 + 2600)
    assert list(out["kind"]) == ["liveness"]
    h.timers.discard(T0 + 2001)  # the timer fires in the same batch, after the rows
    assert list(p.handleExpiredTimer((BUCKET,), TV(T0 + 2600), Expired(T0 + 2001))) == []
    assert h.timers == {T0 + 2001}  # judged again once the data reaches the deadline
    # The timer fires in a batch with no heartbeats at all in the partition: nothing is judged.
    p.close()
    p.init(h)
    h.timers.discard(T0 + 2001)
    fired = list(p.handleExpiredTimer((BUCKET,), TV(T0 + 11_000), Expired(T0 + 2001)))
    assert fired == [] and h.timers == {T0 + 11_000 + 1000}  # look again a second later


def test_sets_share_a_bucket_one_state_value_and_the_earliest_timer():
    """Per-key costs are paid per bucket: one state read and write per batch for all its sets."""
    h = FakeHandle()
    p = MasterWatchProcessor()
    p.init(h)
    rows = [ev(1, 1, 1, "a"), ev(2, 1, 1, "b"), hb(1, T0, 1, "a"), hb(2, T0, 2, "a"), hb(1, T0 + 500, 3, "b"),
            hb(2, T0 + 500, 4, "b")]
    out = run(p, rows, T0 + 500)
    assert sorted(out["brokerName"]) == ["a", "b"] and set(out["kind"]) == {"liveness"}
    # Both masters were learned at T0 + 500 (the data horizon): one timer, at the earliest deadline.
    assert h.state.calls == 2 and h.timers == {T0 + 2501}
    # a's master (broker 1) falls silent while b's keeps heartbeating. a's deadline passes while
    # the bucket processes rows: a is checked then, not only when the timer fires.
    run(p, [hb(2, T0 + 1000, 5, "a"), hb(1, T0 + 1500, 6, "b"), hb(2, T0 + 1500, 7, "b"), hb(2, T0 + 1500, 8, "a")],
        T0 + 1500)
    out = run(p, [hb(2, T0 + 2000, 9, "a"), hb(1, T0 + 2600, 10, "b"), hb(2, T0 + 2600, 11, "a")], T0 + 2600)
    proposals = [json.loads(x) for k, x in zip(out["kind"], out["payload"]) if k == "proposal"]
    assert [q["brokerName"] for q in proposals] == ["a"] and proposals[0]["expectedMasterEpoch"] == 1
    assert sorted(json.loads(h.state.value[0])) == ["a", "b"]  # both sets in one state value


def test_a_master_past_its_deadline_is_proposed_before_the_bucket_s_other_sets_are_processed(monkeypatch):
    """A bucket holds thousands of sets at scale: its failovers leave first, not after all of its sets and its
    state's write. The other sets are still processed and stored in the same batch."""
    from electra.streaming import detector

    processed: list[str] = []
    real = detector.process
    monkeypatch.setattr(detector, "process",
                        lambda w, name, *a, **k: (processed.append(name), real(w, name, *a, **k))[1])
    h = FakeHandle()
    sent: list[tuple[list[str], list[str], int]] = []

    class Proposer:
        def send(self, payloads: list[dict]) -> None:
            if payloads:
                sent.append(([q["brokerName"] for q in payloads], list(processed), h.state.calls))

    p = MasterWatchProcessor(proposer=Proposer())
    p.init(h)
    names = ["a", "b", "c", "d", "e"]
    rows = [ev(i, 1, 1, n) for i, n in enumerate(names)]
    run(p, rows + [hb(b, T0, 10 * i + b, n) for i, n in enumerate(names) for b in (1, 2, 3)], T0)
    # c's master (broker 1) falls silent; the others keep heartbeating past its 2 s timeout.
    for t in (1000, 2000, 2600):
        p.close()
        p.init(h)
        processed.clear()
        calls = h.state.calls
        out = run(p, [hb(b, T0 + t, t + 10 * i + b, n) for i, n in enumerate(names) for b in (1, 2, 3)
                      if not (n == "c" and b == 1)], T0 + t)
    assert sent == [(["c"], ["c"], calls + 1)]  # only the state's read before the proposal left
    assert sorted(processed) == names and h.state.calls == calls + 2
    assert sorted(json.loads(h.state.value[0])) == names
    assert [n for k, n in zip(out["kind"], out["brokerName"]) if k == "proposal"] == ["c"]


def test_a_set_is_taken_first_whenever_its_master_may_be_past_its_deadline_this_batch():
    """Besides a due timer: a timer re-armed while nothing was judged (later than the deadline), and a heartbeat
    with a shorter timeout (an earlier deadline). Heartbeats as the watch already holds them are not urgent."""
    from electra.streaming import detector
    from electra.streaming.processor import _may_propose

    def hbd(bid: int, ts: int, timeout: int = 2000) -> dict:
        d = json.loads(hb(bid, ts, 0)[-1])
        d["heartbeatTimeoutMillis"] = timeout
        return d

    w, _ = detector.process(None, "bs", [hbd(b, T0) for b in (1, 2, 3)],
                            [{"index": 1, "brokerName": "bs", "clusterName": "c1",
                              "state": {"clusterName": "c1", "masterBrokerId": 1, "masterEpoch": 1}}], T0)
    assert w.timer_ms == T0 + 2001
    same = [((0, 1), hbd(2, T0 + 500)), ((0, 2), hbd(3, T0 + 500))]
    assert not _may_propose(w, [], [], same, T0 + 1500)
    assert _may_propose(w, [], [], same, T0 + 2001)  # the timer is due
    assert _may_propose(w, [], [], [((0, 3), hbd(1, T0, timeout=1000))] + same, T0 + 1500)  # a shorter timeout
    assert _may_propose(w, [], [], [((0, 4), hbd(4, T0 + 500))], T0 + 1500)  # a broker the watch does not hold
    w.timer_ms = T0 + 3001  # re-armed a second on by a timer that fired with no data horizon
    assert _may_propose(w, [], [], same, T0 + 2500)  # the deadline, T0 + 2000, is behind the judge instant


def test_a_disconnected_master_is_proposed_in_the_batch_that_brings_the_record():
    """The disconnect's ingest time moves the data horizon: no waiting for a later batch or the timeout."""
    from electra.streaming.parsing import DISCONNECTED

    h = FakeHandle()
    p = MasterWatchProcessor()
    p.init(h)
    run(p, [ev(1, 1, 1), hb(1, T0, 1), hb(2, T0, 2), hb(3, T0, 3)], T0)
    p.close()
    p.init(h)
    d = {"type": "disconnected", "clusterName": "c1", "brokerName": "bs", "brokerId": 1, "brokerAddr": "a1",
         "reason": "connection_lost", "ts": T0 + 400}
    out = run(p, [(BUCKET, "bs", DISCONNECTED, "electra.heartbeats", 0, 4, json.dumps(d))], T0 + 450)
    [payload] = [json.loads(x) for k, x in zip(out["kind"], out["payload"]) if k == "proposal"]
    assert payload["proposedAtMs"] == T0 + 400 and {b["broker_id"] for b in payload["live"]} == {2, 3}


def test_a_bucket_read_back_as_stored_is_not_decoded_again_but_a_rolled_back_one_is():
    """The worker keeps each bucket's watches as objects between batches; Spark re-running a batch from
    an older state version (the value read back differs) must be judged on that older state."""
    from electra.streaming import detector

    h = FakeHandle()
    p = MasterWatchProcessor()
    p.init(h)
    run(p, [ev(1, 1, 1), hb(1, T0, 1), hb(2, T0, 2), hb(3, T0, 3)], T0)
    before = h.state.value
    run(p, [ev(2, 2, 2), hb(2, T0 + 500, 4)], T0 + 500)  # master 2 at epoch 2
    decoded = []
    real = detector.SetWatch.from_dict

    def counting(d):
        decoded.append(d["name"])
        return real(d)

    detector.SetWatch.from_dict = staticmethod(counting)
    try:
        run(p, [hb(2, T0 + 1000, 5)], T0 + 1000)
        assert decoded == []  # read back as this worker stored it: no decoding
        h.state.value = before  # Spark rolled the state back: the batch runs again on version 1
        run(p, [hb(2, T0 + 1000, 5)], T0 + 1000)
        assert decoded == ["bs"]
    finally:
        detector.SetWatch.from_dict = real
    assert json.loads(h.state.value[0])["bs"]["master_id"] == 1  # judged on the rolled-back state


def test_records_json_cannot_read_or_write_still_pass_through_the_source_and_the_operator():
    """The job's JSON is msgspec's, which refuses a lone surrogate escape and NaN/Infinity; such records were
    accepted before (validate_heartbeat, parse_event) and must neither stop a batch nor change meaning."""
    from electra.streaming.parsing import parse_records

    addr = json.loads('"\\ud800:1"')  # a str with a lone surrogate: json reads it, UTF-8 cannot hold it
    bad_hb = {"clusterName": "c1", "brokerName": "bs", "brokerAddr": addr, "brokerId": 2, "ts": T0}
    event = {"index": 1, "brokerName": "bs", "clusterName": "c1", "weight": float("inf"),
             "state": {"clusterName": "c1", "masterBrokerId": 1, "masterEpoch": 1}}
    raw = [("electra.events", 0, 1, json.dumps(event), T0),
           ("electra.heartbeats", 0, 1, json.dumps(bad_hb), T0)]
    [batch] = parse_records(iter(raw), "electra.heartbeats", "electra.events", 8)
    frame = batch.to_pandas()
    assert list(frame["kind"]) == [EVENT, HEARTBEAT]
    frame["bucket"] = BUCKET
    h = FakeHandle()
    p = MasterWatchProcessor()
    p.init(h)
    out = pd.concat(list(p.handleInputRows((BUCKET,), iter([frame]), TV(T0))))
    [live] = [json.loads(x) for k, x in zip(out["kind"], out["payload"]) if k == "liveness"]
    assert [b["broker_addr"] for b in live["brokers"]] == [addr]
    assert json.loads(h.state.value[0])["bs"]["master_id"] == 1  # the state was stored and reads back


def test_after_a_fleet_wide_silence_a_master_resuming_a_batch_after_its_replicas_is_not_failed_over():
    """Every broker fell silent for 30 s (ingest restarts, Kafka down, a frozen fleet), then they resume one
    by one. With few operator keys every set is judged at the newest record of many sets: a master whose
    first heartbeat lands a batch after its replicas' looked 30 s stale (the false failovers seen with
    one shuffle partition and two keys). Its set's clocks restart when the set's records resume."""
    h = FakeHandle()
    p = MasterWatchProcessor()
    p.init(h)
    rows = [ev(1, 1, 1, "a"), ev(2, 1, 1, "b")]
    rows += [hb(b, T0 + t, 10 + t // 100 + b, s) for t in (0, 500, 1000) for s in "ab" for b in (1, 2, 3)]
    run(p, rows, T0 + 1000)
    resume = T0 + 31_000
    p.close()
    p.init(h)
    # The batch after the silence: all of a's brokers, b's replicas only; b's master comes a batch later.
    rows = [hb(b, resume + 10 * b, 500 + b, "a") for b in (1, 2, 3)]
    rows += [hb(b, resume + 40, 510 + b, "b") for b in (2, 3)]
    out = run(p, rows, resume + 100)
    assert [k for k in out["kind"] if k == "proposal"] == []
    assert fire(p, h, min(h.timers), horizon=resume + 100) == []
    p.close()
    p.init(h)
    out = run(p, [hb(b, resume + 600, 600 + b, s) for s in "ab" for b in (1, 2, 3)], resume + 700)
    assert [k for k in out["kind"] if k == "proposal"] == []


def test_a_read_that_spans_a_silence_is_folded_and_still_restarts_the_clocks():
    """The source folds a read to one heartbeat per broker, which hides the silence inside it; it says so
    in `detector.RUN_FIELD`, and the operator judges as if it had every record."""
    from electra.streaming.parsing import parse_records

    def raw_hb(b, ts, off, name="bs"):
        return ("electra.heartbeats", 0, off, hb(b, ts, off, name)[-1], ts)

    h = FakeHandle()
    p = MasterWatchProcessor()
    p.init(h)
    run(p, [ev(1, 1, 1)] + [hb(b, T0 + t, 10 + t // 100 + b) for t in (0, 500) for b in (1, 2, 3)], T0 + 500)
    # One long batch: records up to T0 + 900, a 30 s silence, then broker 2 and 3 (the master a batch later).
    raw = [raw_hb(b, T0 + 900, 100 + b) for b in (1, 2, 3)]
    raw += [raw_hb(b, T0 + 31_000 + t, 200 + t // 100 + b) for t in (0, 500, 1000, 1500) for b in (2, 3)]
    [batch] = parse_records(iter(raw), "electra.heartbeats", "electra.events", 8)
    frame = batch.to_pandas()
    assert len(frame) == 3  # folded: one heartbeat per broker
    frame["bucket"] = BUCKET
    p.close()
    p.init(h)
    out = list(p.handleInputRows((BUCKET,), iter([frame]), TV(T0 + 32_600)))
    assert [k for df in out for k in df["kind"] if k == "proposal"] == []


def test_a_hung_master_in_a_long_folded_read_is_failed_over_at_its_timeout():
    """Folded, a long read's heartbeats look like a silence (the hung master's last one early, the others'
    late); `detector.RUN_FIELD` says the records never stopped, so nothing restarts the clocks."""
    from electra.streaming.parsing import parse_records

    h = FakeHandle()
    p = MasterWatchProcessor()
    p.init(h)
    run(p, [ev(1, 1, 1)] + [hb(b, T0, 10 + b) for b in (1, 2, 3)], T0)
    raw = [("electra.heartbeats", 0, 100, hb(1, T0 + 300, 100)[-1], T0)]
    raw += [("electra.heartbeats", 0, 101 + t // 100 + b, hb(b, T0 + t, 0)[-1], T0) for t in range(300, 6001, 500)
            for b in (2, 3)]
    [batch] = parse_records(iter(raw), "electra.heartbeats", "electra.events", 8)
    frame = batch.to_pandas()
    frame["bucket"] = BUCKET
    p.close()
    p.init(h)
    out = list(p.handleInputRows((BUCKET,), iter([frame]), TV(T0 + 6000)))
    [proposal] = [json.loads(x) for df in out for k, x in zip(df["kind"], df["payload"]) if k == "proposal"]
    assert proposal["masterLastHeartbeatMs"] == T0 + 300


def _by_bucket(batches) -> dict[str, pd.DataFrame]:
    """The source's Arrow batches split by operator key, as Spark's groupBy hands them to the operator."""
    frame = pd.concat([b.to_pandas() for b in batches]) if batches else pd.DataFrame(columns=PARSED_COLUMNS)
    return {k: g for k, g in frame.groupby("bucket", sort=True)}


def test_bundled_rows_give_the_operator_exactly_what_one_row_per_record_gives():
    """`parse_bundles` (the Python source's rows: one per bucket) and `parse_records` (one per record) over the
    same reads: every bucket ends with the same state, timers and output, proposals, dead letters and
    liveness included, batch after batch."""
    from electra.streaming.parsing import parse_bundles, parse_records
    from electra.streaming.records import heartbeat_group

    buckets = 3
    sets = [f"s{i}" for i in range(12)]

    def hb_raw(name, b, ts, off, epoch=1):
        d = json.loads(hb(b, ts, off, name)[-1])
        d["epoch"], d["maxOffset"] = epoch, 10 + off
        return ("electra.heartbeats", sets.index(name) % 2, off, json.dumps(d), ts)

    def group_raw(items, part, off, ts):
        return ("electra.heartbeats", part, off, heartbeat_group([i[3].encode() for i in items]).decode(), ts)

    reads = []
    # batch 1: the events naming broker 1 master of every set, and a second of heartbeats (two per broker)
    raw = [("electra.events", 0, i, ev(i, 1, 1, s)[-1], T0) for i, s in enumerate(sets)]
    raw += [hb_raw(s, b, T0 + t, t // 100 + b) for t in (0, 500) for s in sets for b in (1, 2, 3)]
    raw += [("electra.heartbeats", 1, 999, "{not json", T0), ("electra.heartbeats", 0, 998, '{"brokerName": 1}', T0)]
    reads.append((raw, T0 + 600))
    # batch 2: grouped records (ingest's form); s0's master crashes (a disconnected record), s1's hangs
    raw = []
    for s in sets:
        items = [hb_raw(s, b, T0 + 1000 + t, 20 + t // 100 + b) for t in (0, 500) for b in (1, 2, 3)
                 if not (s in ("s0", "s1") and b == 1)]
        raw.append(group_raw(items, sets.index(s) % 2, 100 + sets.index(s), T0 + 1000))
    dc = {"type": "disconnected", "clusterName": "c1", "brokerName": "s0", "brokerAddr": "a1", "brokerId": 1,
          "reason": "connection_lost", "ts": T0 + 1100}
    raw.append(("electra.heartbeats", 0, 200, json.dumps(dc), T0 + 1100))
    reads.append((raw, T0 + 1600))
    # batch 3: the others keep going until s1's master is past its 2 s timeout
    raw = [hb_raw(s, b, T0 + t, 300 + t // 100 + b) for t in (2000, 2500, 3000) for s in sets for b in (1, 2, 3)
           if not (s in ("s0", "s1") and b == 1)]
    reads.append((raw, T0 + 3100))

    results = []
    for parse, kw in ((parse_records, {}), (parse_bundles, {"per_row": 5})):
        handles: dict[str, FakeHandle] = {}
        procs: dict[str, MasterWatchProcessor] = {}
        outs = []
        for raw, now in reads:
            for bucket, frame in _by_bucket(list(parse(iter(raw), "electra.heartbeats", "electra.events",
                                                       buckets, **kw))).items():
                if bucket not in procs:
                    handles[bucket], procs[bucket] = FakeHandle(), MasterWatchProcessor()
                    procs[bucket].init(handles[bucket])
                out = list(procs[bucket].handleInputRows((bucket,), iter([frame]), TV(now)))
                outs += sorted(r for df in out for r in df.itertuples(index=False, name=None))
            for bucket, p in procs.items():  # the next batch: a new partition, the same Python worker
                p.close()
                p.init(handles[bucket])
        results.append((outs, {b: (h.state.value, sorted(h.timers)) for b, h in handles.items()}))
    (rec_out, rec_state), (bun_out, bun_state) = results
    assert bun_state == rec_state and len(rec_state) == buckets + 1  # the sets' buckets and the dead letters' ""
    assert bun_out == rec_out
    kinds = [r[0] for r in rec_out]
    assert kinds.count("dlq") == 2 and kinds.count("proposal") == 2 and kinds.count("liveness") > 0


def test_a_bundle_row_holds_at_most_its_size_and_dead_letters_stay_rows():
    from electra.streaming.parsing import BUNDLE, parse_bundles

    raw = [("electra.heartbeats", 0, i, hb(1, T0, i, f"s{i}")[-1], T0) for i in range(10)]
    raw.append(("electra.heartbeats", 0, 10, "[]", T0))
    [batch] = parse_bundles(iter(raw), "electra.heartbeats", "electra.events", 1, per_row=4)
    frame = batch.to_pandas()
    assert list(frame["kind"]) == ["dlq", BUNDLE, BUNDLE, BUNDLE]
    assert [len(json.loads(p)) for p in frame["payload"][1:]] == [4, 4, 2]
    assert list(frame["bucket"]) == [DLQ_GROUP, "0", "0", "0"]


def test_a_batch_is_parsed_and_processed_with_the_collector_paused_and_resumed_after():
    """The cyclic collector walked the whole heap dozens of times a batch (35-44% of the operator's batch at
    10,000 sets) and found nothing; the source's parse and the operator's batch now run with it paused."""
    import gc

    from electra.streaming.parsing import parse_bundles

    raw = [("electra.heartbeats", 0, i, hb(b, T0, i, f"s{i}")[-1], T0) for i in range(300) for b in (1, 2, 3)]
    h, p = FakeHandle(), MasterWatchProcessor()
    p.init(h)
    runs: list[int] = []

    def count(phase, info) -> None:
        if phase == "start":
            runs.append(info["generation"])

    gc.callbacks.append(count)
    try:
        gc.collect()
        runs.clear()
        batches = list(parse_bundles(iter(raw), "electra.heartbeats", "electra.events", 1))
        in_parse = len(runs)
        frames = [b.to_pandas() for b in batches]
        gc.collect()
        runs.clear()
        out = list(p.handleInputRows(("0",), iter(frames), TV(T0)))
        in_operator = len(runs)
    finally:
        gc.callbacks.remove(count)
    assert sum(len(df) for df in out) == 300  # a liveness record per set: the batch was processed
    # None while paused; one once it resumes (the young objects the batch left), not one every 700 allocations
    assert in_parse <= 1 and in_operator <= 1, runs
    assert gc.isenabled()


def test_the_collector_is_resumed_after_an_error_and_left_off_if_it_was_off():
    import gc

    import pytest

    from electra.streaming.collector import collector_paused

    with pytest.raises(ValueError), collector_paused():
        assert not gc.isenabled()
        raise ValueError("a batch fails")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
