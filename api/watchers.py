"""Applied events, for whoever follows them: the journal (publishers) and the role-change watchers (SSE).

The state machine reports every event it applies (`on_event`); this piece is their one owner
on a node. It keeps the event journal by Raft index (the Kafka events publisher and the Delta
tier read it) and fans ElectMaster/AlterSyncStateSet out to NOTIFY_BROKER_ROLE_CHANGED watchers.
"""

from __future__ import annotations

import asyncio
import logging

from electra.consensus.node import RaftNode
from electra.state.journal import EventJournal, JournalEntry, set_state
from electra.state.machine import ControllerStateMachine

log = logging.getLogger("electra.api.watchers")


class Watchers:
    def __init__(self, node: RaftNode, sm: ControllerStateMachine, *, queue_size: int = 1000) -> None:
        self.node = node
        self.sm = sm
        self.queue_size = queue_size
        self.journal = EventJournal(floor=sm.applied)
        self._queues: dict[str, set[asyncio.Queue]] = {}
        sm.on_event(self._on_event)
        sm.on_restore(self.journal.reset)

    def subscribe(self, name: str) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue(maxsize=self.queue_size)
        self._queues.setdefault(name, set()).add(q)
        return q

    def unsubscribe(self, name: str, q: asyncio.Queue) -> None:
        self._queues.get(name, set()).discard(q)

    def _on_event(self, index: int, ev: dict) -> None:
        bs = self.sm.sets.get(ev.get("brokerName", ""))
        term = self.node.core.term_at(index) if self.node.core else None
        self.journal.append(JournalEntry(index, term or 0, self.sm.apply_time_ms, ev,
                                         bs.cluster if bs else ev.get("clusterName"), set_state(bs)))
        if ev.get("type") not in ("ElectMaster", "AlterSyncStateSet"):
            return
        for q in list(self._queues.get(ev["brokerName"], ())):
            payload = {"index": index, **ev, "masterBrokerId": bs.master_id if bs else None,
                       "masterAddress": bs.address(bs.master_id) if bs else None,
                       "masterEpoch": bs.master_epoch if bs else None,
                       "syncStateSet": sorted(bs.sync_state_set) if bs else [],
                       "syncStateSetEpoch": bs.sync_state_set_epoch if bs else None}
            try:
                q.put_nowait(payload)
            except asyncio.QueueFull:
                log.warning("watcher of %s is too slow; dropping an event", ev["brokerName"])
