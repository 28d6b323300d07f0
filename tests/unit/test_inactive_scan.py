"""The inactive-master scan: one scan's controller-triggered elections, `in_flight` at a time.

The new architecture proposes them together so the engine commits many in one batch (a storm of
dead masters is not recovered one Raft round trip per set); the legacy one waits for each, as
RocketMQ's triggerElectMaster does. Fakes stand in for the node and state machine: what is checked
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


@pytest.mark.parametrize(("requests", "in_flight"), [(ControllerService, 64), (LegacyControllerService, 1)])
def test_each_architecture_builds_its_scan(requests, in_flight):
    node = SimpleNamespace(role=Role.FOLLOWER, leader_id=None, core=None, on_role_change=lambda fn: None)
    ctl = Controller(node, ControllerStateMachine(), ControllerConfig(make_requests=requests))
    assert ctl.scan.in_flight == in_flight
