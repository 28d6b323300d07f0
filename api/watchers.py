"""Applied events, for whoever follows them: the journal (publishers) and the role-change watchers (SSE).

The state machine reports every event it applies (`on_event`); this piece is their one owner
on a node. It keeps the event journal by Raft index (the Kafka events publisher and the Delta
tier read it) and fans ElectMaster/AlterSyncStateSet out to NOTIFY_BROKER_ROLE_CHANGED watchers.
"""

from __future__ import annotations

import asyncio
import logging

from electra.consensus.node import RaftNode
from electra.state.journal import EventJournal, entry_for
from electra.state.machine import ControllerStateMachine
from electra.state.results import Event
from electra.state.views import NO_SET_ROLE_FIELDS

log = logging.getLogger("electra.api.watchers")


class Watchers:
    def __init__(self, node: RaftNode, sm: ControllerStateMachine, *, queue_size: int = 1000) -> None:
        self.node = node
        self.sm = sm
        self.queue_size = queue_size
        self.journal = EventJournal(floor=sm.applied)
        self._queues: dict[str, set[asyncio.Queue]] = {}
        self.closed = False
        sm.on_event(self._on_event)
        sm.on_restore(self.journal.reset)

    def subscribe(self, name: str) -> asyncio.Queue:
        """A queue of the set's role changes; `None` in it ends the stream (the node is stopping)."""
        q: asyncio.Queue = asyncio.Queue(maxsize=self.queue_size)
        if self.closed:
            q.put_nowait(None)
        self._queues.setdefault(name, set()).add(q)
        return q

    def close(self) -> None:
        """The node is stopping: end every watch stream, so its HTTP server can stop and the watchers
        reconnect to another node (they re-read the state there; queued events are dropped)."""
        self.closed = True
        for qs in self._queues.values():
            for q in qs:
                while not q.empty():
                    q.get_nowait()
                q.put_nowait(None)

    def unsubscribe(self, name: str, q: asyncio.Queue) -> None:
        self._queues.get(name, set()).discard(q)

    def _on_event(self, index: int, ev: Event) -> None:
        term = self.node.core.term_at(index) if self.node.core else None
        entry = entry_for(self.sm, index, term or 0, ev)
        self.journal.append(entry)
        if ev.get("type") not in ("ElectMaster", "AlterSyncStateSet"):
            return
        role = entry.state.role_fields() if entry.state is not None else NO_SET_ROLE_FIELDS
        for q in list(self._queues.get(ev["brokerName"], ())):
            payload = {"index": index, **ev, **role}
            try:
                q.put_nowait(payload)
            except asyncio.QueueFull:
                log.warning("watcher of %s is too slow; dropping an event", ev["brokerName"])
