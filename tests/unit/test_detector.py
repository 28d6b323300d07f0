"""The per-broker-set detector (pure Python): timer, stale master, candidates, event order, epoch fence, retries."""

from __future__ import annotations

import json

from electra.streaming import detector, records
from electra.streaming.detector import LIVENESS, PROPOSAL, SetWatch
from electra.streaming.parsing import DEAD_LETTER, DLQ_GROUP, EVENT, HEARTBEAT, parse_row

T0 = 1_700_000_000_000
TIMEOUT = 2000


def hb(bid: int, ts: int, *, epoch: int = 1, max_offset: int = 100, confirm: int = 100, name: str = "bs",
       timeout: int = TIMEOUT) -> dict:
    return {"clusterName": "c1", "brokerName": name, "brokerAddr": f"10.0.0.{bid}:10911", "brokerId": bid,
            "epoch": epoch, "maxOffset": max_offset, "confirmOffset": confirm, "heartbeatTimeoutMillis": timeout,
            "electionPriority": bid, "ts": ts}


def ev(index: int, master: int | None, epoch: int, name: str = "bs", removed: bool = False) -> dict:
    state = None if removed else {"clusterName": "c1", "masterBrokerId": master, "masterEpoch": epoch,
                                  "syncStateSet": [1, 2, 3], "syncStateSetEpoch": 1,
                                  "brokers": {"1": "a1", "2": "a2", "3": "a3"}}
    return {"index": index, "term": 1, "ts": T0, "type": "ElectMaster", "brokerName": name, "clusterName": "c1",
            "event": {"type": "ElectMaster", "brokerName": name}, "state": state}


def proposals(outs):
    return [o.payload for o in outs if o.kind == PROPOSAL]


def started(now: int = T0) -> SetWatch:
    """Master 1 at epoch 1; brokers 1-3 heartbeat at `now`."""
    w, _ = detector.process(None, "bs", [hb(1, now), hb(2, now), hb(3, now)], [ev(5, 1, 1)], now)
    return w


def beats(w: SetWatch, ids, start: int, end: int, every: int = 500) -> tuple[SetWatch, list]:
    """Brokers `ids` heartbeat every `every` ms from `start` to `end` (one batch each); all outputs."""
    outs = []
    for t in range(start, end + 1, every):
        w, out = detector.process(w, "bs", [hb(i, t) for i in ids], [], t)
        outs += out
    return w, outs


def test_timer_is_armed_at_master_heartbeat_plus_timeout():
    w = started()
    assert w.master_id == 1 and w.master_epoch == 1
    assert w.timer_ms == T0 + TIMEOUT + 1
    # A fresh master heartbeat moves the timer.
    w, outs = detector.process(w, "bs", [hb(1, T0 + 500)], [], T0 + 600)
    assert not proposals(outs) and w.timer_ms == T0 + 500 + TIMEOUT + 1


def test_stale_master_yields_one_proposal_with_snapshot():
    w = started()
    w, _ = beats(w, [2, 3], T0 + 500, T0 + 1500)
    now = T0 + TIMEOUT + 1
    outs = detector.on_timer(w, now)
    [p] = proposals(outs)
    assert p["brokerName"] == "bs" and p["clusterName"] == "c1" and p["expectedMasterEpoch"] == 1
    assert p["proposedAtMs"] == now and p["masterLastHeartbeatMs"] == T0
    live = {b["broker_id"]: b for b in p["live"]}
    assert set(live) == {1, 2, 3}
    assert live[2]["last_update_ms"] == T0 + 1500 and live[2]["timeout_ms"] == TIMEOUT
    assert set(live[2]) == {"broker_id", "broker_addr", "last_update_ms", "timeout_ms", "epoch", "max_offset",
                            "confirm_offset", "priority"}
    # Not proposed again for the same epoch before the retry time, even on new data.
    w, outs = detector.process(w, "bs", [hb(2, now + 100)], [], now + 100)
    assert not proposals(outs)
    assert w.timer_ms == now + 2 * TIMEOUT


def test_master_alive_at_deadline_is_not_stale():
    w, _ = beats(started(), [2, 3], T0 + 500, T0 + 1500)
    assert not proposals(detector.on_timer(w, T0 + TIMEOUT))  # last + timeout >= now: still alive
    assert w.timer_ms == T0 + TIMEOUT + 1


def test_no_live_candidate_no_proposal_until_one_heartbeats():
    w, _ = beats(started(), [2, 3], T0 + 500, T0 + 1000)
    w, _ = detector.process(w, "bs", [], [], T0 + 1600, disconnects=[dc(2, T0 + 1500), dc(3, T0 + 1600)])
    now = T0 + TIMEOUT + 100  # the master is stale, and both replicas are disconnected
    assert not proposals(detector.on_timer(w, now))
    assert w.timer_ms is None  # waits for data
    w, outs = detector.process(w, "bs", [hb(3, now + 10)], [], now + 20)
    [p] = proposals(outs)
    assert p["expectedMasterEpoch"] == 1


def test_a_silent_set_restarts_its_clocks_when_its_records_resume():
    """The whole set fell silent (an ingest restart, Kafka down): when its records resume, brokers come
    back one by one, and a master still to resume must not look dead by the length of the outage."""
    w = started()
    w, _ = beats(w, [1, 2, 3], T0 + 500, T0 + 1000)
    gap_end = T0 + 30_000
    # Other sets' records moved the data horizon during the silence: nothing is judged past the set's data.
    assert not proposals(detector.on_timer(w, gap_end - 1)) and w.timer_ms is None
    # Replicas resume first (their heartbeats in a batch of their own), the master a heartbeat later.
    w, outs = detector.process(w, "bs", [hb(2, gap_end), hb(3, gap_end + 100)], [], gap_end + 200)
    assert not proposals(outs) and w.resumed_ms == gap_end
    assert w.timer_ms == gap_end + TIMEOUT + 1  # a full timeout from the resumption
    w, outs = beats(w, [1, 2, 3], gap_end + 500, gap_end + 3 * TIMEOUT)
    assert not proposals(outs)
    # A master that does not resume is failed over a full timeout after the others did.
    w, outs = beats(w, [2, 3], gap_end + 3 * TIMEOUT + 500, gap_end + 5 * TIMEOUT)
    [p] = proposals(outs)
    assert p["proposedAtMs"] == gap_end + 4 * TIMEOUT + 500


def test_a_silence_inside_one_batch_restarts_the_clocks_too():
    """A batch that spans the outage (it ran long) holds records from before and after it."""
    w = started()
    w, outs = detector.process(w, "bs", [hb(1, T0 + 500), hb(2, T0 + 500), hb(3, T0 + 500), hb(2, T0 + 20_000),
                                         hb(3, T0 + 20_100)], [], T0 + 20_200)
    assert not proposals(outs) and w.resumed_ms == T0 + 20_000
    # The source folds them (one per broker) and says what the fold dropped: the same judgment.
    [f] = [o for o in detector.collapse_heartbeats([hb(1, T0 + 500), hb(2, T0 + 20_000)]) if o["brokerId"] == 2]
    f[detector.RUN_FIELD] = [T0 + 500, T0 + 20_000]
    w2, outs = detector.process(started(), "bs", [f, hb(3, T0 + 20_100)], [], T0 + 20_200)
    assert not proposals(outs) and w2.resumed_ms == T0 + 20_000
    # Records that never fell silent for half a timeout do not restart anything.
    w3, _ = detector.process(started(), "bs", [hb(2, T0 + 1000), hb(3, T0 + 1900)], [], T0 + 1900)
    assert w3.resumed_ms == 0 and w3.timer_ms == T0 + TIMEOUT + 1


def test_a_hung_master_among_live_replicas_is_still_failed_over_at_its_timeout():
    w = started()
    w, outs = beats(w, [2, 3], T0 + 500, T0 + TIMEOUT + 500)
    [p] = proposals(outs)
    assert p["proposedAtMs"] == T0 + TIMEOUT + 500 and p["masterLastHeartbeatMs"] == T0


def test_master_learned_late_gets_a_full_timeout_from_learning():
    # Heartbeats of broker 2 are old, then an event makes it master: the timer starts when the job learns it.
    w, _ = detector.process(None, "bs", [hb(1, T0), hb(2, T0 - 10_000), hb(3, T0)], [ev(1, 1, 1)], T0)
    w, outs = detector.process(w, "bs", [], [ev(2, 2, 2)], T0 + 100)
    assert w.master_id == 2 and not proposals(outs)
    assert w.timer_ms == T0 + 100 + TIMEOUT + 1
    # A master that never heartbeated: timeout from when it was learned (default: the set's timeouts).
    w2, _ = detector.process(None, "bs", [hb(2, T0), hb(3, T0)], [ev(1, 1, 1)], T0)
    assert w2.timer_ms == T0 + TIMEOUT + 1


def test_duplicate_and_old_event_indexes_are_ignored():
    w = started()
    assert w.last_index == 5
    w, _ = detector.process(w, "bs", [], [ev(5, 2, 9), ev(3, 3, 7)], T0 + 10)
    assert (w.master_id, w.master_epoch, w.last_index) == (1, 1, 5)
    # Out-of-order within a batch: applied in index order, the highest wins.
    w, _ = detector.process(w, "bs", [], [ev(8, 3, 3), ev(7, 2, 2), ev(7, 2, 2)], T0 + 20)
    assert (w.master_id, w.master_epoch, w.last_index) == (3, 3, 8)


def test_epoch_fence_new_epoch_can_be_proposed_again():
    w = started()
    w, _ = beats(w, [2, 3], T0 + 950, T0 + 1900, every=950)
    [p1] = proposals(detector.on_timer(w, T0 + TIMEOUT + 1))
    assert p1["expectedMasterEpoch"] == 1
    # The controller elected broker 2 at epoch 2; the job learns it from the events topic.
    now = T0 + TIMEOUT + 500
    w, outs = detector.process(w, "bs", [hb(2, now), hb(3, now)], [ev(6, 2, 2)], now)
    assert not proposals(outs) and w.master_id == 2 and w.retries == 0
    # Broker 2 dies too: epoch 2 is a different epoch, so it is proposed.
    later = now + TIMEOUT + 1
    w, _ = beats(w, [3], now + 500, now + 1500)
    w, outs = detector.process(w, "bs", [hb(3, later)], [], later)
    [p2] = proposals(outs)
    assert p2["expectedMasterEpoch"] == 2


def test_retry_is_bounded():
    w = started()
    now = T0 + TIMEOUT + 1
    w, outs = detector.process(w, "bs", [hb(2, now), hb(3, now)], [], now)  # the data path detects it too
    first = proposals(outs) + proposals(detector.on_timer(w, now))
    # No event arrives; brokers 2 and 3 keep heartbeating.
    got = list(first)
    t = now
    for _ in range(40):  # 40 x 500 ms = 20 s = 10 x timeout
        t += 500
        w, outs = detector.process(w, "bs", [hb(2, t), hb(3, t)], [], t)
        got += proposals(outs)
        if w.timer_ms is not None and w.timer_ms <= t + 500:
            got += proposals(detector.on_timer(w, w.timer_ms))
    assert [p["retry"] for p in got] == [0, 1, 2, 3]
    assert all(p["expectedMasterEpoch"] == 1 for p in got)
    times = [p["proposedAtMs"] for p in got]
    assert all(b - a >= 2 * TIMEOUT for a, b in zip(times, times[1:]))
    assert w.timer_ms is None


def test_rocketmq_offset_rule():
    w = started()
    # Lower max offset at the same epoch: offsets kept, heartbeat time and address follow.
    w, _ = detector.process(w, "bs", [hb(2, T0 + 10, epoch=1, max_offset=50, confirm=40)], [], T0 + 10)
    b = w.brokers[2]
    assert (b.epoch, b.max_offset, b.confirm_offset, b.last_update_ms) == (1, 100, 100, T0 + 10)
    # Higher epoch with a lower offset moves forward.
    w, _ = detector.process(w, "bs", [hb(2, T0 + 20, epoch=2, max_offset=10, confirm=5)], [], T0 + 20)
    b = w.brokers[2]
    assert (b.epoch, b.max_offset, b.confirm_offset) == (2, 10, 5)
    # Same epoch, higher offset moves forward; older epoch never goes back.
    w, _ = detector.process(w, "bs", [hb(2, T0 + 30, epoch=2, max_offset=20, confirm=15),
                                      hb(2, T0 + 40, epoch=1, max_offset=999, confirm=999)], [], T0 + 40)
    b = w.brokers[2]
    assert (b.epoch, b.max_offset, b.confirm_offset, b.last_update_ms) == (2, 20, 15, T0 + 40)


def test_collapse_equals_sequential_apply():
    seq = [hb(2, T0 + 1, epoch=1, max_offset=5, confirm=1), hb(3, T0 + 2), hb(2, T0 + 3, epoch=2, max_offset=1),
           hb(2, T0 + 4, epoch=1, max_offset=50, confirm=9), hb(3, T0 + 5, max_offset=7)]
    a = started()
    b = started()
    for h in seq:
        a.apply_heartbeat(h, T0 + 10)
    for h in detector.collapse_heartbeats(seq):
        b.apply_heartbeat(h, T0 + 10)
    assert a.brokers == b.brokers


def test_liveness_record_for_sets_with_heartbeats():
    w = started()
    w, outs = detector.process(w, "bs", [hb(2, T0 + 100)], [], T0 + 200)
    [rec] = [o for o in outs if o.kind == LIVENESS]
    assert rec.broker_name == "bs"
    p = json.loads(rec.row()[2])  # as the liveness topic carries it
    assert p["clusterName"] == "c1" and p["brokerName"] == "bs" and p["ts"] == T0 + 200
    assert [b["broker_id"] for b in p["brokers"]] == [1, 2, 3]
    assert p["brokers"][1]["last_update_ms"] == T0 + 100
    # No heartbeats in the batch: no liveness record.
    w, outs = detector.process(w, "bs", [], [ev(9, 1, 1)], T0 + 300)
    assert not [o for o in outs if o.kind == LIVENESS]


def test_removed_set_clears_master_and_json_round_trip():
    w = started()
    w2 = SetWatch.from_json(w.to_json())
    assert w2 == w
    w2, _ = detector.process(w2, "bs", [], [ev(6, None, 0, removed=True)], T0 + 10)
    assert w2.master_id is None and w2.timer_ms is None
    assert not proposals(detector.on_timer(w2, T0 + 100 * TIMEOUT))


def test_silent_non_master_brokers_are_forgotten():
    w = started()
    later = T0 + 61_000
    w, _ = detector.process(w, "bs", [hb(1, later), hb(2, later)], [], later)
    assert set(w.brokers) == {1, 2}


def test_parse_row_routes_heartbeats_events_and_dead_letters():
    good = json.dumps({k: v for k, v in hb(2, T0).items() if k != "ts"})
    group, kind, payload = parse_row("electra.heartbeats", 1, 7, good, T0 + 5, "electra.heartbeats",
                                     "electra.events")
    assert (group, kind) == ("bs", HEARTBEAT) and json.loads(payload)["ts"] == T0 + 5
    group, kind, _ = parse_row("electra.events", 0, 1, json.dumps(ev(1, 1, 1)), T0, "electra.heartbeats",
                               "electra.events")
    assert (group, kind) == ("bs", EVENT)
    for raw, err in (("{nope", "invalid JSON"), ('{"clusterName":"c1","brokerName":"bs"}', "brokerAddr"),
                     (None, "missing")):
        group, kind, payload = parse_row("electra.heartbeats", 3, 9, raw, T0, "electra.heartbeats",
                                         "electra.events")
        d = json.loads(payload)
        assert (group, kind) == (DLQ_GROUP, DEAD_LETTER)
        assert err in d["error"] and d["topic"] == "electra.heartbeats" and d["partition"] == 3
        assert d["offset"] == 9 and d["raw"] == raw


def dc(bid: int, ts: int, reason: str = "connection_lost", name: str = "bs") -> dict:
    return {"type": "disconnected", "clusterName": "c1", "brokerName": name, "brokerId": bid,
            "brokerAddr": f"10.0.0.{bid}:10911", "reason": reason, "ts": ts}


def test_disconnected_master_is_inactive_at_that_instant_and_left_out_of_the_snapshot():
    """RocketMQ's channel-close rule: no heartbeat timeout to wait for."""
    w = started()
    at = T0 + 300  # well within the master's 2 s timeout
    w, outs = detector.process(w, "bs", [hb(2, at), hb(3, at)], [], at + 50, judge_ms=at, disconnects=[dc(1, at)])
    [p] = proposals(outs)
    assert p["expectedMasterEpoch"] == 1 and p["proposedAtMs"] == at
    assert {b["broker_id"] for b in p["live"]} == {2, 3}  # the controller must not see the master alive
    # Restored from the state store, the disconnect is still known (no second proposal, same fence).
    w2 = SetWatch.from_json(w.to_json())
    assert w2.gone == {1: (at, at)} and not proposals(detector.on_timer(w2, at + 100))


def test_disconnected_replica_is_not_a_candidate():
    w = started()
    w, outs = detector.process(w, "bs", [hb(3, T0 + 200)], [], T0 + 300,
                               disconnects=[dc(2, T0 + 200), dc(3, T0 + 250)])
    assert not proposals(outs)
    assert w.live_others(T0 + 300) == []
    # The master crashes too: nobody alive and connected, so no proposal.
    w, outs = detector.process(w, "bs", [], [], T0 + 400, disconnects=[dc(1, T0 + 400)])
    assert not proposals(outs)


def test_a_heartbeat_after_the_disconnect_means_reconnected_and_an_older_one_does_not():
    w = started()
    w, _ = detector.process(w, "bs", [hb(2, T0 + 100)], [], T0 + 100, judge_ms=T0 + 100,
                            disconnects=[dc(2, T0 + 200)])
    assert 2 in w.gone
    w, _ = detector.process(w, "bs", [hb(2, T0 + 150)], [], T0 + 250)  # in flight before the disconnect
    assert 2 in w.gone
    w, _ = detector.process(w, "bs", [hb(2, T0 + 900)], [], T0 + 900)
    assert 2 not in w.gone and 2 in {b.broker_id for b in w.live_others(T0 + 900)}
    # A disconnect older than a known heartbeat (records through two ingest workers) is ignored.
    w, _ = detector.process(w, "bs", [], [], T0 + 950, disconnects=[dc(3, T0 - 10)])
    assert 3 not in w.gone


def test_grace_applies_to_a_lost_connection_but_not_to_a_goodbye():
    w = started()
    at = T0 + 300
    w, outs = detector.process(w, "bs", [hb(2, at), hb(3, at)], [], at, judge_ms=at, disconnects=[dc(1, at)],
                               grace_ms=500)
    assert not proposals(outs) and w.timer_ms == at + 500  # looked at again when the grace ends
    assert not proposals(detector.on_timer(w, at + 499))
    [p] = proposals(detector.on_timer(w, at + 500))
    assert p["expectedMasterEpoch"] == 1
    # A clean shutdown is final: no grace.
    w = started()
    w, outs = detector.process(w, "bs", [hb(2, at), hb(3, at)], [], at, judge_ms=at,
                               disconnects=[dc(1, at, reason="shutdown")], grace_ms=500)
    assert proposals(outs)


def test_parse_row_routes_disconnected_records_and_rejects_bad_ones():
    from electra.streaming.parsing import DISCONNECTED

    group, kind, payload = parse_row("electra.heartbeats", 0, 1, json.dumps(dc(1, T0)), T0, "electra.heartbeats",
                                     "electra.events")
    assert (group, kind) == ("bs", DISCONNECTED) and json.loads(payload) == dc(1, T0)
    bad = {**dc(1, T0), "reason": "bored"}
    group, kind, payload = parse_row("electra.heartbeats", 0, 2, json.dumps(bad), T0, "electra.heartbeats",
                                     "electra.events")
    assert (group, kind) == (DLQ_GROUP, DEAD_LETTER) and "reason" in json.loads(payload)["error"]


def test_broker_live_info_wire_form_has_every_field():
    """The wire form (liveness topic, the job's state) has every field and reads back equal."""
    import msgspec

    from electra.state.liveness import BrokerLiveInfo

    b = BrokerLiveInfo(1, "a:1", 2, 3, 4, 5, 6, 7)
    fields = {f.name: getattr(b, f.name) for f in msgspec.structs.fields(b)}
    assert b.to_wire() == fields and len(fields) == 8 and BrokerLiveInfo.from_wire(b.to_wire()) == b


def test_parse_records_in_the_source_equals_the_map_in_pandas_stage():
    """The Python source parses in its reader (Arrow batches); the result must equal the mapInPandas stage's."""
    import pandas as pd

    from electra.streaming.parsing import PARSED_COLUMNS, parse_frames, parse_records

    raw = [("electra.heartbeats", 1, 5, json.dumps(hb(1, T0)), T0 + 1),
           ("electra.heartbeats", 1, 6, json.dumps({k: v for k, v in hb(2, T0).items() if k != "ts"}), T0 + 2),
           ("electra.heartbeats", 2, 7, json.dumps(dc(1, T0 + 5)), T0 + 5),
           ("electra.events", 0, 3, json.dumps(ev(9, 1, 1)), T0),
           ("electra.heartbeats", 0, 8, "{not json", T0), ("electra.heartbeats", 0, 9, None, None)]
    frame = pd.DataFrame(raw, columns=["topic", "partition", "offset", "value", "kafka_ts"])
    expected = pd.concat(list(parse_frames(iter([frame]), "electra.heartbeats", "electra.events", 8)))
    batches = list(parse_records(iter(raw), "electra.heartbeats", "electra.events", 8, chunk=4))
    assert [b.num_rows for b in batches] == [4, 2]
    got = pd.concat([b.to_pandas() for b in batches], ignore_index=True)
    # The source's heartbeats also say what its fold dropped (detector.RUN_FIELD); nothing else differs.
    runs = [json.loads(p).pop(detector.RUN_FIELD, None) for p in got["payload"]]
    assert runs == [[T0, T0]] * 2 + [None] * 4
    got["payload"] = [p if r is None else records.dumps({k: v for k, v in json.loads(p).items()
                                                         if k != detector.RUN_FIELD})
                      for p, r in zip(got["payload"], runs)]
    assert got[PARSED_COLUMNS].values.tolist() == expected.reset_index(drop=True)[PARSED_COLUMNS].values.tolist()
    assert str(batches[0].schema.field("partition").type) == "int32"


def test_the_source_hands_on_one_folded_heartbeat_per_broker_per_read():
    """A read that fell behind holds many heartbeats per broker: only the last goes on, folded by RocketMQ's
    rule exactly as the operator folds them (`collapse_heartbeats`), at the last one's offset; events,
    disconnects and dead letters pass unchanged."""
    from electra.streaming.detector import collapse_heartbeats
    from electra.streaming.parsing import DISCONNECTED, parse_records

    beats = [hb(1, T0, epoch=2, max_offset=500), hb(2, T0), hb(1, T0 + 1000, epoch=1, max_offset=900),  # stale epoch
             hb(1, T0 + 2000, epoch=2, max_offset=400), hb(2, T0 + 3000, max_offset=50), hb(1, T0 + 900, name="other")]
    raw = [("electra.heartbeats", 0, i, json.dumps(b), T0) for i, b in enumerate(beats)]
    raw.insert(2, ("electra.heartbeats", 0, 90, json.dumps(dc(2, T0 + 1)), T0))
    raw.insert(3, ("electra.events", 0, 91, json.dumps(ev(9, 1, 2)), T0))
    raw.append(("electra.heartbeats", 0, 92, "{not json", T0))
    [batch] = parse_records(iter(raw), "electra.heartbeats", "electra.events", 8)
    rows = batch.to_pylist()
    assert [(r["kind"], r["offset"]) for r in rows] == [(DISCONNECTED, 90), (EVENT, 91), (HEARTBEAT, 3),
                                                        (HEARTBEAT, 4), (HEARTBEAT, 5), (DEAD_LETTER, 92)]
    got = {(r["group"], json.loads(r["payload"])["brokerId"]): json.loads(r["payload"]) for r in rows
           if r["kind"] == HEARTBEAT}
    # With the span of each set's records, the disconnect included (what the fold drops).
    assert {k: v.pop(detector.RUN_FIELD) for k, v in got.items()} == {
        ("bs", 1): [T0, T0], ("bs", 2): [T0, T0], ("other", 1): [T0 + 900, T0 + 900]}
    for name in ("bs", "other"):
        for want in collapse_heartbeats([b for b in beats if b["brokerName"] == name]):
            assert got[(name, want["brokerId"])] == want
    assert got[("bs", 1)]["epoch"] == 2 and got[("bs", 1)]["maxOffset"] == 500 and got[("bs", 1)]["ts"] == T0 + 2000


def _heartbeat_variants() -> list[str]:
    """Valid and invalid heartbeat values: every field at, inside and past its bound, wrong types, extras."""
    from electra.streaming.records import MAX_NAME

    base = {"clusterName": "c", "brokerName": "set-1", "brokerAddr": "10.0.0.1:10911", "brokerId": 2, "epoch": 3,
            "maxOffset": 4, "confirmOffset": 5, "heartbeatTimeoutMillis": 3000, "electionPriority": 1, "ts": T0}
    odd = [None, True, 1.5, "1", -1, 0, 2**31, -(2**31) - 1, 2**63, -(2**63) - 1, 2**62 + 1, 99, 100, 3_600_001,
           "", "é" * MAX_NAME, "é" * (MAX_NAME + 1), [], {}]
    values = [json.dumps(base), json.dumps({k: v for k, v in base.items() if k in
                                            ("clusterName", "brokerName", "brokerAddr", "brokerId")})]
    for key in base:
        values.append(json.dumps({k: v for k, v in base.items() if k != key}))
        values += [json.dumps({**base, key: v}) for v in odd]
    values += [json.dumps({**base, "extra": [1, 2]}), json.dumps({**base, "type": "heartbeat"}),
               json.dumps({**base, "type": "disconnected"}), '{"brokerId": 1, "brokerId": 2}', "[]", "7", "{",
               '{"clusterName":"c","brokerName":"b","brokerAddr":"a","brokerId":1,"brokerId":2}', '"\\ud800"']
    return values


def test_the_fast_heartbeat_decoder_accepts_and_returns_exactly_what_the_rule_does():
    from electra.streaming.records import fast_heartbeat, validate_heartbeat

    fast_taken = 0
    for raw in _heartbeat_variants():
        try:
            exact = validate_heartbeat(json.loads(raw))
        except ValueError:
            exact = None
        got = fast_heartbeat(raw)
        if got is not None:
            fast_taken += 1
            assert got == exact and list(got) == list(exact), raw  # same dict, same field order
        assert fast_heartbeat(raw.encode()) == got
    assert fast_taken > 20  # the fast path is really taken for valid records


def test_parse_row_gives_the_same_row_with_or_without_the_fast_decoder(monkeypatch):
    from electra.streaming import records

    rows = [parse_row("electra.heartbeats", 0, i, raw, T0, "electra.heartbeats", "electra.events")
            for i, raw in enumerate(_heartbeat_variants())]
    monkeypatch.setattr(records, "fast_heartbeat", lambda raw: None)
    assert rows == [parse_row("electra.heartbeats", 0, i, raw, T0, "electra.heartbeats", "electra.events")
                    for i, raw in enumerate(_heartbeat_variants())]


def test_state_and_liveness_json_write_brokers_as_their_wire_maps_even_with_a_lone_surrogate():
    """Brokers stay structs in `to_dict`/`liveness` (no dict copy per broker per batch): the JSON must be
    exactly what the wire maps give, through msgspec and through `records.dumps`'s `json` fallback."""
    from electra.state.liveness import BrokerLiveInfo

    for addr in ("10.0.0.1:10911", "a\ud800"):
        w = SetWatch("bs", cluster="c1", master_id=1, master_epoch=3)
        w.brokers = {2: BrokerLiveInfo(2, "b", T0), 1: BrokerLiveInfo(1, addr, T0, 10, 1, 2, 3, 4)}
        w.gone = {2: (T0 + 1, T0 + 2)}
        as_maps = {**w.to_dict(), "brokers": [b.to_wire() for b in w.brokers.values()]}
        assert json.loads(w.to_json()) == json.loads(json.dumps(as_maps))
        assert SetWatch.from_json(w.to_json()) == w
        live = json.loads(records.dumps(w.liveness(T0 + 5)))
        assert live["brokers"] == [w.brokers[1].to_wire(), w.brokers[2].to_wire()]  # by broker id


def test_records_naming_another_cluster_than_the_sets_neither_keep_it_alive_nor_fail_it_over():
    """A set belongs to one cluster (the controllers refuse requests naming another). A credential scoped to
    cluster `c9` may write heartbeats and disconnects for set `bs` of cluster `c1` through an ingest worker,
    which cannot know the set's cluster: the job ignores them, and no fold lets them take a real one's place."""
    from electra.streaming.detector import collapse_heartbeats
    from electra.streaming.parsing import parse_records

    def forged(record: dict) -> dict:
        return {**record, "clusterName": "c9"}

    w = started()
    # The master (1) stops; a forged heartbeat in its name would keep it "alive" for ever.
    w, outs = beats(w, [2, 3], T0 + 500, T0 + 1500)
    w, out = detector.process(w, "bs", [forged(hb(1, T0 + 1900, epoch=9)), hb(2, T0 + 2500), hb(3, T0 + 2500)], [],
                              T0 + 2500)
    assert w.brokers[1].last_update_ms == T0 and w.brokers[1].epoch == 1  # the forged one changed nothing
    assert [p["expectedMasterEpoch"] for p in proposals(outs + out)] == [1]  # the real master is replaced
    # A forged disconnect of a live master fails nothing over.
    w = started()
    w, out = detector.process(w, "bs", [hb(1, T0 + 500), hb(2, T0 + 500), hb(3, T0 + 500)], [], T0 + 500,
                              disconnects=[forged(dc(1, T0 + 600))])
    w, more = detector.process(w, "bs", [hb(2, T0 + 1000), hb(3, T0 + 1000)], [], T0 + 1000)
    assert not w.gone and not proposals(out + more)
    # Folded apart: a forged heartbeat after the real one in the same read does not replace it.
    real, fake = hb(1, T0 + 100), forged(hb(1, T0 + 200, epoch=9, max_offset=10**6))
    assert sorted(h["clusterName"] for h in collapse_heartbeats([real, fake])) == ["c1", "c9"]
    raw = [("electra.heartbeats", 0, i, json.dumps(b), T0) for i, b in enumerate([real, fake])]
    [batch] = parse_records(iter(raw), "electra.heartbeats", "electra.events", 8)
    assert sorted(json.loads(r["payload"])["clusterName"] for r in batch.to_pylist()) == ["c1", "c9"]
