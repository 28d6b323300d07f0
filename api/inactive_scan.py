"""RocketMQ's scanInactiveMasterAndTriggerReelect: on the leader, from this node's heartbeat table.

Every `interval_s` the leader forgets brokers silent for a minute past their timeout and asks
for a controller-triggered election (broker id -1) in every set whose master is not alive
while some replica is. Off (interval 0) when the streaming job detects inactive masters.

The elections of one scan run `in_flight` at a time. RocketMQ waits for each before the next
(the legacy architecture keeps that: 1); the new one proposes them together (64) so the engine
commits them in a few group-commit batches: when many masters die at once (a rack, a storm),
the last set's election no longer waits for every other set's Raft round trip in turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from electra.consensus.core import Role
from electra.consensus.node import RaftNode
from electra.state import commands as C
from electra.state.liveness import LivenessTable
from electra.state.machine import ControllerStateMachine

log = logging.getLogger("electra.api.service")

ElectMaster = Callable[[str, str, int], Awaitable[dict]]


class InactiveMasterScan:
    def __init__(self, node: RaftNode, sm: ControllerStateMachine, liveness: LivenessTable,
                 elect_master: ElectMaster, interval_s: float, now_ms: Callable[[], int], in_flight: int = 1) -> None:
        self.node = node
        self.sm = sm
        self.liveness = liveness
        self.elect_master = elect_master
        self.interval_s = interval_s
        self.now_ms = now_ms
        self.in_flight = max(1, in_flight)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.interval_s > 0:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if self.node.role != Role.LEADER:
                continue
            await self.scan_once()

    async def scan_once(self) -> None:
        self.liveness.expire(self.now_ms() - 60_000)  # forget brokers silent for a minute past timeout
        slots = asyncio.Semaphore(self.in_flight)

        async def elect(name: str) -> None:
            bs = self.sm.sets.get(name)
            if bs is None:
                return
            async with slots:
                try:
                    res = await self.elect_master(bs.cluster, name, C.CONTROLLER_TRIGGER)
                    log.info("controller-triggered election in %s: code %d master %s", name, res["code"],
                             res["header"].get("masterBrokerId"))
                except Exception as exc:  # keep electing in the other sets
                    log.warning("controller-triggered election in %s failed: %r", name, exc)

        await asyncio.gather(*(elect(n) for n in self.sm.sets_needing_election(self.liveness.group_by_name,
                                                                                self.now_ms())))
