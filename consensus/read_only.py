"""Linearizable reads without log entries: ReadIndex rounds, the leader lease, follower read batches.

As in etcd's read_only.go, a read is served at a *read index* (the leader's commit
index when the read arrived) once the leader has confirmed it still leads. Every
heartbeat broadcast is a numbered round; when a quorum has answered round `r`, every
read queued before `r` went out is confirmed, and, with leases on, the leader knows
that no other leader can exist until `lease_s` after `r` was sent (followers refuse
votes for an election timeout after hearing from it). A follower batches its reads:
one ReadIndex request per Ready, answered for all of them. The rules and their
assumptions are in docs/reads-and-snapshots.md.

This class holds the bookkeeping; `RaftCore` decides when rounds start and what is sent.
"""

from __future__ import annotations

from collections import deque

MAX_FOLLOWER_BATCHES = 1024  # unanswered batches a follower remembers (answers lost with their messages)


class ReadOnly:
    __slots__ = ("round", "confirmed_round", "_round_sent_at", "lease_until", "_unstarted", "_pending",
                 "_confirmed", "_dropped", "_follower_reads", "_follower_batches", "_batch_ids",
                 "leader_commit", "last_leader_contact")

    def __init__(self, leader_commit: int) -> None:
        # Leader side.
        self.round = 0  # every heartbeat broadcast is a numbered round
        self.confirmed_round = 0  # the newest round a quorum answered
        self._round_sent_at: dict[int, float] = {}
        self.lease_until = float("-inf")  # on the core's clock; no lease before a round confirms one
        self._unstarted: list[tuple[int, int]] = []  # (ctx, requester) waiting for the next round
        self._pending: deque[tuple[int, int, int, int]] = deque()  # (round, read index, ctx, requester)
        # Outputs for the next Ready.
        self._confirmed: list[tuple[int, int]] = []  # (ctx, read index) of this node's own reads
        self._dropped: list[int] = []  # ctx of this node's reads that can no longer be confirmed
        # Follower side.
        self._follower_reads: list[int] = []
        self._follower_batches: dict[int, list[int]] = {}
        self._batch_ids = 0
        # A follower's view of its leader, for bounded-staleness follower reads.
        self.leader_commit = leader_commit
        self.last_leader_contact = float("-inf")  # a restarted follower has heard from nobody

    # ------------------------------------------------------------------ leader side
    def queue(self, ctx: int, requester: int) -> None:
        """A read (this node's own, or a follower's batch) for the leader to confirm."""
        self._unstarted.append((ctx, requester))

    def round_due(self) -> bool:
        """Reads wait for a round of their own, and none is out: at most one round carrying reads is
        unconfirmed at a time (etcd's server does the same: one ReadIndex in flight, the reads that
        arrive meanwhile batched into the next). Under load a round then confirms every read queued
        during the one before, instead of a round (a heartbeat to each follower and its answer) per
        few reads; an idle leader still starts one at once. A lost round does not hold reads: the
        heartbeat tick's rounds confirm it (`confirm` takes every read up to the round answered)."""
        return bool(self._unstarted) and not self._pending

    def start_round(self, now: float) -> int:
        """A heartbeat broadcast is about to leave at (or after) `now`: the next round."""
        self.round += 1
        self._round_sent_at[self.round] = now
        return self.round

    def start_reads(self, commit: int) -> None:
        """Every queued read is served at `commit` once the round just started is confirmed."""
        rnd = self.round
        self._pending.extend((rnd, commit, ctx, src) for ctx, src in self._unstarted)
        self._unstarted.clear()

    def confirm(self, rnd: int, me: int, lease_s: float) -> list[tuple[int, int, int]]:
        """A quorum answered round `rnd`: confirm the reads waiting on it and, if `lease_s`, extend
        the lease. This node's reads go to the next Ready; returns (requester, ctx, read index)
        for the answers owed to followers."""
        if rnd <= self.confirmed_round:
            return []
        self.confirmed_round = rnd
        sent = self._round_sent_at.get(rnd)
        if sent is not None and lease_s > 0:
            self.lease_until = max(self.lease_until, sent + lease_s)
        for k in [k for k in self._round_sent_at if k <= rnd]:
            del self._round_sent_at[k]
        answers = []
        pending = self._pending
        while pending and pending[0][0] <= rnd:
            _, index, ctx, src = pending.popleft()
            if src == me:
                self._confirmed.append((ctx, index))
            else:
                answers.append((src, ctx, index))
        return answers

    def lease_holds(self, now: float) -> bool:
        return now < self.lease_until

    def revoke_lease(self) -> None:
        self.lease_until = float("-inf")

    # ------------------------------------------------------------------ follower side
    def queue_follower(self, ctx: int) -> None:
        self._follower_reads.append(ctx)

    def has_follower_reads(self) -> bool:
        return bool(self._follower_reads)

    def take_follower_batch(self) -> int:
        """Group the reads queued since the last Ready into one batch; returns its id."""
        self._batch_ids += 1
        self._follower_batches[self._batch_ids] = self._follower_reads
        self._follower_reads = []
        if len(self._follower_batches) > MAX_FOLLOWER_BATCHES:  # answers lost with their messages: give up
            self._dropped.extend(self._follower_batches.pop(next(iter(self._follower_batches))))
        return self._batch_ids

    def drop_follower_reads(self) -> None:
        """Queued reads with no leader to ask fail."""
        self._dropped.extend(self._follower_reads)
        self._follower_reads = []

    def answer_batch(self, batch: int, index: int) -> None:
        """The leader confirmed `batch` at read index `index`."""
        for ctx in self._follower_batches.pop(batch, ()):
            self._confirmed.append((ctx, index))

    # ------------------------------------------------------------------ both
    def drop_all(self, me: int) -> None:
        """A role change: no read in progress can be confirmed any more. This node's own fail;
        followers' forwarded reads are forgotten (they time out there and retry)."""
        self._dropped.extend(ctx for ctx, src in self._unstarted if src == me)
        self._dropped.extend(ctx for _, _, ctx, src in self._pending if src == me)
        self._dropped.extend(self._follower_reads)
        for ctxs in self._follower_batches.values():
            self._dropped.extend(ctxs)
        self._follower_reads = []
        self._follower_batches.clear()
        self._unstarted.clear()
        self._pending.clear()
        self._round_sent_at.clear()
        self.revoke_lease()

    def has_output(self) -> bool:
        return bool(self._confirmed or self._dropped)

    def take_confirmed(self) -> list[tuple[int, int]]:
        out, self._confirmed = self._confirmed, []
        return out

    def take_dropped(self) -> list[int]:
        out, self._dropped = self._dropped, []
        return out
