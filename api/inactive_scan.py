"""RocketMQ's scanInactiveMasterAndTriggerReelect: on the leader, from this node's heartbeat table.

Every `interval_s` the leader forgets brokers silent for a minute past their timeout and asks
for a controller-triggered election (broker id -1) in every set whose master is not alive
while some replica is. Off (interval 0) when the streaming job detects inactive masters.

The elections of one scan run `in_flight` at a time. RocketMQ waits for each before the next
(the legacy architecture keeps that: 1); the new one proposes them together (64) so the engine
commits them in a few group-commit batches: when many masters die at once (a rack, a storm),
the last set's election no longer waits for every other set's Raft round trip in turn.

When a scan runs differs too. RocketMQ scans at a fixed rate, so a master is re-elected up to one
period (5 s) after its heartbeat timed out (the legacy architecture keeps that). The new one
(`at_master_expiry`) also wakes at the moment the first master alive at the last scan would time
out, and sooner when a master's heartbeat shortens its timeout (`heartbeatTimeoutMillis` is the
broker's to choose) or a new master would time out first: otherwise heartbeats only move that moment
later, so no master can die unseen before it, and a dead master's set is re-elected as soon as its
timeout has passed. The fixed period stays as the upper bound (a set with no live replica yet).
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

MIN_WAIT_S = 0.05  # between two scans at least: heartbeats at a millisecond's distance share one

ElectMaster = Callable[[str, str, int], Awaitable[dict]]


class InactiveMasterScan:
    def __init__(self, node: RaftNode, sm: ControllerStateMachine, liveness: LivenessTable,
                 elect_master: ElectMaster, interval_s: float, now_ms: Callable[[], int], in_flight: int = 1,
                 at_master_expiry: bool = False) -> None:
        self.node = node
        self.sm = sm
        self.liveness = liveness
        self.elect_master = elect_master
        self.interval_s = interval_s
        self.now_ms = now_ms
        self.in_flight = max(1, in_flight)
        self.at_master_expiry = at_master_expiry
        self._task: asyncio.Task | None = None
        self._slots = asyncio.Semaphore(self.in_flight)  # elections in flight, over every scan running
        self._electing: set[str] = set()  # sets whose election a scan has proposed and not yet seen answered
        self._scans: set[asyncio.Task] = set()
        self._wake_at_ms: int | None = None  # when the sleeping scan loop wakes next (None: not sleeping)
        self._sooner = asyncio.Event()  # a master's deadline moved before that: wake and look again
        if at_master_expiry:
            liveness.deadline_listeners.append(self._deadline_moved)
            sm.on_event(self._master_elected)

    def start(self) -> None:
        if self.interval_s > 0:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._scans) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        """RocketMQ's scan waits for its elections before the next period; the new one does not: a set whose
        master times out while another scan's elections are still in flight is not kept waiting for them."""
        while True:
            try:
                wait_s = self.next_wait_s()
            except Exception:
                log.exception("inactive-master scan: cannot tell when the next master times out; scanning in "
                              "%.1fs", self.interval_s)
                wait_s = self.interval_s
            if await self._sleep_unless_sooner(wait_s):
                continue  # a master's deadline moved earlier: the next wait is computed again
            if self.node.role != Role.LEADER:
                continue
            if self.at_master_expiry:
                scan = asyncio.create_task(self._scan_logged())
                self._scans.add(scan)
                scan.add_done_callback(self._scans.discard)
            else:
                await self._scan_logged()

    async def _sleep_unless_sooner(self, wait_s: float) -> bool:
        """Sleep `wait_s`; True if a master's deadline moved before the end of it (`_deadline_moved`)."""
        if not self.at_master_expiry:
            await asyncio.sleep(wait_s)
            return False
        self._sooner.clear()
        self._wake_at_ms = self.now_ms() + int(wait_s * 1000)
        try:
            async with asyncio.timeout(wait_s):
                await self._sooner.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self._wake_at_ms = None

    def _deadline_moved(self, cluster: str, name: str, broker_id: int, deadline_ms: int) -> None:
        """A broker's heartbeat deadline moved earlier (LivenessTable.deadline_listeners): wake the scan loop if
        the broker is its set's master and would now time out before the loop wakes."""
        wake = self._wake_at_ms
        if wake is None or deadline_ms + 1 >= wake:
            return
        bs = self.sm.sets.get(name)
        if bs is not None and bs.master_id == broker_id and bs.cluster == cluster:
            self._sooner.set()

    def _master_elected(self, index: int, ev: dict) -> None:
        """A set got a new master while the scan sleeps: wake it if that master times out before it wakes
        (the scan's wake-up is the first deadline among the masters it knew)."""
        if self._wake_at_ms is None or ev.get("type") != "ElectMaster" or not ev.get("newMasterBrokerId"):
            return
        bs = self.sm.sets.get(ev.get("brokerName", ""))
        info = self.liveness.group(bs.cluster, bs.name).get(bs.master_id) if bs is not None else None
        if info is not None and info.last_update_ms + info.timeout_ms + 1 < self._wake_at_ms:
            self._sooner.set()

    async def _scan_logged(self) -> None:
        """One scan whose failure is logged and ends only that scan: the periodic scan is a failover path, and
        an exception in its loop ended it for good, unseen (`stop()` gathers the task's error away)."""
        try:
            await self.scan_once()
        except Exception:
            log.exception("inactive-master scan failed; the next one runs on schedule")

    def next_wait_s(self) -> float:
        """Seconds until the next scan: the fixed period, or sooner when a live master times out before it."""
        if not self.at_master_expiry:
            return self.interval_s
        expiry = self.first_master_expiry_ms()
        if expiry is None:
            return self.interval_s
        return min(self.interval_s, max(MIN_WAIT_S, (expiry - self.now_ms()) / 1000))

    def first_master_expiry_ms(self) -> int | None:
        """The first moment (ms) a master alive now stops being alive, if no heartbeat comes: None if none is."""
        now = self.now_ms()
        first = None
        for name, bs in self.sm.sets.items():
            if bs.master_id is None:
                continue
            info = self.liveness.group(bs.cluster, name).get(bs.master_id)
            if info is None or not info.alive_at(now):
                continue  # already dead: the scan saw it (or its set has no live replica to elect)
            dead_at = info.last_update_ms + info.timeout_ms + 1  # alive_at holds up to the timeout inclusive
            if first is None or dead_at < first:
                first = dead_at
        return first

    async def scan_once(self) -> None:
        self.liveness.expire(self.now_ms() - 60_000)  # forget brokers silent for a minute past timeout

        async def elect(name: str) -> None:
            bs = self.sm.sets.get(name)
            if bs is None:
                return
            try:
                async with self._slots:
                    res = await self.elect_master(bs.cluster, name, C.CONTROLLER_TRIGGER)
                log.info("controller-triggered election in %s: code %d master %s", name, res["code"],
                         res["header"].get("masterBrokerId"))
            except Exception as exc:  # keep electing in the other sets
                log.warning("controller-triggered election in %s failed: %r", name, exc)
            finally:
                self._electing.discard(name)

        names = [n for n in self.sm.sets_needing_election(self.liveness.group, self.now_ms())
                 if n not in self._electing]  # an earlier scan's election there is still in flight
        self._electing.update(names)
        await asyncio.gather(*(elect(n) for n in names))
