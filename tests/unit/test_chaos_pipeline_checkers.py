"""The pipeline checkers of `electra chaos --pipeline` on hand-written histories: each accepts a correct
history and rejects a broken one (two brokers acting as master under one epoch, a master not replaced in
time, a healthy master failed over)."""

from __future__ import annotations

import pytest

from electra.chaos import checkers
from electra.chaos.history import HistoryLog
from electra.chaos.pipeline import PIPELINE_KINDS, parse_entry, pipeline_schedule, supported


def _role(log: HistoryLog, t: float, s: str, broker: int, master: int | None, mepoch: int, **kw) -> None:
    role = "master" if master == broker else ("slave" if master is not None else "unknown")
    log.records.append({"type": "role", "mono": t, "wall": t, "set": s, "broker": broker, "role": role,
                        "master": master, "mepoch": mepoch, "alive": kw.get("alive", True),
                        "hung": kw.get("hung", False)})


def _watch(log: HistoryLog, t: float, s: str, master: int, mepoch: int) -> None:
    log.records.append({"type": "watch", "mono": t, "wall": t, "set": s, "conn": f"{s}#1@n1",
                        "event": {"type": "ElectMaster", "newMasterElected": True, "newMasterBrokerId": master,
                                  "masterEpoch": mepoch}})


def _fleet(log: HistoryLog, sets=("p-0", "p-1")) -> None:
    """Two sets, master 1 at epoch 1, every broker agreeing; then a broker-kill of p-0's master at t=5."""
    log.records.append({"type": "fleet-baseline", "mono": 0, "wall": 0,
                        "sets": {s: {"master": 1, "mepoch": 1} for s in sets}})
    for s in sets:
        for b in (1, 2, 3):
            _role(log, 0.1, s, b, 1, 1)


def _kill(log: HistoryLog, t: float, s: str = "p-0", kind: str = "broker-kill") -> None:
    log.records.append({"type": "fault-start", "mono": t, "wall": t, "fault": kind, "kind": kind, "mode": "master",
                        "set": s, "broker": 1, "mepoch": 1})


def _correct_failover(log: HistoryLog) -> None:
    _kill(log, 5.0)
    _role(log, 5.0, "p-0", 1, 1, 1, alive=False)  # the dead master keeps its last view
    _watch(log, 9.0, "p-0", 2, 2)
    _role(log, 9.5, "p-0", 2, 2, 2)
    _role(log, 9.7, "p-0", 3, 2, 2)
    _role(log, 30.0, "p-0", 1, 2, 2)  # revived: now a slave of the new master


def test_a_correct_failover_passes_every_pipeline_checker():
    log = HistoryLog()
    _fleet(log)
    _correct_failover(log)
    assert checkers.check_one_acting_master(log).ok
    v, times = checkers.check_broker_failover(log, bound_s=10.0)
    assert v.ok and times == [("broker-kill", 4.0)]
    v, n = checkers.check_no_false_failover(log)
    assert v.ok and n == 0


def test_two_brokers_acting_as_master_under_one_epoch_are_caught():
    log = HistoryLog()
    _fleet(log)
    _correct_failover(log)
    assert checkers.check_one_acting_master(log).ok
    _role(log, 10.0, "p-0", 3, 3, 2)  # broker 3 believes itself master under epoch 2, as broker 2 does
    v = checkers.check_one_acting_master(log)
    assert not v.ok and v.violations == 1 and "p-0 epoch 2" in v.detail and "[2, 3]" in v.detail


def test_watch_events_of_sets_without_simulated_brokers_are_left_to_the_controller_checkers():
    log = HistoryLog()
    _fleet(log)
    _watch(log, 2.0, "e0-s0", 2, 1)
    _watch(log, 2.5, "e0-s0", 3, 1)  # a workload set: one-master-per-epoch's business, not the brokers'
    assert checkers.check_one_acting_master(log).ok
    assert not checkers.check_one_master_per_epoch(log, []).ok


def test_brokers_told_different_masters_for_one_epoch_are_caught():
    log = HistoryLog()
    _fleet(log)
    _role(log, 2.0, "p-1", 2, 3, 1)  # broker 2 of p-1 told master 3 under epoch 1, whose master is 1
    v = checkers.check_one_acting_master(log)
    assert not v.ok and "p-1 epoch 1" in v.detail


def test_a_master_not_replaced_or_replaced_too_late_fails_the_recovery_checker():
    log = HistoryLog()
    _fleet(log)
    _kill(log, 5.0, kind="broker-hang")
    v, times = checkers.check_broker_failover(log, bound_s=10.0)
    assert not v.ok and "not replaced" in v.detail and times == []
    _role(log, 20.0, "p-0", 2, 2, 2)
    v, times = checkers.check_broker_failover(log, bound_s=10.0)
    assert not v.ok and "replaced after 15.0s" in v.detail and times == [("broker-hang", 15.0)]
    assert checkers.check_broker_failover(log, bound_s=20.0)[0].ok


def test_a_new_master_at_the_same_epoch_or_the_old_master_again_is_not_a_replacement():
    log = HistoryLog()
    _fleet(log)
    _kill(log, 5.0)
    _role(log, 6.0, "p-0", 2, 1, 1)  # still the old master
    _role(log, 7.0, "p-0", 2, 1, 2)  # the old master at a higher epoch: not replaced either
    assert not checkers.check_broker_failover(log, bound_s=10.0)[0].ok


def test_a_healthy_master_failed_over_is_a_false_failover():
    log = HistoryLog()
    _fleet(log)
    _correct_failover(log)  # the victim set's failover is expected
    log.records.append({"type": "fault-start", "mono": 12.0, "wall": 12.0, "fault": "ingest-kill(any:n2)",
                        "kind": "ingest-kill", "mode": "any"})
    assert checkers.check_no_false_failover(log)[0].ok
    _watch(log, 14.0, "p-1", 2, 2)  # p-1 was hit by no broker fault
    v, n = checkers.check_no_false_failover(log)
    assert not v.ok and n == 1 and "set p-1: master 1 (epoch 1) -> 2 (epoch 2)" in v.detail


def test_an_uninjected_broker_fault_is_not_judged():
    log = HistoryLog()
    _fleet(log)
    log.records.append({"type": "fault-start", "mono": 5.0, "wall": 5.0, "fault": "broker-kill", "kind": "broker-kill",
                        "mode": "master"})  # no eligible set: nothing injected, nothing to replace
    v, times = checkers.check_broker_failover(log)
    assert v.ok and times == []


def test_pipeline_schedules_are_seeded_round_robin_and_delegate_node_kinds():
    kinds = ["broker-kill", "broker-hang", "ingest-kill", "kafka-restart", "spark-kill", "kill:leader",
             "partition:isolate-leader"]
    a = [pipeline_schedule(5, n, kinds, 3) for n in range(14)]
    b = [pipeline_schedule(5, n, kinds, 3) for n in range(14)]
    assert [[(f.kind, f.mode, f.start, f.end) for f in fs] for fs in a] == \
           [[(f.kind, f.mode, f.start, f.end) for f in fs] for fs in b]
    assert all(len(fs) == 1 for fs in a)
    assert [fs[0].kind for fs in a[:7]] == [parse_entry(k)[0] for k in kinds]
    assert a[5][0].mode == "leader" and a[6][0].mode == "isolate-leader"
    assert all(f.start < f.end for fs in a for f in fs)
    # Mixed: a broker fault sometimes gets a node fault on top; the others stay alone.
    mixed = [pipeline_schedule(5, n, kinds, 3, mixed=True) for n in range(70)]
    assert {tuple(f.kind for f in fs) for fs in mixed if len(fs) > 1} <= {
        (b, n) for b in ("broker-kill", "broker-hang") for n in ("kill", "partition")}
    assert any(len(fs) == 2 for fs in mixed)
    assert all(len(fs) == 1 for fs in mixed if fs[0].kind not in ("broker-kill", "broker-hang"))
    ok, skipped = supported([*PIPELINE_KINDS, "kill", "clock", "disk-full"])
    assert ok == [*PIPELINE_KINDS, "kill"] and set(skipped) == {"clock", "disk-full"}
    with pytest.raises(ValueError):
        parse_entry("broker-kill:leader")
    with pytest.raises(ValueError):
        parse_entry("kafka-explode")


def test_the_role_recorder_writes_each_brokers_view_once_per_change():
    import asyncio
    from types import SimpleNamespace

    from electra.broker_simulator import SimBroker
    from electra.chaos.pipeline import record_roles

    brokers = [SimBroker("c", "p-0", k, f"10.0.0.{k}:1", broker_id=k + 1, role="slave", master_id=1, master_epoch=1)
               for k in range(3)]
    brokers[0].role = "master"
    log = HistoryLog()

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(record_roles(SimpleNamespace(brokers=brokers), log, stop))
        await asyncio.sleep(0.2)
        brokers[0].alive = False  # killed
        brokers[1].role, brokers[1].master_id, brokers[1].master_epoch = "master", 2, 2
        await asyncio.sleep(0.2)
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(scenario())
    roles = [(r["broker"], r["role"], r["master"], r["mepoch"], r["alive"]) for r in log.of_type("role")]
    assert roles == [(1, "master", 1, 1, True), (2, "slave", 1, 1, True), (3, "slave", 1, 1, True),
                     (1, "master", 1, 1, False), (2, "master", 2, 2, True)]
    assert checkers.check_one_acting_master(log).ok


def test_the_elect_keeps_epoch_mutation_makes_a_failover_keep_the_master_epoch():
    """The deliberate bug `electra chaos --pipeline` must catch: a failover without a new master epoch."""
    from electra.consensus import mutations
    from electra.state import commands as C
    from electra.state.liveness import BrokerLiveInfo
    from electra.state.machine import ControllerStateMachine

    now = 1_000_000
    live = {i: BrokerLiveInfo(i, f"10.0.0.{i}:1", now - 100) for i in (1, 2)}
    master_dead = {**live, 1: BrokerLiveInfo(1, "10.0.0.1:1", now - 20_000)}

    def failover() -> tuple[int, int]:
        sm, index = ControllerStateMachine(), 0

        def run(cmd: bytes):
            nonlocal index
            index += 1
            return sm.apply(index, cmd)

        for bid in (1, 2):
            run(C.apply_broker_id("c", "b", bid, f"10.0.0.{bid}:1;{bid}"))
            run(C.register_broker("c", "b", bid, f"10.0.0.{bid}:1", now, live))
        first = run(C.elect_master("c", "b", 1, now, live)).header()["masterEpoch"]
        run(C.alter_sync_state_set("b", 1, first, [1, 2], 1, now, live))
        h = run(C.elect_master("c", "b", C.CONTROLLER_TRIGGER, now, master_dead)).header()
        assert h["masterBrokerId"] == 2
        return first, h["masterEpoch"]

    first, second = failover()
    assert second == first + 1
    with mutations.forced("elect_keeps_epoch"):
        first, second = failover()
    assert second == first  # the bug: the old and the new master share an epoch
