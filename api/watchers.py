"""Applied events, for whoever follows them: the journal (publishers) and the role-change watchers (SSE).

The state machine reports every event it applies (`on_event`); this piece is their one owner
on a node. It keeps the event journal by Raft index (the Kafka events publisher and the Delta
tier read it) and fans ElectMaster/AlterSyncStateSet/CleanBrokerData out to NOTIFY_BROKER_ROLE_CHANGED watchers.

A watcher that reconnects, to this node or another, names the last event it received (its Raft
index, the same on every node) and gets what it missed (`resume`): from the set's recent role
changes kept here, or, when this node no longer holds that far back, the set as it is now (a
`resync`). So a role change is never lost to a reconnect; a watcher too slow for its queue is ended
rather than skipped over, and a snapshot installed under open watchers sends each of them a resync.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from electra.consensus.node import RaftNode
from electra.state.journal import EventJournal, JournalEntry, entry_for
from electra.state.machine import ControllerStateMachine
from electra.state.results import Event
from electra.state.views import NO_SET_ROLE_FIELDS

log = logging.getLogger("electra.api.watchers")

# Role changes: an election, a sync-state-set change, and a clean of broker data (it can remove the
# master, fencing it with a new master epoch, drop sync-state-set members, or remove the whole set).
WATCHED_EVENTS = ("ElectMaster", "AlterSyncStateSet", "CleanBrokerData")
OVERFLOW = "overflow"  # put in a watcher's queue in place of the events it could not take
RESYNC = "resync"      # put in every watcher's queue when a snapshot replaced the state
RECENT_PER_SET = 128   # role changes kept per set for watchers that resume (older ones: a resync)
TRIMMED_SETS = 100_000  # sets whose dropped changes are remembered by name (beyond: one index for all)
CATCH_UP_S = 2.0       # how long a resume from an index this node has not applied waits for it


class WatchQueue(asyncio.Queue):
    """A watcher's pending role changes: dicts; `None` (the node is stopping) or `OVERFLOW` (it fell behind)
    end its stream; `RESYNC` (a snapshot replaced the state) has it send the set as it is now."""


class NotApplied(Exception):
    """A resume from an index this node has not applied (it is behind): another node may serve it."""


def _payload(e: JournalEntry) -> dict:
    role = e.state.role_fields() if e.state is not None else NO_SET_ROLE_FIELDS
    return {"index": e.index, **e.event, **role}


class Watchers:
    def __init__(self, node: RaftNode, sm: ControllerStateMachine, *, queue_size: int = 1000) -> None:
        self.node = node
        self.sm = sm
        self.queue_size = queue_size
        self.journal = EventJournal(floor=sm.applied)
        self._queues: dict[str, set[asyncio.Queue]] = {}
        # Each set's newest role changes (shared with the journal), for watchers that resume. What is no
        # longer held is told by index: the state the node started or restored from (`_floor`), the
        # newest change of a set that was dropped (`_trimmed`: its deque was full, or the set was
        # removed), and, past TRIMMED_SETS names, one index for every set (`_forgot`).
        self._recent: dict[str, deque[JournalEntry]] = {}
        self._trimmed: dict[str, int] = {}
        self._floor = sm.applied
        self._forgot = 0
        self.closed = False
        sm.on_event(self._on_event)
        sm.on_restore(self._restored)

    def subscribe(self, name: str) -> WatchQueue:
        """A queue of the set's role changes from now on (see `WatchQueue`)."""
        q = WatchQueue(maxsize=self.queue_size)
        if self.closed:
            q.put_nowait(None)
        self._queues.setdefault(name, set()).add(q)
        return q

    def close(self) -> None:
        """The node is stopping: end every watch stream, so its HTTP server can stop and the watchers
        reconnect to another node (they resume there; queued events are dropped)."""
        self.closed = True
        self._replace_queued(None)

    def unsubscribe(self, name: str, q: asyncio.Queue) -> None:
        qs = self._queues.get(name)
        if qs is not None:
            qs.discard(q)
            if not qs:
                del self._queues[name]

    async def resume(self, name: str, after: int,
                     cluster_ok: Callable[[str], bool] | None = None) -> list[tuple[str, dict]]:
        """What a watcher that last received event `after` gets first: `("role-change", event)`s it missed,
        oldest first, or one `("resync", the set now)` when this node no longer holds them.

        Subscribe first: what is applied between the two is in both, and the stream sends it once. An
        index this node has not applied is waited for (`CATCH_UP_S`): it may be just behind the node the
        watcher left. Past that, a follower raises NotApplied (the watcher tries another node), while a
        leader that has committed in its term, and so holds every committed index, knows the index is
        not one of this cluster's history (a rebuilt cluster, a client's bug) and answers a resync.
        `cluster_ok`: a credential's cluster scope; changes of the set while it was in another cluster
        (since removed and created again) are not for it.
        """
        deadline = time.monotonic() + CATCH_UP_S
        while after > self.node.applied and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if after > self.node.applied:
            core = self.node.core
            if not (self.node.is_leader and core is not None and core.committed_in_term()):
                raise NotApplied(f"this node has applied up to index {self.node.applied}, not {after}")
            return [(RESYNC, self.current(name))]
        if after < max(self._floor, self._forgot, self._trimmed.get(name, 0)):
            return [(RESYNC, self.current(name))]
        return [("role-change", _payload(e)) for e in self._recent.get(name, ())
                if e.index > after and (cluster_ok is None or e.cluster is None or cluster_ok(e.cluster))]

    def current(self, name: str) -> dict:
        """The set's role as applied here now, at the node's applied index (a resync; the Raft index, which
        counts the entries that carry no command too, as `/v1/admin/metadata` reports it)."""
        view = self.sm.view(name)
        role = view.role_fields() if view is not None else NO_SET_ROLE_FIELDS
        return {"index": self.node.applied, "brokerName": name, **role}

    def _restored(self, index: int) -> None:
        """A snapshot replaced the state: no change before it can be told, and every open watcher is sent
        the set as the snapshot has it (it missed what the snapshot covers)."""
        self.journal.reset(index)
        self._recent.clear()
        self._trimmed.clear()
        self._floor = index
        self._replace_queued(RESYNC)

    def _replace_queued(self, marker: str | None) -> None:
        for qs in self._queues.values():
            for q in qs:
                while not q.empty():
                    q.get_nowait()
                q.put_nowait(marker)

    def _trim(self, name: str, index: int) -> None:
        self._trimmed[name] = index
        if len(self._trimmed) > TRIMMED_SETS:
            self._trimmed.clear()
            self._forgot = index

    def _on_event(self, index: int, ev: Event) -> None:
        term = self.node.core.term_at(index) if self.node.core else None
        entry = entry_for(self.sm, index, term or 0, ev)
        self.journal.append(entry)
        name = ev.get("brokerName") or ""
        if ev.get("type") not in WATCHED_EVENTS:
            return
        if entry.state is None:  # the set is gone: its changes are not kept (a resume gets a resync)
            self._recent.pop(name, None)
            self._trim(name, index)
        else:
            recent = self._recent.get(name)
            if recent is None:
                recent = self._recent[name] = deque()
            elif len(recent) >= RECENT_PER_SET:
                self._trim(name, recent.popleft().index)
            recent.append(entry)
        qs = self._queues.get(name)
        if not qs:
            return
        payload = _payload(entry)
        for q in list(qs):
            try:
                q.put_nowait(payload)
            except asyncio.QueueFull:
                # Not a silent gap: the stream ends, and the watcher resumes from the last event it received.
                log.warning("a watcher of %s fell %d events behind; ending its stream", name, q.qsize())
                while not q.empty():
                    q.get_nowait()
                q.put_nowait(OVERFLOW)
                qs.discard(q)
