"""The legacy architecture: RocketMQ 5's DLedgerController request design on Electra's Raft engine.

For comparison only (`electra node --architecture legacy`, `electra report performance`), never for
production: it exists so that the performance report measures the *architecture* (one queue, one
request at a time, reads through the log) with everything else equal: the same Raft engine, state
machine, HTTP API and answers (docs/architectures.md).

As in RocketMQ 5's DLedger controller (reference §2.1):

* every state-machine request, read or write, is an event in ONE bounded `EventQueue` (capacity
  1024; a caller waits at most 5 s to enqueue, then gets SYSTEM_BUSY as a 503);
* ONE scheduler task takes one event at a time: it reads the state and this node's own heartbeat
  table, builds the command, proposes it and waits until it is applied before taking the next one;
* a read is a log entry too (`READ_EVENT`, RocketMQ's `isProcessReadEvent=true`): the scheduler
  appends it, waits for its apply and then reads the state;
* a caller waits at most 5 s for its event's result (then 504, outcome unknown: RocketMQ's
  `future.get(5, SECONDS)` → SYSTEM_ERROR);
* heartbeats go straight to this node's liveness table (the heartbeat manager, not the queue), and
  the leader scans for inactive masters every 5 s, queueing their elections like any request.

No Kafka, no Spark: liveness is leader-local by design. Followers answer every queued request with
CONTROLLER_NOT_LEADER (a redirect), as RocketMQ's `appendEvent` does.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from electra.consensus.core import Role
from electra.consensus.errors import NotLeader, ProposalDropped, ProposalTimeout
from electra.state import commands as C
from electra.state.liveness import BrokerLiveInfo
from electra.state.machine import ControllerStateMachine
from electra.state.results import Result

from .service import ControllerService

log = logging.getLogger("electra.api.legacy")

ARCHITECTURES = ("new", "legacy")  # `electra node --architecture`: Electra's own, or RocketMQ 5's (this module)
EVENT_QUEUE_CAPACITY = 1024  # DLedgerController's EventQueue (hard-coded there)
ENQUEUE_WAIT_S = 5.0  # its offer(…, 5 s)
RESULT_WAIT_S = 5.0  # ControllerRequestProcessor's future.get(5, SECONDS)

Work = Callable[[], Awaitable[dict]]


class LegacyControllerService(ControllerService):
    """`ControllerService`'s request methods, served the RocketMQ 5 way: one queue, one request at a time."""

    architecture = "legacy"
    scan_elections_in_flight = 1  # RocketMQ's triggerElectMaster waits for each election before the next
    scan_at_fixed_rate = True  # RocketMQ's scan runs every 5 s, not when a master's heartbeat times out

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.events: asyncio.Queue[tuple[Work, asyncio.Future]] = asyncio.Queue(maxsize=EVENT_QUEUE_CAPACITY)
        self.events_processed = 0
        self._scheduler: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._scheduler = asyncio.create_task(self._schedule())

    async def stop(self) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel()
            await asyncio.gather(self._scheduler, return_exceptions=True)
        while not self.events.empty():  # nobody will run these any more
            _, fut = self.events.get_nowait()
            if not fut.done():
                fut.set_exception(ProposalDropped("the controller is stopping"))

    # ------------------------------------------------------------------ the EventQueue and its scheduler
    async def _append_event(self, work: Work) -> dict:
        """DLedgerController.appendEvent: refuse on a follower, queue, wait for the scheduler's result."""
        if self.node.role != Role.LEADER:
            raise NotLeader(self.node.leader_id, self.leader_address())
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(ENQUEUE_WAIT_S):
                await self.events.put((work, fut))
        except TimeoutError:
            raise ProposalDropped(f"the event queue is full ({EVENT_QUEUE_CAPACITY} requests waiting)") from None
        try:
            async with asyncio.timeout(RESULT_WAIT_S):  # cancels `fut` on timeout: the scheduler skips it
                return await fut
        except TimeoutError:
            raise ProposalTimeout(f"no result within {RESULT_WAIT_S:.0f}s from the event queue") from None

    async def _schedule(self) -> None:
        """The EventScheduler thread: one event at a time, each proposed and applied before the next."""
        while True:
            work, fut = await self.events.get()
            if fut.done():  # its caller gave up (timeout, disconnect)
                continue
            try:
                if self.node.role != Role.LEADER:
                    raise NotLeader(self.node.leader_id, self.leader_address())
                res = await work()
            except Exception as exc:  # NotLeader, ProposalTimeout, ...: the caller maps it
                if not fut.done():
                    fut.set_exception(exc)
            else:
                if not fut.done():
                    fut.set_result(res)
            self.events_processed += 1

    def _write_event(self, build: Callable[[], bytes]) -> Work:
        """A write: the command is built when the scheduler takes it, from the state and heartbeats of then."""

        async def work() -> dict:
            res = await self.node.propose(build())
            return res.to_response()

        return work

    def _read_event(self, read: Callable[[ControllerStateMachine], Result]) -> Work:
        """A read through the log: append a READ_EVENT, wait for its apply, then read the state."""

        async def work() -> dict:
            await self.node.propose(C.read_event())
            return read(self.sm).to_response()

        return work

    # ------------------------------------------------------------------ requests (ControllerService's interface)
    async def get_next_broker_id(self, cluster: str, name: str) -> dict:
        if (refusal := self.other_cluster(cluster, name)) is not None:
            return refusal
        return await self._append_event(self._read_event(lambda sm: sm.get_next_broker_id(cluster, name)))

    async def get_replica_info(self, name: str, lease: bool = False) -> dict:
        # RocketMQ 5's controller has no leases: every read goes through its event queue.
        return await self._append_event(self._read_event(lambda sm: sm.get_replica_info(name)))

    async def apply_broker_id(self, cluster: str, name: str, broker_id: int, check_code: str) -> dict:
        if (refusal := self.other_cluster(cluster, name)) is not None:
            return refusal
        return await self._append_event(self._write_event(
            lambda: C.apply_broker_id(cluster, name, broker_id, check_code, self.now_ms())))

    async def register_broker(self, cluster: str, name: str, broker_id: int, addr: str) -> dict:
        if (refusal := self.other_cluster(cluster, name)) is not None:
            return refusal
        return await self._append_event(self._write_event(
            lambda: C.register_broker(cluster, name, broker_id, addr, self.now_ms(),
                                      self.liveness.group(cluster, name))))

    async def elect_master(self, cluster: str, name: str, broker_id: int, designate: bool = False,
                           unclean: bool = False) -> dict:
        if (refusal := self.other_cluster(cluster or None, name)) is not None:
            return refusal

        def build() -> bytes:
            live = self.set_liveness(name, cluster)
            return C.elect_master(cluster, name, broker_id, self.now_ms(), live, designate=designate,
                                  unclean=self.unclean or unclean)

        res = await self._append_event(self._write_event(build))
        self._count_election(res)
        return res

    async def propose_election(self, cluster: str, name: str, expected_master_epoch: int,
                               live: list[BrokerLiveInfo], judged_at_ms: int | None = None) -> dict:
        if (refusal := self.other_cluster(cluster, name)) is not None:
            return refusal

        def build() -> bytes:
            now = self.now_ms() if judged_at_ms is None else min(judged_at_ms, self.now_ms())
            return C.elect_master(cluster, name, C.CONTROLLER_TRIGGER, now, live, unclean=self.unclean,
                                  expected_master_epoch=expected_master_epoch)

        res = await self._append_event(self._write_event(build))
        self._count_election(res)
        return res

    async def alter_sync_state_set(self, name: str, master_id: int, master_epoch: int, new_set: list[int],
                                   sync_state_set_epoch: int) -> dict:
        return await self._append_event(self._write_event(
            lambda: C.alter_sync_state_set(name, master_id, master_epoch, new_set, sync_state_set_epoch,
                                           self.now_ms(), self.set_liveness(name))))

    async def clean_broker_data(self, cluster: str | None, name: str, ids: list[int] | None,
                                clean_living: bool) -> dict:
        if (refusal := self.other_cluster(cluster or None, name)) is not None:
            return refusal

        def build() -> bytes:
            live = self.set_liveness(name, cluster)
            return C.clean_broker_data(cluster, name, ids, clean_living, self.now_ms(), live)

        return await self._append_event(self._write_event(build))

    def status(self) -> dict:
        return {"architecture": self.architecture, "event_queue": self.events.qsize(),
                "events_processed": self.events_processed}
