"""The inactive-master scan: one scan's controller-triggered elections, `in_flight` at a time.

The new architecture proposes them together so the engine commits many in one batch (a storm of
dead masters is not recovered one Raft round trip per set); the legacy one waits for each, as
RocketMQ's triggerElectMaster does. The new scan also runs when the first live master would time
out (the legacy one keeps RocketMQ's fixed 5 s rate). Fakes stand in for the node and state machine: what is checked
is how many elections the scan has outstanding at once, not how long anything takes.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from electra.api.controller import Controller, ControllerConfig
from electra.api.inactive_scan import InactiveMasterScan
from electra.api.legacy import LegacyControllerService
from electra.api.service import ControllerService
from electra.consensus.core import Role
from electra.state import commands as C
from electra.state.liveness import LivenessTable
from electra.state.machine import ControllerStateMachine

DEAD = [f"set-{i}" for i in range(10)]


class _StateWithDeadMasters:
    def __init__(self) -> None:
        self.sets = {n: SimpleNamespace(cluster="c") for n in DEAD}
        self.listeners: list = []

    def on_event(self, fn) -> None:
        self.listeners.append(fn)

    def sets_needing_election(self, live_of, now_ms: int) -> list[str]:
        return list(DEAD)


def _scan(in_flight: int):
    outstanding, peak, elected = 0, 0, []

    async def elect_master(cluster: str, name: str, broker_id: int) -> dict:
        nonlocal outstanding, peak
        outstanding += 1
        peak = max(peak, outstanding)
        await asyncio.sleep(0)  # the proposal's round trip: other elections may start meanwhile
        await asyncio.sleep(0)
        outstanding -= 1
        elected.append((name, broker_id))
        return {"code": 0, "header": {"masterBrokerId": 2}}

    scan = InactiveMasterScan(SimpleNamespace(role=Role.LEADER), _StateWithDeadMasters(), LivenessTable(),
                              elect_master, 5.0, lambda: 0, in_flight)
    asyncio.run(scan.scan_once())
    return peak, elected


def test_one_scan_proposes_its_elections_together():
    peak, elected = _scan(64)
    assert sorted(elected) == [(n, C.CONTROLLER_TRIGGER) for n in sorted(DEAD)]
    assert peak == len(DEAD)


def test_at_most_in_flight_elections_at_once():
    peak, elected = _scan(3)
    assert len(elected) == len(DEAD) and peak == 3


def test_legacy_scan_waits_for_each_election():
    peak, elected = _scan(1)
    assert len(elected) == len(DEAD) and peak == 1


def test_an_election_that_fails_does_not_stop_the_others():
    calls = []

    async def elect_master(cluster: str, name: str, broker_id: int) -> dict:
        calls.append(name)
        if name == DEAD[0]:
            raise TimeoutError("proposal timed out")
        return {"code": 0, "header": {}}

    scan = InactiveMasterScan(SimpleNamespace(role=Role.LEADER), _StateWithDeadMasters(), LivenessTable(),
                              elect_master, 5.0, lambda: 0, 64)
    asyncio.run(scan.scan_once())
    assert sorted(calls) == sorted(DEAD)


@pytest.mark.parametrize(("requests", "in_flight", "at_expiry"),
                         [(ControllerService, 64, True), (LegacyControllerService, 1, False)])
def test_each_architecture_builds_its_scan(requests, in_flight, at_expiry):
    node = SimpleNamespace(role=Role.FOLLOWER, leader_id=None, core=None, on_role_change=lambda fn: None)
    ctl = Controller(node, ControllerStateMachine(), ControllerConfig(make_requests=requests))
    assert ctl.scan.in_flight == in_flight
    assert ctl.scan.at_master_expiry is at_expiry


# ---------------------------------------------------------------- when the next scan runs
NOW_MS = 1_000_000


def _timed_scan(at_master_expiry: bool, heartbeats: dict[str, tuple[int, int]]) -> InactiveMasterScan:
    """Sets `a`, `b`, ... whose master (broker 1) last heartbeat at `ms` with `timeout` ms; interval 5 s."""
    live = LivenessTable()
    for name, (ms, timeout) in heartbeats.items():
        live.on_heartbeat("c", name, 1, "10.0.0.1:10911", ms, timeout_ms=timeout)
    listeners: list = []
    sm = SimpleNamespace(sets={name: SimpleNamespace(cluster="c", name=name, master_id=1) for name in heartbeats}
                         | {"masterless": SimpleNamespace(cluster="c", name="masterless", master_id=None)},
                         on_event=listeners.append, listeners=listeners)

    async def never(*_):
        raise AssertionError("no election expected")

    return InactiveMasterScan(SimpleNamespace(role=Role.LEADER), sm, live, never, 5.0, lambda: NOW_MS, 64,
                              at_master_expiry)


def test_the_new_scan_wakes_when_the_first_live_master_times_out():
    # a: heartbeat 8.5 s ago with a 10 s timeout -> dead 1.501 s from now; b: fresh
    scan = _timed_scan(True, {"a": (NOW_MS - 8_500, 10_000), "b": (NOW_MS, 10_000)})
    assert scan.first_master_expiry_ms() == NOW_MS + 1_501
    assert scan.next_wait_s() == pytest.approx(1.501)


def test_the_fixed_period_bounds_the_wait():
    scan = _timed_scan(True, {"a": (NOW_MS, 10_000)})  # dead in 10 s: the 5 s period comes first
    assert scan.next_wait_s() == 5.0


def test_a_master_already_dead_does_not_make_the_scan_spin():
    # dead 1 s ago (its set may have no live replica to elect): the next wake is b's expiry, or the period
    scan = _timed_scan(True, {"a": (NOW_MS - 11_000, 10_000), "b": (NOW_MS - 7_000, 10_000)})
    assert scan.next_wait_s() == pytest.approx(3.001)
    assert _timed_scan(True, {"a": (NOW_MS - 11_000, 10_000)}).next_wait_s() == 5.0


def test_the_legacy_scan_keeps_rocketmqs_fixed_rate():
    scan = _timed_scan(False, {"a": (NOW_MS - 8_500, 10_000)})
    assert scan.next_wait_s() == 5.0


def test_the_scan_loop_sleeps_until_the_next_wake(monkeypatch):
    import electra.api.inactive_scan as module

    waits = []

    class _Stop(Exception):
        pass

    async def sleep(s: float) -> None:
        waits.append(s)
        raise _Stop

    scan = _timed_scan(True, {"a": (NOW_MS - 8_500, 10_000)})
    monkeypatch.setattr(scan, "_sleep_unless_sooner", sleep)
    with pytest.raises(_Stop):
        asyncio.run(scan._run())
    assert waits == [pytest.approx(1.501)]
    legacy = _timed_scan(False, {"a": (NOW_MS - 8_500, 10_000)})
    monkeypatch.setattr(module, "asyncio", SimpleNamespace(sleep=sleep))
    with pytest.raises(_Stop):
        asyncio.run(legacy._run())
    assert waits[1:] == [5.0]


class _SecondSleep(Exception):
    pass


def _record_two_sleeps(scan: InactiveMasterScan) -> list[float]:
    """The scan loop's waits, as it sleeps them: the first sleeps (and may be woken), the second ends the loop."""
    waits: list[float] = []
    sleep = scan._sleep_unless_sooner

    async def spy(wait_s: float) -> bool:
        waits.append(wait_s)
        if len(waits) == 2:
            raise _SecondSleep
        return await sleep(wait_s)

    scan._sleep_unless_sooner = spy  # type: ignore[method-assign]
    return waits


def test_a_master_heartbeat_with_a_shorter_timeout_wakes_the_scan_sooner():
    """A broker chooses its heartbeatTimeoutMillis: a master's heartbeat that shortens it moves its deadline
    before the scan's wake-up, and the scan wakes to look again (it slept out the 5 s period before, and the
    set was re-elected up to 5 s late). A replica's shorter timeout does not wake it."""
    scan = _timed_scan(True, {"a": (NOW_MS, 10_000)})  # next wake: the 5 s period
    waits = _record_two_sleeps(scan)

    async def main() -> None:
        task = asyncio.ensure_future(scan._run())
        await asyncio.sleep(0.05)
        scan.liveness.on_heartbeat("c", "a", 2, "10.0.0.2:10911", NOW_MS, timeout_ms=100)  # a replica
        await asyncio.sleep(0.1)
        assert waits == [5.0]
        scan.liveness.on_heartbeat("c", "a", 1, "10.0.0.1:10911", NOW_MS, timeout_ms=100)  # the master
        with pytest.raises(_SecondSleep):
            async with asyncio.timeout(2):
                await task

    asyncio.run(main())
    assert waits == [5.0, pytest.approx(0.101)]


def test_a_set_whose_election_is_in_flight_is_not_elected_again_by_the_next_scan():
    """The new scan does not wait for its elections; the next one skips the sets still being elected."""
    release = None
    calls = []

    async def elect_master(cluster: str, name: str, broker_id: int) -> dict:
        calls.append(name)
        await release.wait()
        return {"code": 0, "header": {"masterBrokerId": 2}}

    async def main() -> None:
        nonlocal release
        release = asyncio.Event()
        scan = InactiveMasterScan(SimpleNamespace(role=Role.LEADER), _StateWithDeadMasters(), LivenessTable(),
                                  elect_master, 5.0, lambda: 0, 64, True)
        first = asyncio.create_task(scan.scan_once())
        for _ in range(5):
            await asyncio.sleep(0)
        second = asyncio.create_task(scan.scan_once())  # every set's election is still in flight
        for _ in range(5):
            await asyncio.sleep(0)
        assert sorted(calls) == sorted(DEAD)  # nothing proposed twice
        release.set()
        await asyncio.gather(first, second)
        await scan.scan_once()  # answered (here: the fake state still lists them): elected again
        assert len(calls) == 2 * len(DEAD)

    asyncio.run(main())


def test_a_scan_that_fails_is_logged_and_the_next_one_runs(caplog):
    """Review: an exception in the scan's loop (from the state, the liveness table or the clock) ended the periodic
    failover scan for good, and `stop()` gathered the error away: dead masters were no longer replaced."""
    failures = {"expiry": 1, "scan": 1}
    scanned = []

    class _Flaky(_StateWithDeadMasters):
        def sets_needing_election(self, live_of, now_ms: int) -> list[str]:
            if failures["scan"]:
                failures["scan"] -= 1
                raise KeyError("a state the scan did not expect")
            scanned.append(now_ms)
            return []

    async def elect_master(cluster: str, name: str, broker_id: int) -> dict:
        return {"code": 0, "header": {}}

    async def main(at_master_expiry: bool) -> None:
        scan = InactiveMasterScan(SimpleNamespace(role=Role.LEADER), _Flaky(), LivenessTable(), elect_master, 0.01,
                                  lambda: 0, at_master_expiry=at_master_expiry)
        if at_master_expiry:
            def next_wait_s() -> float:
                if failures["expiry"]:
                    failures["expiry"] -= 1
                    raise ValueError("a liveness entry the scan did not expect")
                return 0.01
            scan.next_wait_s = next_wait_s
        scan.start()
        for _ in range(200):  # bounded: 2 s at most
            if scanned:
                break
            await asyncio.sleep(0.01)
        await scan.stop()

    for at_master_expiry in (False, True):
        failures.update(expiry=1, scan=1)
        scanned.clear()
        caplog.clear()
        asyncio.run(main(at_master_expiry))
        assert scanned, "no scan ran after the one that failed"
        assert "inactive-master scan failed" in caplog.text
        assert at_master_expiry == ("cannot tell when the next master times out" in caplog.text)


def test_a_new_master_that_times_out_before_the_scan_wakes_wakes_it():
    """The scan sleeps until the first deadline among the masters it knew; a master elected meanwhile whose
    heartbeat times out sooner wakes it (it waited for the fixed period before)."""
    scan = _timed_scan(True, {"a": (NOW_MS, 10_000)})  # next wake: the 5 s period
    waits = _record_two_sleeps(scan)

    async def main() -> None:
        task = asyncio.ensure_future(scan._run())
        await asyncio.sleep(0.05)
        scan.liveness.on_heartbeat("c", "b", 2, "10.0.0.2:10911", NOW_MS, timeout_ms=100)  # b's broker 2: no master
        await asyncio.sleep(0.05)
        scan.sm.sets["b"] = SimpleNamespace(cluster="c", name="b", master_id=2)  # then elected master of b
        (listener,) = scan.sm.listeners
        listener(7, {"type": "AlterSyncStateSet", "brokerName": "b"})
        listener(8, {"type": "ElectMaster", "brokerName": "a", "newMasterBrokerId": 1})  # a's deadline is 10 s out
        await asyncio.sleep(0.1)
        assert waits == [5.0]
        listener(9, {"type": "ElectMaster", "brokerName": "b", "newMasterBrokerId": 2})
        with pytest.raises(_SecondSleep):
            async with asyncio.timeout(2):
                await task

    asyncio.run(main())
    assert waits == [5.0, pytest.approx(0.101)]
