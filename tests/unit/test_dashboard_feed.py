"""The dashboard feed: failovers with their three instants, fleet counts, one shared frame for every viewer."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from electra.api.dashboard import DashboardFeed
from electra.state import commands as C
from electra.state.liveness import LivenessTable
from electra.state.machine import ControllerStateMachine
from electra.state.results import WriteResult

T0 = 1_700_000_000_000  # ms


class FakeNode:
    """What the feed reads from a Raft node (unit test only)."""

    def __init__(self) -> None:
        self.cfg = SimpleNamespace(node_id=1)
        self.core = object()
        self.leader_id = 1
        self.listeners = []

    def status(self) -> dict:
        return {"node_id": 1, "role": "leader", "term": 3, "leader_id": 1, "commit_index": 10, "applied_index": 10,
                "snapshot_index": 0}

    def on_role_change(self, fn) -> None:
        self.listeners.append(fn)


class FakeService:
    def __init__(self, now_ms: int) -> None:
        self.sm = ControllerStateMachine()
        self.node = FakeNode()
        self.liveness = LivenessTable()
        self.http_peers: dict[int, str] = {}
        self.liveness_consumer = self.events_publisher = None
        self.elections = {"success": 0}
        self.heartbeats_received = 0
        self.now = now_ms
        self.index = 0

    def pipeline_status(self) -> dict:
        return {"liveness": dict(self.liveness_consumer.stats)} if self.liveness_consumer else {}

    def metadata(self) -> dict:
        return self.node.status()

    def apply(self, cmd: bytes) -> WriteResult:
        self.index += 1
        return self.sm.apply(self.index, cmd)

    def beat(self, name: str, broker_id: int, at_ms: int) -> None:
        self.liveness.on_heartbeat("c", name, broker_id, f"10.0.0.{broker_id}:1", at_ms, timeout_ms=1000)


def _set_with_master(svc: FakeService, name: str) -> None:
    for b in (1, 2):
        svc.apply(C.apply_broker_id("c", name, b, f"10.0.0.{b}:1;1", T0))
        svc.beat(name, b, T0)
        svc.apply(C.register_broker("c", name, b, f"10.0.0.{b}:1", T0, svc.liveness.group("c", name)))
    assert svc.apply(C.elect_master("c", name, 1, T0, svc.liveness.group("c", name))).code == 0
    svc.apply(C.alter_sync_state_set(name, 1, 1, [1, 2], 1, T0, svc.liveness.group("c", name)))


def test_a_failover_is_recorded_with_lost_detected_and_committed_instants():
    clock = [T0 / 1000]
    svc = FakeService(T0)
    feed = DashboardFeed(svc, clock=lambda: clock[0])
    _set_with_master(svc, "s1")
    assert list(feed.failovers) == []  # a set's first master is no failover
    svc.beat("s1", 2, T0 + 3000)  # the master (1) fell silent at T0; replica 2 still heartbeats
    clock[0] = (T0 + 3500) / 1000
    res = svc.apply(C.elect_master("c", "s1", C.CONTROLLER_TRIGGER, T0 + 3000, svc.liveness.group("c", "s1")))
    assert res.header()["masterBrokerId"] == 2
    (f,) = feed.failovers
    assert (f["set"], f["old"], f["new"], f["epoch"], f["elected"]) == ("s1", 1, 2, 2, True)
    assert (f["lost_ms"], f["detected_ms"], f["committed_ms"]) == (T0, T0 + 3000, T0 + 3500)


def test_a_crash_failover_counts_from_the_lost_connection():
    """Elected by the connection-loss lane: the old master left the table at its disconnect, which is `lost`."""
    clock = [T0 / 1000]
    svc = FakeService(T0)
    feed = DashboardFeed(svc, clock=lambda: clock[0])
    _set_with_master(svc, "s1")
    svc.beat("s1", 1, T0 + 900)
    assert svc.liveness.disconnect("c", "s1", 1, T0 + 1000)  # the master's session ended at T0 + 1 s
    clock[0] = (T0 + 1200) / 1000
    # judged at the job's data horizon (T0 + 400), before the disconnect
    svc.apply(C.elect_master("c", "s1", C.CONTROLLER_TRIGGER, T0 + 400, svc.liveness.group("c", "s1")))
    (f,) = feed.failovers
    assert (f["old"], f["new"], f["lost_ms"], f["committed_ms"]) == (1, 2, T0 + 1000, T0 + 1200)
    assert f["detected_ms"] == T0 + 1000  # detected when lost, never before


def test_a_hang_failover_counts_from_the_last_heartbeat_and_is_detected_when_the_timeout_ran_out():
    """Elected by the lane from a silent session: lost at its last heartbeat, detected at the timeout's end (the
    command is judged at the job's data horizon, which may come before)."""
    clock = [T0 / 1000]
    svc = FakeService(T0)
    feed = DashboardFeed(svc, clock=lambda: clock[0])
    _set_with_master(svc, "s1")
    svc.beat("s1", 2, T0 + 2000)
    assert svc.liveness.disconnect("c", "s1", 1, T0, T0 + 3000)  # silent since T0, for its 3 s timeout
    clock[0] = (T0 + 3200) / 1000
    svc.apply(C.elect_master("c", "s1", C.CONTROLLER_TRIGGER, T0 + 2000, svc.liveness.group("c", "s1")))
    (f,) = feed.failovers
    assert (f["lost_ms"], f["detected_ms"], f["committed_ms"]) == (T0, T0 + 3000, T0 + 3200)


def test_fleet_counts_live_down_and_masterless_sets():
    clock = [T0 / 1000]
    svc = FakeService(T0)
    feed = DashboardFeed(svc, clock=lambda: clock[0])
    for name in ("a", "b"):
        _set_with_master(svc, name)
    svc.beat("a", 1, T0 + 2000)  # only a's master keeps heartbeating
    clock[0] = (T0 + 2500) / 1000
    frame = asyncio.run(feed.refresh())
    assert {k: frame["fleet"][k] for k in ("sets", "live_master", "master_down", "no_master")} == \
        {"sets": 2, "live_master": 1, "master_down": 1, "no_master": 0}
    assert frame["fleet"]["unhealthy"] == [{"set": "b", "state": "master down", "master": 1, "epoch": 1}]
    assert frame["group"]["nodes"][0]["role"] == "leader"
    assert frame["pipeline"]["unavailable"]["spark_batch"]  # what a node cannot know is said, not guessed


def test_every_viewer_gets_the_same_frame_built_once_per_tick():
    svc = FakeService(T0)
    feed = DashboardFeed(svc, interval_s=0.05)

    async def main():
        a, b = feed.subscribe(), feed.subscribe()
        first_a, first_b = await asyncio.wait_for(a.get(), 5), await asyncio.wait_for(b.get(), 5)
        assert first_a is first_b and first_a.startswith(b"event: frame\ndata: {")
        built = feed.cost["frames"]
        feed.unsubscribe(a)
        feed.unsubscribe(b)
        await asyncio.sleep(0.3)
        assert feed.cost["frames"] <= built + 1  # nobody watches: the feed stops building
        assert feed._task.done()
        await feed.stop()

    asyncio.run(main())


def test_leader_changes_are_counted():
    svc = FakeService(T0)
    feed = DashboardFeed(svc)
    (listener,) = svc.node.listeners
    listener(None, 4, 2)
    listener(None, 4, 2)
    listener(None, 5, 0)
    listener(None, 5, 3)
    assert feed.leader_changes == 2


def test_with_kafka_and_no_liveness_from_the_job_master_liveness_is_unknown_not_down():
    clock = [T0 / 1000]
    svc = FakeService(T0)
    feed = DashboardFeed(svc, clock=lambda: clock[0])
    _set_with_master(svc, "a")
    svc.liveness_consumer = SimpleNamespace(stats={"records": 0, "last_record_ms": 0})
    clock[0] = (T0 + 60_000) / 1000
    fleet = asyncio.run(feed.refresh())["fleet"]
    assert (fleet["live_master"], fleet["master_down"], fleet["liveness_unknown"]) == (0, 0, 1)
    assert "no liveness records" in fleet["liveness_unknown_why"]
    svc.liveness_consumer.stats["last_record_ms"] = T0 + 59_000
    fleet = asyncio.run(feed.refresh())["fleet"]
    assert (fleet["master_down"], fleet["liveness_unknown"], fleet["liveness_unknown_why"]) == (1, 0, None)


def test_the_jobs_batch_and_lag_replace_unavailable_once_reported():
    svc = FakeService(T0)
    feed = DashboardFeed(svc, clock=lambda: T0 / 1000)
    svc.liveness_consumer = SimpleNamespace(stats={"records": 5, "last_record_ms": T0})
    feed._topic_sample = {"heartbeats_total": 10, "heartbeats_per_s": 2.0, "dead_letters_total": 1, "job": None}
    pipe = asyncio.run(feed.refresh())["pipeline"]
    assert "no batch report" in pipe["unavailable"]["spark_batch"] and "kafka_consumer_lag" in pipe["unavailable"]
    feed._topic_sample["job"] = {"batchId": 7, "rows": 40, "batchMs": 900, "proposals": 0, "liveness": 3,
                                 "deadLetters": 0, "ts": T0, "heartbeatsLag": 4}
    pipe = asyncio.run(feed.refresh())["pipeline"]
    assert pipe["spark_batch"]["batchId"] == 7 and pipe["kafka_consumer_lag"] == 4 and pipe["unavailable"] == {}
    assert (pipe["heartbeats_per_s"], pipe["dead_letters_total"]) == (2.0, 1)


def test_with_kafka_the_masters_are_judged_at_the_jobs_data_horizon():
    """The job's records arrive a batch late: judged at the clock a live master would show as down."""
    clock = [(T0 + 2_500) / 1000]
    svc = FakeService(T0)
    feed = DashboardFeed(svc, clock=lambda: clock[0])
    _set_with_master(svc, "a")  # master 1's newest heartbeat at T0, timeout 1 s: 2.5 s old at the clock
    svc.liveness_consumer = SimpleNamespace(stats={"records": 1, "last_record_ms": T0 + 2_400})
    fleet = asyncio.run(feed.refresh())["fleet"]
    assert (fleet["live_master"], fleet["master_down"]) == (0, 1)  # no horizon known: the clock
    svc.liveness.advance_horizon(T0 + 500)  # the job's data reached T0 + 0.5 s
    fleet = asyncio.run(feed.refresh())["fleet"]
    assert (fleet["live_master"], fleet["master_down"]) == (1, 0)
    assert feed.broker_set("a")["liveness"]["1"]["alive"] is True
