"""The leader's view of each follower: how far it matches, what to send next, what is in flight.

Modelled on etcd's tracker package: a follower is probed one AppendEntries at a time
until the leader knows where their logs agree (`PROBE`), then gets optimistic
pipelining bounded by an inflight window (`REPLICATE`), or waits for an
InstallSnapshot transfer when what it needs is compacted away (`SNAPSHOT`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from enum import IntEnum


class ProgressState(IntEnum):
    PROBE = 0  # one AppendEntries at a time until the match point is found
    REPLICATE = 1  # optimistic pipelining within the inflight window
    SNAPSHOT = 2  # the entries it needs are compacted: an InstallSnapshot transfer is under way


class Inflights:
    """The flow-control window: the last index carried by each unacknowledged AppendEntries."""

    __slots__ = ("_lasts", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lasts: deque[int] = deque()

    def __len__(self) -> int:
        return len(self._lasts)

    def full(self) -> bool:
        return len(self._lasts) >= self.capacity

    def add(self, last: int) -> None:
        self._lasts.append(last)

    def free_to(self, index: int) -> None:
        """The follower acknowledged everything up to `index`: those messages left the window."""
        lasts = self._lasts
        while lasts and lasts[0] <= index:
            lasts.popleft()

    def clear(self) -> None:
        self._lasts.clear()


class Progress:
    """One follower, as its leader sees it."""

    __slots__ = ("match", "next", "state", "inflight", "probe_sent", "recent_active", "heard_at", "match_at_hb",
                 "sent_commit", "acked_round", "pending_snapshot")

    def __init__(self, next_index: int, max_inflight: int, heard_at: float = 0.0) -> None:
        self.match = 0
        self.next = next_index
        self.state = ProgressState.PROBE
        self.inflight = Inflights(max_inflight)
        self.probe_sent = False
        self.recent_active = False  # heard from since the last CheckQuorum
        # when (the leader's time, in ticks) the newest heartbeat round it answered was sent (`RaftCore.quorum_silent`)
        self.heard_at = heard_at
        self.match_at_hb = -1  # match at the previous heartbeat answer: no change means lost appends
        self.sent_commit = 0  # highest commit index this follower has been told
        self.acked_round = 0  # newest heartbeat round (read/lease confirmation) it answered
        self.pending_snapshot = 0  # snapshot index being installed on it

    def become_probe(self) -> None:
        self.state = ProgressState.PROBE
        self.next = self.match + 1
        self.inflight.clear()
        self.probe_sent = False

    def become_replicate(self) -> None:
        self.state = ProgressState.REPLICATE
        self.next = self.match + 1
        self.inflight.clear()

    def become_snapshot(self, snap_index: int) -> None:
        self.state = ProgressState.SNAPSHOT
        self.pending_snapshot = snap_index
        self.inflight.clear()

    def paused(self) -> bool:
        """May no AppendEntries go to it now? (a transfer, an unanswered probe, a full window)"""
        if self.state == ProgressState.SNAPSHOT:
            return True
        if self.state == ProgressState.PROBE:
            return self.probe_sent
        return self.inflight.full()

    def sent(self, prev: int, count: int) -> None:
        """An AppendEntries of `count` entries after `prev` went out."""
        if self.state == ProgressState.REPLICATE:
            if count:
                self.next = prev + count + 1
                self.inflight.add(self.next - 1)
        else:
            self.probe_sent = True

    def acked(self, index: int) -> bool:
        """It acknowledged entries up to `index`; True if that moved its match forward."""
        if index <= self.match:
            return False
        self.match = index
        if self.next <= index:
            self.next = index + 1
        if self.state == ProgressState.PROBE or (self.state == ProgressState.SNAPSHOT
                                                 and index >= self.pending_snapshot):
            self.become_replicate()
        self.inflight.free_to(index)
        return True


def quorum_value(values: Iterable[int], quorum: int) -> int:
    """The highest value that at least `quorum` of `values` have reached (a match, a round)."""
    ordered = sorted(values, reverse=True)
    return ordered[quorum - 1]
