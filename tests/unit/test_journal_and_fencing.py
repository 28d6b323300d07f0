"""Fenced elections from the streaming job, the event journal, and liveness records from Kafka."""

from __future__ import annotations

import gc
import io

import pytest
from test_controller_state import NOW, Controller, live

from electra.state import commands as C
from electra.state.codes import Code
from electra.state.journal import EventJournal, JournalGap, entry_for
from electra.state.liveness import BrokerLiveInfo, LivenessTable
from electra.state.machine import ControllerStateMachine


def test_proposal_fenced_by_the_master_epoch_it_saw():
    c = Controller()
    c.register("b", 3)
    assert c(C.elect_master("c", "b", 1, NOW, live(1, 2, 3))).code == Code.SUCCESS
    assert c(C.alter_sync_state_set("b", 1, 1, [1, 2, 3], 1, NOW, live(1, 2, 3))).code == Code.SUCCESS
    dead1 = live(1, 2, 3, dead=(1,))
    stale = C.elect_master("c", "b", C.CONTROLLER_TRIGGER, NOW, dead1, expected_master_epoch=0)
    r = c(stale)
    assert r.code == Code.CONTROLLER_FENCED_MASTER_EPOCH and r.header()["masterEpoch"] == 1
    proposal = C.elect_master("c", "b", C.CONTROLLER_TRIGGER, NOW, dead1, expected_master_epoch=1)
    r = c(proposal)
    assert r.code == Code.SUCCESS and r.header()["masterEpoch"] == 2 and r.header()["masterBrokerId"] != 1
    # The same proposal delivered again (Spark retry, job restart) changes nothing.
    before = c.sm.get_replica_info("b")
    r = c(proposal)
    assert r.code == Code.CONTROLLER_FENCED_MASTER_EPOCH
    assert c.sm.get_replica_info("b") == before


def test_unfenced_election_still_works_as_before():
    c = Controller()
    c.register("b", 2)
    c(C.elect_master("c", "b", 1, NOW, live(1, 2)))
    c(C.alter_sync_state_set("b", 1, 1, [1, 2], 1, NOW, live(1, 2)))
    r = c(C.elect_master("c", "b", C.CONTROLLER_TRIGGER, NOW, live(1, 2, dead=(1,))))
    assert r.code == Code.SUCCESS and r.header()["masterBrokerId"] == 2


def _journal_for(c: Controller) -> EventJournal:
    j = EventJournal(floor=c.sm.applied)
    c.sm.on_event(lambda i, ev: j.append(entry_for(c.sm, i, 1, ev)))
    c.sm.on_restore(j.reset)
    return j


def test_journal_holds_events_with_index_time_and_resulting_state():
    c = Controller()
    j = _journal_for(c)
    c.register("b", 2)
    c(C.elect_master("c", "b", 1, NOW + 5, live(1, 2)))
    entries = j.since(0)
    assert [e.event["type"] for e in entries] == ["ApplyBrokerId", "ApplyBrokerId", "ElectMaster"]
    assert [e.index for e in entries] == sorted(e.index for e in entries)
    last = entries[-1]
    assert last.ts == NOW + 5 and last.state.master_broker_id == 1 and last.state.master_epoch == 1
    assert last.state.brokers == {1: "10.0.0.1:10911", 2: "10.0.0.2:10911"} and last.cluster == "c"
    # The wire form (Kafka events records, Delta events table): RocketMQ's names, ids as JSON keys.
    assert last.public_state() == {"clusterName": "c", "brokerName": "b", "masterBrokerId": 1,
                                   "masterAddress": "10.0.0.1:10911", "masterEpoch": 1, "syncStateSet": [1],
                                   "syncStateSetEpoch": 1, "brokers": {"1": "10.0.0.1:10911",
                                                                       "2": "10.0.0.2:10911"}}
    assert j.since(last.index) == [] and j.since(entries[0].index) == entries[1:]
    assert j.since(0, limit=1) == entries[:1]


def test_journal_entries_are_out_of_the_cyclic_collectors_sight():
    """The journal keeps up to 200,000 entries: tracked, each full collection walked them all (about
    100 ms of CPU for a full journal, a pause every request in flight waited for: the write p99)."""
    c = Controller()
    j = _journal_for(c)
    c.register("b", 2)
    c(C.elect_master("c", "b", 1, NOW + 5, live(1, 2)))
    for e in j.since(0):
        assert not gc.is_tracked(e) and not gc.is_tracked(e.state)


def test_a_write_builds_one_view_of_its_set(monkeypatch):
    """The journal's entry shares the view the result already holds (views are immutable): one per write."""
    from electra.state.machine import BrokerSet

    c = Controller()
    j = _journal_for(c)
    c.register("b", 2)
    built = []
    real_view = BrokerSet.view
    monkeypatch.setattr(BrokerSet, "view", lambda bs: built.append(bs.name) or real_view(bs))
    for cmd in (C.register_broker("c", "b", 1, "moved:1", NOW, live(1, 2)),
                C.elect_master("c", "b", 1, NOW, live(1, 2)),
                C.alter_sync_state_set("b", 1, 1, [1, 2], 1, NOW, live(1, 2))):
        r = c(cmd)
        assert r.code == Code.SUCCESS and j.since(0)[-1].state is r.state
    assert built == ["b", "b", "b"]
    assert c.sm.view("b") == j.since(0)[-1].state  # outside apply, views are built from the state again
    assert len(built) == 4


def test_journal_gap_after_capacity_and_after_restore():
    c = Controller()
    j = _journal_for(c)
    j.capacity = 2
    c.register("b", 3)  # 3 ApplyBrokerId events, the first is dropped
    with pytest.raises(JournalGap):
        j.since(0)
    assert len(j.since(j.floor)) == 2
    buf = io.BytesIO()
    c.sm.snapshot(buf)
    other = ControllerStateMachine()
    j2 = EventJournal()
    other.on_restore(j2.reset)
    other.restore(io.BytesIO(buf.getvalue()))
    assert j2.floor == c.sm.applied
    with pytest.raises(JournalGap):
        j2.since(0)
    assert j2.since(c.sm.applied) == []


def test_liveness_put_keeps_the_newest_record_and_indexes_by_name():
    t = LivenessTable()
    t.put("c", "b", BrokerLiveInfo(1, "a:1", 2000))
    t.put("c", "b", BrokerLiveInfo(1, "a:1", 1000))  # older record replayed from the topic
    assert t.group("c", "b")[1].last_update_ms == 2000
    t.put("c", "b", BrokerLiveInfo(2, "a:2", 3000, timeout_ms=100))
    t.put("other", "b", BrokerLiveInfo(1, "x:1", 3000))
    assert sorted(t.group("c", "b")) == [1, 2] and sorted(t.group("other", "b")) == [1]
    assert len(t) == 3
    assert sorted(t.expire(12_500)) == [("c", "b", 1), ("c", "b", 2)] and len(t) == 1
    assert list(t.group("c", "b")) == [] and t.group("other", "b")[1].broker_addr == "x:1"
