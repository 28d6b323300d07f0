"""Applied events, for whoever follows them: the journal (publishers) and the role-change watchers (SSE).

The state machine reports every event it applies (`on_event`); this piece is their one owner
on a node. It keeps the event journal by Raft index (the Kafka events publisher and the Delta
tier read it) and fans ElectMaster/AlterSyncStateSet out to NOTIFY_BROKER_ROLE_CHANGED watchers.

A watcher that reconnects, to this node or another, names the last event it received (its Raft
index, the same on every node) and gets what it missed from the journal (`missed`), or, when the
journal no longer holds that far back, the set as it is now (`current`). So a role change is never
lost to a reconnect; a watcher too slow for its queue is ended rather than skipped over, and
resumes the same way.
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

WATCHED_EVENTS = ("ElectMaster", "AlterSyncStateSet")
OVERFLOW = "overflow"  # put in a watcher's queue in place of the events it could not take


class WatchQueue(asyncio.Queue):
    """A watcher's pending role changes: dicts; `None` (the node is stopping) or `OVERFLOW` (it fell behind)
    end its stream."""


def _payload(index: int, event: Event, role: dict) -> dict:
    return {"index": index, **event, **role}


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

    def subscribe(self, name: str) -> WatchQueue:
        """A queue of the set's role changes from now on (see `WatchQueue`)."""
        q = WatchQueue(maxsize=self.queue_size)
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
        qs = self._queues.get(name)
        if qs is not None:
            qs.discard(q)
            if not qs:
                del self._queues[name]

    def missed(self, name: str, after: int) -> list[dict]:
        """The set's role changes applied here after index `after`, oldest first, as the stream sends them.

        Raises JournalGap when this node's journal no longer holds (or never held) all of them: a
        snapshot was installed since, or more than its capacity of events came after. Nothing is
        returned past what this node has applied; a watcher resuming on a node behind the one it left
        gets the rest live.
        """
        out: list[dict] = []
        index = after
        while True:
            entries = self.journal.since(index)
            for e in entries:
                if e.event.get("type") in WATCHED_EVENTS and e.event.get("brokerName") == name:
                    role = e.state.role_fields() if e.state is not None else NO_SET_ROLE_FIELDS
                    out.append(_payload(e.index, e.event, role))
            if not entries or entries[-1].index == index:
                return out
            index = entries[-1].index

    def current(self, name: str) -> dict:
        """The set's role as applied here now, at the node's applied index (for a watcher that missed more
        than the journal holds)."""
        view = self.sm.view(name)
        role = view.role_fields() if view is not None else NO_SET_ROLE_FIELDS
        return {"index": self.journal.last_applied, "brokerName": name, **role}

    def _on_event(self, index: int, ev: Event) -> None:
        term = self.node.core.term_at(index) if self.node.core else None
        entry = entry_for(self.sm, index, term or 0, ev)
        self.journal.append(entry)
        if ev.get("type") not in ("ElectMaster", "AlterSyncStateSet"):
            return
        qs = self._queues.get(ev["brokerName"])
        if not qs:
            return
        payload = _payload(index, ev, entry.state.role_fields() if entry.state is not None else NO_SET_ROLE_FIELDS)
        for q in list(qs):
            try:
                q.put_nowait(payload)
            except asyncio.QueueFull:
                # Not a silent gap: the stream ends, and the watcher resumes from the last event it received.
                log.warning("a watcher of %s fell %d events behind; ending its stream", ev["brokerName"], q.qsize())
                while not q.empty():
                    q.get_nowait()
                q.put_nowait(OVERFLOW)
                qs.discard(q)
