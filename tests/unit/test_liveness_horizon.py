"""Controllers judge the streaming job's liveness records at the job's data horizon, not at their clock.

A liveness record reaches a controller a trigger interval plus a batch after its heartbeats were
ingested. With batches longer than the heartbeat timeout (a loaded machine), a controller that
judged at its own clock saw every broker dead: AlterSyncStateSet refused every replica, and a
crashed master's set could never have grown a sync state set to fail over to.
"""

from __future__ import annotations

import asyncio

import pytest

from electra.api.controller import ControllerConfig
from electra.api.kafka_bridge import LivenessConsumer
from electra.api.service import ControllerService
from electra.consensus.core import Role
from electra.state import commands as C
from electra.state.codes import Code
from electra.state.liveness import PIPELINE_LAG_BOUND_MS, BrokerLiveInfo, LivenessTable
from electra.state.machine import ControllerStateMachine
from electra.streaming import detector, records

NOW = 1_000_000_000
TIMEOUT = 3_000
LAG = 3_800  # the job's records arrive this much after the heartbeats they describe: longer than TIMEOUT


class FakeNode:
    """A leader that applies each proposal at once (the service's write path, without Raft)."""

    role, leader_id, core = Role.LEADER, 1, None

    def __init__(self, sm: ControllerStateMachine) -> None:
        self.sm, self.index = sm, 0

    def _apply(self, cmd: bytes):
        self.index += 1
        return self.sm.apply(self.index, cmd)

    def propose_future(self, cmd: bytes) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(self._apply(cmd))
        return fut

    async def read(self, fn, mode: str):
        return fn(self.sm)


def _set_with_master(sm: ControllerStateMachine, node: FakeNode) -> None:
    """Set `s`: brokers 1-3 registered, 1 elected master; its sync state set is {1} (epoch 1)."""
    fresh = {i: BrokerLiveInfo(i, f"10.0.0.{i}:10911", NOW, TIMEOUT) for i in (1, 2, 3)}
    for i in (1, 2, 3):
        assert node._apply(C.apply_broker_id("c", "s", i, f"10.0.0.{i}:10911;{i}")).code == Code.SUCCESS
        assert node._apply(C.register_broker("c", "s", i, f"10.0.0.{i}:10911", NOW, fresh)).code == Code.SUCCESS
    assert node._apply(C.elect_master("c", "s", 1, NOW, fresh)).code == Code.SUCCESS


def _service(table: LivenessTable, heard_at_ms: int) -> ControllerService:
    """The set above, and its brokers' newest records (from the job) saying they heartbeat at `heard_at_ms`."""
    sm = ControllerStateMachine()
    node = FakeNode(sm)
    _set_with_master(sm, node)
    for i in (1, 2, 3):
        table.put("c", "s", BrokerLiveInfo(i, f"10.0.0.{i}:10911", heard_at_ms, TIMEOUT))
    return ControllerService(node, sm, table, ControllerConfig(scan_interval_s=0, clock=lambda: NOW / 1000))


def _answer(request) -> dict:
    """Run one request (a callable returning its awaitable answer) on an event loop."""
    async def main() -> dict:
        return await request()

    return asyncio.run(main())


def _grow_sync_state_set(svc: ControllerService) -> dict:
    return _answer(lambda: svc.alter_sync_state_set("s", 1, 1, [1, 2, 3], 1))


def test_a_lagging_jobs_records_are_judged_at_its_horizon_so_replicas_can_join():
    table = LivenessTable()
    table.advance_horizon(NOW - LAG)  # the newest instant the job judged at
    svc = _service(table, NOW - LAG - 200)
    assert svc.live_now_ms() == NOW - LAG
    res = _grow_sync_state_set(svc)
    assert res["code"] == Code.SUCCESS, res
    assert svc.sm.sets["s"].sync_state_set == frozenset({1, 2, 3})


def test_judged_at_the_clock_the_same_records_refuse_every_replica():
    """The control: without the job's horizon (as before), the same lag makes every broker look dead."""
    svc = _service(LivenessTable(), NOW - LAG - 200)
    assert svc.live_now_ms() == NOW
    res = _grow_sync_state_set(svc)
    assert res["code"] != Code.SUCCESS, res
    assert svc.sm.sets["s"].sync_state_set == frozenset({1})


def test_a_job_that_stopped_keeps_no_broker_alive_beyond_the_bound():
    table = LivenessTable()
    table.advance_horizon(NOW - PIPELINE_LAG_BOUND_MS - 5_000)  # the job's last batch, long ago
    svc = _service(table, NOW - PIPELINE_LAG_BOUND_MS - 5_000)
    assert svc.live_now_ms() == NOW - PIPELINE_LAG_BOUND_MS
    assert _grow_sync_state_set(svc)["code"] != Code.SUCCESS


def test_register_reports_the_master_alive_at_the_horizon():
    table = LivenessTable()
    svc = _service(table, NOW - LAG - 200)
    def register() -> dict:
        return _answer(lambda: svc.register_broker("c", "s", 2, "10.0.0.2:10911"))

    assert register()["header"]["masterBrokerId"] is None
    table.advance_horizon(NOW - LAG)
    assert register()["header"]["masterBrokerId"] == 1


def test_live_brokers_counts_the_living_at_the_horizon_and_known_brokers_every_record():
    """`electra status`'s `live` column: brokers alive when commands are judged, not every broker held."""
    table = LivenessTable()
    table.put("c", "s", BrokerLiveInfo(1, "10.0.0.1:10911", NOW - LAG - 200, TIMEOUT))  # fresh at the horizon
    table.put("c", "s", BrokerLiveInfo(2, "10.0.0.2:10911", NOW - LAG - TIMEOUT - 1, TIMEOUT))  # its process died
    table.put("c", "t", BrokerLiveInfo(1, "10.0.0.3:10911", NOW - LAG - 200, TIMEOUT))
    table.advance_horizon(NOW - LAG)
    assert len(table) == 3
    assert table.alive_count(table.judge_at(NOW)) == 2
    assert table.alive_count(NOW) == 0  # judged at the clock, the lagging job's records all look dead


@pytest.mark.parametrize(("horizon", "expected"), [
    (None, NOW),  # heartbeats come straight to this node: its clock
    (NOW - 2_000, NOW - 2_000),  # the job lags 2 s: its horizon
    (NOW - PIPELINE_LAG_BOUND_MS - 1, NOW - PIPELINE_LAG_BOUND_MS),  # lagging past the bound: the bound
    (NOW + 5_000, NOW),  # a job whose clock runs ahead: never later than this node's clock
])
def test_judge_at(horizon, expected):
    table = LivenessTable()
    if horizon is not None:
        table.advance_horizon(horizon)
    assert table.judge_at(NOW) == expected


def test_the_horizon_only_moves_forward():
    table = LivenessTable()
    table.advance_horizon(NOW - 1_000)
    table.advance_horizon(NOW - 9_000)  # an older record (replayed at start, another partition)
    assert table.horizon_ms == NOW - 1_000


def _job_liveness_record(heartbeats: dict[str, list[tuple[int, int]]], batch_ms: int) -> bytes:
    """A liveness record as the streaming job writes it: for each set, its brokers' (id, ingest stamp)
    heartbeats through the job's own detector, processed at `batch_ms` (the job's clock)."""
    texts = []
    for name, beats in heartbeats.items():
        hbs = [{"clusterName": "c", "brokerName": name, "brokerAddr": f"10.0.0.{bid}:10911", "brokerId": bid,
                "epoch": 1, "maxOffset": 100, "confirmOffset": 100, "heartbeatTimeoutMillis": TIMEOUT,
                "electionPriority": bid, "ts": ts} for bid, ts in beats]
        _, outs = detector.process(None, name, hbs, [], batch_ms)
        texts += [o.row()[2] for o in outs if o.kind == detector.LIVENESS]
    (record,) = records.liveness_records(texts)
    return record


def _consumer(clock_ms: int) -> LivenessConsumer:
    svc = type("Svc", (), {})()
    svc.liveness = LivenessTable()
    svc.now_ms = lambda: clock_ms
    svc.connection_loss = type("Lane", (), {"on_view": lambda self: None})()  # (its lane: test_connection_loss.py)
    return LivenessConsumer(svc, "127.0.0.1:9")


def test_the_horizon_is_the_newest_ingest_stamp_the_jobs_records_carry():
    """The job writes each broker's newest heartbeat, stamped by ingest; the newest stamp is how far the
    job's data reached, whatever the job's own clock said when it wrote the record (a batch that ran
    late, a job whose clock is off)."""
    consumer = _consumer(NOW)
    record = _job_liveness_record({"a": [(1, NOW - 4_300), (2, NOW - 4_100)], "b": [(1, NOW - 4_200)]},
                                  batch_ms=NOW + 60_000)
    consumer._apply(consumer._items_of(record))
    table = consumer.svc.liveness
    assert table.horizon_ms == NOW - 4_100
    assert table.group("c", "a")[2].alive_at(table.judge_at(NOW))  # 3 s timeout, 4.1 s lag: alive
    assert consumer._items_of(b"not json") == [] and consumer.stats["bad_records"] == 1


def test_a_stamp_ahead_of_this_nodes_clock_does_not_hold_the_horizon_there():
    consumer = _consumer(NOW)
    consumer._apply(consumer._items_of(_job_liveness_record({"a": [(1, NOW + 3_600_000)]}, batch_ms=NOW)))
    assert consumer.svc.liveness.horizon_ms == NOW  # clamped: the clock catches up at once


def test_heartbeats_under_another_cluster_make_no_broker_of_the_set_alive():
    """Set `s` is in cluster `c`. Brokers 2 and 3 heartbeating as cluster `c9` (another cluster's credential,
    or a misconfigured broker) are not alive in `s`: RocketMQ keys liveness by (cluster, set, id). Every
    request judged them by name alone before: they joined the sync state set, showed alive in the sync
    state data, and blocked cleaning them."""
    table = LivenessTable()
    svc = _service(table, heard_at_ms=NOW)
    for i in (2, 3):
        table._by_name["s"].pop(("c", i))
        table.put("c9", "s", BrokerLiveInfo(i, f"10.0.0.{i}:10911", NOW, TIMEOUT))
    assert _grow_sync_state_set(svc)["code"] == Code.CONTROLLER_BROKER_NOT_ALIVE
    replicas = svc.get_sync_state_data(["s"])["body"]["replicasInfoTable"]["s"]["notInSyncReplicas"]
    assert [(r["brokerId"], r["alive"]) for r in replicas] == [(2, False), (3, False)]
    cleaned = _answer(lambda: svc.clean_broker_data(None, "s", [3], clean_living=False))
    assert cleaned["code"] == Code.SUCCESS  # not 2009 "still alive"
    table.put("c", "s", BrokerLiveInfo(2, "10.0.0.2:10911", NOW, TIMEOUT))  # broker 2 in its own cluster: alive
    assert _answer(lambda: svc.alter_sync_state_set("s", 1, 1, [1, 2], 1))["code"] == Code.SUCCESS
