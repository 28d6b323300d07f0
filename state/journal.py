"""Recent applied events by Raft index, for publishers that resume from an index.

Every node applies every entry, so every node can publish; only the leader does
(the Kafka events topic, the Delta events table). A publisher that becomes leader
asks `since(last_published_index)`. The journal holds events in memory from its
`floor` (the state it started from: a restored snapshot, or 0) onwards, bounded
by `capacity`; asking for anything older raises `JournalGap`, and the publisher
must then fall back to state (a resync) instead of inventing history.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections import deque
from typing import Any

import msgspec

from .machine import ControllerStateMachine
from .results import Event
from .views import BrokerSetView, public


class JournalEntry(msgspec.Struct, frozen=True, gc=False):
    """One applied event, as the journal's readers (Kafka events, the Delta tier, watchers) see it.

    Not tracked by the cyclic garbage collector (`gc=False`: it holds only strings, numbers, an
    event dict and an immutable view, so it can be in no reference cycle): the journal holds up to
    200,000 of them, and a full collection walking them all was a pause of hundreds of ms.
    """

    index: int  # Raft index of the command that produced the event
    term: int  # Raft term of that entry
    ts: int  # the proposer's clock (ms) carried by the command; 0 if the command had none
    event: Event  # the state machine's event (RocketMQ event type and fields)
    cluster: str | None  # the broker set's cluster, when known
    state: BrokerSetView | None  # the broker set right after the event; None when the set was removed

    def public_state(self) -> dict[str, Any] | None:
        """`state` in its wire form (Kafka events records, the Delta events table)."""
        return public(self.state)


def entry_for(sm: ControllerStateMachine, index: int, term: int, event: Event) -> JournalEntry:
    """The entry of an event `sm` has just applied: stamped with the command's clock, the set as it is now."""
    state = sm.view(event.get("brokerName") or "")
    cluster = state.cluster_name if state is not None else event.get("clusterName")
    return JournalEntry(index, term, sm.apply_time_ms, event, cluster, state)


class JournalGap(LookupError):
    """Events after `index` are no longer (or never were) held in memory."""

    def __init__(self, index: int, first_available: int) -> None:
        super().__init__(f"events after index {index} are not in the journal; it starts after {first_available}")
        self.index = index
        self.first_available = first_available


class EventJournal:
    def __init__(self, capacity: int = 200_000, floor: int = 0) -> None:
        self.capacity = capacity
        self._entries: deque[JournalEntry] = deque()
        self._indexes: deque[int] = deque()
        self.floor = floor  # every event with index > floor is (or was) held
        self.last_applied = floor  # newest applied index the journal heard about, event or not
        self._changed: asyncio.Event | None = None

    def reset(self, floor: int) -> None:
        """The state machine was replaced by a snapshot at `floor`: older events cannot be produced here."""
        self._entries.clear()
        self._indexes.clear()
        self.floor = self.last_applied = floor
        self._notify()

    def append(self, entry: JournalEntry) -> None:
        entries = self._entries
        entries.append(entry)
        self._indexes.append(entry.index)
        if entry.index > self.last_applied:
            self.last_applied = entry.index
        while len(entries) > self.capacity:
            self.floor = entries.popleft().index
            self._indexes.popleft()
        if self._changed is not None:
            self._changed.set()

    def advance(self, applied: int) -> None:
        """Entries up to `applied` are applied (most produce no event)."""
        if applied > self.last_applied:
            self.last_applied = applied
            self._notify()

    def since(self, index: int, limit: int = 10_000) -> list[JournalEntry]:
        """Events with index > `index`, oldest first, at most `limit`; JournalGap if some are gone."""
        if index < self.floor:
            raise JournalGap(index, self.floor)
        start = bisect.bisect_right(self._indexes, index)
        return [self._entries[i] for i in range(start, min(len(self._entries), start + limit))]

    def __len__(self) -> int:
        return len(self._entries)

    async def wait(self, timeout: float) -> None:
        """Wait until something is appended or advanced (or `timeout` passes)."""
        if self._changed is None:
            self._changed = asyncio.Event()
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
