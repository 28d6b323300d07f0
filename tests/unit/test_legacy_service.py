"""The legacy architecture's event queue: one request at a time, reads through the log, leader only."""

from __future__ import annotations

import asyncio

import pytest

from electra.api.controller import ControllerConfig
from electra.api.legacy import LegacyControllerService
from electra.consensus.core import Role
from electra.consensus.errors import NotLeader
from electra.state import commands as C
from electra.state.liveness import LivenessTable
from electra.state.machine import ControllerStateMachine


class FakeNode:
    """Applies each proposal to the state machine after a pause, counting proposals in flight."""

    def __init__(self, sm: ControllerStateMachine) -> None:
        self.sm, self.role, self.leader_id, self.core = sm, Role.LEADER, 1, None
        self.index = self.in_flight = self.max_in_flight = 0
        self.ops: list[str] = []

    async def propose(self, cmd: bytes) -> dict:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.001)
            self.index += 1
            self.ops.append(C.decode(cmd).__struct_config__.tag)
            return self.sm.apply(self.index, cmd)
        finally:
            self.in_flight -= 1


def _service() -> tuple[LegacyControllerService, FakeNode]:
    sm = ControllerStateMachine()
    node = FakeNode(sm)
    return LegacyControllerService(node, sm, LivenessTable(), ControllerConfig(scan_interval_s=0)), node


def test_requests_run_one_at_a_time_and_reads_are_log_entries():
    async def main():
        svc, node = _service()
        svc.start()
        try:
            await svc.apply_broker_id("c", "s", 1, "10.0.0.1:1;1")
            results = await asyncio.gather(*(svc.get_replica_info("s") for _ in range(20)),
                                           *(svc.register_broker("c", "s", 1, f"10.0.0.1:{p}") for p in range(20)))
        finally:
            await svc.stop()
        return node, results

    node, results = asyncio.run(main())
    assert node.max_in_flight == 1  # the scheduler never has two proposals out
    assert node.ops.count("read_event") == 20  # every read appended a READ_EVENT
    assert all(r["code"] == 0 for r in results)


def test_a_follower_refuses_before_queueing():
    async def main():
        svc, node = _service()
        node.role, node.leader_id = Role.FOLLOWER, 2
        svc.start()
        try:
            with pytest.raises(NotLeader):
                await svc.get_replica_info("s")
        finally:
            await svc.stop()
        return node

    assert asyncio.run(main()).ops == []


def test_the_command_is_built_when_the_scheduler_takes_it():
    """Liveness is read at the head of the queue (as RocketMQ's supplier runs on the scheduler thread)."""
    async def main():
        svc, node = _service()
        svc.start()
        try:
            await svc.apply_broker_id("c", "s", 1, "10.0.0.1:1;1")
            await svc.elect_master("c", "s", 1)
            blocker = asyncio.ensure_future(svc.get_replica_info("s"))  # occupies the scheduler
            register = asyncio.ensure_future(svc.register_broker("c", "s", 1, "10.0.0.1:1"))
            await asyncio.sleep(0)  # both queued, the heartbeat not yet taken
            svc.heartbeat("c", "s", 1, "10.0.0.1:1")
            await blocker
            return await register
        finally:
            await svc.stop()

    res = asyncio.run(main())
    assert res["header"]["masterBrokerId"] == 1  # the heartbeat sent while it queued counts


def test_a_request_naming_another_cluster_than_its_sets_is_refused_as_in_the_new_architecture():
    """docs/architectures.md: both architectures answer alike; a set belongs to the cluster it was created in."""
    async def main():
        svc, node = _service()
        svc.start()
        try:
            await svc.apply_broker_id("c", "s", 1, "10.0.0.1:1;1")
            before = list(node.ops)
            answers = [await svc.register_broker("other", "s", 1, "10.0.0.9:1"),
                       await svc.apply_broker_id("other", "s", 2, "10.0.0.2:1;2"),
                       await svc.get_next_broker_id("other", "s"),
                       await svc.elect_master("other", "s", 1),
                       await svc.propose_election("other", "s", 0, []),
                       await svc.clean_broker_data("other", "s", [1], True)]
            return answers, node.ops[len(before):]
        finally:
            await svc.stop()

    answers, ops = asyncio.run(main())
    assert all(a["code"] == 2005 and "not in cluster 'other'" in a["remark"] for a in answers), answers
    assert ops == []  # nothing reached the log
